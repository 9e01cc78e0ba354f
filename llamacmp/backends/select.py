"""Pick the compute backend: CUDA when its library and a GPU are present, else the numpy reference (one warning)."""
from __future__ import annotations

import sys
from typing import TextIO

from .base import Backend


def cuda_backend_or_none(device: int = 0) -> Backend | None:
    """The CUDA backend on `device` if cuda.py imports and reports a usable GPU; never raises."""
    try:
        from . import cuda
    except ImportError:
        return None
    try:
        return cuda.CudaBackend(device=device) if cuda.cuda_available() else None
    except Exception as e:  # a broken driver or library: fall back, but say why
        print(f"warning: CUDA backend failed to start ({e})", file=sys.stderr)
        return None


def select_backend(log: TextIO | None = None, device: int = 0, cpu_only: bool = False) -> Backend:
    """CUDA if possible; otherwise the numpy reference, announced with one line on `log` (stderr by default).
    cpu_only (llama.cpp's -ngl 0) asks for the numpy reference directly."""
    backend = None if cpu_only else cuda_backend_or_none(device)
    if backend is not None:
        return backend
    from .numpy_ref import NumpyBackend
    reason = "-ngl 0" if cpu_only else "no CUDA GPU or libcmpkern.so found"
    print(f"warning: {reason}: using the numpy reference backend (slow)", file=log or sys.stderr)
    return NumpyBackend()
