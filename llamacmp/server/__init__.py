"""llamacmp-server: llama-server's HTTP API over the engine (app.py routes, worker.py bridge to the engine thread)."""
