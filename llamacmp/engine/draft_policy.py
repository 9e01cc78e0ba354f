"""Whether a round drafts, and how many tokens: the MTP draft length per round (0: a plain decode step) from the
engine's own measured costs and each sequence's measured acceptance (engine/speculative.py asks before each round).

Model. A round of S sequences that each draft n tokens costs spec(S, n) seconds (n draft rounds, the verify of
S * (n + 1) rows, the host's work between) and yields sum_i E_i(n) tokens, where E(n) = 1 + a + a^2 + .. + a^n for a sequence whose next draft is accepted with
probability a once the one before it was (llama.cpp's synthetic rates have this form too). A plain step of the same
S sequences costs plain(S) and yields S tokens. The round takes the n with the most tokens per second; all
sequences draft the same n or none draft (one verify forward of S*(n+1) rows, one graph per list and n).

The costs are wall-clock seconds the engine measured itself (CostTable: an EMA per S and n, from every round that
replayed its graphs, or ran where there are none), so the choice follows the card, the model and the context length
rather than constants. A round that captured a graph, or ran eagerly because its shape of several sequences was
new (the graphs decline a shape's first sighting, capture its second: backends/spec_graphs.py), is a one-off and
not timed: a length whose only timing was its eager round looked dearer than its replays for as long as the policy
did not run it again (2026-12-05, H100, 4 streams at L3.5: n = 3 eager 11.9 ms against 9.6 replayed, rounds kept at
n = 2). A length not measured yet is estimated on the line through the measured ones and the
plain step as n = 0 (draft rounds and verify rows both grow linearly with n); with nothing measured for S yet, the
round explores: it drafts n_max until a spec round is measured, then steps plainly until a plain step is.

Probes. While drafting does not pay, every `gap` plain rounds one round drafts the smallest n anyway, so that the
acceptance is measured again (a prompt's later text may be easier). A probe that does not bring drafting back
doubles the gap (PROBE_MIN .. PROBE_MAX rounds); one that does resets it. The sequences' heads keep up meanwhile:
plain steps feed them the target's hidden states (Speculator.observe_plain), so a probe drafts as well as a round
in a run of drafting would. The other way round, after PROBE_MAX drafting rounds in a row one round steps plainly,
so that the plain cost is measured again too (a slow first timing must not keep drafting on for good).

Several sequences. Exploring S > 1 costs more than at S = 1 (each new shape is an eager round, then a graph
capture, then the timed round; a verify of S * (n + 1) rows is no longer bandwidth-bound), and it rarely wins:
on the H200 a 9B Q8_0 GEMV of 4 rows costs 1.18x one row, of 16 rows ~3x. So at S > 1 a plain step of S is
measured first, then only the lengths whose best case beats it are explored, the one with the best best case
(not n_max), and only where that best case beats the plain step by EXPLORE_MARGIN. The best case divides the
expected tokens by a floor under spec(S, n) from what is measured:
  - a forward's cost is convex in its rows (flat while bandwidth-bound, then rising), so the verify of S(n+1)
    rows costs at least the plain costs' secant extrapolated there (CostTable.rows_floor);
  - a spec round of S' < S sequences drafting n (measured, or estimated as spec_cost does), plus
    (n + 1) (plain(S) - plain(S')): the S - S' more
    sequences add (S - S')(n + 1) verify rows, each at least the plain secant's slope (convexity again).
No length passing: the round steps plainly. Nor does one whose best case cannot repay the exploration
(EXPLORE_STEPS plain steps) within the tokens its sequences have left ('short'): the rounds of these S sequences
end when the first of them does (its n_predict, its context), so near the end of a run, streams finishing one by
one, each smaller S would pay an eager round and captures for a few rounds' gain at best. Probes at S > 1 run only
where a spec round of S was measured (else exploring already decides each round from the current acceptance) and
only when the round would win were every draft accepted. S = 1 explores and probes as before, but for the same
bound on what is left, with free drafts as the best case (more than EXPLORE_STEPS tokens): the last stream of
several, its graphs not captured at its prompt's end (Speculator.prompt_end: not alone then), explored with its
last few tokens, an eager round and captures in the tail of 4-stream runs on a fresh server (2026-12-06, H100,
acceptance length 1.5: the tail +30-48 ms over MTP off in half the rounds).

Near ties at S > 1. Once measured, S > 1 sequences draft only where the expected rate beats a plain step's by
DRAFT_MARGIN, not by any amount as one sequence does. Each sequence of a drafting round accepts its own number of
drafts, so rounds of several put the streams out of step: where they end together (a batch of requests of one
length) the last of them then run alone, at a smaller S, where a token costs more. And a near tie is inside what
the tables know: the EMA leans to the fast timings (EMA_DOWN), and a drafting round's timings spread wider than a
plain step's, so its low tail lies further under its mean. At acceptance length 1.5 with 4 streams (2026-12-06,
H100) the rounds a near tie drafted after each probe (1-23 a run beside 10-15 probes) cost ~1% of the steady rate
(0.989 of MTP off, 1.001 at length 1 where nothing drafts), and the tail +13-51 ms in every round (10 tokens after
the first stream's last, MTP off 6).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Optional, Sequence

DECAY = 0.9                # per round: the acceptance counts' memory (~10 rounds)
PRIOR = (1.0, 2.0)         # (accepted, tried) before anything is seen: a = 0.5, so a new sequence drafts; once
                           # verifies were seen, a new sequence takes their pooled rate at this weight (prior())
EMA_DOWN, EMA_UP = 0.8, 0.1   # weight of a new timing below / above the table's: the noise of a wall-clock timing
                              # is mostly added time (another process, a collection), so a slow one moves it less
PROBE_MIN, PROBE_MAX = 8, 64
EXPLORE_STEPS = 12         # what exploring a new shape of S > 1 sequences costs (an eager round and two graph
                           # captures), in plain steps of those sequences: ~a dozen on the H200
EXPLORE_MARGIN = 1.25      # S > 1: explore only where the best case beats a plain step by this much (its cost)
DRAFT_MARGIN = 1.05        # S > 1: draft only where the expected rate beats a plain step's by this much (module
                           # docstring: a near tie puts the streams out of step for nothing)


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

    def prior(self) -> "Acceptance":
        """A new sequence's counts from these (pooled over the sequences verified before it): their rate at PRIOR's
        weight. The model's drafts on this server's recent text say more about the next request than a fixed
        a = 0.5 does: with them all rejected, each new request no longer drafts its first rounds and, among several
        streams, explores shapes that cannot win (2026-12-05, H100, 4 streams at acceptance 0: 3 explored rounds,
        2 eager and 4 captures a run); the new text's own verifies outweigh it within a round or two."""
        return Acceptance(PRIOR[1] * self.rate, PRIOR[1])

    def expected(self, n: int) -> float:
        """E(n): tokens a round drafting n yields for this sequence, the target's own token included."""
        return self.expected_upto(n)[n]

    def expected_upto(self, n: int) -> list[float]:
        """[E(0), .., E(n)] in one pass. Running sums, which expected() takes its value from: sum() is not a plain
        running sum from Python 3.12 on (compensated), so a sum() here gave other bits than these there."""
        a = self.rate
        return list(accumulate([a ** i for i in range(n + 1)]))


@dataclass
class CostTable:
    """Measured seconds per round (EMA): plain[S] a plain step of S sequences, spec[(S, n)] a round of S sequences
    drafting n each, with the draft head in use (use_head)."""
    plain: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    head: str = "fixed"
    heads: dict = field(default_factory=dict)     # draft head -> its spec table (spec is heads[head])

    def __post_init__(self):
        self.heads.setdefault(self.head, self.spec)

    def use_head(self, head: str) -> None:
        """--spec-draft-vocab auto switched the draft's LM head (engine/draft_vocab.py): from now on spec is the
        rounds of that head. A prefix head's rounds are cheaper, so each head keeps its own (a switch back finds
        its timings); the plain steps do not depend on it. A head not seen yet starts empty: the policy explores it
        as it does a new table."""
        self.heads[self.head] = self.spec
        self.head = head
        self.spec = self.heads.setdefault(head, {})

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

    def has_spec(self, S: int) -> bool:
        """Whether a spec round of S sequences was measured (spec_cost(S, n) is None for every n otherwise)."""
        for s, _ in self.spec:          # (a loop, not any() over a generator: asked before every round)
            if s == S:
                return True
        return False

    def rows_floor(self, rows: int) -> float:
        """A lower bound on one forward of `rows` rows from the measured plain steps (0.0: none measured): the
        most expensive measured step of at most that many rows, or a secant of two of them extrapolated to
        `rows` (a forward's cost is convex in its rows)."""
        return self._rows_floor(rows, sorted(self.plain.items()))

    @staticmethod
    def _rows_floor(rows: int, plain: list) -> float:
        """rows_floor over plain, the (rows, seconds) points sorted by rows."""
        pts = [p for p in plain if p[0] <= rows]
        best = max((t for _, t in pts), default=0.0)
        for i, (r0, t0) in enumerate(pts):
            for r1, t1 in pts[i + 1:]:
                best = max(best, t1 + (rows - r1) * (t1 - t0) / (r1 - r0))
        return best

    def spec_floor(self, S: int, n: int) -> float:
        """A lower bound on a round of S sequences drafting n (module docstring: the verify's rows, and a
        measured round of fewer sequences plus the plain secant's slope times the added rows)."""
        return self.spec_floors(S, (n,))[n]

    def spec_floors(self, S: int, lengths) -> dict:
        """spec_floor(S, n) for each n of lengths, from one look at the tables."""
        plain, pts = self.plain.get(S), sorted(self.plain.items())
        fewer = [(s, self.plain[s]) for s in {s for s, _ in self.spec if s < S and s in self.plain}] \
            if plain is not None else []
        out = {}
        for n in lengths:
            best = self._rows_floor(S * (n + 1), pts)
            for s, t in fewer:
                best = max(best, self.spec_cost(s, n) + (n + 1) * (plain - t))
            out[n] = best
        return out

    def spec_cost(self, S: int, n: int) -> Optional[float]:
        """A round of S sequences drafting n: measured, else on the line through the two known points nearest n
        (this S's measured lengths, its plain step as n = 0); None when no spec round of S was measured."""
        t = self.spec.get((S, n))
        if t is not None:
            return t
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
        self.counts: dict[int, dict[str, int]] = {}   # per S: rounds by kind (count())
        self._tokens_of: dict = {}                # the sequences' acceptance counts -> their tokens per n: _tokens

    def count(self, S: int, kind: str, k: int = 1) -> None:
        """Per number of sequences S: rounds 'drafted', 'plain', 'probes', 'explored' (drafted with nothing
        measured for S), 'skipped' (plain where exploring could not win), 'short' (plain where it could, but not
        within the tokens the sequences have left); the Speculator adds 'prompt' (plain rounds beside a prompt
        chunk, the policy not asked: Engine._step), 'captures' (rounds
        that captured a graph), 'eager' (drafting rounds run eagerly though graphs exist) and 'ahead' (rounds
        whose lengths were weighed while the plain step before them ran: Speculator.plan_ahead)."""
        row = self.counts.get(S)
        if row is None:
            row = self.counts[S] = {}
        row[kind] = row.get(kind, 0) + k

    def choose(self, accs: Sequence[Acceptance], others: int = 0, best: Optional[tuple] = None,
               left: Optional[int] = None) -> int:
        """accs: the acceptance of each sequence that may draft this round; others: sequences that step plainly
        either way (a drafting round runs their step apart, a plain one with the rest) -> n (0: a plain step).
        best: what best(accs, others, left) gave, if the caller weighed the lengths ahead (Speculator.plan_ahead).
        left: the most tokens the first of these sequences to end can still make (None: no bound known)."""
        S = len(accs)
        n, kind = self.best(accs, others, left) if best is None else best
        if kind is not None:
            self.count(S, kind)
        if self.probing:                          # the round after a probe: did it bring drafting back?
            self.probing = False
            self.gap = PROBE_MIN if n else min(2 * self.gap, PROBE_MAX)
        if n == 0:
            self.since += 1
            if self.since >= self.gap and self._may_win(S, self.lengths[0], others):
                self.probing = True
                self.n_probes += 1
                self.count(S, "probes")
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
        self.count(S, "drafted" if n else "plain")
        return n

    def _may_win(self, S: int, n: int, others: int) -> bool:
        """Whether a probe of S sequences drafting n may run: only once a spec round of S was measured (before
        that, exploring decides each round: a probe of a shape never run would pay an eager round and captures
        to learn what exploring's bound already said: 'skipped' or 'short'); S = 1 then always, S > 1 only if
        the round could beat a plain step were every draft accepted."""
        if not self.costs.has_spec(S):
            return False
        if S == 1:
            return True
        plain, apart = self.costs.plain_cost(S + others), self.costs.plain_cost(others) if others else 0.0
        if plain is None or apart is None:
            return True
        return (S * (n + 1) + others) / (self._floor(S, n) + apart) > (S + others) / plain

    def _floor(self, S: int, n: int) -> float:
        """What a round of S > 1 sequences drafting n costs: measured, else its estimate but never below
        CostTable.spec_floor (an estimate on the line from one measured length can be)."""
        return self._floors(S, (n,))[n]

    def _floors(self, S: int, lengths) -> dict:
        """_floor(S, n) for each n of lengths."""
        c = self.costs
        todo = [n for n in lengths if (S, n) not in c.spec]
        floors = c.spec_floors(S, todo) if todo else {}
        measured = c.has_spec(S)
        out = {}
        for n in lengths:
            if n not in floors:
                out[n] = c.spec[(S, n)]
                continue
            known = c.spec_cost(S, n) if measured else None
            out[n] = max(floors[n], known if known is not None else 0.0)
        return out

    def _tokens(self, accs: Sequence[Acceptance]) -> list[float]:
        """[n] -> the expected tokens of a round of these sequences drafting n (0 .. n_max), sum(E_i(n)); kept
        while their acceptance counts stay (they change only when a round drafts: a run of plain rounds asks the
        same)."""
        key = tuple([(a.accepted, a.tried) for a in accs])
        tokens = self._tokens_of.get(key)
        if tokens is None:                  # (one pass per sequence, not one per n)
            per = [a.expected_upto(self.n_max) for a in accs]
            tokens = list(map(sum, zip(*per)))         # (each n's sum over the sequences in order)
            self._tokens_of = {key: tokens}
        return tokens

    def expect(self, accs: Sequence[Acceptance], n: int) -> None:
        """A round of these sequences drafting n is on the device: _tokens for each way it can end (0 .. n drafts
        accepted; the counts as Acceptance.update will leave them, the same bits), weighed now, while the device
        works, so that the next choice finds them rather than computing them between the verified ids and the
        next launch, where the device is idle. One sequence only (S sequences' outcomes are (n + 1)^S)."""
        if len(accs) != 1:
            return
        (a,) = accs
        out = {}
        for k in range(n + 1):
            b = Acceptance(a.accepted, a.tried)
            b.update(n, k)
            out[((b.accepted, b.tried),)] = b.expected_upto(self.n_max)
        self._tokens_of = out

    def best(self, accs: Sequence[Acceptance], others: int = 0,
             left: Optional[int] = None) -> tuple[int, Optional[str]]:
        """The weighing of the lengths that choose() starts from, from the tables and the acceptance alone (no
        probe, no refresh; nothing changes): -> (the length with the most expected tokens per second, 0 where
        a plain step wins, and 'explored', 'skipped' or 'short' where that was how it was reached (count()), else
        None). left: as choose()'s."""
        S, c = len(accs), self.costs
        if not c.has_spec(S):
            if S > 1:
                return self._explore(accs, others, left)
            if left is not None and not repays(left, 0.0):
                return 0, "short"                 # not even free drafts would repay the captures in what is left
            return self.n_max, "explored"         # explore: measure a spec round of S sequences first
        plain, apart = c.plain_cost(S + others), c.plain_cost(others) if others else 0.0
        if plain is None or apart is None:
            return (0 if plain is None else self.n_max), None   # then a plain step of them (and of the others alone)
        best, rate, tokens = 0, (S + others) / plain * (DRAFT_MARGIN if S > 1 else 1.0), self._tokens(accs)
        floors = self._floors(S, self.lengths) if S > 1 else None
        for n in self.lengths:
            cost = c.spec_cost(S, n) if S == 1 else floors[n]
            r = (tokens[n] + others) / (cost + apart)
            if r > rate:
                best, rate = n, r
        return best, None

    def _explore(self, accs: Sequence[Acceptance], others: int, left: Optional[int]) -> tuple[int, Optional[str]]:
        """Nothing measured for S > 1 sequences drafting: a plain step of them first (and of the others alone),
        then the length whose best case (expected tokens over spec_floor) beats it most; none: plain ('skipped');
        one that cannot repay the exploration within `left` rounds: plain ('short')."""
        S, c = len(accs), self.costs
        plain = c.plain_cost(S + others)
        if plain is None:
            return 0, None
        apart = c.rows_floor(others) if others else 0.0     # (a lower bound: the others' step is not measured yet)
        best, rate, tokens = 0, (S + others) / plain, self._tokens(accs)
        floors = self._floors(S, self.lengths)
        for n in self.lengths:
            r = (tokens[n] + others) / (floors[n] + apart)
            if r > rate:
                best, rate = n, r
        if best and rate < EXPLORE_MARGIN * (S + others) / plain:
            best = 0                              # a best case this close cannot pay back the new shape's cost
        elif best and left is not None and not repays(left, (S + others) / plain / rate):
            return 0, "short"
        return best, "explored" if best else "skipped"

    @property
    def share(self) -> float:
        """The fraction of rounds that drafted."""
        total = self.n_spec + self.n_plain
        return self.n_spec / total if total else 0.0


def repays(left: int, ratio: float) -> bool:
    """Whether exploring a shape (EXPLORE_STEPS plain steps) can pay for itself in the `left` rounds it may run
    for: those rounds' plain steps take `left` steps, drafting at best `ratio` (plain rate / best-case rate) of
    that, so at most left * (1 - ratio) steps are saved."""
    return left * (1.0 - ratio) > EXPLORE_STEPS
