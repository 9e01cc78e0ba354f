"""The host sampler chain: each step against a hand computation, then the whole chain's statistics."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.sampling import (Candidates, Sampler, SamplingParams, apply_min_p, apply_penalties, apply_top_k,
                               apply_top_p, apply_typical, parse_sampler_letters, parse_sampler_names)


def cands(logits):
    x = np.asarray(logits, dtype=np.float64)
    return Candidates(np.arange(len(x)), x.copy())


def only(**kw) -> SamplingParams:
    """Params with every filter off except the given ones."""
    base = dict(top_k=0, top_p=1.0, min_p=0.0, typ_p=1.0, temp=1.0)
    base.update(kw)
    return SamplingParams(**base)


def test_greedy_when_temp_not_positive():
    logits = np.array([0.1, 3.0, 2.9, -1.0])
    for temp in (0.0, -1.0):
        s = Sampler(SamplingParams(temp=temp, seed=1))
        assert all(s.sample(logits) == 1 for _ in range(20))


def test_greedy_ties_take_lowest_id():
    assert Sampler(SamplingParams(temp=0)).sample(np.array([1.0, 5.0, 5.0])) == 1


def test_top_k_keeps_k_best():
    c = cands([1, 5, 3, 4, 2])
    apply_top_k(c, only(top_k=2), [])
    assert sorted(c.ids.tolist()) == [1, 3]
    c = cands([1, 5, 3])
    apply_top_k(c, only(top_k=0), [])
    assert len(c.ids) == 3


def test_top_p_keeps_smallest_set_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    c = cands(np.log(probs))
    apply_top_p(c, only(top_p=0.79), [])
    assert c.ids.tolist() == [0, 1]          # 0.5 + 0.3 reaches 0.79
    c = cands(np.log(probs))
    apply_top_p(c, only(top_p=0.81), [])
    assert c.ids.tolist() == [0, 1, 2]


def test_min_p_relative_to_best():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    c = cands(np.log(probs))
    apply_min_p(c, only(min_p=0.25), [])     # keep p >= 0.125
    assert sorted(c.ids.tolist()) == [0, 1, 2]


def test_typical_keeps_tokens_near_entropy():
    probs = np.array([0.7, 0.2, 0.05, 0.05])
    c = cands(np.log(probs))
    apply_typical(c, only(typ_p=0.5), [])
    # entropy ~0.87 nats; |-log p - H|: 0.51, 0.74, 2.1, 2.1 -> token 0 first, its mass 0.7 >= 0.5
    assert c.ids.tolist() == [0]


def test_penalties_match_llamacpp_formula():
    c = cands([2.0, -2.0, 1.0, 0.5])
    p = only(penalty_repeat=2.0, penalty_freq=0.1, penalty_present=0.3, penalty_last_n=3)
    apply_penalties(c, p, [3, 0, 1, 0])      # window: last 3 = [0, 1, 0]
    assert c.logits.tolist() == pytest.approx([2.0 / 2 - 2 * 0.1 - 0.3, -2.0 * 2 - 0.1 - 0.3, 1.0, 0.5])


def test_penalty_window_zero_and_whole_history():
    c = cands([2.0, 1.0])
    apply_penalties(c, only(penalty_repeat=2.0, penalty_last_n=0), [0])
    assert c.logits.tolist() == [2.0, 1.0]
    c = cands([2.0, 1.0])
    apply_penalties(c, only(penalty_repeat=2.0, penalty_last_n=-1), [0] + [1] * 100)
    assert c.logits.tolist() == [1.0, 0.5]


def test_logit_bias_and_ignore_eos():
    logits = np.array([5.0, 1.0, 0.0])
    assert Sampler(SamplingParams(temp=0, logit_bias={0: -np.inf})).sample(logits) == 1
    assert Sampler(SamplingParams(temp=0, logit_bias={2: 10.0})).sample(logits) == 2
    s = Sampler(SamplingParams(temp=0, ignore_eos=True), eog_ids=frozenset({0}))
    assert s.sample(logits) == 1


def test_seeded_draws_repeat_and_differ_by_seed():
    logits = np.random.default_rng(0).normal(size=100)
    p = dict(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = [Sampler(SamplingParams(seed=7, **p)).sample(logits) for _ in range(3)]
    s1, s2 = Sampler(SamplingParams(seed=7, **p)), Sampler(SamplingParams(seed=8, **p))
    draws1 = [s1.sample(logits) for _ in range(50)]
    draws2 = [s2.sample(logits) for _ in range(50)]
    assert len(set(a)) == 1 and draws1 != draws2


def test_draws_follow_softmax_of_tempered_logits():
    logits = np.array([1.0, 0.0, -1.0, 0.5])
    temp = 0.7
    s = Sampler(SamplingParams(seed=3, **{**dict(top_k=0, top_p=1.0, min_p=0.0), "temp": temp}))
    n = 20000
    counts = np.bincount([s.sample(logits) for _ in range(n)], minlength=4) / n
    expect = np.exp(logits / temp) / np.exp(logits / temp).sum()
    assert np.abs(counts - expect).max() < 0.015


def test_chain_order_matters():
    # min_p before top_k vs a chain without min_p: the excluded token is never drawn only with min_p
    logits = np.log(np.array([0.6, 0.39, 0.01]))
    with_min_p = Sampler(SamplingParams(seed=0, temp=1.0, top_k=0, top_p=1.0, min_p=0.1,
                                        samplers=("min_p", "temperature")))
    without = Sampler(SamplingParams(seed=0, temp=1.0, top_k=0, top_p=1.0, min_p=0.1,
                                     samplers=("temperature",)))
    assert 2 not in {with_min_p.sample(logits) for _ in range(2000)}
    assert 2 in {without.sample(logits) for _ in range(2000)}


def test_accept_feeds_penalty_history():
    s = Sampler(SamplingParams(temp=0, penalty_repeat=100.0, penalty_last_n=64))
    logits = np.array([2.0, 1.9])
    assert s.sample(logits) == 0
    s.accept(0)
    assert s.sample(logits) == 1


def test_sampler_name_parsing():
    assert parse_sampler_names("top_k;top-p;temp") == ("top_k", "top_p", "temperature")
    assert parse_sampler_names("top_k,min_p") == ("top_k", "min_p")
    assert parse_sampler_letters("edskypmxt") == ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p",
                                                  "min_p", "xtc", "temperature")
    with pytest.raises(ValueError):
        SamplingParams(samplers=("nope",))


def test_top_k_and_penalties_equal_the_plain_loops_on_ties():
    """keep_top (a partition, not a sort of the vocabulary) keeps a stable sort's first k in its order, ties at the
    k-th value included; the vectorised penalties give the per-token loop's logits."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 400))
        x = rng.integers(-4, 5, size=n).astype(np.float64)        # many ties
        ids = rng.permutation(n)
        k = int(rng.integers(1, n + 1))
        c = Candidates(ids.copy(), x.copy())
        c.keep_top(k)
        order = np.argsort(-x, kind="stable")[:k]
        assert np.array_equal(c.ids, ids[order]) and np.array_equal(c.logits, x[order])
        window = list(rng.integers(0, n + 5, size=int(rng.integers(0, 30))))
        p = only(penalty_repeat=1.3, penalty_freq=0.2, penalty_present=0.1, penalty_last_n=-1)
        c = Candidates(ids.copy(), x.copy())
        apply_penalties(c, p, window)
        want = x.copy()
        for tok in set(window):
            (where,) = np.flatnonzero(ids == tok) if tok in ids else (None,)
            if where is None:
                continue
            v = want[where]
            v = v * 1.3 if v <= 0 else v / 1.3
            want[where] = v - window.count(tok) * 0.2 - 0.1
        assert np.allclose(c.logits, want, rtol=0, atol=0)
