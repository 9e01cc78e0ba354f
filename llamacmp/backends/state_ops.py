"""Copies of a sequence's memory, so that the prompt cache can go back to an earlier position (what a backend must
provide: `Backend.state_ops()`; the numpy version is here, the CUDA one in cuda_state.py).

A hybrid model's KV cache can be cut at any position (the rows past it are simply overwritten later), but the
GDN conv and SSM states are a running summary that cannot be rolled back. So the cache keeps *checkpoints*:
copies of the recurrent state (conv + ssm) taken at chosen positions. Going back to position p means: restore the
checkpoint taken at p and set n_past = p; KV rows [0, p) are still right as long as the slot processed the same
tokens before p (the prompt cache checks that by comparing token prefixes).

A `HostState` is a whole sequence (KV rows [0, n_past) too), for the host-RAM cache (-cram) that lets a prompt
move from one slot to another.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Optional, Protocol

import numpy as np

from .base import SeqState


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
    filled: Optional[Future] = field(default=None, compare=False, repr=False)   # the arrays' contents still on
    #                                                                             their way (CUDA's HostCopies)

    def ready(self) -> "HostState":
        """Wait until the arrays (the checkpoints' too) hold their contents; read them only after."""
        if self.filled is not None:
            self.filled.result()
            self.filled = None
        return self

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
