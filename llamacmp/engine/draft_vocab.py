"""--spec-draft-vocab auto: which rows of the LM head the MTP draft reads, chosen from the committed tokens.

A prefix of the head (token ids < prefix) costs a fraction of the whole one per draft step (the 9B's 248K rows:
the three draft heads of a round are ~1 ms of a ~4.9 ms round on the H200; 32768 rows cut MTP on/off from
1.43-1.50x to 1.66x at a synthetic length of 2.5), and BPE ids come in merge order, roughly most frequent first, so
it holds most tokens of English and code. A committed token outside it is one the prefix could not have drafted:
with a share s of such tokens the draft acceptance drops by at most about s per position (a = 0.6, n = 3: s = 6%
costs ~5% of the tokens per round, against the ~15% of the round that the prefix saves). Text made of ids above
the prefix (Chinese, say) needs the whole head, so the window below switches to it and back.
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
    # Switch to the whole head once more than `up` of the window's tokens lie outside the prefix (8%: the loss is
    # about that share, still below the saving; Python code's 6.3% stays on the prefix, Chinese text leaves it
    # after ~11 tokens), and back once fewer than `down` do (3%): the gap keeps a text near the edge from
    # switching every few tokens. Counted, not a share, before the window fills: the first tokens decide as soon
    # as `up` outside ids are seen, rather than on the share of a handful.
    up: int = 10
    down: int = 4

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
