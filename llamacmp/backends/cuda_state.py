"""StateOps (backends/state_ops.py) over the CUDA backend's sequence state."""
from __future__ import annotations

import ctypes
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional, Union

import numpy as np

from ..lib._native import CMP_ERR_NOMEM, NativeError
from .base import SeqState
from .cuda_memory import DTYPES, DeviceTensor, PinnedBlock
from .state_ops import Checkpoint, HostState

_ALIGN = 256                  # each array's offset in a group's host buffer (and in the staging block)

# A part of a host copy: a device tensor's first rows (None: all of it), or an array already on the host (a
# checkpoint that came back from the host-RAM cache), kept as it is.
Part = Union[tuple[DeviceTensor, Optional[int]], np.ndarray]


class CudaStateOps:
    """StateOps over the CUDA backend's SeqState (DeviceTensor fields). Checkpoints stay in device memory and
    are taken and restored with device-to-device copies (no PCIe traffic); only the host-RAM cache (-cram)
    crosses the bus. Uses the backend's public pieces: empty(), the arena-owned DeviceTensor, and the
    library's cmp_memcpy_d2d / cmp_memcpy_h2d / cmp_memset."""

    def __init__(self, backend):
        self.be = backend

    def _clone(self, t):
        c = self.be.empty(t.shape, t.dtype, "a prompt-cache checkpoint (fewer with -ctxcp, or a smaller -np)")
        self.be.native.cmp_memcpy_d2d(c.ptr, t.ptr, t.nbytes)
        return c

    def _copy(self, dst, src) -> None:
        if isinstance(src, np.ndarray):          # a checkpoint that came back from the host-RAM cache
            self.be.copy_from_host(dst, src)
        else:
            self.be.native.cmp_memcpy_d2d(dst.ptr, src.ptr, dst.nbytes)

    def snapshot(self, state: SeqState, logits: Optional[np.ndarray]) -> Checkpoint:
        conv = [self._clone(a) for a in state.conv]
        ssm = [self._clone(a) for a in state.ssm]
        lg = None if logits is None else np.array(logits, np.float32)
        nbytes = sum(a.nbytes for a in conv + ssm) + (lg.nbytes if lg is not None else 0)
        return Checkpoint(state.n_past, conv, ssm, lg, nbytes)

    def restore(self, state: SeqState, ckpt: Checkpoint) -> None:
        for dst, src in zip(state.conv, ckpt.conv):
            self._copy(dst, src)
        for dst, src in zip(state.ssm, ckpt.ssm):
            self._copy(dst, src)
        state.n_past = ckpt.pos

    def reset(self, state: SeqState) -> None:
        for a in (*state.conv, *state.ssm):
            self.be.native.cmp_memset(a.ptr, 0, a.nbytes)
        state.n_past = 0

    def save_host(self, state: SeqState, tokens: list[int], logits: Optional[np.ndarray],
                  checkpoints: list[Checkpoint]) -> HostState:
        """Host copies of everything, device checkpoints included (they must not pin device memory), made by the
        backend's HostCopies: the arrays' contents arrive on its worker thread (HostState.ready() waits for them).
        KV rows as stored (f16/f32 values or quantized bytes): load_host copies them back byte for byte."""
        n = state.n_past
        kept = [c for c in checkpoints if c.pos <= n]
        groups = [[(a, n) for a in (*state.k, *state.v)] + [(a, None) for a in (*state.conv, *state.ssm)]]
        groups += [[a if isinstance(a, np.ndarray) else (a, None) for a in (*c.conv, *c.ssm)] for c in kept]
        (own, *ckpt_arrays), filled = self.be.host_copies.run(groups)
        nk, nc = len(state.k), len(state.conv)
        host_ckpts = [Checkpoint(c.pos, arrays[:nc], arrays[nc:], c.logits, c.nbytes)
                      for c, arrays in zip(kept, ckpt_arrays)]
        return HostState(list(tokens[:n]), own[:nk], own[nk:2 * nk], own[2 * nk:2 * nk + nc], own[2 * nk + nc:],
                         None if logits is None else np.array(logits, np.float32), host_ckpts, filled)

    def load_host(self, state: SeqState, host: HostState, ckpt: Optional[Checkpoint]) -> None:
        host.ready()
        n = len(host.tokens) if ckpt is None else ckpt.pos
        for dst, src in zip(state.k + state.v, host.k + host.v):
            rows = np.ascontiguousarray(src[:n])
            if rows.nbytes:
                self.be.native.cmp_memcpy_h2d(dst.ptr, rows.ctypes.data, rows.nbytes)
        conv, ssm = (host.conv, host.ssm) if ckpt is None else (ckpt.conv, ckpt.ssm)
        for dst, src in zip(state.conv + state.ssm, list(conv) + list(ssm)):
            self.be.copy_from_host(dst, src)
        state.n_past = n


class HostCopies:
    """Device tensors to host memory without the engine's thread waiting on the host: the copies go asynchronously,
    in stream order, into a pinned staging block; a worker thread waits for them (an event), then copies the block
    into fresh host buffers, one per group, whose views are the arrays (a group's arrays live and die together: a
    checkpoint a slot keeps holds only its own buffer). Why: a copy per tensor, each waited for, into its own fresh
    pageable array held the engine's thread 137-139 ms for a 9B slot of 72 tokens on an H100 (153 MiB with its two
    checkpoints, 160 copies, the host's first touch of every page behind each), every other slot's decode stalled
    meanwhile; now 4.5-5 ms (benchmarks/host_cache.py, RESULTS.md 2026-12-05 "twenty-eighth session"), the worker
    filling the arrays in ~50-60 ms more (the host's first touch of their pages). Two staging blocks, each with
    its own worker, so that two saves in a row do not wait for each other and their fills run at once; a third
    waits for the first's fill. Without pinned memory to spare, the copies go to the buffers directly, waited for."""
    BLOCKS = 2

    def __init__(self, native):
        self.native = native
        self.blocks = [PinnedBlock(native) for _ in range(self.BLOCKS)]
        self.events = [0] * self.BLOCKS
        self.jobs: list[Optional[Future]] = [None] * self.BLOCKS
        self.turn = 0
        self.worker: Optional[ThreadPoolExecutor] = None

    def run(self, groups: list[list[Part]]) -> tuple[list[list[np.ndarray]], Optional[Future]]:
        """-> each group's arrays (an np.ndarray part is kept as it is) and the job that fills them (None: filled)."""
        layout, size = _layout(groups)
        bufs = [np.empty(gsize, np.uint8) for _, gsize, _ in layout]     # (untouched pages: no cost yet)
        arrays = [[part if isinstance(part, np.ndarray) else _view(buf, off, *part) for part, off in zip(group, offs)]
                  for group, buf, (_, _, offs) in zip(groups, bufs, layout)]
        copies = [(base + off, buf, off, part[0].ptr, _nbytes(*part))
                  for group, buf, (base, _, offs) in zip(groups, bufs, layout)
                  for part, off in zip(group, offs) if not isinstance(part, np.ndarray) and _nbytes(*part)]
        k = self.turn
        staging = self._staging(k, size)
        if not staging:
            for _, buf, off, src, nbytes in copies:
                self.native.cmp_memcpy_d2h(buf.ctypes.data + off, src, nbytes)
            return arrays, None
        self.turn = (k + 1) % self.BLOCKS
        for at, _, _, src, nbytes in copies:
            self.native.cmp_memcpy_d2h_async(staging + at, src, nbytes)
        if not self.events[k]:
            self.events[k] = self.native.event_create()
        self.native.cmp_event_record(self.events[k])
        if self.worker is None:
            self.worker = ThreadPoolExecutor(self.BLOCKS, thread_name_prefix="llamacmp-host-copies")
        self.jobs[k] = self.worker.submit(self._fill, self.events[k], staging, bufs, layout)
        return arrays, self.jobs[k]

    def _staging(self, k: int, nbytes: int) -> int:
        """Block k (its last job done) of at least nbytes, or 0 where there is nothing to copy or pinned memory is
        short."""
        if self.jobs[k] is not None:
            self.jobs[k].result()
            self.jobs[k] = None
        try:
            return self.blocks[k].at_least(nbytes) if nbytes else 0
        except NativeError as e:
            if e.code != CMP_ERR_NOMEM:
                raise
            return 0

    def _fill(self, event: int, staging: int, bufs: list[np.ndarray], layout) -> None:
        self.native.cmp_event_synchronize(event)
        for buf, (base, gsize, _) in zip(bufs, layout):
            ctypes.memmove(buf.ctypes.data, staging + base, gsize)

    def close(self) -> None:
        """Wait for the jobs in flight, then give the pinned blocks and events back."""
        for j in self.jobs:
            if j is not None:
                j.result()
        for e in self.events:
            if e:
                self.native.cmp_event_destroy(e)
        for b in self.blocks:
            b.close()
        self.jobs, self.events = [None] * self.BLOCKS, [0] * self.BLOCKS


def _layout(groups: list[list[Part]]) -> tuple[list, int]:
    """-> per group (its offset in the staging block, its host buffer's size, its parts' offsets), total bytes."""
    layout, size = [], 0
    for group in groups:
        offsets, gsize = [], 0
        for part in group:
            offsets.append(gsize)
            gsize += 0 if isinstance(part, np.ndarray) else -(-_nbytes(*part) // _ALIGN) * _ALIGN
        layout.append((size, gsize, offsets))
        size += gsize
    return layout, size


def _rows(t: DeviceTensor, rows: Optional[int]) -> tuple:
    return t.shape if rows is None else (rows,) + tuple(t.shape[1:])


def _nbytes(t: DeviceTensor, rows: Optional[int]) -> int:
    return int(np.prod(_rows(t, rows), dtype=np.int64)) * np.dtype(DTYPES[t.dtype]).itemsize


def _view(buf: np.ndarray, off: int, t: DeviceTensor, rows: Optional[int]) -> np.ndarray:
    """t's first rows as copied to buf at off (its dtype and shape)."""
    return buf[off:off + _nbytes(t, rows)].view(DTYPES[t.dtype]).reshape(_rows(t, rows))
