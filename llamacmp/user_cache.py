"""llamacmp's user cache folder: $LLAMACMP_CACHE, else ~/.cache/llamacmp (the Qwen vocabulary, the probe results)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
