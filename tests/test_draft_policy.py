"""engine/draft_policy.py on the CPU: acceptance counts, the cost table's estimates, and the policy's choices
against simulated engines whose true costs are fake tables (an H200-like single stream, four streams where
batching wins and where drafting still pays), with synthetic geometric acceptance as --spec-synth-len draws it."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.engine.draft_policy import (DRAFT_MARGIN, PRIOR, PROBE_MAX, PROBE_MIN, Acceptance, CostTable,
                                          DraftPolicy)

# seconds per round, shaped like the 9B Q8_0 on the H200 (plain 3.2 ms; a draft round ~0.19 steps; verify at
# T = n + 1 rows per sequence ~1.1 / 1.2 / 1.3 steps)
PLAIN = 3.2e-3
ONE = {"plain": {1: PLAIN}, "draft": {1: 0.19 * PLAIN}, "verify": {(1, n): (1.0 + 0.1 * n) * PLAIN
                                                                   for n in range(1, 5)}}


def test_acceptance_counts_the_tried_positions():
    a = Acceptance(0.0, 0.0)
    a.update(3, 1)                      # draft 1 accepted, draft 2 rejected, draft 3 never compared
    assert (a.accepted, a.tried) == (1.0, 2.0) and a.rate == 0.5
    a.update(3, 3)                      # all three accepted: nothing was rejected
    assert a.accepted == pytest.approx(0.9 + 3) and a.tried == pytest.approx(1.8 + 3)
    a.update(0, 0)                      # nothing drafted: nothing learnt
    assert a.tried == pytest.approx(4.8)
    assert Acceptance(1.0, 2.0).expected(3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert Acceptance(0.0, 5.0).expected(3) == 1.0


def test_a_new_sequence_starts_from_the_pooled_rate():
    """Acceptance.prior: the pooled rate at the prior's weight, so a request after rejected drafts starts low and
    its own first verify outweighs it; before anything is pooled, the fixed prior."""
    assert (Acceptance().prior().accepted, Acceptance().prior().tried) == PRIOR
    pooled = Acceptance()
    for _ in range(20):
        pooled.update(3, 0)
    a = pooled.prior()
    assert a.tried == PRIOR[1] and a.rate == pytest.approx(pooled.rate) and a.rate < 0.05
    a.update(3, 3)
    assert a.rate > 0.5


def test_expected_in_one_pass_is_the_running_sum_bit_for_bit():
    """The policy weighs every length from expected_upto (one pass a sequence), the reference policy
    (test_draft_policy_reference.py) from expected(): both must be the plain running sums of a^i, in order, on every
    Python (sum() compensates from 3.12 on: expected() summed with it failed this on the device's Python,
    2026-12-06)."""
    rng = np.random.default_rng(0)
    for accepted, tried in zip(rng.uniform(0, 10, 2000), rng.uniform(0.01, 10, 2000)):
        a = Acceptance(float(accepted), float(tried))
        running, total = [], 0.0
        for i in range(5):
            total += a.rate ** i
            running.append(total)
        assert a.expected_upto(4) == running and [a.expected(n) for n in range(5)] == running


def test_expect_weighs_each_end_of_a_running_round(monkeypatch):
    """DraftPolicy.expect (while a round of one sequence runs): the tokens per n after each way it can end are
    there for the next choice, the same bits as weighed then; of several sequences nothing is weighed ahead."""
    acc, n = Acceptance(2.7, 4.1), 3
    fresh = []
    for k in range(n + 1):
        b = Acceptance(acc.accepted, acc.tried)
        b.update(n, k)
        fresh.append((b, DraftPolicy(4)._tokens([b])))
    p = DraftPolicy(4)
    p.expect([acc], n)
    calls = []
    monkeypatch.setattr(Acceptance, "expected_upto", lambda self, m: calls.append(m) or [1.0] * (m + 1))
    for b, want in fresh:
        got = p._tokens([b])
        assert got == want and all(type(x) is float for x in got)
    assert calls == []
    p.expect([acc, acc], n)
    assert p._tokens([acc, acc]) == [2.0] * 5 and calls == [4, 4]      # (weighed when asked: the stub's)


def test_cost_table_measures_and_estimates():
    c = CostTable()
    assert c.spec_cost(1, 3) is None and c.plain_cost(1) is None
    c.add_spec(1, 3, 1.9)
    assert c.spec_cost(1, 3) == pytest.approx(1.9)
    assert c.spec_cost(1, 1) == pytest.approx(1.9)                # no plain step yet: the one measured length
    c.add_plain(1, 1.0)
    assert c.spec_cost(1, 1) == pytest.approx(1.3)                # on the line (0, 1.0) - (3, 1.9)
    c.add_spec(1, 1, 1.4)
    assert c.spec_cost(1, 1) == pytest.approx(1.4) and c.spec_cost(1, 2) == pytest.approx(1.65)   # (1, 1.4) - (3, 1.9)
    assert c.spec_cost(1, 4) == pytest.approx(2.15)               # beyond: the line through the two nearest
    assert c.spec_cost(2, 1) is None                              # another number of sequences: not known
    c.add_plain(1, 2.0)
    assert c.plain_cost(1) == pytest.approx(1.1)                  # EMA: a slower timing moves it by a tenth
    c.add_plain(1, 0.1)
    assert c.plain_cost(1) == pytest.approx(0.3)                  # a faster one by 0.8 of the way


def _simulate(p: float, n_max: int, S: int, truth: dict, tokens: int, seed: int = 0, n_min: int = 0):
    """A fake engine: each round asks the policy, 'runs' it at the true cost (which it reports as measured),
    and accepts drafts as --spec-synth-len does (each with probability p once the one before was) -> (tokens
    per second, plain tokens per second, the policy, the draft lengths chosen)."""
    rng = np.random.default_rng(seed)
    pol, accs = DraftPolicy(n_max, n_min), [Acceptance() for _ in range(S)]
    made = spent = 0.0
    chosen = []
    while made < tokens:
        n = pol.choose(accs)
        chosen.append(n)
        if n == 0:
            pol.costs.add_plain(S, truth["plain"][S])
            spent += truth["plain"][S]
            made += S
            continue
        t = n * truth["draft"][S] + truth["verify"][(S, n)]
        pol.costs.add_spec(S, n, t)
        spent += t
        for a in accs:
            k = 0
            while k < n and rng.random() < p:
                k += 1
            a.update(n, k)
            made += k + 1
    return made / spent, S / truth["plain"][S], pol, chosen


def test_acceptance_zero_costs_under_five_percent_and_probes():
    rate, plain, pol, chosen = _simulate(0.0, 3, 1, ONE, 128)
    assert rate >= 0.95 * plain
    assert pol.n_probes >= 2 and chosen.count(0) > 0.9 * len(chosen)
    rate, plain, pol, _ = _simulate(0.0, 3, 1, ONE, 4096)
    assert rate >= 0.985 * plain and pol.gap == PROBE_MAX        # failed probes back off to every 64 rounds


def test_high_acceptance_drafts_n_max_and_wins():
    rate, plain, pol, chosen = _simulate(0.9, 3, 1, ONE, 512)
    assert chosen[-50:].count(3) >= 49 and pol.share > 0.95       # (a plain step every PROBE_MAX rounds)
    ideal = (1 + 0.9 + 0.81 + 0.729) / (1.3 + 3 * 0.19)           # tokens per plain-step time at n = 3
    assert rate > 0.95 * ideal * plain


def test_a_slow_first_plain_timing_is_measured_again():
    """Drafting rounds at low acceptance look cheaper than a plain step timed once at 10x its cost (a collection
    during the step); after PROBE_MAX drafting rounds one plain step is timed again, and the rounds go plain."""
    pol, acc = DraftPolicy(3), Acceptance(0.0, 10.0)
    pol.costs.add_plain(1, 10 * PLAIN)
    for n in (1, 2, 3):
        pol.costs.add_spec(1, n, n * ONE["draft"][1] + ONE["verify"][(1, n)])
    chosen = []
    for _ in range(5 * PROBE_MAX):
        n = pol.choose([acc])
        chosen.append(n)
        if n == 0:
            pol.costs.add_plain(1, PLAIN)
        else:
            acc.update(n, 0)
    assert chosen[:PROBE_MAX] == [1] * PROBE_MAX and chosen[PROBE_MAX] == 0      # (refreshes: 10x -> 2.8x -> 1.36x -> 1.07x)
    assert chosen[-PROBE_MAX:].count(0) > PROBE_MAX - 5                          # (probes)


def test_middling_acceptance_picks_the_length_that_pays():
    """At a = 0.4 one draft pays a little (1.4 tokens for 1.29 steps), three do not (1.62 for 1.87): the rounds
    draft one or, where the estimate dips below the break-even 0.29 (it is ~10 trials' worth), step plainly
    until a probe brings drafting back; never slower than plain."""
    rate, plain, _, chosen = _simulate(0.4, 3, 1, ONE, 2048, seed=1)
    late = chosen[len(chosen) // 2:]
    assert late.count(1) > 0.1 * len(late) and late.count(3) + late.count(2) < 0.05 * len(late)
    assert rate >= 0.99 * plain


def test_probes_bring_drafting_back():
    """Acceptance 0, then 0.9 (text the head predicts well): a probe finds it and drafting resumes."""
    truth = ONE
    pol, acc = DraftPolicy(3), Acceptance()
    for p, rounds in ((0.0, 300), (0.9, 300)):
        rng = np.random.default_rng(0)
        chosen = []
        for _ in range(rounds):
            n = pol.choose([acc])
            chosen.append(n)
            if n == 0:
                pol.costs.add_plain(1, truth["plain"][1])
                continue
            pol.costs.add_spec(1, n, n * truth["draft"][1] + truth["verify"][(1, n)])
            k = 0
            while k < n and rng.random() < p:
                k += 1
            acc.update(n, k)
        if p == 0.0:
            assert chosen[-100:].count(0) > 95 and pol.gap == PROBE_MAX
    first = next(i for i, n in enumerate(chosen) if n)
    assert first <= PROBE_MAX and chosen[-100:].count(3) > 90 and pol.gap == PROBE_MIN


# four streams: a plain step of 4 rows costs little more than one of 1 (the weights are read once), a verify of
# 4 x (n + 1) rows much more (the quantized GEMV is no longer bandwidth-bound)
FOUR_BATCHING_WINS = {"plain": {4: 1.1 * PLAIN}, "draft": {4: 0.22 * PLAIN},
                      "verify": {(4, n): (1.1 + 0.45 * n) * PLAIN for n in range(1, 4)}}
FOUR_DRAFTING_PAYS = {"plain": {4: 1.1 * PLAIN}, "draft": {4: 0.22 * PLAIN},
                      "verify": {(4, n): (1.1 + 0.12 * n) * PLAIN for n in range(1, 4)}}


@pytest.mark.parametrize("p", [0.0, 0.5, 0.7])
def test_four_streams_never_slower_than_batching(p):
    rate, plain, pol, chosen = _simulate(p, 3, 4, FOUR_BATCHING_WINS, 2048)
    assert rate >= 0.97 * plain
    assert chosen[len(chosen) // 2:].count(0) > 0.9 * len(chosen[len(chosen) // 2:])


def test_four_streams_draft_where_it_pays():
    rate, plain, pol, chosen = _simulate(0.8, 3, 4, FOUR_DRAFTING_PAYS, 2048)
    assert pol.share > 0.9 and rate > 1.5 * plain


def test_one_stream_with_acceptance_among_four_counts_each():
    """All-or-none per round: the round's tokens are every sequence's expected ones."""
    pol = DraftPolicy(3)
    for S in (4,):
        pol.costs.add_plain(S, FOUR_DRAFTING_PAYS["plain"][S])
        for n in range(1, 4):
            pol.costs.add_spec(S, n, n * FOUR_DRAFTING_PAYS["draft"][S] + FOUR_DRAFTING_PAYS["verify"][(S, n)])
    dead, good = Acceptance(0.0, 10.0), Acceptance(9.5, 10.0)
    assert pol.choose([dead] * 4) == 0
    assert pol.choose([good] * 3 + [dead]) == 3               # three good streams pay for the fourth's rows
    assert pol.choose([good] + [dead] * 3) == 0               # one does not


def test_n_min_bounds_the_lengths():
    pol = DraftPolicy(3, n_min=2)
    assert list(pol.lengths) == [2, 3]
    _, _, _, chosen = _simulate(0.4, 3, 1, ONE, 256, n_min=2)
    assert 1 not in chosen
    assert list(DraftPolicy(3, n_min=5).lengths) == [3]        # more than n_max: only n_max drafts


def test_slots_that_cannot_draft_count_against_a_drafting_round():
    """A slot that must step plainly (grammar, n_probs) makes a drafting round two forwards (the round and its
    plain step apart): one good drafting slot beside three such slots steps plainly with them."""
    pol, good = DraftPolicy(3), Acceptance(9.5, 10.0)
    for n in (1, 2, 3):
        pol.costs.add_spec(1, n, n * ONE["draft"][1] + ONE["verify"][(1, n)])
    pol.costs.add_plain(1, PLAIN)
    assert pol.choose([good]) == 3
    assert pol.choose([good], others=3) == 0                  # plain(4) not measured yet: explore it
    pol.costs.add_plain(4, 1.1 * PLAIN)
    assert pol.choose([good], others=3) == 3                  # plain(3) apart not measured yet: draft to see it
    pol.costs.add_plain(3, 1.08 * PLAIN)
    assert pol.choose([good], others=3) == 0                  # (3.71 + 3) / 2.95 < 4 / 1.1


def _gemv(R: int) -> float:
    """A forward of R rows shaped like the 9B Q8_0 on the H200: 1.18x one row at 4 rows, ~3x at 16 (convex)."""
    return PLAIN * (1 + 0.06 * (R - 1) if R <= 4 else 1.18 + (R - 4) * (3 - 1.18) / 12)


def _ramp(p: float, forward, schedule, seed: int = 0, left: bool = False):
    """Requests arriving one by one, as a server's: (S, rounds) phases. A spec round of S > 1 sequences of a shape
    (S, n) run for the first time drafts eagerly and captures its verify graph, the second captures the draft
    graph (neither timed: speculative.py), later ones replay -> (tokens per second over MTP off's, the policy).
    left: the policy is told the rounds left in each phase (as tokens left: the phase ends with its first
    sequence)."""
    rng = np.random.default_rng(seed)
    pol, accs, seen = DraftPolicy(3), [], {}
    made = spent = off = 0.0
    for S, rounds in schedule:
        accs += [Acceptance() for _ in range(S - len(accs))]
        for i in range(rounds):
            off += forward(S)
            n = pol.choose(accs[:S], left=rounds - i if left else None)
            if n == 0:
                pol.costs.add_plain(S, forward(S))
                spent, made = spent + forward(S), made + S
                continue
            k = seen[(S, n)] = seen.get((S, n), 0 if S > 1 else 2) + 1
            t = n * 0.2 * forward(S) + forward(S * (n + 1))
            t += (n * 0.2 * forward(S) + 5 * PLAIN) if k == 1 else 5 * PLAIN if k == 2 else 0.0
            if k > 2:
                pol.costs.add_spec(S, n, t)
            spent += t
            for a in accs[:S]:
                j = 0
                while j < n and rng.random() < p:
                    j += 1
                a.update(n, j)
                made += j + 1
    return made / spent / (sum(S * r for S, r in schedule) / off), pol


RAMP = [(1, 6), (2, 6), (3, 6), (4, 128)]


@pytest.mark.parametrize("p", [0.0, 0.6, 0.8])
def test_streams_arriving_do_not_explore_drafting_that_cannot_win(p):
    """Four requests arriving one by one where a verify of S(n+1) rows costs far more than a plain step of S: the
    policy explores at S = 1 only; at S = 2..4 the best case (spec round of one sequence + the plain secant's
    slope per added row) loses, so no shape of several sequences is ever run (the old policy explored n_max at
    each S, then probed n = 1 at S = 4: 0.71..0.76 of MTP off here)."""
    rate, pol = _ramp(p, _gemv, RAMP)
    assert rate >= 0.98
    for S in (2, 3, 4):
        assert pol.counts[S].get("drafted", 0) == 0 and pol.counts[S]["skipped"] > 0
        assert "probes" not in pol.counts[S]
    assert pol.counts[4]["plain"] == 128 and pol.counts[1]["explored"] == 1


def test_streams_arriving_still_draft_where_it_pays():
    """The same arrival where rows are cheap (a forward of 16 rows 1.3x one): S = 4 explores and drafts."""
    rate, pol = _ramp(0.8, lambda R: PLAIN * (1 + 0.02 * (R - 1)), RAMP)
    assert pol.counts[4]["explored"] >= 1 and pol.counts[4]["drafted"] > 100 and rate > 1.25


TAIL = [(4, 128), (3, 12), (2, 12), (1, 12)]


def test_streams_finishing_do_not_explore_what_cannot_repay():
    """Streams finishing one by one where drafting pays (cheap rows): the tokens left at S = 3, 2 and 1 cannot
    repay a new shape's eager round and captures, so those S step plainly ('short'), where without the bound they
    explored (and lost: the run's rate is higher with it). S = 4, with its long run left, explores as before."""
    cheap = lambda R: PLAIN * (1 + 0.02 * (R - 1))        # noqa: E731
    rate_blind, blind = _ramp(0.8, cheap, TAIL)
    rate, pol = _ramp(0.8, cheap, TAIL, left=True)
    for S in (3, 2, 1):
        assert blind.counts[S]["explored"] >= 1
        assert pol.counts[S]["short"] >= 1 and "explored" not in pol.counts[S] and "drafted" not in pol.counts[S]
    assert pol.counts[4]["explored"] >= 1 and pol.counts[4]["drafted"] > 100
    assert rate > rate_blind


def test_a_lone_sequence_explores_only_what_it_can_repay():
    """One sequence with nothing measured for S = 1: it explores (drafts n_max) when the tokens it has left could
    repay the exploration even with free drafts (more than EXPLORE_STEPS), or when nothing bounds them; with
    EXPLORE_STEPS or fewer left it steps plainly ('short'), however well its drafts are accepted."""
    from llamacmp.engine.draft_policy import EXPLORE_STEPS
    pol, good = DraftPolicy(3), Acceptance(9.5, 10.0)
    assert pol.best([good]) == pol.best([good], left=EXPLORE_STEPS + 1) == (3, "explored")
    assert pol.best([good], left=EXPLORE_STEPS) == pol.best([good], left=1) == (0, "short")
    pol.costs.add_spec(1, 3, PLAIN)                     # once measured, the tables decide as before
    pol.costs.add_plain(1, PLAIN)
    assert pol.best([good], left=1)[0] == 3


def test_a_long_run_left_still_explores():
    """The bound is the exploration's cost against the best case's gain over the tokens left: enough left, and a
    new S explores as before; too few, and it steps plainly."""
    from llamacmp.engine.draft_policy import EXPLORE_STEPS, repays
    pol, good = DraftPolicy(3), Acceptance(9.5, 10.0)
    pol.costs.add_plain(3, PLAIN)
    pol.costs.add_plain(1, PLAIN)
    assert pol.best([good] * 3) == pol.best([good] * 3, left=1000) == (3, "explored")
    assert pol.best([good] * 3, left=EXPLORE_STEPS) == (0, "short")
    assert repays(EXPLORE_STEPS * 2 + 1, 0.5) and not repays(EXPLORE_STEPS * 2, 0.5)


def test_spec_floor_bounds_a_round_of_more_sequences():
    c = CostTable()
    c.add_plain(1, 1.0)
    c.add_plain(4, 1.3)
    assert c.rows_floor(3) == pytest.approx(1.0) and c.rows_floor(4) == pytest.approx(1.3)
    assert c.rows_floor(8) == pytest.approx(1.3 + 4 * 0.1)          # the secant (1, 1.0) - (4, 1.3) on to 8 rows
    assert c.spec_floor(4, 1) == pytest.approx(1.7)                 # nothing of fewer sequences: the verify's rows
    c.add_spec(1, 1, 1.5)
    assert c.spec_floor(4, 1) == pytest.approx(1.5 + 2 * 0.3)       # + (n + 1)(plain(4) - plain(1))
    assert c.spec_floor(4, 3) == pytest.approx(max(1.3 + 12 * 0.1, 2.5 + 4 * 0.3))   # (1, 3) on the line: 2.5


def test_probes_of_several_sequences_wait_for_a_measured_round():
    """At S > 1 a probe of a shape never run is skipped (exploring decides from the acceptance each round); once a
    round of S was measured, probes run as at S = 1, unless even full acceptance could not win."""
    pol, acc = DraftPolicy(3), Acceptance(0.0, 10.0)
    pol.costs.add_plain(4, _gemv(4))
    assert [pol.choose([acc] * 4) for _ in range(200)] == [0] * 200 and pol.n_probes == 0
    pol.costs.add_spec(4, 1, _gemv(8))
    chosen = [pol.choose([acc] * 4) for _ in range(200)]
    assert pol.n_probes >= 2 and chosen.count(1) == pol.n_probes == pol.counts[4]["probes"]
    pol.costs.add_spec(4, 1, 10 * PLAIN)
    pol.costs.spec[(4, 1)] = 10 * PLAIN                             # 8 tokens in 10 plain steps: never wins
    before = pol.n_probes
    assert [pol.choose([acc] * 4) for _ in range(200)] == [0] * 200 and pol.n_probes == before


@pytest.mark.parametrize("gain", [1.03, 1.08])
def test_several_sequences_draft_only_past_the_margin(gain):
    """Measured costs where a round drafting 1 gives `gain` times a plain step's rate (acceptance 0.5, so 1.5 tokens
    a sequence): one sequence drafts at any gain; four only past DRAFT_MARGIN (a near tie puts them out of step)."""
    assert 1.03 < DRAFT_MARGIN < 1.08
    acc = Acceptance(5.0, 10.0)
    for S in (1, 4):
        pol = DraftPolicy(1)
        pol.costs.add_plain(S, 1.0)
        pol.costs.add_spec(S, 1, 1.5 / gain)
        want = 1 if S == 1 or gain > DRAFT_MARGIN else 0
        assert pol.best([acc] * S) == (want, None)
        assert pol.choose([acc] * S) == want


def test_counts_per_number_of_sequences():
    pol, good = DraftPolicy(3), Acceptance(9.5, 10.0)
    assert pol.choose([good]) == 3                                  # explore
    pol.costs.add_spec(1, 3, 1.5 * PLAIN)
    assert pol.choose([good]) == 0                                  # plain(1) not measured yet
    pol.costs.add_plain(1, PLAIN)
    assert pol.choose([good]) == 3
    assert pol.counts == {1: {"explored": 1, "drafted": 2, "plain": 1}}
