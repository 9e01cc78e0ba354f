"""StateOps (backends/state_ops.py) over the CUDA backend's sequence state."""
from __future__ import annotations

from typing import Optional

import numpy as np

from .base import SeqState
from .state_ops import Checkpoint, HostState


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

    def _host(self, a) -> np.ndarray:
        return a if isinstance(a, np.ndarray) else self.be.to_host(a)

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
        """Host copies of everything, device checkpoints included (they must not pin device memory)."""
        n = state.n_past
        host_ckpts = [Checkpoint(c.pos, [self._host(a) for a in c.conv], [self._host(a) for a in c.ssm],
                                 c.logits, c.nbytes) for c in checkpoints if c.pos <= n]
        # KV rows as stored (f16/f32 values or quantized bytes): load_host copies them back byte for byte.
        return HostState(list(tokens[:n]), [self.be.kv_rows_raw(a, n) for a in state.k],
                         [self.be.kv_rows_raw(a, n) for a in state.v], [self._host(a) for a in state.conv],
                         [self._host(a) for a in state.ssm],
                         None if logits is None else np.array(logits, np.float32), host_ckpts)

    def load_host(self, state: SeqState, host: HostState, ckpt: Optional[Checkpoint]) -> None:
        n = len(host.tokens) if ckpt is None else ckpt.pos
        for dst, src in zip(state.k + state.v, host.k + host.v):
            rows = np.ascontiguousarray(src[:n])
            if rows.nbytes:
                self.be.native.cmp_memcpy_h2d(dst.ptr, rows.ctypes.data, rows.nbytes)
        conv, ssm = (host.conv, host.ssm) if ckpt is None else (ckpt.conv, ckpt.ssm)
        for dst, src in zip(state.conv + state.ssm, list(conv) + list(ssm)):
            self.be.copy_from_host(dst, src)
        state.n_past = n
