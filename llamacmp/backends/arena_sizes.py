"""The device arena's block arithmetic, shared by the CUDA backend's DeviceArena and the memory plan (memplan.py),
so that the plan counts exactly what the arena hands out."""
from __future__ import annotations

ALIGN = 256


def exact(nbytes: int) -> int:
    """A long-lived tensor's bytes in the arena (256-aligned, no size class)."""
    return -(-max(nbytes, 1) // ALIGN) * ALIGN


def size_class(nbytes: int) -> int:
    """Round up to 256 B, then to one of 8 steps per power of two, so that varying batch sizes reuse blocks."""
    n = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
    if n <= 64 * ALIGN:
        return n
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step
