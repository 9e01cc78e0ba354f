"""A single-sequence generator: prefill in micro-batches, then decode token by token, streaming text.

The CLIs (completion, chat, perplexity) drive one `Session`; what each drawn token means is engine/turn.py's Turn,
the same rules the server's slots follow (the scheduler, for many sequences at once, is engine/scheduler.py).
Timing counters follow llama.cpp's perf data: batches of more than one token count as prompt eval, single-token
decodes as eval, so the llama_perf_context_print lines mean the same thing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..sampling import Sampler
from .decode import Decoder, LogitsRow, draw_tokens
from .prompt_cache import SlotCache, rewind
from .tasks import DraftStats
from .turn import Turn


def now_ms() -> float:
    return time.perf_counter() * 1e3


@dataclass(slots=True)
class Timings:
    t_start_ms: float = field(default_factory=now_ms)
    t_load_ms: float = 0.0
    t_p_eval_ms: float = 0.0
    n_p_eval: int = 0
    t_eval_ms: float = 0.0
    n_eval: int = 0
    t_sample_ms: float = 0.0
    n_sample: int = 0
    draft: DraftStats = field(default_factory=DraftStats)    # speculative decoding (the MTP loop counts)

    @property
    def prompt_per_second(self) -> float:
        return 1e3 * self.n_p_eval / self.t_p_eval_ms if self.t_p_eval_ms > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1e3 * self.n_eval / self.t_eval_ms if self.t_eval_ms > 0 else 0.0

    def since(self, earlier: "Timings") -> "Timings":
        """Counters accumulated after `earlier` (a copy taken with snapshot()): one turn's figures."""
        return Timings(earlier.t_start_ms, self.t_load_ms, self.t_p_eval_ms - earlier.t_p_eval_ms,
                       self.n_p_eval - earlier.n_p_eval, self.t_eval_ms - earlier.t_eval_ms,
                       self.n_eval - earlier.n_eval, self.t_sample_ms - earlier.t_sample_ms,
                       self.n_sample - earlier.n_sample, self.draft.since(earlier.draft))

    def snapshot(self) -> "Timings":
        return Timings(self.t_start_ms, self.t_load_ms, self.t_p_eval_ms, self.n_p_eval, self.t_eval_ms,
                       self.n_eval, self.t_sample_ms, self.n_sample, self.draft.copy())


class ContextFull(Exception):
    """The sequence would pass n_ctx (llama.cpp has no context shift for recurrent memory either)."""


@dataclass(slots=True)
class Generation:
    text: str
    tokens: list[int]
    stop: str                    # "eog" | "limit" | "stop" | "interrupted" | "context"
    stop_string: str = ""


class Session:
    """One sequence: its model state, the tokens logically in it, and which of those are decoded yet.

    A sampled token joins `history` at once but is decoded lazily with the next feed, exactly when its logits
    are needed; so a generation that ends on the token limit leaves a consistent, resumable session.
    Recurrent state cannot be rolled back: like a server slot, the session keeps checkpoints (prompt_cache.py) at
    the positions the caller names (a chat's reply start), and a prompt that diverges inside the decoded part
    resumes from the last one before the divergence.
    """

    @classmethod
    def from_plan(cls, lm, run) -> "Session":
        """The one sequence of a run_plan.RunPlan (context, batch sizes, -ctk / -ctv)."""
        return cls(lm, run.n_ctx, run.n_batch, run.n_ubatch, run.k_type, run.v_type)

    def __init__(self, lm, n_ctx: int, n_batch: int = 2048, n_ubatch: int = 512, kv_type: str = "f16",
                 v_type: str | None = None, max_checkpoints: int = 2):
        self.lm = lm
        self.n_ctx = n_ctx
        # a layer split takes whole -b batches and pipelines their -ub pieces over its devices (models/split.py)
        self.chunk = max(1, n_batch if lm.model.splits_batches else min(n_batch, n_ubatch))
        self.kv_type, self.v_type = kv_type, v_type or kv_type
        self.timings = Timings()
        self.history: list[int] = []
        self.state = lm.backend.new_state(lm.cfg, n_ctx, self.kv_type, self.v_type)
        self.decoder = Decoder(lm, max_graphs=1)
        # the last decoded token's logits: a LogitsRow (on the device on CUDA) or a host array
        self.logits: np.ndarray | LogitsRow | None = None
        self.cache = SlotCache(max_checkpoints)     # checkpoints of the decoded history (its tokens: set on use)
        self._ops = None

    @property
    def n_decoded(self) -> int:
        return self.state.n_past

    def reset(self) -> None:
        self.history = []
        self.cache.clear()
        self.decoder.forget(self.state)
        # drop the old caches before making the new ones: the memory plan counts one context (two at -c 262144
        # would not fit a 16 GiB card), and the arena hands the freed blocks straight back
        self.state = self.logits = None
        self.state = self.lm.backend.new_state(self.lm.cfg, self.n_ctx, self.kv_type, self.v_type)

    @property
    def ops(self):
        """The backend's state copies (checkpoints), made on first use."""
        if self._ops is None:
            self._ops = self.lm.backend.state_ops()
        return self._ops

    def feed(self, tokens: list[int], all_logits: bool = False,
             checkpoint_at: tuple[int, ...] = ()) -> np.ndarray | LogitsRow:
        """Append tokens and decode everything pending; returns the last row of logits ([n_vocab], a LogitsRow:
        np.asarray copies it to the host), or all rows of the pending span as a host array when all_logits.
        checkpoint_at: positions (tokens decoded) to keep a checkpoint at; chunks are cut there."""
        self.history.extend(int(t) for t in tokens)
        pending = self.history[self.n_decoded:]
        if not pending:
            raise ValueError("feed() needs at least one token to decode")
        if len(self.history) > self.n_ctx:
            raise ContextFull(f"context full ({len(self.history)} tokens > n_ctx {self.n_ctx})")
        be = self.lm.backend
        if all_logits:
            out = np.concatenate([be.to_host(self._decode(pending[s:s + self.chunk], True))
                                  for s in range(0, len(pending), self.chunk)])
            self.logits = out[-1]
            return out
        start, base = 0, self.n_decoded
        cuts = sorted(p - base for p in checkpoint_at if base < p < base + len(pending))
        while start < len(pending):
            end = min([start + self.chunk, len(pending)] + [c for c in cuts if c > start])
            logits = self._decode(pending[start:end], False)
            if base + end in checkpoint_at:
                self._checkpoint()
            start = end
        self.logits = LogitsRow(be, logits, int(logits.shape[0]) - 1)
        return self.logits

    def _checkpoint(self) -> None:
        try:
            self.cache.add_checkpoint(self.ops.snapshot(self.state, None))
        except MemoryError:        # no device room for a copy: the next divergence re-evaluates from the start
            pass

    def _decode(self, tokens: list[int], all_logits: bool):
        """-> the backend's logits tensor; a single token goes through the decode path (a CUDA graph)."""
        t0 = now_ms()
        if len(tokens) == 1 and not all_logits:
            logits = self.decoder.decode([self.state], tokens)      # advances state.n_past
        else:
            logits = self.decoder.prefill(self.state, tokens, all_logits)
        self.decoder.sync()                                          # so that the timings hold the device work
        dt = now_ms() - t0
        if len(tokens) > 1:
            self.timings.t_p_eval_ms += dt
            self.timings.n_p_eval += len(tokens)
        else:
            self.timings.t_eval_ms += dt
            self.timings.n_eval += 1
        return logits

    def sync_prompt(self, tokens: list[int], checkpoint_at: tuple[int, ...] = ()) -> np.ndarray | LogitsRow:
        """Make the session hold exactly `tokens`, reusing the decoded prefix when possible: the live state when
        the tokens extend it, else the last checkpoint inside the common prefix (the server's prompt-cache rule,
        prompt_cache.py), else a fresh state. checkpoint_at: see feed()."""
        self.cache.tokens = self.history[:self.n_decoded]
        point = self.cache.plan(tokens)
        if point.pos == 0:
            self.reset()
        else:
            rewind(self.ops, self.state, self.cache, point)
            self.history = list(tokens[:point.pos])
        return self.feed(tokens[point.pos:], checkpoint_at=checkpoint_at)

    def sample(self, sampler: Sampler) -> int:
        """Draw from the current logits: on the backend when they are still there (only the id crosses), else
        (a grammar-masked host copy) with the host sampler. The caller's Turn accepts the token."""
        t0 = now_ms()
        x = self.logits
        if isinstance(x, LogitsRow):
            samplers: list = [None] * int(x.logits.shape[0])
            samplers[x.row] = sampler
            token = draw_tokens(self.lm.backend, x.logits, samplers)[x.row]
        else:
            token = sampler.sample(x)
        self.timings.t_sample_ms += now_ms() - t0
        self.timings.n_sample += 1
        return token

    def generate(self, sampler: Sampler, n_predict: int, stop_strings: tuple[str, ...] = (),
                 on_text: Callable[[str], None] | None = None, special: bool = False,
                 should_stop: Callable[[], bool] = lambda: False, stop_window: int = 2,
                 on_token: Callable[[int], None] | None = None, grammar=None, reasoning_budget: int = -1,
                 reasoning_end: tuple[int, ...] = ()) -> Generation:
        """Sample up to n_predict tokens (-1: until EOG or the context is full) from the current logits, each
        through an engine.turn.Turn (the rules the server's slots follow too). Text streams to on_text as soon as
        it is whole UTF-8 (on_token sees each id first); stop strings are looked for at the end of the generated
        text (widened by stop_window chars, as llama-completion does for reverse prompts).
        `grammar`: an engine.grammar.SlotGrammar masking each draw; its completion ends the generation.
        reasoning_budget: tokens of thought (the prompt ends inside <think>) before `reasoning_end` is forced."""
        turn = Turn(sampler, self.lm.tokenizer.stream_decoder(special), self.lm.tokenizer.eog_ids, stop_strings,
                    n_predict, grammar, stop_window, reasoning_budget, reasoning_end,
                    forced_spend_n_predict=False)
        while not turn.stopped and (n_predict < 0 or turn.n_spent < n_predict):
            if should_stop():
                return Generation(turn.text + turn.flush(), turn.generated, "interrupted")
            if self.n_decoded < len(self.history):     # the last sampled (or injected) tokens
                try:
                    self.feed([])
                except ContextFull:
                    del self.history[self.n_decoded:]
                    return Generation(turn.text, turn.generated, "context")
            if grammar is not None:   # disallowed tokens -> -inf before the chain (this row comes to the host)
                self.logits = turn.mask(np.asarray(self.logits, np.float32))
            token = turn.take_forced() if turn.forced else self.sample(sampler)
            self.history.append(token)
            if on_token:
                on_token(token)
            piece = turn.accept(token)
            if piece and on_text:
                on_text(piece)
        if turn.stop_type == "eos":
            if turn.eog_token:
                self.history.pop()                 # llama.cpp never decodes the EOG token either
            return Generation(turn.text, turn.generated, "eog")
        if turn.stop_type == "word":
            return Generation(turn.text, turn.generated, "stop", turn.stopping_word)
        return Generation(turn.text + turn.flush(), turn.generated, "limit")
