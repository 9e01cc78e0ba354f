"""llama-server 0c1e570's agent tools: the /tools endpoint (registry.py) and its built-in tools (builtin.py)."""
