"""DRY ("don't repeat yourself"), llama.cpp's repetition sampler (src/llama-sampler.cpp, b8462; from koboldcpp):
a token that would extend a sequence already seen in the recent context loses
`multiplier * base ** (length - allowed_length)` of its logit, `length` the longest such sequence it would extend.

Sequence breakers (strings, e.g. "\\n") bound how far back a repetition may reach: the most recent occurrence of a
breaker's tokens in the context limits the length. A breaker string becomes token sequences once per vocabulary
(`breakers`, cached): every token whose text contains it is a one-token breaker; a token whose text ends with a prefix
of it is the head of the breaker whose tail is the rest of the string, tokenized (at most MAX_TAIL tokens).

The lengths are what llama.cpp's Z-algorithm computes, min(z_k, rep_limit) for each offset k in the window, found
here with numpy: candidates for k are filtered one matched token at a time, so each round is one vectorised compare.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

MAX_CHARS = 40       # a longer breaker string is cut to its first 40 bytes (llama.cpp: MAX_CHAR_LEN)
MAX_TAIL = 20        # a breaker's tail keeps its first 20 tokens (MAX_SEQ_LEN)
FLOAT_MAX_LOG = 88.7228391   # log(FLT_MAX): the exponent is clamped so that base ** exponent stays finite


@dataclass(frozen=True)
class DryBreakers:
    """head token -> the tails (token tuples, () for a one-token breaker) of the breakers that begin with it."""
    tails: dict

    def single(self, token: int) -> bool:
        """Whether `token` alone is a breaker (never penalised: it ends repetitions)."""
        return () in self.tails.get(token, ())


@lru_cache(maxsize=16)
def breakers(tokenizer, strings: tuple[str, ...]) -> DryBreakers:
    """The token sequences of the breaker strings for this vocabulary (llama.cpp's get_overlapping_token_sequences,
    run once per vocabulary and breaker list: the scan reads every token's text)."""
    pieces = [tokenizer.token_to_piece(t, special=True) for t in range(tokenizer.n_vocab)]
    tails: dict[int, list[tuple[int, ...]]] = {}
    for s in strings:
        b = s.encode("utf-8")[:MAX_CHARS]
        if b:      # llama.cpp skips an empty breaker with a warning; the parsers refuse one before it gets here
            _add_breaker(tokenizer, pieces, b, tails)
    return DryBreakers({t: tuple(v) for t, v in tails.items()})


def _add_breaker(tokenizer, pieces: list[bytes], s: bytes, tails: dict) -> None:
    for tok, word in enumerate(pieces):
        if s in word:
            _add_tail(tails, tok, ())
            continue
        pos = word.find(s[:1])
        while pos >= 0:
            n = len(word) - pos                       # the word's end from pos is a prefix of s (n < len(s))
            if word[pos:] == s[:n]:
                tail = _tokenize_tail(tokenizer, s[n:])
                if tail is not None:
                    _add_tail(tails, tok, tail[:MAX_TAIL])
            pos = word.find(s[:1], pos + 1)


def _tokenize_tail(tokenizer, rest: bytes):
    # A tail cut inside a UTF-8 character (a multi-byte breaker) has no text to tokenize; llama.cpp tokenizes the
    # stray bytes, which no generated text can match either, so the tail is dropped.
    try:
        return tuple(tokenizer.encode(rest.decode("utf-8"), parse_special=False, add_special=False))
    except UnicodeDecodeError:
        return None


def _add_tail(tails: dict, tok: int, tail: tuple) -> None:
    seen = tails.setdefault(tok, [])
    if tail not in seen:
        seen.append(tail)


def penalties(history: Sequence[int], multiplier: float, base: float, allowed_length: int, last_n: int,
              n_ctx_train: int, brk: DryBreakers) -> dict[int, float]:
    """token -> the logit penalty DRY gives it after `history` (every token accepted so far, prompt included).
    last_n: the window (-1: n_ctx_train, as llama_sampler_init_dry). Empty where DRY changes nothing."""
    if multiplier == 0.0 or base < 1.0 or last_n == 0:
        return {}
    window = n_ctx_train if last_n == -1 else max(last_n, 0)
    n = min(len(history), window, n_ctx_train)
    if n <= allowed_length:
        return {}
    rev = np.asarray(history[len(history) - n:], dtype=np.int64)[::-1]      # rev[i]: i tokens back from the last
    limit = _rep_limit(rev, brk)
    if limit < allowed_length:
        return {}
    longest: dict[int, int] = {}
    for k, length in _repeats(rev, limit, allowed_length):
        tok = int(rev[k - 1])             # the token that followed the earlier occurrence would extend the repeat
        if longest.get(tok, -1) < length:
            longest[tok] = length
    max_exp = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out = {}
    for tok, length in longest.items():
        if brk.single(tok):
            continue
        e = length - allowed_length
        if max_exp > 0 and e > max_exp:
            e = max_exp
        # float multiplier * std::pow(float base, int e), which C++ computes in double, stored as a float
        out[tok] = float(np.float32(float(np.float32(multiplier)) * float(np.float32(base)) ** e))
    return out


def _rep_limit(rev: np.ndarray, brk: DryBreakers) -> int:
    """How far back a repeat may reach: the offset of the most recent breaker (its whole token sequence present),
    less its tail's length; len(rev) when there is none."""
    if not brk.tails:
        return len(rev)
    heads = np.flatnonzero(np.isin(rev, np.fromiter(brk.tails, dtype=np.int64)))
    for i in heads:
        longest = -1
        for tail in brk.tails[int(rev[i])]:
            m = len(tail)
            if longest < m <= i and all(tail[o] == rev[i - o - 1] for o in range(m)):
                longest = m
        if longest >= 0:
            return int(i) - longest
    return len(rev)


def _repeats(rev: np.ndarray, limit: int, allowed_length: int) -> list[tuple[int, int]]:
    """(k, min(z_k, limit)) for each offset 1 <= k < len(rev) whose length is at least allowed_length: z_k is how
    many tokens rev[0..] and rev[k..] share (the context's end seen again k tokens earlier), within the window.
    Offsets are dropped as they stop matching, so each round compares only the survivors."""
    n = len(rev)
    z = np.zeros(n, dtype=np.int64)
    alive = np.arange(1, n, dtype=np.int64)
    length = 0
    while alive.size and length < limit:
        alive = alive[alive + length < n]
        alive = alive[rev[alive + length] == rev[length]]
        length += 1
        z[alive] = length
    keep = np.flatnonzero(z[1:] >= allowed_length) + 1
    return [(int(k), int(z[k])) for k in keep]
