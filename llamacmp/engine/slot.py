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
from ..sampling import Sampler, SamplingParams
from .prompt_cache import SlotCache
from .stops import find_stop, partial_stop_len
from .tasks import CompletionTask, FinalResult, PartialResult, Timings, TokenProb

IDLE, PREFILL, GENERATE = "idle", "prefill", "generate"


def fast_greedy(p: SamplingParams, logits: np.ndarray) -> Optional[int]:
    """The sampler chain's answer at temp <= 0 without running it (no penalties: the chain only ever drops
    tokens below the best one, so the draw is the argmax, lowest id among ties, of the biased logits)."""
    if p.temp > 0 or p.penalty_repeat != 1.0 or p.penalty_freq != 0.0 or p.penalty_present != 0.0 or p.ignore_eos:
        return None
    if not p.logit_bias:
        return int(np.argmax(logits))
    x = np.asarray(logits, np.float64).copy()
    for tok, bias in p.logit_bias.items():
        if 0 <= tok < x.shape[0]:
            x[tok] += bias
    return int(np.argmax(x))


def token_probs(logits: np.ndarray, chosen: int, n: int) -> TokenProb:
    """log-softmax over the raw logits (llama.cpp reports pre-sampling probabilities by default)."""
    x = logits.astype(np.float64)
    logp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    n = min(n, len(x))
    top = np.argpartition(-logp, n - 1)[:n] if n > 0 else np.array([], np.int64)
    top = top[np.lexsort((top, -logp[top]))]
    return TokenProb(chosen, float(logp[chosen]), [(int(t), float(logp[t])) for t in top])


@dataclass(slots=True)
class Slot:
    id: int
    state: SeqState
    cache: SlotCache
    phase: str = IDLE
    task: Optional[CompletionTask] = None
    last_used: float = 0.0
    # prompt
    prompt: list[int] = field(default_factory=list)
    n_cached: int = 0                    # prompt tokens reused from the cache
    checkpoint_at: list[int] = field(default_factory=list)
    # generation
    sampler: Optional[Sampler] = None
    decoder: object = None
    generated: list[int] = field(default_factory=list)
    probs: list[TokenProb] = field(default_factory=list)
    text: str = ""
    n_sent: int = 0                      # characters of `text` already sent
    next_token: int = -1
    stop_type: str = "none"
    stopping_word: str = ""
    truncated: bool = False
    t_prompt: float = 0.0
    t_gen: float = 0.0
    timings: Timings = field(default_factory=Timings)
    # reasoning budget
    in_reasoning: bool = False
    reasoning_left: int = -1
    forced: list[int] = field(default_factory=list)
    grammar: object = None               # grammar.SlotGrammar while a constrained request runs

    @property
    def busy(self) -> bool:
        return self.phase != IDLE

    # -- prompt ---------------------------------------------------------------------------------------------
    def begin(self, task: CompletionTask, sampler: Sampler, decoder, checkpoint_at: list[int],
              grammar=None) -> None:
        """Start serving `task`; the cache has already been moved to the resume point (state.n_past)."""
        self.task, self.sampler, self.decoder, self.grammar = task, sampler, decoder, grammar
        self.prompt = task.prompt
        self.n_cached = self.state.n_past
        self.checkpoint_at = sorted(p for p in checkpoint_at if self.n_cached < p <= len(self.prompt))
        self.generated, self.probs, self.text, self.n_sent = [], [], "", 0
        self.next_token, self.stop_type, self.stopping_word, self.truncated = -1, "none", "", False
        self.timings = Timings(cache_n=self.n_cached)
        budget = task.params.reasoning_budget
        self.in_reasoning, self.reasoning_left = budget >= 0, budget
        self.forced = list(task.params.reasoning_end) if budget == 0 else []
        self.t_prompt = time.perf_counter()
        for t in self.prompt:           # the penalty window sees the prompt too, as in llama.cpp
            if t >= 0:                  # (image rows, negative placeholder ids, are not tokens)
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

    def prefill(self, decoder, chunk: list[int]):
        """Run one chunk from next_chunk: text through the decoder, an image's rows through vision/prompt.py.
        -> the backend's logits of the chunk's last row."""
        img = self.task.images.get(self.state.n_past) if self.task.images else None
        if img is not None:
            from ..vision.prompt import eval_image
            return eval_image(decoder.model, self.state, img)
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
        """The next token: a forced one (reasoning budget spent), else the sampler's choice."""
        if self.forced:
            return self.forced.pop(0)
        if self.grammar is not None:
            logits = self.grammar.apply(logits)
        tok = fast_greedy(self.sampler.params, logits)
        return self.sampler.sample(logits) if tok is None else tok

    def _track_reasoning(self) -> None:
        if not self.in_reasoning:
            return
        if "</think>" in self.text:
            self.in_reasoning = False
            return
        self.reasoning_left -= 1
        if self.reasoning_left <= 0 and not self.forced:
            self.forced = list(self.task.params.reasoning_end)
            self.in_reasoning = False

    def accept(self, tok: int, logits: np.ndarray, is_eog: bool, n_ctx: int) -> str:
        """Record a sampled token; returns the text that may be sent now (stop strings held back/cut)."""
        p = self.task.params
        self.sampler.accept(tok)
        self.generated.append(tok)
        if p.n_probs > 0:
            self.probs.append(token_probs(np.asarray(logits, np.float32), tok, p.n_probs))
        self.text += self.decoder.push(tok)
        self._track_reasoning()
        if self.grammar is not None and not self.grammar.accept(tok, self.text):
            is_eog = True                # the grammar is complete: nothing more may follow
        send = self._text_to_send(is_eog)
        self._check_limits(is_eog, n_ctx, send)
        self.timings.predicted_n = len(self.generated)
        self.timings.predicted_ms = (time.perf_counter() - self.t_gen) * 1e3
        return send

    def _text_to_send(self, is_eog: bool) -> str:
        stops = self.task.params.stop
        i, word = find_stop(self.text, stops, self.n_sent)
        if i >= 0:
            self.text = self.text[:i]
            self.stop_type, self.stopping_word = "word", word
        elif not is_eog and partial_stop_len(self.text, stops) > 0:
            return ""
        send = self.text[self.n_sent:]
        self.n_sent = len(self.text)
        return send

    def _check_limits(self, is_eog: bool, n_ctx: int, send: str) -> None:
        p = self.task.params
        if self.stop_type != "none":
            return
        if self.state.n_past + 1 >= n_ctx:
            self.stop_type, self.truncated = "limit", True
        elif p.n_predict >= 0 and len(self.generated) >= p.n_predict:
            self.stop_type = "limit"
        elif p.t_max_predict_ms > 0 and "\n" in send and \
                (time.perf_counter() - self.t_gen) * 1e3 > p.t_max_predict_ms:
            self.stop_type = "limit"
        if is_eog:
            self.stop_type = "eos"

    @property
    def stopped(self) -> bool:
        return self.stop_type != "none"

    # -- results --------------------------------------------------------------------------------------------
    def partial(self, text: str, tok: int) -> PartialResult:
        t = self.task
        probs = self.probs[-1:] if t.params.n_probs > 0 else []
        timings = self.timings if t.params.timings_per_token else None
        return PartialResult(t.id, t.index, self.id, text, [tok], probs, len(self.generated), len(self.prompt),
                             timings)

    def progress(self) -> PartialResult:
        t = self.task
        info = {"total": len(self.prompt), "cache": self.n_cached, "processed": self.state.n_past,
                "time_ms": (time.perf_counter() - self.t_prompt) * 1e3}
        return PartialResult(t.id, t.index, self.id, "", [], [], 0, len(self.prompt), None, info)

    def final(self) -> FinalResult:
        t = self.task
        return FinalResult(t.id, t.index, self.id, self.text, list(self.generated), list(self.probs),
                           self.stop_type, self.stopping_word, len(self.prompt), self.n_cached,
                           len(self.generated), self.truncated, self.timings, list(self.prompt))

    def release(self) -> None:
        self.phase, self.task, self.sampler, self.decoder, self.grammar = IDLE, None, None, None, None
        self.last_used = time.monotonic()
