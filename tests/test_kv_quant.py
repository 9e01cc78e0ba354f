"""KV-cache formats (numpy references): llama.cpp's q8_0/q4_0 rounding rules, tq3's size and error, and the
model running with every type (keys and values may differ)."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp import kv_quant
from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.loader import load_model


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_q8_0_and_q4_0_follow_llama_cpp_rules():
    x = np.zeros((1, 32), np.float32)
    x[0, :3] = [-4.0, 2.0, 0.5]
    # q4_0: d = (signed value of largest magnitude)/-8 = 0.5; q = min(15, trunc(x/d + 8.5)); x = (q - 8) d
    np.testing.assert_array_equal(kv_quant.roundtrip(x, "q4_0")[0, :3], [-4.0, 2.0, 0.5])
    x[0, 0] = 127.0                                            # q8_0: d = 1, 0.5 rounds away from zero
    np.testing.assert_array_equal(kv_quant.roundtrip(x, "q8_0")[0, :3], [127.0, 2.0, 1.0])


@pytest.mark.parametrize("kv_type,bound", [("f16", 1e-3), ("q8_0", 1e-2), ("q4_0", 0.12), ("tq3", 0.2)])
def test_roundtrip_error_on_gaussian_data(kv_type, bound):
    x = np.random.default_rng(1).standard_normal((97, 4, 256)).astype(np.float32)
    assert _rel(kv_quant.roundtrip(x, kv_type), x) < bound


def test_tq3_is_small_and_keeps_norms():
    assert kv_quant.BYTES_PER_VALUE["tq3"] / kv_quant.BYTES_PER_VALUE["f16"] <= 0.21
    x = np.random.default_rng(2).standard_normal((5, 256)).astype(np.float32) * 3
    y = kv_quant.roundtrip(x, "tq3")
    # Norm per 128-block is stored (as f16) and restored after rotating back.
    np.testing.assert_allclose(np.linalg.norm(y.reshape(5, 2, 128), axis=-1),
                               np.linalg.norm(x.reshape(5, 2, 128), axis=-1), rtol=2e-3)
    R = kv_quant.tq3_rotation(128)
    np.testing.assert_allclose(R @ R.T, np.eye(128), atol=1e-12)


def test_unknown_type_is_named():
    with pytest.raises(ValueError, match="q5_k"):
        kv_quant.roundtrip(np.zeros((1, 32)), "q5_k")


@pytest.mark.parametrize("k_type,v_type", [("q8_0", "q8_0"), ("q8_0", "tq3"), ("tq3", "tq3"), ("q4_0", "f16")])
def test_model_runs_with_quantized_cache_close_to_f16(fixture_gguf, k_type, v_type):
    lm = load_model(fixture_gguf("tiny", "f32"), NumpyBackend())
    ids = list(np.random.default_rng(3).integers(0, lm.cfg.n_vocab, 40))
    logits = {}
    for kt, vt in ((k_type, v_type), ("f16", "f16")):
        st = lm.backend.new_state(lm.cfg, 64, kt, vt)
        logits[kt, vt] = lm.model.forward(StepBatch.build([(st, ids)], all_logits=True))
    p, q = (np.exp(x - x.max(1, keepdims=True)) for x in (logits["f16", "f16"], logits[k_type, v_type]))
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    kl = float(np.mean(np.sum(p * np.log(p / q), axis=1)))
    assert 0 < kl < 0.05, kl
