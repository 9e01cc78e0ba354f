"""The draft policy's choices equal those of its first, plain writing (kept below as the reference: the code of
engine/draft_policy.py at 6c379d6, which recomputed every length's floor and every sequence's expected tokens on
each call) for the same measurements, round after round, on random tables, acceptance and streams: the faster
policy (the plain step's host time, issue 19) decides exactly as the plain one did, counters included."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.engine.draft_policy import (DRAFT_MARGIN, EXPLORE_MARGIN, PROBE_MAX, PROBE_MIN, Acceptance,
                                          CostTable, DraftPolicy)


# -- the reference: the policy as first written ------------------------------------------------------------------

def ref_rows_floor(c: CostTable, rows: int) -> float:
    pts = sorted((r, t) for r, t in c.plain.items() if r <= rows)
    best = max((t for _, t in pts), default=0.0)
    for i, (r0, t0) in enumerate(pts):
        for r1, t1 in pts[i + 1:]:
            best = max(best, t1 + (rows - r1) * (t1 - t0) / (r1 - r0))
    return best


def ref_spec_cost(c: CostTable, S: int, n: int):
    if (S, n) in c.spec:
        return c.spec[(S, n)]
    pts = [(m, t) for (s, m), t in c.spec.items() if s == S]
    if not pts:
        return None
    if S in c.plain:
        pts.append((0, c.plain[S]))
    if len(pts) == 1:
        return pts[0][1]
    (x0, y0), (x1, y1) = sorted(sorted(pts, key=lambda p: abs(p[0] - n))[:2])
    return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


def ref_spec_floor(c: CostTable, S: int, n: int) -> float:
    best = ref_rows_floor(c, S * (n + 1))
    plain = c.plain.get(S)
    for s in {s for s, _ in c.spec if s < S and s in c.plain and plain is not None}:
        best = max(best, ref_spec_cost(c, s, n) + (n + 1) * (plain - c.plain[s]))
    return best


class ReferencePolicy(DraftPolicy):
    """DraftPolicy with choose() as first written (the counters and probe state are the same fields)."""

    def choose(self, accs, others=0, best=None):
        S = len(accs)
        self._ref_explored = False
        n = self._ref_best(accs, others)
        if self._ref_explored:
            self.count(S, "explored")
        if self.probing:
            self.probing = False
            self.gap = PROBE_MIN if n else min(2 * self.gap, PROBE_MAX)
        if n == 0:
            self.since += 1
            if self.since >= self.gap and self._ref_may_win(S, self.lengths[0], others):
                self.probing = True
                self.n_probes += 1
                self.count(S, "probes")
                n = self.lengths[0]
        elif self.drafted >= PROBE_MAX:
            n = 0
        if n:
            self.since = 0
            self.drafted += 1
            self.n_spec += 1
        else:
            self.drafted = 0
            self.n_plain += 1
        self.count(S, "drafted" if n else "plain")
        return n

    def _ref_may_win(self, S, n, others):
        if S == 1:
            return True
        if not any(s == S for s, _ in self.costs.spec):
            return False
        plain, apart = self.costs.plain_cost(S + others), self.costs.plain_cost(others) if others else 0.0
        if plain is None or apart is None:
            return True
        return (S * (n + 1) + others) / (self._ref_floor(S, n) + apart) > (S + others) / plain

    def _ref_floor(self, S, n):
        if (S, n) in self.costs.spec:
            return self.costs.spec[(S, n)]
        known = ref_spec_cost(self.costs, S, n)
        return max(ref_spec_floor(self.costs, S, n), known if known is not None else 0.0)

    def _ref_best(self, accs, others):
        S, c = len(accs), self.costs
        if any(ref_spec_cost(c, S, n) is None for n in self.lengths):
            if S > 1:
                return self._ref_explore(accs, others)
            self._ref_explored = True
            return self.n_max
        plain, apart = c.plain_cost(S + others), c.plain_cost(others) if others else 0.0
        if plain is None or apart is None:
            return 0 if plain is None else self.n_max
        best, rate = 0, (S + others) / plain * (DRAFT_MARGIN if S > 1 else 1.0)
        for n in self.lengths:
            cost = ref_spec_cost(c, S, n) if S == 1 else self._ref_floor(S, n)
            r = (sum(a.expected(n) for a in accs) + others) / (cost + apart)
            if r > rate:
                best, rate = n, r
        return best

    def _ref_explore(self, accs, others):
        S, c = len(accs), self.costs
        plain = c.plain_cost(S + others)
        if plain is None:
            return 0
        apart = ref_rows_floor(c, others) if others else 0.0
        best, rate = 0, (S + others) / plain
        for n in self.lengths:
            r = (sum(a.expected(n) for a in accs) + others) / (self._ref_floor(S, n) + apart)
            if r > rate:
                best, rate = n, r
        if best and rate < EXPLORE_MARGIN * (S + others) / plain:
            best = 0
        if best:
            self._ref_explored = True
        else:
            self.count(S, "skipped")
        return best


# -- the same choices --------------------------------------------------------------------------------------------

def _random_truth(rng):
    """Costs shaped like real ones: a plain step of S rows 1 + 0.05-0.6 (S - 1) ms, a round of S drafting n that
    times (1 + 0.05-0.5 n)."""
    slope, per_n = rng.uniform(0.05, 0.6), rng.uniform(0.05, 0.5)

    def plain(S):
        return 1e-3 * (1 + slope * (S - 1))
    return plain, lambda S, n: plain(S) * (1 + per_n * n)


def _random_table(rng) -> dict:
    """A table of such costs, each entry there or not."""
    plain, spec = _random_truth(rng)
    return {"plain": {S: plain(S) * rng.uniform(0.9, 1.1) for S in range(1, 7) if rng.random() < 0.6},
            "spec": {(S, n): spec(S, n) * rng.uniform(0.8, 1.3) for S in range(1, 5) for n in range(1, 5)
                     if rng.random() < 0.3}}


@pytest.mark.parametrize("seed", range(40))
def test_choices_equal_the_reference(seed):
    """Random tables, sequences, acceptance and measurements (a timing within 0.9-1.4x of the true cost, drafts
    accepted one after another with a probability of 0-0.9): every round's length and every counter equal, half
    the rounds weighed first by best() and handed to choose()."""
    rng = np.random.default_rng(seed)
    n_max, n_min = int(rng.integers(1, 5)), int(rng.integers(0, 3))
    t = _random_table(rng)
    plain, spec = _random_truth(rng)
    p_accept = float(rng.choice([0.0, 0.3, 0.6, 0.9]))
    new = DraftPolicy(n_max, n_min, CostTable(plain=dict(t["plain"]), spec=dict(t["spec"])))
    ref = ReferencePolicy(n_max, n_min, CostTable(plain=dict(t["plain"]), spec=dict(t["spec"])))
    accs = [Acceptance(float(rng.uniform(0, 8)), float(rng.uniform(0.5, 10))) for _ in range(4)]
    S = 1
    for _ in range(400):
        if rng.random() < 0.05:                       # streams come and go
            S = int(rng.integers(1, 5))
        others = int(rng.integers(0, 3)) if rng.random() < 0.1 else 0
        ahead = new.best(accs[:S], others) if rng.random() < 0.5 else None     # (weighed first: plan_ahead)
        got, want = new.choose(accs[:S], others, ahead), ref.choose(accs[:S], others)
        assert got == want
        seconds = (spec(S, got) if got else plain(S + others)) * float(rng.uniform(0.9, 1.4))
        for pol in (new, ref):                        # both see the same measurement of what ran
            if got:
                pol.costs.add_spec(S, got, seconds)
            else:
                pol.costs.add_plain(S + others, seconds)
        for a in accs[:S] if got else ():
            k = 0
            while k < got and rng.random() < p_accept:
                k += 1
            a.update(got, k)
    assert new.counts == ref.counts and new.counts
    assert (new.n_spec, new.n_plain, new.n_probes, new.gap, new.since) == \
        (ref.n_spec, ref.n_plain, ref.n_probes, ref.gap, ref.since)


def test_floors_equal_the_reference():
    """CostTable's floors and estimates, to the bit."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        c = CostTable(**_random_table(rng))
        for S in range(1, 6):
            for n in range(1, 5):
                assert c.spec_floor(S, n) == ref_spec_floor(c, S, n)
                assert c.spec_cost(S, n) == ref_spec_cost(c, S, n)
                assert c.has_spec(S) == (ref_spec_cost(c, S, n) is not None)
            assert c.rows_floor(S * 3) == ref_rows_floor(c, S * 3)
            assert c.spec_floors(S, range(1, 5)) == {n: ref_spec_floor(c, S, n) for n in range(1, 5)}


def test_best_changes_nothing():
    """best() is choose()'s weighing alone: asked twice it answers the same and leaves every counter as it was."""
    pol = DraftPolicy(3, costs=CostTable(plain={1: 3.07e-3, 4: 4.74e-3}, spec={(1, n): (3.2 + 0.8 * n) * 1e-3
                                                                              for n in (1, 2, 3)}))
    accs = [Acceptance() for _ in range(4)]
    assert pol.best(accs) == pol.best(accs) == (0, "skipped")       # the H200's 4 streams: batching wins
    assert pol.counts == {} and (pol.since, pol.n_plain) == (0, 0)
    assert pol.best(accs[:1]) == (1, None)                          # (one draft pays at the prior a = 0.5)
    assert DraftPolicy(3).best(accs[:1]) == (3, "explored") and DraftPolicy(3).best(accs) == (0, None)
