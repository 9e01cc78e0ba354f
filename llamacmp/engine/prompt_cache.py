"""Prompt cache: what a slot (or the host-RAM cache) already holds, and where a new prompt can resume.

A slot's state holds `tokens` (state.n_past of them) plus checkpoints at earlier positions. For a new prompt the
best resume point is the furthest position p such that
  - p <= the common prefix of the prompt and the held tokens, and
  - the state at p is available: the live state (p == len(tokens)), a checkpoint at p, or p == 0, and
  - p < len(prompt), or p == len(prompt) with that position's logits stored (then nothing is evaluated).
Everything after p is prefilled again.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .checkpoints import Checkpoint, HostState, StateOps


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(diff[0]) if len(diff) else n


@dataclass(slots=True)
class ResumePoint:
    pos: int
    ckpt: Optional[Checkpoint]          # None: the live/end state (pos == len(tokens)) or a reset (pos == 0)
    logits: Optional[np.ndarray]        # logits of token pos-1, when pos == len(prompt)
    lcp: int


def best_resume(tokens: list[int], checkpoints: list[Checkpoint], end_logits: Optional[np.ndarray],
                prompt: list[int]) -> ResumePoint:
    lcp = common_prefix(tokens, prompt)
    n_prompt = len(prompt)

    def usable(pos: int, logits) -> bool:
        return pos <= lcp and (pos < n_prompt or (pos == n_prompt and logits is not None))

    best = ResumePoint(0, None, None, lcp)
    if usable(len(tokens), end_logits) and len(tokens) > 0:
        best = ResumePoint(len(tokens), None, end_logits if len(tokens) == n_prompt else None, lcp)
    for c in checkpoints:
        if c.pos > best.pos and usable(c.pos, c.logits):
            best = ResumePoint(c.pos, c, c.logits if c.pos == n_prompt else None, lcp)
    return best


@dataclass(slots=True)
class SlotCache:
    """What one slot's state holds: tokens [0, n_past), checkpoints, and the logits of the last token."""
    max_checkpoints: int = 32
    tokens: list[int] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    last_logits: Optional[np.ndarray] = None

    def plan(self, prompt: list[int]) -> ResumePoint:
        return best_resume(self.tokens, self.checkpoints, self.last_logits, prompt)

    def add_checkpoint(self, ckpt: Checkpoint) -> None:
        """Keep checkpoints sorted by position; beyond the limit the oldest (lowest) goes, as llama.cpp does."""
        if self.max_checkpoints <= 0:
            return
        self.checkpoints = [c for c in self.checkpoints if c.pos != ckpt.pos] + [ckpt]
        self.checkpoints.sort(key=lambda c: c.pos)
        while len(self.checkpoints) > self.max_checkpoints:
            self.checkpoints.pop(0)

    def has_checkpoint(self, pos: int) -> bool:
        return any(c.pos == pos for c in self.checkpoints)

    def truncate(self, pos: int) -> None:
        """The state now holds only tokens [0, pos): later checkpoints describe a history that is gone."""
        if pos < len(self.tokens):
            self.last_logits = None
        del self.tokens[pos:]
        self.checkpoints = [c for c in self.checkpoints if c.pos <= pos]

    def clear(self) -> None:
        self.tokens.clear()
        self.checkpoints.clear()
        self.last_logits = None

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.checkpoints)


class HostCache:
    """-cram: slot states that were about to be overwritten, kept in host RAM (LRU, limited in bytes)."""

    def __init__(self, limit_mib: int):
        self.limit = None if limit_mib < 0 else limit_mib * 1024 * 1024
        self.entries: OrderedDict[int, HostState] = OrderedDict()
        self._next = 0

    @property
    def enabled(self) -> bool:
        return self.limit is None or self.limit > 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def holds(self, tokens: list[int]) -> bool:
        """An entry can give back the whole state after `tokens`: the same tokens, or a longer history starting
        with them that has a checkpoint there (a copy of it would be a duplicate)."""
        n = len(tokens)
        return any(common_prefix(e.tokens, tokens) == n
                   and (len(e.tokens) == n or any(c.pos == n for c in e.checkpoints)) for e in self.entries.values())

    def put(self, host: HostState) -> bool:
        """Keep `host`; False when it was not kept (cache off, empty, or larger than the limit)."""
        if not self.enabled or not host.tokens:
            return False
        if self.limit is not None and host.nbytes > self.limit:
            return False
        # a held prompt that is a prefix of the new one is now redundant
        for key in [k for k, e in self.entries.items() if common_prefix(e.tokens, host.tokens) == len(e.tokens)]:
            del self.entries[key]
        self.entries[self._next] = host
        self._next += 1
        while self.limit is not None and self.nbytes > self.limit:
            self.entries.popitem(last=False)
        return True

    def best(self, prompt: list[int]) -> tuple[Optional[int], ResumePoint]:
        best_key, best = None, ResumePoint(0, None, None, 0)
        for key, e in self.entries.items():
            r = best_resume(e.tokens, e.checkpoints, e.logits, prompt)
            if r.pos > best.pos:
                best_key, best = key, r
        return best_key, best

    def take(self, key: int) -> HostState:
        return self.entries.pop(key)


def rewind(ops: StateOps, state, cache: SlotCache, point: ResumePoint) -> None:
    """Move a sequence back to `point` (from SlotCache.plan): its checkpoint's recurrent state, or the live state
    cut at point.pos (KV rows past it are overwritten later), or empty; the cache forgets what came after."""
    if point.ckpt is not None:
        ops.restore(state, point.ckpt)
    elif point.pos == 0:
        ops.reset(state)
    else:
        state.n_past = point.pos
    cache.truncate(point.pos)
    cache.last_logits = point.ckpt.logits if point.ckpt is not None else None


def restore_from_host(ops: StateOps, state, cache: SlotCache, host: HostState, point: ResumePoint) -> None:
    """Load a host entry into a slot at `point` (its end state or one of its checkpoints)."""
    ops.load_host(state, host, point.ckpt)
    cache.tokens = list(host.tokens[:point.pos])
    cache.checkpoints = [c for c in host.checkpoints if c.pos <= point.pos]
    cache.last_logits = host.logits if point.ckpt is None else point.ckpt.logits
