"""One module per GGUF architecture; `model_class` finds it by the file's `general.architecture`."""
from __future__ import annotations

import importlib

SUPPORTED = ("qwen35",)
REFUSED = {"qwen35moe": "Qwen3.5 MoE models are not supported yet: llamacmp runs the dense qwen35 models only"}


class UnsupportedModel(ValueError):
    pass


def model_class(architecture: str):
    if architecture in REFUSED:
        raise UnsupportedModel(f"general.architecture '{architecture}': {REFUSED[architecture]}")
    if architecture not in SUPPORTED:
        raise UnsupportedModel(f"general.architecture '{architecture}' is not supported "
                               f"(llamacmp runs: {', '.join(SUPPORTED)})")
    module = importlib.import_module(f".{architecture}", __name__)
    return getattr(module, "Model")
