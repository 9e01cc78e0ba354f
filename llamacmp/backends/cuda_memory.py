"""Device memory of one GPU for the CUDA backend: the arena (cudaMalloc'd chunks, bump allocation, free lists by
size class) and DeviceTensor, a block of it seen as a row-major array.

Its own module so that the backend's ops (cuda.py) and its decode graphs (cuda_graphs.py) both build on it without
importing each other.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from ..lib._native import CMP_ERR_NOMEM, Native, NativeError
from .arena_sizes import size_class as _size_class

__all__ = ["DTYPES", "DeviceArena", "DeviceMemoryError", "DeviceTensor", "MIB", "PinnedBlock"]

DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i8": np.int8, "u8": np.uint8}
_ITEMSIZE = {k: np.dtype(v).itemsize for k, v in DTYPES.items()}    # (np.dtype() per call: ~0.2 us, ~20 a round
                                                                     # of MTP's host path)
_ALIGN = 256
_CHUNK = 512 << 20
MIB = 1 << 20


class DeviceMemoryError(MemoryError):
    """The arena cannot hold a tensor; the message says what and which command-line flag helps."""


class DeviceArena:
    """Device memory of one GPU: chunks cudaMalloc'd on demand up to `cap` bytes, split by bump allocation, with
    freed blocks kept on free lists by size class."""

    def __init__(self, native: Native, cap: int, chunk: int = _CHUNK):
        """chunk: bytes cudaMalloc'd at a time (a larger block gets a chunk of its own)."""
        self.native, self.cap, self.chunk = native, cap, chunk
        self.chunks: list[int] = []
        self.reserved = 0           # bytes cudaMalloc'd
        self.in_use = 0             # bytes handed out
        self._cur, self._cur_left = 0, 0
        self._free: dict[int, list[int]] = {}
        self._exact = False         # inside persistent(): exact (256-aligned) sizes

    @contextlib.contextmanager
    def persistent(self):
        """Allocations made inside are long-lived (weights, KV caches, recurrent state): exact sizes. Freed, they
        still go back to a free list of that size, so a context rebuilt with the same shape reuses them."""
        prev, self._exact = self._exact, True
        try:
            yield
        finally:
            self._exact = prev

    def reserve(self, nbytes: int, what: str) -> None:
        """Take the next `nbytes` in one cudaMalloc (the memory plan's long-lived total), so that the persistent
        tensors that follow are packed back to back instead of leaving the tail of each 512 MiB chunk unused."""
        if nbytes > self._cur_left:
            self._new_chunk(nbytes, what, nbytes)

    def alloc(self, nbytes: int, what: str) -> tuple[int, int]:
        """-> (device pointer, size class). Raises DeviceMemoryError naming `what`. Inside `persistent()` the
        size is only 256-aligned (long-lived tensors are never resized, so rounding them up would waste up to 1/8)."""
        cls = -(-max(nbytes, 1) // _ALIGN) * _ALIGN if self._exact else _size_class(nbytes)
        free = self._free.get(cls)
        if free:
            self.in_use += cls
            return free.pop(), cls
        if cls > self._cur_left:
            self._new_chunk(max(self.chunk, cls), what, cls)
        ptr = self._cur
        self._cur += cls
        self._cur_left -= cls
        self.in_use += cls
        return ptr, cls

    def _new_chunk(self, size: int, what: str, need: int) -> None:
        size = min(size, max(self.cap - self.reserved, need))
        if self.reserved + size > self.cap:
            raise self._full(what, need)
        try:
            ptr = self.native.malloc(size)
        except NativeError as e:
            if e.code != CMP_ERR_NOMEM:
                raise
            raise self._full(what, need) from None
        self.chunks.append(ptr)
        self.reserved += size
        self._cur, self._cur_left = ptr, size

    def _full(self, what: str, need: int) -> DeviceMemoryError:
        return DeviceMemoryError(
            f"out of device memory: {what} needs {need / MIB:.1f} MiB with {self.in_use / MIB:.0f} MiB in use "
            f"of the {self.cap / MIB:.0f} MiB arena; use a smaller context (-c), a smaller KV cache format "
            f"(-ctk q8_0 -ctv tq3, or tq3 for both), fewer parallel slots (-np), a smaller micro-batch (-ub), "
            f"keep fewer layers on the GPU (-ngl), or raise --device-mem-cap")

    def release(self, ptr: int, cls: int) -> None:
        self._free.setdefault(cls, []).append(ptr)
        self.in_use -= cls

    def close(self) -> None:
        for p in self.chunks:
            self.native.cmp_free(p)
        self.chunks.clear()
        self._free.clear()
        self.reserved = self.in_use = self._cur_left = 0


class PinnedBlock:
    """One pinned (page-locked) host block, grown on demand and kept: the staging of batched copies from the device
    (cuda_state.HostCopies: the host-RAM prompt cache's saves). Copies into it run at the bus's rate without the
    host's first touch of fresh pages behind each one; its contents are the caller's until the next at_least()."""

    def __init__(self, native: Native):
        self.native, self.ptr, self.size = native, 0, 0

    def at_least(self, nbytes: int) -> int:
        """-> the block's address, at least nbytes long (grown by half again, so a slowly growing use reallocates
        rarely: cudaHostAlloc of 150 MB takes ~80 ms)."""
        if nbytes > self.size:
            size = max(nbytes, self.size * 3 // 2)
            self.close()
            self.ptr, self.size = self.native.host_alloc(size), size
        return self.ptr

    def close(self) -> None:
        if self.ptr:
            self.native.cmp_host_free(self.ptr)
        self.ptr, self.size = 0, 0


class DeviceTensor:
    """A block of the arena seen as a row-major array; gives the block back when dropped, which CPython does the
    moment the last reference goes: a tensor that is not bound to a name dies within the expression that made it.

    Reusing a dropped block at once is safe for the kernels already queued on it (one stream per backend, so the
    next user's writes queue behind them), but not for an address read from a temporary: see `ptr`."""
    __slots__ = {
        "ptr": "The block's device address: a plain int, which does not hold the tensor. Read from a temporary "
               "(`be.from_host(a).ptr`) it outlives its block: the tensor is dropped as soon as .ptr is read, and "
               "the next allocation of its size class gets the same address, so `f(be.from_host(a).ptr, "
               "be.from_host(b).ptr)` passes one address twice. Bind the tensor to a name and keep it until the "
               "results are read back (tests/test_temporary_tensors.py refuses two temporaries' addresses in one "
               "call).",
        "shape": "Row-major shape.",
        "dtype": "A key of DTYPES.",
        "nbytes": "The bytes of shape x dtype, kept (shape and dtype are fixed: an MTP round reads it a dozen times "
                  "on the host's critical path, each a math.prod as a property).",
        "_arena": "The arena the block goes back to when this tensor is dropped; None for a view.",
        "_cls": "The block's size class (DeviceArena.alloc).",
        "_base": "Set on views only: the tensor whose block a view reads (held, so that the block stays).",
    }

    def __init__(self, arena: DeviceArena, shape: tuple[int, ...], dtype: str, what: str):
        self.shape, self.dtype = tuple(map(int, shape)), dtype
        self.nbytes = math.prod(self.shape) * _ITEMSIZE[dtype]
        self._arena = None
        self._base = None
        self.ptr, self._cls = arena.alloc(max(self.nbytes, 1), what)
        self._arena = arena

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def row_ptr(self, row: int) -> int:
        """Address of row `row` along the first axis (like `ptr`, it does not keep the tensor alive)."""
        return self.ptr + row * (self.nbytes // self.shape[0])

    def view(self, shape: tuple[int, ...]) -> "DeviceTensor":
        """The same device bytes as `shape` (same element count, row-major), without a copy. The view holds this
        tensor (or the tensor this one views), so the block goes back to the arena only when both are dropped."""
        shape = tuple(map(int, shape))
        if math.prod(shape) != self.size:
            raise ValueError(f"view: {self.shape} has {self.size} elements, {shape} needs {math.prod(shape)}")
        return self._view(self.ptr, shape, self.nbytes)

    def rows(self, start: int, n: int) -> "DeviceTensor":
        """Rows start .. start + n - 1 along the first axis, a view (holding this tensor's block)."""
        if not (0 <= start and 0 < n and start + n <= self.shape[0]):
            raise ValueError(f"rows {start} .. {start + n - 1} of a tensor of {self.shape[0]}")
        row = self.nbytes // self.shape[0]
        return self._view(self.ptr + start * row, (n,) + self.shape[1:], n * row)

    def _view(self, ptr: int, shape: tuple[int, ...], nbytes: int) -> "DeviceTensor":
        # (built field by field: the MTP round's queue takes three views a round on the host's critical path)
        v = DeviceTensor.__new__(DeviceTensor)
        v.ptr, v.shape, v.dtype, v.nbytes, v._cls = ptr, shape, self.dtype, nbytes, self._cls
        v._arena = None                                   # a view gives nothing back itself
        v._base = self if self._base is None else self._base
        return v

    def __del__(self):
        if self._arena is not None:
            self._arena.release(self.ptr, self._cls)

    def __repr__(self) -> str:
        return f"DeviceTensor({self.shape}, {self.dtype}, 0x{self.ptr:x})"
