"""Constrained sampling (grammar, json_schema, response_format) through llguidance token masks.

The grammar is compiled once at the edge (a bad grammar is the client's 400, not an engine error); each slot
then runs its own LLMatcher: before a draw the matcher's bitmask sets disallowed logits to -inf, after it the
token is consumed. llguidance is optional: without it, constrained requests are refused with a clear message.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import numpy as np


class GrammarError(ValueError):
    """The grammar or schema is invalid, or llguidance is not installed."""


@dataclass(frozen=True, slots=True)
class Grammar:
    """A compiled llguidance grammar (its JSON text); `after_think`: constrain only after </think>."""
    compiled: str
    after_think: bool = False


class _VocabForLlg:
    """The object llguidance's TokenizerWrapper reads: token bytes (control tokens marked with 0xff, as its
    llama.cpp adapter does), eos/bos ids and an encode function."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [self._bytes(i) for i in range(tokenizer.n_vocab)]
        self.special_token_ids = [i for i in range(tokenizer.n_vocab) if self._hidden(i)]

    def _hidden(self, i: int) -> bool:
        """llama.cpp's adapter marks a token as special when its plain piece is empty (CONTROL, UNKNOWN); a
        USER_DEFINED token such as Qwen's <tool_call> is text, which the tokenizer also produces from text."""
        return self._tok.is_special(i) and not self._tok.token_to_piece(i, False)

    def _bytes(self, i: int) -> bytes:
        b = self._tok.token_to_piece(i, True)
        return b"\xff" + b if self._hidden(i) and b.startswith(b"<") and b.endswith(b">") else b

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, parse_special=False)


class GrammarCompiler:
    """One per model: builds llguidance's tokenizer view once, compiles request grammars."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._ll = None

    def _lltokenizer(self):
        if self._ll is None:
            try:
                import llguidance
            except ImportError:
                raise GrammarError("grammar, json_schema and response_format need the 'llguidance' package "
                                   "(pip install llguidance)") from None
            self._ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_VocabForLlg(self._tokenizer)))
        return self._ll

    def compile(self, grammar: str = "", json_schema: Optional[dict] = None, after_think: bool = False,
                syntax: str = "gbnf") -> Grammar:
        """grammar: text in `syntax`, "gbnf" (the API's) or "lark" (llguidance's, for grammars of our own)."""
        self._lltokenizer()
        import llguidance
        try:
            if json_schema is not None:
                # compact JSON unless the schema's x-guidance says otherwise: with free whitespace a small or
                # unsure model can spend its whole budget on blanks and end with truncated JSON
                text = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(json_schema),
                                                                     defaults={"whitespace_flexible": False})
            else:
                text = llguidance.grammar_from(syntax, grammar)
        except (ValueError, RuntimeError) as e:
            raise GrammarError(f"failed to parse grammar: {e}") from None
        message = llguidance.LLMatcher.validate_grammar(text, self._ll)   # "" when valid
        if message:
            raise GrammarError(f"failed to parse grammar: {message}")
        return Grammar(text, after_think)

    def matcher(self, g: Grammar) -> "SlotGrammar":
        import llguidance
        return SlotGrammar(llguidance.LLMatcher(self._lltokenizer(), g.compiled), g.after_think,
                           self._tokenizer.n_vocab)


class SlotGrammar:
    """One request's matcher and its bitmask buffer."""

    def __init__(self, matcher, after_think: bool, n_vocab: int):
        self.m = matcher
        self.active = not after_think
        self.mask = np.full((1, (n_vocab + 31) // 32), -1, np.int32)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A masked copy of logits [n_vocab]."""
        if not self.active:
            return logits
        from llguidance.numpy import fill_next_token_bitmask
        fill_next_token_bitmask(self.m, self.mask)
        # bit i of the little-endian int32 words = token i allowed (unpackbits is ~10x faster than llguidance's
        # numpy helper on a 248k vocabulary)
        allowed = np.unpackbits(self.mask.view(np.uint8), bitorder="little")[:len(logits)].astype(bool)
        return np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32, copy=False)

    def accept(self, tok: int, text_so_far: str) -> bool:
        """Consume the token; returns False when the grammar is finished (or broke) and generation must stop."""
        if not self.active:
            self.active = "</think>" in text_so_far
            return True
        self.m.consume_token(tok)
        return not (self.m.is_stopped() or self.m.is_error())
