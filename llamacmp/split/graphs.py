"""Decode steps over a CUDA split: one captured graph per part and list of states, the hidden state crossing by
the parts' bridges between the replays (each part's graph a backends/cuda_graphs.RecordedGraph: the one capture
mechanism, whose module doc says why captured tensors come from an arena of the graph's own).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..backends.base import Segment, StepBatch
from ..backends.cuda_graphs import RecordedGraph, upload_state_tables
from .bridges import Bridge


class _PartStep:
    """Part p's share of one captured decode step for a fixed list of states: its own CUDA graph (embed on the first
    part, its layers, the head on the last) over device buffers owned here -- token ids (first part), the hidden
    state coming in (x_in, later parts), positions, output rows -- and the tensors the graph leaves (x_out, logits).
    Made and replayed on the part's thread."""

    def __init__(self, split, p: int, states: Sequence):        # a SplitModel, its SplitStates
        part = split.parts[p]
        be, model = part.backend, part.model
        self.be, self.first, self.last = be, p == 0, p == len(split.parts) - 1
        B, D = len(states), split.cfg.n_embd
        pos0 = np.asarray([s.n_past for s in states], np.int32)
        self.tokens = be.from_host(np.zeros(B, np.int32), "i32", "graph token ids") if self.first else None
        self.x_in = None if self.first else be.zeros((B, D), "f32", "graph hidden state in")
        self.pos = be.from_host(pos0, "i32", "graph positions")
        self.rows = be.from_host(np.arange(B, dtype=np.int32), "i32", "graph output rows")
        batch = StepBatch(self.tokens if self.first else pos0, pos0,
                          [Segment(i, 1, s.parts[p]) for i, s in enumerate(states)], self.rows)
        batch.device["cuda_pos"] = self.pos

        def forward():
            x = model.embed(batch) if self.first else self.x_in
            x = model.run_layers(x, batch, part.layers)
            return model.head(x, batch) if self.last else x

        # the one-launch conv / GDN tables go up before the capture, as CapturedStep's (every part state holds every
        # layer's tensors, so a part's table has all GDN layers' rows; it reads only its own)
        self.graph = RecordedGraph(be, forward, before=lambda: upload_state_tables(be, batch))
        self.logits, self.x_out = (self.graph.out, None) if self.last else (None, self.graph.out)
        self.tables = (batch.device.get("conv_ptrs"), batch.device.get("ssm_ptrs"))   # read by every replay

    def replay(self, positions: np.ndarray, tokens, inbound: Bridge | None, outbound: Bridge | None):
        be = self.be
        if self.first:
            be.copy_from_host(self.tokens, np.asarray(tokens, np.int32))
        else:
            inbound.recv(out=self.x_in)
        be.copy_from_host(self.pos, positions)
        self.graph.launch()
        if outbound is not None:
            outbound.send(self.x_out)
            return None
        return be.to_host(self.logits)


class SplitDecodeGraphs:
    """Decode steps over a CUDA split: per list of states, one captured graph per part (_PartStep), the hidden state
    crossing by the parts' bridges between the replays. Same interface as backends/cuda_graphs.DecodeGraphs, but
    `step` returns host logits [B, N] (they crossed from the last GPU anyway)."""

    def __init__(self, split, capacity: int = 8):                # a SplitModel
        if capacity < 1:
            raise ValueError(f"SplitDecodeGraphs needs room for at least one graph (capacity {capacity})")
        self.split, self.capacity = split, capacity
        self._graphs: dict[tuple[int, ...], list[_PartStep]] = {}
        self.n_captured = 0

    def step(self, states: Sequence, tokens: Sequence[int]) -> np.ndarray:    # SplitStates
        sp = self.split
        if len(tokens) != len(states):
            raise ValueError(f"{len(tokens)} token ids for {len(states)} sequences")
        for s in states:
            if s.n_past >= s.n_ctx:
                raise ValueError(f"sequence needs {s.n_past + 1} positions, its context is {s.n_ctx}")
        key = tuple(id(s) for s in states)
        steps = self._graphs.pop(key, None)
        if steps is None:
            while len(self._graphs) >= self.capacity:
                self._drop(next(iter(self._graphs)))
            # capture one part after the other, each on its own thread
            steps = [part.call(_PartStep, sp, p, states) for p, part in enumerate(sp.parts)]
            self.n_captured += 1
        self._graphs[key] = steps                     # most recently used last
        pos = np.asarray([s.n_past for s in states], np.int32)
        for part in sp.parts:
            if part.bridge_out is not None:
                part.bridge_out.reset()
        last = len(sp.parts) - 1
        futures = [part.pool.submit(sp._guarded, steps[p].replay, pos, tokens,
                                    None if p == 0 else sp.parts[p - 1].bridge_out,
                                    part.bridge_out if p < last else None)
                   for p, part in enumerate(sp.parts)]
        logits = sp._gather(futures)[-1]
        for s in states:
            s.n_past += 1
        return logits

    def _drop(self, key) -> None:
        steps = self._graphs.pop(key)
        for p, part in enumerate(self.split.parts):
            box, steps[p] = [steps[p]], None
            part.call(box.clear)          # the last reference goes on the part's thread (its arena, its device)

    def forget(self, state) -> None:
        for key in [k for k in self._graphs if id(state) in k]:
            self._drop(key)

    def clear(self) -> None:
        for key in list(self._graphs):
            self._drop(key)
