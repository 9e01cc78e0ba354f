"""Command-line tools, one module per llama.cpp binary."""
