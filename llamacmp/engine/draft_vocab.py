"""--spec-draft-vocab auto: which rows of the LM head the MTP draft reads, chosen from the committed tokens.

A prefix of the head (token ids < prefix) costs a fraction of the whole one per draft step (the 9B's 248K rows:
the three draft heads of a round are ~1 ms of a ~4.9 ms round on the H200; 32768 rows cut MTP on/off from
1.43-1.50x to 1.66x at a synthetic length of 2.5), and BPE ids come in merge order, roughly most frequent first, so
it holds most tokens of English and code. A committed token outside it is one the prefix could not have drafted:
with a share s of such tokens the per-position acceptance a drops to about a (1 - s) at worst (less where those
tokens are hard to draft anyway). At a = 0.6, n = 3 the tokens per round drop by ~0.9 s (s = 6%: 5.3%), against
the 9-14% of a 9B round the prefix saves on the H200 (1.43-1.50x -> 1.66x): the prefix pays up to s = 11-17%,
more on smaller models with the same 248K vocabulary (the head is a larger part of their round). Text made of
ids above the prefix (Chinese: 82% of its Qwen3.5 tokens) needs the whole head, so the window below switches to
it and back.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AutoVocab:
    """The constants of auto (a test injects a prefix the tiny fixtures' tokens cross)."""
    prefix: int = 32768         # ids drafted from while the text stays in them (93.7% of Python code's tokens)
    min_factor: int = 4         # only for vocabularies >= min_factor * prefix: below, the saving is small
    window: int = 128           # the committed tokens looked at (all sequences of the Speculator together)
    # Switch to the whole head once more than `up` of the window's tokens lie outside the prefix (12.5%: about the
    # lower end of where the prefix stops paying, see above), and back once fewer than `down` do (4.7%): the gap
    # keeps text near the edge from switching every few tokens. Held-out Python (44.6K Qwen3.5 tokens, 6.2%
    # outside, in bursts): 82% of its tokens are drafted on the prefix, 5.4% of those outside, 0.6 switches per
    # 1000 tokens; 10 / 4 (8% / 3%) left only 51% on the prefix. Chinese switches after ~20 tokens, English (2.6%
    # outside) stays. Counted, not a share, before the window fills: the first tokens decide as soon as `up`
    # outside ids are seen, rather than on the share of a handful.
    up: int = 16
    down: int = 6

    def __post_init__(self):
        if not (1 <= self.prefix and self.min_factor >= 1 and 1 <= self.down <= self.up < self.window):
            raise ValueError(f"AutoVocab: need prefix >= 1, min_factor >= 1 and 1 <= down <= up < window, got {self}")

    def applies(self, n_vocab: int) -> bool:
        """Whether auto drafts from a prefix at all on this vocabulary (else the whole head, always)."""
        return n_vocab >= self.min_factor * self.prefix


class VocabWindow:
    """The last `window` committed token ids, the count of those >= prefix, and which head drafts: "prefix"
    (the start) or "whole"."""

    def __init__(self, auto: AutoVocab):
        self.auto = auto
        self._outside: deque[bool] = deque(maxlen=auto.window)
        self.n_outside = 0
        self.head = "prefix"
        self.n_switches = 0

    def observe(self, tokens) -> None:
        """Committed tokens, in order; moves self.head across the thresholds."""
        a, w = self.auto, self._outside
        for t in tokens:
            if len(w) == w.maxlen:
                self.n_outside -= w[0]
            out = int(t) >= a.prefix
            w.append(out)
            self.n_outside += out
        want = "whole" if self.n_outside > a.up else "prefix" if self.n_outside < a.down else self.head
        if want != self.head:
            self.head = want
            self.n_switches += 1
