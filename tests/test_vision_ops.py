"""The vision encoder's backend ops in the numpy reference, each against a second, loop-by-loop statement of the
same contract (base.Backend docstrings), and the text side's IMROPE against NeoX for text positions."""
import math

import numpy as np
import pytest

from llamacmp.backends.numpy_ref import NumpyBackend, rope_imrope, rope_neox

be = NumpyBackend()
rng = np.random.default_rng(7)


def _rope_vision_loop(x, pos, H, Dh, sections, theta):
    """ggml's VISION mrope as a plain loop: per-section theta restarts, pairs (i, i + Dh/2)."""
    n_dims = Dh // 2
    scale = theta ** (-2.0 / n_dims)
    out = x.astype(np.float64).reshape(len(x), H, Dh).copy()
    s0, s1, s2, s3 = sections
    for t in range(len(x)):
        th = [0.0] * 4
        for i in range(n_dims):
            sector = i % (s0 + s1 + s2 + s3)
            for a, first in enumerate((0, s0, s0 + s1, s0 + s1 + s2)):
                if sector == first:
                    th[a] = float(pos[t, a])
            a = 0 if sector < s0 else 1 if sector < s0 + s1 else 2 if sector < s0 + s1 + s2 else 3
            ang = th[a]
            for h in range(H):
                x0, x1 = out[t, h, i], out[t, h, i + n_dims]
                out[t, h, i] = x0 * math.cos(ang) - x1 * math.sin(ang)
                out[t, h, i + n_dims] = x0 * math.sin(ang) + x1 * math.cos(ang)
            th = [v * scale for v in th]
    return out.reshape(len(x), H * Dh)


@pytest.mark.parametrize("T,H,Dh", [(1, 1, 8), (7, 2, 16), (12, 3, 32)])
def test_rope_vision_matches_loop(T, H, Dh):
    x = rng.standard_normal((T, H * Dh)).astype(np.float32)
    pos = rng.integers(0, 40, (T, 4)).astype(np.int32)
    sec = (Dh // 4,) * 4
    got = be.rope_vision(x, pos, H, Dh, sec, 10000.0)
    np.testing.assert_allclose(got, _rope_vision_loop(x, pos, H, Dh, sec, 10000.0), rtol=1e-5, atol=1e-5)


def test_layernorm_bias_gelu():
    x = rng.standard_normal((5, 33)).astype(np.float32) * 3 + 1
    w, b = rng.standard_normal(33).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    got = be.layernorm(x, w, b, 1e-6)
    m = x.mean(1, keepdims=True)
    want = (x - m) / np.sqrt(((x - m) ** 2).mean(1, keepdims=True) + 1e-6) * w + b
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(be.bias_add(x, b), x + b, rtol=1e-6)
    vals = (-12.0, -10.0, -1.0, 0.0, 0.1234567, 0.5, 3.0, 9.99, 10.0, 11.5)
    g = be.gelu(np.array([vals], np.float32))[0]

    def table(v):       # ggml-cpu's GGML_GELU_FP16 path, written out: f16 in, f32 formula, f16 out
        if v <= -10:
            return 0.0
        if v >= 10:
            return v
        h = float(np.float16(v))
        return float(np.float16(0.5 * h * (1 + math.tanh(math.sqrt(2 / math.pi) * h * (1 + 0.044715 * h * h)))))
    np.testing.assert_array_equal(g, np.array([table(v) for v in vals], np.float32))
    # the f16 roundings are real: 0.1234567 is not an f16 value and its GELU lands on an f16 grid point
    exact = 0.5 * 0.1234567 * (1 + math.tanh(math.sqrt(2 / math.pi) * (0.1234567 + 0.044715 * 0.1234567 ** 3)))
    assert g[4] != np.float32(exact) and g[4] == float(np.float16(g[4]))
    # not the erf form: at x = -1 they differ by ~1.5e-4 (more than the f16 step there)
    assert abs(g[2] - (-1 * 0.5 * (1 + math.erf(-1 / math.sqrt(2))))) > 1e-4


def test_attention_full_is_noncausal_softmax():
    T, H, Dh = 6, 2, 8
    q, k, v = (rng.standard_normal((T, H * Dh)).astype(np.float32) for _ in range(3))
    got = be.attention_full(q, k, v, H, Dh, 0.3)
    for h in range(H):
        sl = slice(h * Dh, (h + 1) * Dh)
        s = q[:, sl].astype(np.float64) @ k[:, sl].T * 0.3
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(got[:, sl], p @ v[:, sl], rtol=1e-5, atol=1e-6)


def test_matmul_f16_weights_round_activations():
    w = rng.standard_normal((5, 16)).astype(np.float16)
    x = (rng.standard_normal((3, 16)) * 1.2345).astype(np.float32)
    got = be.matmuls(x, [be.upload_matrix(w)])[0]
    want = x.astype(np.float16).astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # and differs from the f32-activation product (x is not f16-exact)
    assert np.abs(got - x.astype(np.float64) @ w.astype(np.float64).T).max() > 0


def test_imrope_text_positions_equal_neox_and_image_positions_differ():
    x = rng.standard_normal((4, 2, 16))
    p = np.array([0, 5, 9, 100])
    same = rope_imrope(x, np.repeat(p[:, None], 4, 1), 16, 1e7, (3, 3, 2, 0))
    np.testing.assert_array_equal(same, rope_neox(x, p, 16, 1e7))
    pos4 = np.stack([p, p + 1, p + 2, 0 * p], 1)
    diff = rope_imrope(x, pos4, 16, 1e7, (3, 3, 2, 0))
    assert np.abs(diff - same).max() > 1e-3
    # pair 1 (sector 1 -> axis h) rotates by the h position
    ang = (p + 1) * 1e7 ** (-2 * 1 / 16)
    np.testing.assert_allclose(diff[:, 0, 1], x[:, 0, 1] * np.cos(ang) - x[:, 0, 9] * np.sin(ang), rtol=1e-9)
