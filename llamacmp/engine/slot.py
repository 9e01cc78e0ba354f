"""One slot: a sequence state, its prompt cache, and the request it is serving (llama.cpp's server_slot).

The scheduler decides *when* a slot runs; this file decides what a slot does with its share of a batch:
which prompt tokens go next, and what a sampled token means (text, stop strings, limits, probabilities).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..backends.base import SeqState
from ..sampling import Sampler
from .prompt_cache import SlotCache
from .slot_log import StartMarks
from .turn import LIMIT, Turn
from .tasks import CompletionTask, FinalResult, PartialResult, Timings, TokenProb

IDLE, PREFILL, GENERATE = "idle", "prefill", "generate"


def token_probs(logits: np.ndarray, chosen: int, n: int) -> TokenProb:
    """log-softmax over the raw logits (llama.cpp reports pre-sampling probabilities by default)."""
    x = logits.astype(np.float64)
    logp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    n = min(n, len(x))
    top = np.argpartition(-logp, n - 1)[:n] if n > 0 else np.array([], np.int64)
    top = top[np.lexsort((top, -logp[top]))]
    return TokenProb(chosen, float(logp[chosen]), [(int(t), float(logp[t])) for t in top])


def post_sampling_probs(sampler: Sampler, logits: np.ndarray, chosen: int, n: int) -> TokenProb:
    """The chosen token and the top n of the distribution after the sampler chain (as log-probabilities, 0 ->
    -inf; the server reports their exp)."""
    ids, probs = sampler.post_sampling_probs(logits)
    with np.errstate(divide="ignore"):
        logp = np.log(probs)
    where = np.flatnonzero(ids == chosen)
    chosen_lp = float(logp[where[0]]) if len(where) else float("-inf")
    return TokenProb(chosen, chosen_lp, [(int(t), float(lp)) for t, lp in zip(ids[:n], logp[:n])])


@dataclass(slots=True)
class Slot:
    id: int
    state: SeqState
    cache: SlotCache
    phase: str = IDLE
    task: Optional[CompletionTask] = None
    last_task: Optional[tuple] = None        # (id, params) of the task before, for /slots (task_prev)
    last_used: float = 0.0
    # prompt
    prompt: list[int] = field(default_factory=list)
    n_cached: int = 0                    # prompt tokens reused from the cache
    checkpoint_at: list[int] = field(default_factory=list)
    # generation: what each token means (sampler, text, stop strings, grammar, reasoning budget) is the turn's
    turn: Optional[Turn] = None
    probs: list[TokenProb] = field(default_factory=list)
    next_token: int = -1
    t_prompt: float = 0.0
    t_gen: float = 0.0
    timings: Timings = field(default_factory=Timings)
    mtp: object = None                   # speculative.MtpSeq: the MTP head's memory of this slot (--spec-type)
    synth: object = None                 # this request's synthetic acceptance (spec.synth_acceptor), or None
    marks: StartMarks = field(default_factory=StartMarks)   # where the time to its first token went (-v)

    @property
    def busy(self) -> bool:
        return self.phase != IDLE

    # the turn's state, as the scheduler and /slots read it (an idle slot: its last turn's)
    @property
    def sampler(self) -> Optional[Sampler]:
        return self.turn.sampler if self.turn else None

    @property
    def grammar(self):
        return self.turn.grammar if self.turn else None

    @property
    def forced(self) -> list[int]:
        return self.turn.forced if self.turn else []

    @property
    def generated(self) -> list[int]:
        return self.turn.generated if self.turn else []

    @property
    def text(self) -> str:
        return self.turn.text if self.turn else ""

    @property
    def stop_type(self) -> str:
        return self.turn.stop_type if self.turn else "none"

    @stop_type.setter
    def stop_type(self, value: str) -> None:
        self.turn.stop_type = value

    @property
    def stopping_word(self) -> str:
        return self.turn.stopping_word if self.turn else ""

    @property
    def truncated(self) -> bool:
        return self.turn.truncated if self.turn else False

    # -- prompt ---------------------------------------------------------------------------------------------
    def begin(self, task: CompletionTask, sampler: Sampler, decoder, checkpoint_at: list[int],
              grammar=None) -> None:
        """Start serving `task`; the cache has already been moved to the resume point (state.n_past)."""
        p = task.params
        self.task = task
        self.turn = Turn(sampler, decoder, sampler.eog_ids, p.stop, p.n_predict, grammar, p.stop_window,
                         p.reasoning_budget, tuple(p.reasoning_end), p.forced_spend_n_predict)
        self.prompt = task.prompt
        self.n_cached = self.state.n_past
        self.checkpoint_at = sorted(p for p in checkpoint_at if self.n_cached < p <= len(self.prompt))
        self.probs, self.next_token = [], -1
        self.timings = Timings(cache_n=self.n_cached)
        self.t_prompt = time.perf_counter()
        self.marks = StartMarks(task.t_queued or self.t_prompt, self.t_prompt)
        if p.sampler is None:           # (a caller's own sampler has seen the prompt already)
            for t in self.prompt:       # the penalty window sees the prompt too, as in llama.cpp
                if t >= 0:              # (image rows, negative placeholder ids, are not tokens)
                    sampler.accept(t)
        self.state.rope_shift = self._rope_shift_at(self.state.n_past)
        self.phase = PREFILL

    def _rope_shift_at(self, pos: int) -> int:
        """Rotary position minus cache row at prompt position `pos`: each image before it takes nx*ny rows but
        max(nx, ny) positions (vision/prompt.py). Set on every begin, since a resumed or reused state may hold
        another prompt's value."""
        shift = 0
        for start, img in self.task.images.items():
            if start + img.n_tokens <= pos:
                shift += max(img.nx, img.ny) - img.n_tokens
            elif start < pos:
                raise ValueError(f"prompt resumed at {pos}, inside the image at {start}")
        return shift

    def next_chunk(self, n_ubatch: int) -> list[int]:
        """Prompt tokens for this step: up to n_ubatch, cut at the next planned checkpoint."""
        start = self.state.n_past
        img = self.task.images.get(start) if self.task.images else None
        if img is not None:             # an image is one chunk of its own, whole
            return self.prompt[start:start + img.n_tokens]
        end = min(start + n_ubatch, len(self.prompt))
        for p in self.checkpoint_at:
            if start < p < end:
                end = p
                break
        for p in self.task.images:      # text stops where the next image starts
            if start < p < end:
                end = p
        return self.prompt[start:end]

    def prefill(self, decoder, chunk: list[int], spec=None):
        """Run one chunk from next_chunk: text through the decoder (and the MTP head: `spec`, a Speculator), an
        image's rows through vision/prompt.py (the head does not see images: its memory starts over after one).
        -> the backend's logits of the chunk's last row."""
        img = self.task.images.get(self.state.n_past) if self.task.images else None
        if img is not None:
            from ..vision.prompt import eval_image
            return eval_image(decoder.model, self.state, img)
        if spec is not None:
            return spec.prefill(self.state, self.mtp, chunk, defer=True)     # (its head's part: prompt_end)
        return decoder.prefill(self.state, chunk)

    def prompt_done(self) -> bool:
        return self.state.n_past >= len(self.prompt)

    def finish_prompt_timing(self) -> None:
        self.timings.prompt_n = len(self.prompt) - self.n_cached
        self.timings.prompt_ms = (time.perf_counter() - self.t_prompt) * 1e3
        self.t_gen = time.perf_counter()
        self.phase = GENERATE

    # -- tokens ---------------------------------------------------------------------------------------------
    def draw(self, logits: np.ndarray) -> int:
        """The next token from host logits: a forced one (reasoning budget spent), else the sampler's choice."""
        return self.turn.draw(logits)

    def accept(self, tok: int, logits: np.ndarray, n_ctx: int) -> str:
        """Record a drawn token; returns the text that may be sent now (stop strings held back/cut)."""
        p = self.task.params
        if p.n_probs > 0 and p.post_sampling_probs:       # the chain as it was for this draw: before accept
            self.probs.append(post_sampling_probs(self.turn.sampler, np.asarray(logits, np.float32), tok, p.n_probs))
        elif p.n_probs > 0:
            self.probs.append(token_probs(np.asarray(logits, np.float32), tok, p.n_probs))
        send = self.turn.accept(tok, full=self.state.n_past + 1 >= n_ctx)
        if not self.turn.stopped and p.t_max_predict_ms > 0 and "\n" in send and \
                (time.perf_counter() - self.t_gen) * 1e3 > p.t_max_predict_ms:
            self.turn.stop_type = LIMIT
        self.timings.predicted_n = len(self.generated)
        self.timings.predicted_ms = (time.perf_counter() - self.t_gen) * 1e3
        return send

    @property
    def stopped(self) -> bool:
        return self.turn.stopped

    def tokens_left(self) -> int:
        """The most tokens this request can still generate: its n_predict and its context's room (an EOS or a stop
        string may end it sooner)."""
        room = self.state.n_ctx - self.state.n_past
        n = self.turn.n_predict
        return room if n < 0 else min(room, n - self.turn.n_spent)

    # -- results --------------------------------------------------------------------------------------------
    def partial(self, text: str, tok: int) -> PartialResult:
        t = self.task
        probs = self.probs[-1:] if t.params.n_probs > 0 else []
        timings = self.timings if t.params.timings_per_token else None
        return PartialResult(t.id, t.index, self.id, text, [tok], probs, len(self.generated), len(self.prompt),
                             timings)

    def progress(self) -> PartialResult:
        """A prompt_progress update; with timings_per_token it carries the prompt's timings so far, as
        llama-server 0c1e570's (0 ms before the first batch is evaluated)."""
        t = self.task
        elapsed = (time.perf_counter() - self.t_prompt) * 1e3
        info = {"total": len(self.prompt), "cache": self.n_cached, "processed": self.state.n_past,
                "time_ms": elapsed}
        n = self.state.n_past - self.n_cached
        timings = Timings(cache_n=self.n_cached, prompt_n=n, prompt_ms=elapsed if n > 0 else 0.0) \
            if t.params.timings_per_token else None
        return PartialResult(t.id, t.index, self.id, "", [], [], 0, len(self.prompt), timings, info)

    def final(self) -> FinalResult:
        t = self.task
        u = self.turn
        return FinalResult(t.id, t.index, self.id, u.text, list(u.generated), list(self.probs), u.stop_type,
                           u.stopping_word, len(self.prompt), self.n_cached, len(u.generated), u.truncated,
                           self.timings, list(self.prompt))

    def release(self) -> None:
        """The turn stays readable (/slots shows the last reply) until the next begin()."""
        if self.task is not None:
            self.last_task = (self.task.id, self.task.params)
        self.phase, self.task = IDLE, None
        self.last_used = time.monotonic()
