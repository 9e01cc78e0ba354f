"""Decode steps on CUDA graphs: a step (one new token for each of a fixed list of sequences) is recorded once and
replayed, so a step costs two small uploads (token ids, positions) and one graph launch instead of ~15 Python
calls and kernel launches per layer.

A graph binds the device addresses of its sequences' states (KV cache, conv and GDN state), so it serves exactly
the states it was captured for: `DecodeGraphs` keeps one per list of states in a small LRU (the engine's slots
are fixed objects, so a set of slots generating together replays its graph until one of them finishes or joins).
Capturing costs about one eager step (the forward runs in Python, its launches are recorded rather than run)
plus the instantiation.

What makes a row's numerics independent of the other rows in the step (CudaBackend.capturing): attention's
split-K count is chosen from the state's whole context (n_ctx), not from the batch or the current length; Q8
projections go through the GEMV path in launches of at most GEMV_MAX_ROWS rows (each row with the single-row
reduction order); every other op is row-wise or per sequence. So a sequence decodes the same tokens alone or with
any neighbours (tests/test_decode_cuda.py).

Memory: a graph's intermediate tensors come from an arena of its own (GRAPH_CHUNK at a time), freed with the
graph. They cannot come from the backend's arena: blocks freed after capture would be handed to later long-lived
tensors (a prompt-cache checkpoint, a new state) that every replay would then overwrite. Within the capture the
blocks are reused as in an eager forward, so a graph holds about one forward's working set. The logits a step
returns are the graph's own buffer: read them before the next replay of that graph.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from ..lib._native import NativeError
from .base import Segment, SeqState, StepBatch
from .cuda_memory import DeviceArena

GRAPH_CHUNK = 16 << 20        # bytes a graph's arena takes at a time
GRAPH_ARENA_CAP = 1 << 40     # no cap of its own: a failing cudaMalloc is the limit (DeviceMemoryError)


class RecordedGraph:
    """A CUDA graph recorded from one Python call, with the arena its tensors come from (the module doc says why a
    graph has an arena of its own). The one capture mechanism: CapturedStep (a decode step on one device) and the
    layer split's per-part steps (split/graphs.py) are built on it."""

    def __init__(self, be, record: Callable[[], Any], before: Callable[[], None] | None = None):
        """be: a CudaBackend. record: issues the launches to capture (be.capturing set: decode-step arguments) and
        returns what they leave, kept as `out` (tensors of this graph's arena). before: runs first with the graph's
        arena current and nothing recorded yet (uploads, which a capture cannot hold)."""
        self.be, self.exec, self.out = be, 0, None
        main = be.arena
        self.arena = DeviceArena(be.native, GRAPH_ARENA_CAP, GRAPH_CHUNK)
        be.arena = self.arena
        try:
            if before is not None:
                before()
            be.capturing = True
            be.native.cmp_graph_begin()
            try:
                self.out = record()                        # recorded, not run
            except BaseException:
                try:
                    be.native.graph_end()
                except NativeError:
                    pass
                raise
            self.exec = be.native.graph_end()
        finally:
            be.capturing = False
            be.arena = main

    def launch(self) -> None:
        self.be.native.cmp_graph_launch(self.exec)

    def __del__(self):
        if getattr(self, "exec", 0):
            self.be.native.cmp_graph_destroy(self.exec)
            self.exec = 0
        arena = getattr(self, "arena", None)
        if arena is not None:
            self.out = None          # blocks of this arena (a block released into a closed arena is harmless)
            arena.close()


def upload_state_tables(be, batch: StepBatch) -> None:
    """Before a decode step of several sequences is recorded (or run eagerly as its graph would run it): the state
    pointer tables of the one-launch conv / GDN (CudaBackend.state_tables) into batch.device. A capture cannot upload
    them itself; without them a recorded step falls back to one launch per sequence and layer (the same numbers,
    2 x S launches per GDN layer). A graph holds the tables for as long as it replays."""
    if be.gdn_rows and len(batch.segments) > 1:
        be.state_tables(batch)


class CapturedStep:
    """One decode step (one new token for each of the given states) captured once as a CUDA graph and replayed.

    The graph reads the token ids, positions and output rows from device buffers owned here, and the kernels take
    the key count from the positions, so a replay needs only two small uploads; attention splits are sized for
    the states' whole context at capture time.
    """

    def __init__(self, be, model, states: Sequence[SeqState], greedy: bool = False, hidden: bool = False):
        """be: a CudaBackend. greedy: also capture the argmax of the logits into the graph's own token-id input,
        so that `step_greedy` feeds each step's greedy token to the next with nothing but the position uploaded.
        hidden: also the hidden state the MTP head reads (forward_hidden; the logits are the same op's), in
        self.h [B, D] after each replay."""
        self.be, self.model, self.states, self.greedy = be, model, list(states), greedy
        self.h = None
        B = len(self.states)
        self.tokens = be.from_host(np.zeros(B, np.int32), "i32", "graph token ids")
        self.pos = be.from_host(np.asarray([s.n_past for s in self.states], np.int32), "i32", "graph positions")
        self.rows = be.from_host(np.arange(B, dtype=np.int32), "i32", "graph output rows")
        batch = StepBatch(self.tokens, np.asarray([s.n_past for s in self.states], np.int32),
                          [Segment(i, 1, s) for i, s in enumerate(self.states)], self.rows)
        batch.device["cuda_pos"] = self.pos
        saved = [s.n_past for s in self.states]

        def forward():
            logits, h = model.forward_hidden(batch) if hidden else (model.forward(batch), None)
            if greedy:
                be.argmax(logits, out=self.tokens)         # the next replay embeds these ids
            return logits, h

        try:
            self.graph = RecordedGraph(be, forward, before=lambda: upload_state_tables(be, batch))
        finally:
            for s, n in zip(self.states, saved):
                s.n_past = n
        self.logits, self.h = self.graph.out
        self.tables = (batch.device.get("conv_ptrs"), batch.device.get("ssm_ptrs"))   # read by every replay

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed one token per state at its n_past; -> logits [B, n_vocab] on the host. Advances every state."""
        self.set_tokens(tokens)
        self._launch()
        return self.be.to_host(self.logits)

    def run(self, tokens: Sequence[int]):
        """Feed one token per state at its n_past; -> the graph's logits [B, n_vocab] on the device, valid until
        the next replay of any graph. Advances every state."""
        self.set_tokens(tokens)
        self._launch()
        return self.logits

    def _launch(self) -> None:
        """Upload the positions, replay the graph, advance the states (the token ids are already in place)."""
        be = self.be
        for s in self.states:
            if s.n_past >= s.n_ctx:
                raise ValueError(f"sequence needs {s.n_past + 1} positions, its context is {s.n_ctx}")
        be.copy_from_host(self.pos, np.asarray([s.n_past for s in self.states], np.int32))
        self.graph.launch()
        for s in self.states:
            s.n_past += 1

    def set_tokens(self, tokens: Sequence[int]) -> None:
        """The ids the next step feeds (for `step_greedy`: the first step after a prompt)."""
        if len(tokens) != len(self.states):
            raise ValueError(f"{len(tokens)} token ids for a graph of {len(self.states)} sequences")
        self.be.copy_from_host(self.tokens, np.asarray(tokens, np.int32))

    def step_greedy(self, read: bool = True) -> np.ndarray | None:
        """(greedy graphs) Feed the current token ids (set_tokens, or the previous step's argmax); the argmax of
        this step's logits becomes the next input on the device. -> the new ids [B] (4 bytes each cross to the
        host; none with read=False). Advances every state."""
        if not self.greedy:
            raise ValueError("step_greedy needs a CapturedStep made with greedy=True")
        self._launch()
        return self.be.ids_to_host(self.tokens) if read else None

class DecodeGraphs:
    """The decode steps of an engine or session: one CapturedStep per list of states, most recently used kept.

    `step(states, tokens)` replays the graph of exactly that list, so the caller passes its generating sequences
    in a stable order (the scheduler: by slot id). A list is captured the second step in a row it is asked for;
    a list that lasts one step (slots joining and leaving under churn) runs eagerly with the same kernels and
    arguments (CudaBackend.capturing set), so eager and replayed steps give the same numbers."""

    def __init__(self, be, model, capacity: int = 8, hidden: bool = False):
        """hidden: every step also gives the hidden state the MTP head reads (step_hidden)."""
        if capacity < 1:
            raise ValueError(f"DecodeGraphs needs room for at least one graph (capacity {capacity})")
        self.be, self.model, self.capacity, self.hidden = be, model, capacity, hidden
        # keyed by the states' identities: a graph holds its states, so an id cannot be reused while it is cached
        self._graphs: OrderedDict[tuple[int, ...], CapturedStep] = OrderedDict()
        self._last: tuple[int, ...] = ()      # the list of the previous step
        self.n_captured = self.n_eager = self.n_replayed = 0

    def step(self, states: Sequence[SeqState], tokens: Sequence[int]):
        """One token for each state at its n_past -> logits [len(states), n_vocab] on the device (valid until the
        next step or eager forward reuses the arena). Advances every state."""
        return self.step_hidden(states, tokens)[0]

    def step_hidden(self, states: Sequence[SeqState], tokens: Sequence[int]):
        """step -> (logits, h [len(states), D] or None unless made with hidden=True), both valid as the logits."""
        key = tuple(id(s) for s in states)
        graph = self._graphs.get(key)
        if graph is None and key != self._last:
            self._last = key
            self.n_eager += 1
            return self._eager(states, tokens)
        self._last = key
        if graph is None:
            while len(self._graphs) >= self.capacity:
                self._graphs.popitem(last=False)
            graph = CapturedStep(self.be, self.model, states, hidden=self.hidden)
            self._graphs[key] = graph
            self.n_captured += 1
        else:
            self._graphs.move_to_end(key)
            self.n_replayed += 1
        return graph.run(tokens), graph.h

    def _eager(self, states: Sequence[SeqState], tokens: Sequence[int]):
        """The step a graph would run, run eagerly: the same kernels with the same arguments."""
        if len(tokens) != len(states):
            raise ValueError(f"{len(tokens)} token ids for {len(states)} sequences")
        batch = StepBatch.build([(s, [int(t)]) for s, t in zip(states, tokens)])
        upload_state_tables(self.be, batch)    # the one-launch conv / GDN, as the graph of this list will run them
        self.be.capturing = True       # decode-step arguments (splits for the whole context, GEMV row launches)
        try:
            return self.model.forward_hidden(batch) if self.hidden else (self.model.forward(batch), None)
        finally:
            self.be.capturing = False

    def forget(self, state: SeqState) -> None:
        """Drop every graph that holds `state` (its owner is replacing it), so its memory can go."""
        for key in [k for k in self._graphs if id(state) in k]:
            del self._graphs[key]

    def clear(self) -> None:
        self._graphs.clear()
