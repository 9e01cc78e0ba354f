"""Copies of a sequence's memory, so that the prompt cache can go back to an earlier position.

A hybrid model's KV cache can be cut at any position (the rows past it are simply overwritten later), but the
GDN conv and SSM states are a running summary that cannot be rolled back. So the cache keeps *checkpoints*:
copies of the recurrent state (conv + ssm) taken at chosen positions. Going back to position p means: restore the
checkpoint taken at p and set n_past = p; KV rows [0, p) are still right as long as the slot processed the same
tokens before p (the prompt cache checks that by comparing token prefixes).

A `HostState` is a whole sequence (KV rows [0, n_past) too), for the host-RAM cache (-cram) that lets a prompt
move from one slot to another.

`StateOps` is what a backend must provide. The numpy version is here; the CUDA backend needs the same five
operations working on device buffers (checkpoints kept in device memory: a 9B model's recurrent state is ~50 MB,
which the CMP's PCIe Gen1 x1 link would take ~0.2 s to move).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Protocol

import numpy as np

from ..backends.base import Backend, SeqState


@dataclass(slots=True)
class Checkpoint:
    """The recurrent state after the first `pos` tokens; `logits` (float32 [n_vocab]) of token pos-1 when known,
    so that resuming exactly at pos needs no forward pass."""
    pos: int
    conv: list
    ssm: list
    logits: Optional[np.ndarray] = None
    nbytes: int = 0


@dataclass(slots=True)
class HostState:
    """A whole sequence in host memory: KV rows [0, n_past), conv, ssm, and the checkpoints taken on the way."""
    tokens: list[int]
    k: list[np.ndarray]
    v: list[np.ndarray]
    conv: list[np.ndarray]
    ssm: list[np.ndarray]
    logits: Optional[np.ndarray]
    checkpoints: list[Checkpoint] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        arrays = [*self.k, *self.v, *self.conv, *self.ssm]
        own = sum(a.nbytes for a in arrays) + (self.logits.nbytes if self.logits is not None else 0)
        return own + sum(c.nbytes for c in self.checkpoints) + 8 * len(self.tokens)


class StateOps(Protocol):
    def snapshot(self, state: SeqState, logits: Optional[np.ndarray]) -> Checkpoint: ...
    def restore(self, state: SeqState, ckpt: Checkpoint) -> None: ...
    def reset(self, state: SeqState) -> None: ...
    def save_host(self, state: SeqState, tokens: list[int], logits: Optional[np.ndarray],
                  checkpoints: list[Checkpoint]) -> HostState: ...
    def load_host(self, state: SeqState, host: HostState, ckpt: Optional[Checkpoint]) -> None: ...


def _nbytes(arrays: list[np.ndarray], logits: Optional[np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays) + (logits.nbytes if logits is not None else 0)


class NumpyStateOps:
    """StateOps over the numpy backend's SeqState (plain arrays)."""

    def snapshot(self, state: SeqState, logits: Optional[np.ndarray]) -> Checkpoint:
        conv = [a.copy() for a in state.conv]
        ssm = [a.copy() for a in state.ssm]
        lg = None if logits is None else np.array(logits, np.float32)
        return Checkpoint(state.n_past, conv, ssm, lg, _nbytes(conv + ssm, lg))

    def restore(self, state: SeqState, ckpt: Checkpoint) -> None:
        for dst, src in zip(state.conv, ckpt.conv):
            dst[...] = src
        for dst, src in zip(state.ssm, ckpt.ssm):
            dst[...] = src
        state.n_past = ckpt.pos

    def reset(self, state: SeqState) -> None:
        # KV rows need no clearing: attention only reads rows [0, n_past + new).
        for a in (*state.conv, *state.ssm):
            a[...] = 0
        state.n_past = 0

    def save_host(self, state: SeqState, tokens: list[int], logits: Optional[np.ndarray],
                  checkpoints: list[Checkpoint]) -> HostState:
        n = state.n_past
        return HostState(list(tokens[:n]), [a[:n].copy() for a in state.k], [a[:n].copy() for a in state.v],
                         [a.copy() for a in state.conv], [a.copy() for a in state.ssm],
                         None if logits is None else np.array(logits, np.float32),
                         [c for c in checkpoints if c.pos <= n])

    def load_host(self, state: SeqState, host: HostState, ckpt: Optional[Checkpoint]) -> None:
        """Copy the KV rows, then either the host state's own end state (ckpt None) or one of its checkpoints."""
        n = len(host.tokens) if ckpt is None else ckpt.pos
        for dst, src in zip(state.k, host.k):
            dst[:n] = src[:n]
        for dst, src in zip(state.v, host.v):
            dst[:n] = src[:n]
        if ckpt is not None:
            self.restore(state, ckpt)
            return
        for dst, src in zip(state.conv, host.conv):
            dst[...] = src
        for dst, src in zip(state.ssm, host.ssm):
            dst[...] = src
        state.n_past = n


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


def state_ops_for(backend: Backend) -> StateOps:
    """The backend's own StateOps when it has one (`backend.state_ops()`), else ours for numpy and cuda."""
    own = getattr(backend, "state_ops", None)
    if callable(own):
        return own()
    if backend.name == "cuda":
        return CudaStateOps(backend)
    if backend.name != "numpy":
        raise NotImplementedError(f"backend '{backend.name}' has no state_ops(): prompt-cache checkpoints need it")
    return NumpyStateOps()


# -- slot files (/slots/:id?action=save|restore) ----------------------------------------------------------------

def write_host_state(path: str, host: HostState) -> int:
    """One .npz per slot (no pickles); checkpoints are not kept: a restored slot resumes from its end state."""
    arrays = {"tokens": np.asarray(host.tokens, np.int32)}
    for name in ("k", "v", "conv", "ssm"):
        for i, a in enumerate(getattr(host, name)):
            arrays[f"{name}{i}"] = a
    if host.logits is not None:
        arrays["logits"] = host.logits
    try:
        with open(path, "wb") as f:
            np.savez(f, **arrays)
            return f.tell()
    except OSError:                      # disk full half way: leave no truncated slot file behind
        if os.path.isfile(path):
            os.remove(path)
        raise


def read_host_state(path: str, like: SeqState) -> tuple[HostState, int]:
    """Read a slot file written for a state shaped like `like`; ValueError if it does not fit."""
    with np.load(path, allow_pickle=False) as z:
        def group(name: str, refs: list) -> list[np.ndarray]:
            out = [z[f"{name}{i}"] for i in range(len(refs))]
            if f"{name}{len(refs)}" in z.files:
                raise ValueError(f"slot file has more '{name}' layers than the model")
            return out
        tokens = [int(t) for t in z["tokens"]]
        host = HostState(tokens, group("k", like.k), group("v", like.v), group("conv", like.conv),
                         group("ssm", like.ssm), z["logits"] if "logits" in z.files else None)
    if len(tokens) >= like.n_ctx or any(a.shape[0] != len(tokens) for a in host.k + host.v):
        raise ValueError("slot file does not fit this slot's context")
    for a, ref in zip(host.conv + host.ssm, like.conv + like.ssm):
        if tuple(a.shape) != tuple(ref.shape):
            raise ValueError("slot file was saved from a different model")
    return host, os.path.getsize(path)
