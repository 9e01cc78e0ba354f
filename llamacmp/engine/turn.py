"""One generation: what each drawn token means -- the sampler's history, the streamed text, stop strings, the
grammar, the reasoning budget, end of generation and the n_predict limit.

Every generation is a slot of the scheduler (the server's requests, and the CLIs' turns through client.py), and every
token goes through a Turn. Tools differ in two settings (GenParams), as llama.cpp's do: the server looks for stop strings
in all new text and holds back a partial one while streaming (`stop_window` None); llama-completion checks its
reverse prompts at the end of the text (the last `stop_window` + 1 characters) and prints every piece at once; and
llama-cli's -n counts sampled tokens only (`forced_spend_n_predict` False), the server's max_tokens forced ones too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..sampling import Sampler, SamplingParams
from .stops import find_stop, partial_stop_len

NONE, EOS, WORD, LIMIT = "none", "eos", "word", "limit"


def fast_greedy(p: SamplingParams, logits: np.ndarray) -> Optional[int]:
    """The sampler chain's answer at temp <= 0 without running it (no penalties: the chain only ever drops
    tokens below the best one, so the draw is the argmax, lowest id among ties, of the biased logits)."""
    if p.temp > 0 or p.penalty_repeat != 1.0 or p.penalty_freq != 0.0 or p.penalty_present != 0.0 or p.ignore_eos \
            or not p.plain:
        return None
    if not p.logit_bias:
        return int(np.argmax(logits))
    x = np.asarray(logits, np.float64).copy()
    for tok, bias in p.logit_bias.items():
        if 0 <= tok < x.shape[0]:
            x[tok] += bias
    return int(np.argmax(x))


@dataclass(slots=True)
class Turn:
    sampler: Sampler
    decoder: object                      # tokenizer.stream_decoder: ids -> whole UTF-8 pieces
    eog_ids: frozenset
    stops: Sequence[str] = ()
    n_predict: int = -1                  # -1: no limit
    grammar: object = None               # engine.grammar.SlotGrammar: masks each draw; its completion ends the turn
    stop_window: Optional[int] = None    # see the module docstring
    reasoning_budget: int = -1           # tokens inside <think> before `reasoning_end` is forced; -1 unlimited
    reasoning_end: tuple[int, ...] = ()
    forced_spend_n_predict: bool = True  # forced tokens count against n_predict (server max_tokens; llama-cli's -n
                                         # counts only sampled ones)
    generated: list[int] = field(default_factory=list)
    text: str = ""
    n_sent: int = 0                      # characters of `text` already handed out (stop_window None)
    stop_type: str = NONE                # none | eos | word | limit
    stopping_word: str = ""
    eog_token: bool = False              # the turn ended on an end-of-generation token (not a completed grammar)
    truncated: bool = False              # ended because the sequence's context is full
    in_reasoning: bool = False
    reasoning_left: int = -1
    forced: list[int] = field(default_factory=list)
    n_forced: int = 0

    def __post_init__(self) -> None:
        self.in_reasoning, self.reasoning_left = self.reasoning_budget >= 0, self.reasoning_budget
        self.forced = list(self.reasoning_end) if self.reasoning_budget == 0 else []

    @property
    def stopped(self) -> bool:
        return self.stop_type != NONE

    # -- drawing ----------------------------------------------------------------------------------------------
    def mask(self, logits: np.ndarray) -> np.ndarray:
        """float32 [N] host logits with the grammar's disallowed tokens at -inf (unchanged without a grammar)."""
        return logits if self.grammar is None else self.grammar.apply(np.asarray(logits, np.float32))

    def draw(self, logits: Optional[np.ndarray]) -> int:
        """The next token from host logits [N]: a forced one (reasoning budget spent), else the sampler's choice."""
        if self.forced:
            return self.take_forced()
        logits = self.mask(logits)
        tok = fast_greedy(self.sampler.params, logits)
        return self.sampler.sample(logits) if tok is None else tok

    def take_forced(self) -> int:
        self.n_forced += 1
        return self.forced.pop(0)

    @property
    def n_spent(self) -> int:
        """Tokens that count against n_predict."""
        return len(self.generated) - (0 if self.forced_spend_n_predict else self.n_forced)

    # -- a drawn token ----------------------------------------------------------------------------------------
    def accept(self, tok: int, full: bool = False) -> str:
        """Record a drawn token -> the text that may be handed out now. full: the sequence has no room for another
        token (the turn ends at the limit, truncated)."""
        self.sampler.accept(tok)
        self.generated.append(tok)
        piece = self.decoder.push(tok)
        self.text += piece
        self._track_reasoning()
        self.eog_token = tok in self.eog_ids and not self.sampler.params.ignore_eos
        is_eog = self.eog_token
        if self.grammar is not None and not self.grammar.accept(tok, self.text):
            is_eog = True                # the grammar is complete: nothing more may follow
        send = self._held_text(is_eog) if self.stop_window is None else self._tail_stop(piece)
        self._check_limits(is_eog, full)
        return send

    def _track_reasoning(self) -> None:
        if not self.in_reasoning:
            return
        if "</think>" in self.text:
            self.in_reasoning = False
            return
        self.reasoning_left -= 1
        if self.reasoning_left <= 0 and not self.forced:
            self.forced = list(self.reasoning_end)
            self.in_reasoning = False

    def _held_text(self, is_eog: bool) -> str:
        """Server streaming: cut the text at a stop string, hold back the start of one, hand out the rest."""
        i, word = find_stop(self.text, self.stops, self.n_sent)
        if i >= 0:
            self.text = self.text[:i]
            self.stop_type, self.stopping_word = WORD, word
        elif not is_eog and partial_stop_len(self.text, self.stops) > 0:
            return ""
        send = self.text[self.n_sent:]
        self.n_sent = len(self.text)
        return send

    def _tail_stop(self, piece: str) -> str:
        """llama-completion: a stop string ending in the last stop_window + 1 characters ends the turn; the piece
        goes out whole (the text keeps the stop string)."""
        _, word = find_stop(self.text, self.stops, len(self.text) - 1 - self.stop_window)
        if word:
            self.stop_type, self.stopping_word = WORD, word
        return piece

    def _check_limits(self, is_eog: bool, full: bool) -> None:
        if self.stop_type != NONE:
            return
        if full:
            self.stop_type, self.truncated = LIMIT, True
        elif 0 <= self.n_predict <= self.n_spent:
            self.stop_type = LIMIT
        if is_eog:
            self.stop_type = EOS

    def flush(self) -> str:
        """What the decoder still holds (an incomplete UTF-8 tail), at the end of a turn that stopped early."""
        rest = self.decoder.flush()
        self.text += rest
        return rest
