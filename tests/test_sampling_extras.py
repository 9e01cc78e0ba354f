"""DRY, top-n-sigma, XTC, dynamic temperature and Mirostat on the host chain: llama.cpp b8462's own test vectors
(tests/test-sampling.cpp: probabilities in, probabilities out), hand computations, and the chain's wiring (which
rows leave the device chain, what the speculative verify does with them)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from llamacmp import dry
from llamacmp.sampling import (Candidates, Sampler, SamplerVocab, SamplingParams, apply_temperature,
                               apply_top_n_sigma, apply_xtc)


def cands(probs):
    """llama.cpp's sampler_tester: logit = log(p) for token ids 0.."""
    return Candidates(np.arange(len(probs)), np.log(np.asarray(probs, np.float64)))


def probs_by_id(c: Candidates, n: int) -> np.ndarray:
    out = np.zeros(n)
    out[c.ids] = c.probs()
    return out


def only(**kw) -> SamplingParams:
    base = dict(top_k=0, top_p=1.0, min_p=0.0, typ_p=1.0, temp=1.0)
    base.update(kw)
    return SamplingParams(**base)


# -- DRY ---------------------------------------------------------------------------------------------------------

def _dry_probs(probs, history, mult, base, allowed, last_n, breakers=()):
    """test_dry: the breakers are token sequences (llama_sampler_init_dry_testing), context size 1024."""
    tails = {}
    for seq in breakers:
        tails.setdefault(seq[0], []).append(tuple(seq[1:]))
    brk = dry.DryBreakers({t: tuple(v) for t, v in tails.items()})
    c = cands(probs)
    pen = dry.penalties(history, mult, base, allowed, last_n, 1024, brk)
    if pen:
        c.subtract(pen)
    return probs_by_id(c, len(probs))


@pytest.mark.parametrize("probs,history,want,mult,base,allowed,last_n,breakers", [
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, ()),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, ()),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, ((3,),)),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, ()),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, ()),
])
def test_dry_llama_cpp_vectors(probs, history, want, mult, base, allowed, last_n, breakers):
    assert np.allclose(_dry_probs(probs, history, mult, base, allowed, last_n, breakers), want, atol=1e-5)


def test_dry_penalty_grows_with_the_repeat_and_respects_window_and_breakers():
    seq = [5, 6, 7, 8, 9]
    history = [1, 2] + seq + [3] + seq[:4]           # "5 6 7 8" repeated: 9 would extend a repeat of length 4
    none = dry.DryBreakers({})
    pen = dry.penalties(history, 0.8, 1.75, 2, -1, 4096, none)
    assert pen == pytest.approx({9: 0.8 * 1.75 ** 2})     # length 4, allowed 2
    # a window that no longer reaches the first occurrence: nothing repeats inside it
    assert dry.penalties(history, 0.8, 1.75, 2, 5, 4096, none) == {}
    # a breaker token 7 inside the repeat cuts how far back it may reach: the repeat "8" is shorter than allowed
    assert dry.penalties(history, 0.8, 1.75, 2, -1, 4096, dry.DryBreakers({7: ((),)})) == {}
    # the exponent is clamped so that the penalty stays finite
    big = [1] * 300
    assert math.isfinite(dry.penalties(big, 1.0, 1.5, 2, -1, 4096, none)[1])


def test_dry_lengths_equal_a_naive_scan():
    rng = np.random.default_rng(3)
    for _ in range(50):
        hist = list(rng.integers(0, 4, size=int(rng.integers(3, 60))))
        rev = np.asarray(hist[::-1])
        limit = int(rng.integers(0, len(hist) + 1))
        for k, length in dry._repeats(rev, limit, 0):
            z = 0
            while k + z < len(rev) and rev[z] == rev[k + z]:
                z += 1
            assert length == min(z, limit)


def test_dry_breakers_from_the_vocabulary(tiny_tokenizer):
    tok = tiny_tokenizer
    brk = dry.breakers(tok, ("\n", "ab:"))
    newline = [t for t in range(tok.n_vocab) if b"\n" in tok.token_to_piece(t)]
    assert newline and all(brk.single(t) for t in newline)
    # a token whose text ends with "a" (a prefix of "ab:") heads the breaker whose tail is "b:", tokenized
    a = tok.encode("a")[0]
    assert tok.encode("b:") in [list(tail) for tail in brk.tails[a]]
    assert dry.breakers(tok, ("\n", "ab:")) is brk           # cached per vocabulary and list


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_vocab):
    from llamacmp.tokenizer import Tokenizer
    v = tiny_vocab
    return Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, v.pre, v.eos_id, v.bos_id, v.add_bos)


def test_sampler_with_dry_steers_greedy_off_the_repeat(tiny_tokenizer):
    n = tiny_tokenizer.n_vocab
    logits = np.zeros(n)
    logits[40], logits[41] = 2.0, 1.5
    vocab = SamplerVocab(tiny_tokenizer, 4096)
    s = Sampler(SamplingParams(temp=0.0, dry_multiplier=1.0, dry_allowed_length=2), vocab=vocab)
    for t in [40, 7, 8, 40, 7, 8]:                   # after "40 7 8 40 7 8", 40 would extend a repeat of 3
        s.accept(t)
    assert s.sample(logits) == 41
    off = Sampler(SamplingParams(temp=0.0))
    for t in [40, 7, 8, 40, 7, 8]:
        off.accept(t)
    assert off.sample(logits) == 40
    with pytest.raises(ValueError, match="vocabulary"):
        Sampler(SamplingParams(dry_multiplier=1.0))


# -- top-n-sigma, temperature, XTC -----------------------------------------------------------------------------

@pytest.mark.parametrize("n,want", [(1.0, [0.0, 0.0, 0.428571, 0.571429]), (0.0, [0.1, 0.2, 0.3, 0.4]),
                                    (3.0, [0.1, 0.2, 0.3, 0.4])])
def test_top_n_sigma_llama_cpp_vectors(n, want):
    c = cands([0.1, 0.2, 0.3, 0.4])
    apply_top_n_sigma(c, only(top_n_sigma=n), [])
    assert np.allclose(probs_by_id(c, 4), want, atol=1e-5)


def test_top_n_sigma_leaves_minus_infinity_out_of_its_statistics():
    c = Candidates(np.arange(5), np.array([-np.inf, 0.0, 1.0, 2.0, 3.0]))
    apply_top_n_sigma(c, only(top_n_sigma=1.0), [])
    std = np.std([0.0, 1.0, 2.0, 3.0])
    assert list(c.ids) == [t for t, x in zip(range(1, 5), [0.0, 1.0, 2.0, 3.0]) if x >= 3.0 - std]


def test_temperature_and_dynatemp():
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    c = cands(probs)
    apply_temperature(c, only(temp=1.0), [])
    assert np.allclose(probs_by_id(c, 4), probs)
    c = cands(probs)
    apply_temperature(c, only(temp=0.0), [])
    assert list(c.ids) == [3]
    # dynamic: temperature = lo + (hi - lo) * (H / log n) ** exponent
    for temp, rng, exp in ((1.0, 0.5, 1.0), (0.7, 0.6, 2.0), (0.2, 0.5, 0.5)):
        h = -(probs * np.log(probs)).sum() / np.log(4)
        lo, hi = max(0.0, temp - rng), temp + rng
        t = lo + (hi - lo) * h ** exp
        want = probs ** (1 / t) / (probs ** (1 / t)).sum()
        c = cands(probs)
        apply_temperature(c, only(temp=temp, dynatemp_range=rng, dynatemp_exponent=exp), [])
        assert np.allclose(probs_by_id(c, 4), want)


@pytest.mark.parametrize("t,kept", [(0.09, [3]), (0.19, [2, 3]), (0.29, [1, 2, 3]), (0.39, [0, 1, 2, 3])])
def test_xtc_llama_cpp_vectors(t, kept):
    c = cands([0.4, 0.3, 0.2, 0.1])
    apply_xtc(c, only(xtc_probability=0.99, xtc_threshold=t), coin=0.5)
    assert sorted(c.ids) == kept


def test_xtc_coin_and_min_keep():
    c = cands([0.4, 0.3, 0.2, 0.1])
    apply_xtc(c, only(xtc_probability=0.3, xtc_threshold=0.09), coin=0.31)    # the coin says no
    assert len(c.ids) == 4
    c = cands([0.4, 0.3, 0.2, 0.1])
    apply_xtc(c, only(xtc_probability=1.0, xtc_threshold=0.09, min_keep=2), coin=0.0)   # would leave 1 < 2
    assert len(c.ids) == 4
    # a sampler tosses its own coin: at probability 0.5 about half the greedy draws skip the top choices
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    s = Sampler(SamplingParams(temp=0.0, top_k=0, min_p=0.0, xtc_probability=0.5, xtc_threshold=0.25, seed=7))
    picks = [s.sample(logits) for _ in range(2000)]
    assert set(picks) == {0, 1} and 0.45 < picks.count(1) / 2000 < 0.55


# -- Mirostat ----------------------------------------------------------------------------------------------------

def zipf_logits(n: int, s: float) -> np.ndarray:
    return -s * np.log(np.arange(1, n + 1, dtype=np.float64))


def test_mirostat_1_keeps_the_top_k_its_zipf_estimate_gives():
    # on an exact Zipf distribution of exponent s the estimate is s, so k = (eps 2^mu / (1 - N^-eps))^(1/s)
    n, s_exp, tau = 1000, 1.5, 3.0
    mu = 2 * tau
    eps = s_exp - 1
    k = int((eps * 2 ** mu / (1 - n ** -eps)) ** (1 / s_exp))
    sm = Sampler(SamplingParams(temp=1.0, mirostat=1, mirostat_tau=tau, seed=1))
    ids, probs = sm.post_sampling_probs(zipf_logits(n, s_exp))
    assert list(ids) == list(range(k))
    want = np.exp(zipf_logits(n, s_exp)[:k])
    assert np.allclose(probs, want / want.sum())


def test_mirostat_2_truncates_by_surprise_and_learns_mu():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    sm = Sampler(SamplingParams(temp=1.0, mirostat=2, mirostat_tau=1.5, mirostat_eta=0.1, seed=3))
    ids, p = sm.post_sampling_probs(np.log(probs))     # mu = 3: surprises 1.32, 1.74, 2.32 kept, 3.32 not
    assert list(ids) == [0, 1, 2] and np.allclose(p, probs[:3] / 0.9)
    tok = sm.sample(np.log(probs))
    assert tok in (0, 1, 2)
    assert sm.mu == pytest.approx(3.0 - 0.1 * (-math.log2(p[list(ids).index(tok)]) - 1.5))
    # the draw's distribution is what post_sampling_probs reports until the token is accepted
    assert np.array_equal(sm.post_sampling_probs(np.log(probs))[1], p)
    sm.accept(tok)
    sm.reset()
    assert sm.mu == 3.0


def test_mirostat_skips_the_sampler_sequence_and_greedy_stays_greedy():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    # top_k 1 would leave one token in the normal chain; Mirostat does not run it
    sm = Sampler(SamplingParams(temp=1.0, top_k=1, mirostat=2, mirostat_tau=5.0, seed=1))
    assert len(sm.post_sampling_probs(logits)[0]) == 4
    greedy = Sampler(SamplingParams(temp=0.0, mirostat=1, seed=1))
    assert all(greedy.sample(logits) == 3 for _ in range(5))
    with pytest.raises(ValueError, match="mirostat"):
        SamplingParams(mirostat=3)


# -- wiring ------------------------------------------------------------------------------------------------------

def test_extras_leave_the_device_chain():
    from llamacmp.engine.decode import plan_row
    from llamacmp.engine.speculative import history_free_greedy
    from llamacmp.engine.turn import fast_greedy
    for kw in (dict(top_n_sigma=1.0), dict(xtc_probability=0.5), dict(dynatemp_range=0.5), dict(mirostat=2)):
        s = Sampler(SamplingParams(temp=0.0, **kw))
        assert not s.params.plain
        assert plan_row(s, 1000, 1024, 1024).kind == "host"
        assert not history_free_greedy(s) and fast_greedy(s.params, np.zeros(8)) is None
    s = Sampler(SamplingParams(temp=0.0))
    assert s.params.plain and plan_row(s, 1000, 1024, 1024).kind == "argmax"
    # dynamic temperature around 0 samples: not greedy
    assert SamplingParams(temp=0.0).greedy and not SamplingParams(temp=0.0, dynatemp_range=0.5).greedy


# -- adaptive-p --------------------------------------------------------------------------------------------------

def test_adaptive_p_draws_near_its_target_and_averages_what_it_drew():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs)
    p = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, samplers=("temperature", "adaptive_p"),
                       adaptive_target=0.3, adaptive_decay=0.5, seed=2)
    s = Sampler(p)
    assert not p.plain and p.random_chain and p.adaptive_on
    ids, got = s.post_sampling_probs(logits)
    # before any draw the average is the target itself: aim = 2 * 0.3 - 0.3
    d = np.abs(probs - 0.3) / 0.3
    want = np.exp(5 - 10 * d * d / (1 + d))
    want /= want.sum()
    order = np.argsort(-want, kind="stable")
    assert list(ids) == list(order) and np.allclose(got, want[order])
    tok = s.sample(logits)
    s.accept(tok)
    # the average takes the drawn token's probability before the transform: sum = p + decay * 0.3/0.5
    assert s._ada_sum == pytest.approx(probs[tok] + 0.5 * 0.6) and s._ada_weight == pytest.approx(1 + 0.5 * 2)
    # a token accepted that adaptive-p did not draw (a prompt token) leaves the average alone
    s.accept(3)
    assert s._ada_weight == pytest.approx(2.0)


def test_adaptive_p_off_and_by_letter():
    from llamacmp.sampling import parse_sampler_letters, parse_sampler_names
    assert parse_sampler_letters("kta") == ("top_k", "temperature", "adaptive_p")
    assert parse_sampler_names("top_k;adaptive-p") == ("top_k", "adaptive_p")
    # a negative target draws from the chain's own distribution
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    s = Sampler(SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, samplers=("temperature", "adaptive_p")))
    assert np.allclose(s.post_sampling_probs(logits)[1], [0.5, 0.3, 0.2])
    # named but Mirostat on: Mirostat's chain
    assert not SamplingParams(samplers=("adaptive_p",), mirostat=2).adaptive_on
