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


STEP_PARTS = ("between", "launch", "overlap", "wait")


class StepClock:
    """Where the wall time of the server's plain decode steps goes, per number of rows S (llamacmp-only metrics,
    llamacmp:plain_step_seconds_total): MTP on cost 3-4% at 4 streams where its policy stepped plainly, and the
    rounds' counters could not say whether the device or the host took it. Each step of S rows that follows a
    plain step of S rows with nothing else between (no prompt chunk, no drafting round) adds, in seconds:
      between  the previous step's tokens drawn -> this step's start (emission, streaming, new requests);
      launch   -> the forward launched (the draft policy's choice, the decode graph's inputs and replay);
      overlap  -> the host's work beside the running forward done (the results' flush, the MTP heads' queue,
               the next round weighed ahead);
      wait     -> this step's tokens drawn (the device's remaining time, then the draw).
    A part that grows with MTP on is host work where it is the host's, device time where it is 'wait'."""

    def __init__(self):
        self.rows: dict[int, list] = {}            # S -> [steps, between, launch, overlap, wait]
        self._last: tuple | None = None            # (S, time) the last plain step's tokens were drawn

    def broken(self) -> None:
        """Something other than a plain step ran (a prompt chunk, a drafting round): the next step starts a run."""
        self._last = None

    def step(self, S: int, t_start: float, t_launched: float, t_overlapped: float, t_drawn: float) -> None:
        last, self._last = self._last, (S, t_drawn)
        if last is None or last[0] != S:
            return
        row = self.rows.setdefault(S, [0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        for i, dt in enumerate((t_start - last[1], t_launched - t_start, t_overlapped - t_launched,
                                t_drawn - t_overlapped)):
            row[1 + i] += dt

    def snapshot(self) -> dict[int, dict]:
        """{S: {"steps": n, part: seconds, ..}} (a copy: the server's metrics read it from another thread)."""
        return {S: {"steps": row[0], **dict(zip(STEP_PARTS, row[1:]))} for S, row in sorted(self.rows.items())}
