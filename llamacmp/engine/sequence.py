"""One sequence fed tokens directly, for scoring: llamacmp-perplexity and the benchmarks that read logits.

Nothing here draws tokens: every generation goes through the scheduler (scheduler.py; the CLIs through client.py).
Prompts are cut as the engine cuts them: -ub pieces, or whole -b batches for a layer split (llamacmp/split/),
which pipelines their -ub pieces over its devices.
"""
from __future__ import annotations

import numpy as np

from .decode import Decoder, LogitsRow


class ContextFull(Exception):
    """The sequence would pass n_ctx."""


class Sequence:
    def __init__(self, lm, n_ctx: int, n_batch: int = 2048, n_ubatch: int = 512, kv_type: str = "f16",
                 v_type: str | None = None):
        self.lm, self.n_ctx = lm, n_ctx
        self.chunk = max(1, n_batch if lm.model.splits_batches else min(n_batch, n_ubatch))
        self.kv_type, self.v_type = kv_type, v_type or kv_type
        self.decoder = Decoder(lm, max_graphs=1)
        self.state = lm.backend.new_state(lm.cfg, n_ctx, self.kv_type, self.v_type)

    @classmethod
    def from_plan(cls, lm, run) -> "Sequence":
        """The one sequence of a run_plan.RunPlan (context, batch sizes, -ctk / -ctv)."""
        return cls(lm, run.n_ctx, run.n_batch, run.n_ubatch, run.k_type, run.v_type)

    @property
    def n_past(self) -> int:
        return self.state.n_past

    def reset(self) -> None:
        self.decoder.forget(self.state)
        # drop the old caches before making the new ones: the memory plan counts one context
        self.state = None
        self.state = self.lm.backend.new_state(self.lm.cfg, self.n_ctx, self.kv_type, self.v_type)

    def feed(self, tokens: list[int], all_logits: bool = False) -> np.ndarray | LogitsRow:
        """Decode tokens after what the sequence holds -> the last row of logits ([n_vocab], a LogitsRow:
        np.asarray copies it to the host), or every row as a host array [len(tokens), n_vocab] when all_logits.
        A single token goes through the decode path (a CUDA graph)."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("feed() needs at least one token to decode")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFull(f"context full ({self.n_past + len(tokens)} tokens > n_ctx {self.n_ctx})")
        be = self.lm.backend
        if all_logits:
            return np.concatenate([be.to_host(self.decoder.prefill(self.state, tokens[s:s + self.chunk], True))
                                   for s in range(0, len(tokens), self.chunk)])
        if len(tokens) == 1:
            logits = self.decoder.decode([self.state], tokens)
        else:
            for s in range(0, len(tokens), self.chunk):
                logits = self.decoder.prefill(self.state, tokens[s:s + self.chunk])
        return LogitsRow(be, logits, int(logits.shape[0]) - 1)
