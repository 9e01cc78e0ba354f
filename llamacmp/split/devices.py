"""The CUDA backends of a split: one per device index."""
from __future__ import annotations

import ctypes
from typing import Sequence


def make_cuda_backends(devices: Sequence[int], arena_bytes: int | None = None) -> list:
    """One CudaBackend per device index (the same index twice: two parts on one GPU). Making a CudaBackend selects
    its device for the calling thread; the caller's own device is put back, so that a backend it already uses on
    this thread keeps working (each part binds its device on its own thread)."""
    from ..backends.cuda import CudaBackend
    from ..lib._native import Native
    nat = Native()
    cur = ctypes.c_int(0)
    nat.cmp_get_device(ctypes.byref(cur))
    try:
        return [CudaBackend(device=d, arena_bytes=arena_bytes, native=nat) for d in devices]
    finally:
        nat.cmp_set_device(cur.value)
