"""llama.cpp's perf counters (llama_perf_context_data): what the CLIs' `common_perf_print` block and llama-cli's
`[ Prompt: x t/s | Generation: y t/s ]` line report.

Forwards of more than one token count as prompt eval, single-token forwards as eval, as llama.cpp counts them; the
engine books them (scheduler.py) and the draws as sampling time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from .tasks import DraftStats


def now_ms() -> float:
    return time.perf_counter() * 1e3


@dataclass(slots=True)
class Perf:
    t_start_ms: float = field(default_factory=now_ms)
    t_load_ms: float = 0.0
    t_p_eval_ms: float = 0.0
    n_p_eval: int = 0
    t_eval_ms: float = 0.0
    n_eval: int = 0
    t_sample_ms: float = 0.0
    n_sample: int = 0
    draft: DraftStats = field(default_factory=DraftStats)    # speculative decoding (the MTP loop counts)

    def add_forward(self, n_tokens: int, ms: float) -> None:
        if n_tokens > 1:
            self.t_p_eval_ms += ms
            self.n_p_eval += n_tokens
        else:
            self.t_eval_ms += ms
            self.n_eval += 1

    def add_verified(self, n_tokens: int, ms: float) -> None:
        """A draft-and-verify step (engine/speculative.py) that gave n_tokens: they count as eval, the tokens the
        reader waits for, so the generation t/s is what speculation delivers."""
        self.t_eval_ms += ms
        self.n_eval += n_tokens

    def add_sample(self, n_drawn: int, ms: float) -> None:
        self.t_sample_ms += ms
        self.n_sample += n_drawn

    @property
    def prompt_per_second(self) -> float:
        return 1e3 * self.n_p_eval / self.t_p_eval_ms if self.t_p_eval_ms > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1e3 * self.n_eval / self.t_eval_ms if self.t_eval_ms > 0 else 0.0

    def since(self, earlier: "Perf") -> "Perf":
        """Counters accumulated after `earlier` (a copy taken with snapshot()): one turn's figures."""
        return Perf(earlier.t_start_ms, self.t_load_ms, self.t_p_eval_ms - earlier.t_p_eval_ms,
                    self.n_p_eval - earlier.n_p_eval, self.t_eval_ms - earlier.t_eval_ms,
                    self.n_eval - earlier.n_eval, self.t_sample_ms - earlier.t_sample_ms,
                    self.n_sample - earlier.n_sample, self.draft.since(earlier.draft))

    def snapshot(self) -> "Perf":
        return replace(self, draft=self.draft.copy())
