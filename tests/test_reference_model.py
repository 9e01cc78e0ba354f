"""The numpy reference forward: prefill == token-by-token decode, chunked GDN == recurrent GDN, a batch of
sequences == each sequence alone."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend, gdn_chunked, gdn_recurrent
from llamacmp.loader import load_model


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("length", [1, 7, 64, 65, 130])
def test_chunked_gdn_equals_recurrent(length):
    rng = np.random.default_rng(length)
    dk, dv = 16, 24
    q = rng.standard_normal((length, dk)) / 4
    k = rng.standard_normal((length, dk))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((length, dv))
    g = -rng.uniform(0.0, 2.0, length)            # log-decay <= 0
    b = rng.uniform(0.0, 1.0, length)
    S0 = rng.standard_normal((dk, dv))
    o_r, S_r = gdn_recurrent(q, k, v, g, b, S0)
    o_c, S_c = gdn_chunked(q, k, v, g, b, S0)
    assert _rel(o_c, o_r) < 1e-10
    assert _rel(S_c, S_r) < 1e-10


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_prefill_equals_stepwise_decode(fixture_gguf, dtype, kv_type):
    lm = load_model(fixture_gguf("tiny", dtype), NumpyBackend())
    be, cfg = lm.backend, lm.cfg
    ids = list(np.random.default_rng(5).integers(0, cfg.n_vocab, 37))
    s_pre = be.new_state(cfg, 64, kv_type)
    logits_pre = lm.model.forward(StepBatch.build([(s_pre, ids)], all_logits=True))
    s_dec = be.new_state(cfg, 64, kv_type)
    logits_dec = np.concatenate([lm.model.forward(StepBatch.build([(s_dec, [t])])) for t in ids])
    assert logits_pre.shape == (37, cfg.n_vocab)
    # Only summation order differs; with an f16 cache a value on a rounding boundary may land one f16 ulp away.
    tol = 1e-5 if kv_type == "f32" else 1e-3
    assert _rel(logits_pre, logits_dec) < tol
    a, b = be.state_to_host(s_pre), be.state_to_host(s_dec)
    for key in ("k", "v", "conv", "ssm"):
        for x, y in zip(a[key], b[key]):
            assert _rel(x, y) < tol, key


def test_batch_of_sequences_equals_each_alone(fixture_gguf):
    lm = load_model(fixture_gguf("tiny", "q8_0"), NumpyBackend())
    be, cfg = lm.backend, lm.cfg
    rng = np.random.default_rng(9)
    prompts = [list(rng.integers(0, cfg.n_vocab, n)) for n in (5, 1, 12)]
    alone = []
    for p in prompts:
        s = be.new_state(cfg, 32)
        alone.append(lm.model.forward(StepBatch.build([(s, p)]))[0])
    states = [be.new_state(cfg, 32) for _ in prompts]
    together = lm.model.forward(StepBatch.build(list(zip(states, prompts))))
    assert _rel(together, np.stack(alone)) < 1e-5
    # Continue: one decode step for all three at different positions.
    nxt = [[int(np.argmax(row))] for row in together]
    step = lm.model.forward(StepBatch.build(list(zip(states, nxt))))
    for i, p in enumerate(prompts):
        s = be.new_state(cfg, 32)
        ref = lm.model.forward(StepBatch.build([(s, p + nxt[i])]))[0]
        assert _rel(step[i], ref) < 1e-5


def test_context_overflow_is_refused(fixture_gguf):
    lm = load_model(fixture_gguf("tiny", "f32"), NumpyBackend())
    s = lm.backend.new_state(lm.cfg, 4)
    with pytest.raises(ValueError, match="context is 4"):
        StepBatch.build([(s, [1, 2, 3, 4, 5])])
