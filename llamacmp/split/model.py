"""The split's runner (lm.model): each part is an instance of the model's own class that uploaded only its layer
range (the first part also the token embedding, the last the output norm and head), and the runner calls its three
steps, embed / run_layers / head, on the part's own thread.

Every part has one worker thread for its whole life; on CUDA that thread binds the part's device and a stream of
its own once (CudaBackend.bind_thread), so ctypes calls never land on another GPU, and two parts on ONE GPU still
run on two streams (how the tests prove the split on a single card).

Prefill is pipelined: a batch of one sequence longer than `micro_batch` (-ub) is cut into micro-batches, and part
p runs micro-batch m while part p+1 runs micro-batch m-1. Flow control is the bridge's two slots (double
buffering): a part runs at most two micro-batches ahead of the next. Each part keeps its own n_past per sequence
(`SplitState.parts`), because part 0 is already at chunk m+1 while part 1 still writes chunk m's keys; the
sequence's own n_past advances when the last part is done. A batch of several sequences (the server's slots)
crosses the parts as one micro-batch.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..backends.base import Backend, Segment, SeqState, StepBatch
from ..config import ModelConfig
from ..weights import ModelWeights
from .backend import SplitBackend, SplitState
from .bridges import Bridge, BridgeAborted, CudaBridge, NumpyHostBridge, choose_bridge
from .placement import assign_layers, weight_bytes

# SeqState fields beyond the tensors and n_past that a part's state mirrors from its sequence before each step.
_SHARED_STATE_FIELDS = tuple(n for n in getattr(SeqState, "__dataclass_fields__", {})
                             if n not in ("n_ctx", "k", "v", "conv", "ssm", "n_past", "k_type", "v_type", "steps"))
# StepBatch fields beyond tokens/positions/segments/output_rows/device that hold one row per token (sliced with the
# micro-batch) -- the vision batches' rope_pos and embeddings where those exist.
_ROW_FIELDS = tuple(n for n in getattr(StepBatch, "__dataclass_fields__", {})
                    if n not in ("tokens", "positions", "segments", "output_rows", "device", "keep_steps"))


def _with_rows(dst: StepBatch, src: StepBatch, rows: slice | None = None) -> StepBatch:
    """Copy src's per-token extra fields (sliced to `rows`) onto dst."""
    for name in _ROW_FIELDS:
        val = getattr(src, name)
        if val is not None:
            setattr(dst, name, val if rows is None else val[rows])
    return dst


@dataclass
class Part:
    backend: Backend
    layers: range
    model: object = None             # the part's instance of the model class
    pool: ThreadPoolExecutor | None = None
    bridge_out: Bridge | None = None

    def call(self, fn, *args):
        """Run fn on this part's thread and wait for it."""
        return self.pool.submit(fn, *args).result()


class SplitModel:
    """lm.model for a split: forward(batch) -> host logits [len(batch.output_rows), N], advancing the states."""
    splits_batches = True      # the engine hands it whole -b batches; it cuts them into micro_batch pieces itself
    mtp = None                 # the MTP head does not run over a layer split (engine/speculative.py refuses)

    def __init__(self, model_class, cfg: ModelConfig, weights: ModelWeights, backends: Sequence[Backend],
                 ratios: Sequence[float] | None = None, bridge: str = "auto", micro_batch: int = 512):
        """model_class: the architecture's class (models.model_class), made once per part on its thread."""
        if len(backends) < 2:
            raise ValueError("a layer split needs at least two backends")
        if len({be.name for be in backends}) != 1:
            raise ValueError("a layer split runs on backends of one kind (all CUDA, or all numpy)")
        self.cfg, self.micro_batch = cfg, max(1, micro_batch)
        layer_b, embd_b, head_b = weight_bytes(weights)
        self.ratios = list(ratios) if ratios else [1.0] * len(backends)
        if len(self.ratios) != len(backends):
            raise ValueError(f"{len(self.ratios)} split ratios for {len(backends)} devices")
        ranges = assign_layers(layer_b, self.ratios, embd_b, head_b)
        self.parts = [Part(be, rng) for be, rng in zip(backends, ranges)]
        self.weight_bytes = [sum(layer_b[i] for i in rng) + (embd_b if p == 0 else 0)
                             + (head_b if p == len(ranges) - 1 else 0) for p, rng in enumerate(ranges)]
        last = len(self.parts) - 1
        for p, part in enumerate(self.parts):
            part.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llamacmp-split{p}",
                                           initializer=part.backend.bind_thread)
            part.model = part.call(model_class, cfg, weights, part.backend, part.layers, p == 0, p == last)
        self.set_bridge(bridge)
        self.backend = SplitBackend(self.parts, cfg)

    def set_bridge(self, mode: str) -> None:
        """(Re)make the bridges between the parts: auto | host | peer (a benchmark compares both on one load)."""
        kinds = [choose_bridge(self.parts[p].backend, self.parts[p + 1].backend, mode)
                 for p in range(len(self.parts) - 1)]
        for p, kind in enumerate(kinds):
            part = self.parts[p]
            if part.bridge_out is not None:
                part.call(part.bridge_out.close)
            src, dst = part.backend, self.parts[p + 1].backend
            part.bridge_out = NumpyHostBridge() if src.device is None else CudaBridge(src, dst, kind)
        self.bridge_kinds = kinds

    # -- description --------------------------------------------------------------------------------------------
    def describe(self) -> list[str]:
        """One line per part: device, layers, memory, bridge (printed at start-up)."""
        lines = []
        for p, part in enumerate(self.parts):
            be = part.backend
            where = f"GPU {be.device}" if be.device is not None else f"{be.name} part {p}"
            extra = (" + token embedding" if p == 0 else "") + (" + output head" if p == len(self.parts) - 1 else "")
            mem = f"{self.weight_bytes[p] / 2**20:.0f} MiB of weights"
            arena = be.arena
            if arena is not None:
                mem += f", {arena.reserved / 2**20:.0f} MiB reserved of a {arena.cap / 2**20:.0f} MiB arena"
            rng = part.layers
            bridge = f"bridge to part {p + 1}: {self.bridge_kinds[p]}" if p < len(self.bridge_kinds) else "last part"
            lines.append(f"split: {where}: layers {rng.start}-{rng.stop - 1} ({len(rng)}){extra}; {mem}; {bridge}")
        return lines

    # -- forward ------------------------------------------------------------------------------------------------
    def forward(self, batch: StepBatch) -> np.ndarray:
        micro = self._micro_batches(batch)
        states = {id(s.state): s.state for s in batch.segments}
        for st in states.values():
            if not isinstance(st, SplitState):
                raise TypeError("a split model runs states made by its own backend (SplitBackend.new_state)")
            for ps in st.parts:
                ps.n_past = st.n_past
                for name in _SHARED_STATE_FIELDS:         # fields other features add to SeqState (vision)
                    setattr(ps, name, getattr(st, name))
        logits: list[np.ndarray] = []
        for part in self.parts:
            if part.bridge_out is not None:
                part.bridge_out.reset()
        self._gather([part.pool.submit(self._guarded, self._run_part, p, micro, logits)
                      for p, part in enumerate(self.parts)])
        for seg in batch.segments:
            seg.state.n_past += seg.length
        N = self.cfg.n_vocab
        return np.concatenate(logits) if logits else np.zeros((0, N), np.float32)

    def _micro_batches(self, batch: StepBatch) -> list[StepBatch]:
        """One sequence longer than micro_batch -> consecutive pieces (output rows renumbered); else the batch."""
        T = len(batch.tokens)
        if len(batch.segments) != 1 or T <= self.micro_batch:
            return [batch]
        rows = np.asarray(batch.output_rows)
        if np.any(np.diff(rows) <= 0):
            raise ValueError("output rows must be ascending")
        seg, out = batch.segments[0], []
        for c0 in range(0, T, self.micro_batch):
            c1 = min(T, c0 + self.micro_batch)
            r = rows[(rows >= c0) & (rows < c1)] - c0
            out.append(_with_rows(StepBatch(batch.tokens[c0:c1], batch.positions[c0:c1],
                                            [Segment(0, c1 - c0, seg.state)], r.astype(np.int32)), batch,
                                  slice(c0, c1)))
        return out

    def _guarded(self, fn, *args):
        """Run one part's share of a step on its thread. A failure stops every bridge at once, so that no other
        part waits for a hidden state that will never come."""
        try:
            return fn(*args)
        except BaseException:
            for part in self.parts:
                if part.bridge_out is not None:
                    part.bridge_out.abort()
            raise

    @staticmethod
    def _gather(futures) -> list:
        """Wait for every part; raise the first real failure (not the BridgeAborted of the parts it stopped)."""
        results, errors = [], []
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as e:
                errors.append(e)
        if errors:
            raise next((e for e in errors if not isinstance(e, BridgeAborted)), errors[0])
        return results

    def _run_part(self, p: int, micro: list[StepBatch], logits: list) -> None:
        """On part p's thread: every micro-batch through this part's layers, in order."""
        part = self.parts[p]
        first, last = p == 0, p == len(self.parts) - 1
        inbound = None if first else self.parts[p - 1].bridge_out
        for mb in micro:
            pb = _with_rows(StepBatch(mb.tokens, mb.positions,
                                      [Segment(s.start, s.length, s.state.parts[p]) for s in mb.segments],
                                      mb.output_rows), mb)
            x = part.model.embed(pb) if first else inbound.recv()
            x = part.model.run_layers(x, pb, part.layers)
            for s in pb.segments:
                s.state.n_past += s.length
            if not last:
                part.bridge_out.send(x)
            elif len(mb.output_rows):
                logits.append(part.backend.to_host(part.model.head(x, pb)))
            del x, pb

    def close(self) -> None:
        for part in self.parts:
            if part.bridge_out is not None:
                part.call(part.bridge_out.close)
            part.pool.shutdown(wait=True)
