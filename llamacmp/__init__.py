"""llamacmp: a llama.cpp-compatible engine for Qwen3.5/3.6 hybrid models on old and cheap NVIDIA GPUs."""
__version__ = "0.1.0"
BUILD_NUMBER = 8462          # the llama.cpp build whose interface we follow
