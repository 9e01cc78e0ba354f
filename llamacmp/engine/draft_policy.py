"""Whether a round drafts, and how many tokens: the MTP draft length per round (0: a plain decode step) from the
engine's own measured costs and each sequence's measured acceptance (engine/speculative.py asks before each round).

Model. A round of S sequences that each draft n tokens costs spec(S, n) seconds (n draft rounds, the verify of
S * (n + 1) rows, the host's work between) and yields sum_i E_i(n) tokens, where E(n) = 1 + a + a^2 + .. + a^n for a sequence whose next draft is accepted with
probability a once the one before it was (llama.cpp's synthetic rates have this form too). A plain step of the same
S sequences costs plain(S) and yields S tokens. The round takes the n with the most tokens per second; all
sequences draft the same n or none draft (one verify forward of S*(n+1) rows, one graph per list and n).

The costs are wall-clock seconds the engine measured itself (CostTable: an EMA per S and n, from every round that
did not capture a graph; eager rounds count, being what a shape of catch-up lengths seen once costs), so the choice
follows the card, the model and the context length rather than constants. A length not measured yet is estimated on the line through the measured ones and the
plain step as n = 0 (draft rounds and verify rows both grow linearly with n); with nothing measured for S yet, the
round explores: it drafts n_max until a spec round is measured, then steps plainly until a plain step is.

Probes. While drafting does not pay, every `gap` plain rounds one round drafts the smallest n anyway, so that the
acceptance is measured again (a prompt's later text may be easier). A probe that does not bring drafting back
doubles the gap (PROBE_MIN .. PROBE_MAX rounds); one that does resets it. The sequences' heads keep up meanwhile:
plain steps feed them the target's hidden states (Speculator.observe_plain), so a probe drafts as well as a round
in a run of drafting would. The other way round, after PROBE_MAX drafting rounds in a row one round steps plainly,
so that the plain cost is measured again too (a slow first timing must not keep drafting on for good).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

DECAY = 0.9                # per round: the acceptance counts' memory (~10 rounds)
PRIOR = (1.0, 2.0)         # (accepted, tried) before anything is seen: a = 0.5, so a new sequence drafts
EMA_DOWN, EMA_UP = 0.8, 0.1   # weight of a new timing below / above the table's: the noise of a wall-clock timing
                              # is mostly added time (another process, a collection), so a slow one moves it less
PROBE_MIN, PROBE_MAX = 8, 64


@dataclass(slots=True)
class Acceptance:
    """One sequence's recent acceptance: decayed counts of draft positions accepted and tried."""
    accepted: float = PRIOR[0]
    tried: float = PRIOR[1]

    @property
    def rate(self) -> float:
        """a: P(draft i accepted | draft i - 1 was)."""
        return self.accepted / self.tried if self.tried > 0 else 0.0

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """A verify of n_drafted drafts accepted the first n_accepted: that many positions succeeded, and one more
        was tried (the first rejection) unless all were accepted."""
        if n_drafted <= 0:
            return
        self.accepted = DECAY * self.accepted + n_accepted
        self.tried = DECAY * self.tried + min(n_accepted + 1, n_drafted)

    def expected(self, n: int) -> float:
        """E(n): tokens a round drafting n yields for this sequence, the target's own token included."""
        a = self.rate
        return sum(a ** i for i in range(n + 1))


@dataclass
class CostTable:
    """Measured seconds per round (EMA): plain[S] a plain step of S sequences, spec[(S, n)] a round of S sequences
    drafting n each."""
    plain: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)

    @staticmethod
    def _add(table: dict, key, seconds: float) -> None:
        old = table.get(key)
        w = EMA_DOWN if old is None or seconds < old else EMA_UP
        table[key] = seconds if old is None else old + w * (seconds - old)

    def add_plain(self, S: int, seconds: float) -> None:
        self._add(self.plain, S, seconds)

    def add_spec(self, S: int, n: int, seconds: float) -> None:
        self._add(self.spec, (S, n), seconds)

    def plain_cost(self, S: int) -> Optional[float]:
        return self.plain.get(S)

    def spec_cost(self, S: int, n: int) -> Optional[float]:
        """A round of S sequences drafting n: measured, else on the line through the two known points nearest n
        (this S's measured lengths, its plain step as n = 0); None when no spec round of S was measured."""
        if (S, n) in self.spec:
            return self.spec[(S, n)]
        pts = [(m, t) for (s, m), t in self.spec.items() if s == S]
        if not pts:
            return None
        if S in self.plain:
            pts.append((0, self.plain[S]))
        if len(pts) == 1:
            return pts[0][1]
        (x0, y0), (x1, y1) = sorted(sorted(pts, key=lambda p: abs(p[0] - n))[:2])
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


class DraftPolicy:
    """choose() -> the draft length of the next round; the caller reports what ran (record_*) and each
    sequence's acceptance (Acceptance.update). Counters: rounds drafted, plain, probes."""

    def __init__(self, n_max: int, n_min: int = 0, costs: Optional[CostTable] = None):
        self.n_max = n_max
        # drafts shorter than n_min are dropped (--spec-draft-n-min), so a round never asks for fewer
        self.lengths = range(min(max(1, n_min), n_max), n_max + 1)
        self.costs = costs if costs is not None else CostTable()
        self.gap, self.since, self.probing = PROBE_MIN, 0, False
        self.drafted = 0                          # drafting rounds in a row
        self.n_spec = self.n_plain = self.n_probes = 0

    def choose(self, accs: Sequence[Acceptance], others: int = 0) -> int:
        """accs: the acceptance of each sequence that may draft this round; others: sequences that step plainly
        either way (a drafting round runs their step apart, a plain one with the rest) -> n (0: a plain step)."""
        n = self._best(accs, others)
        if self.probing:                          # the round after a probe: did it bring drafting back?
            self.probing = False
            self.gap = PROBE_MIN if n else min(2 * self.gap, PROBE_MAX)
        if n == 0:
            self.since += 1
            if self.since >= self.gap:
                self.probing = True
                self.n_probes += 1
                n = self.lengths[0]
        elif self.drafted >= PROBE_MAX:
            n = 0                                 # refresh the plain cost
        if n:
            self.since = 0
            self.drafted += 1
            self.n_spec += 1
        else:
            self.drafted = 0
            self.n_plain += 1
        return n

    def _best(self, accs: Sequence[Acceptance], others: int) -> int:
        S, c = len(accs), self.costs
        if any(c.spec_cost(S, n) is None for n in self.lengths):
            return self.n_max                     # explore: measure a spec round of S sequences first
        plain, apart = c.plain_cost(S + others), c.plain_cost(others) if others else 0.0
        if plain is None or apart is None:
            return 0 if plain is None else self.n_max   # then a plain step of them (and of the others alone)
        best, rate = 0, (S + others) / plain
        for n in self.lengths:
            r = (sum(a.expected(n) for a in accs) + others) / (c.spec_cost(S, n) + apart)
            if r > rate:
                best, rate = n, r
        return best

    @property
    def share(self) -> float:
        """The fraction of rounds that drafted."""
        total = self.n_spec + self.n_plain
        return self.n_spec / total if total else 0.0
