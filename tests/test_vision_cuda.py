"""The vision tower's CUDA ops (cuda_src/dense.cu, cuda_src/vision.cu) against numpy_ref (the specification), on
fresh seeded random inputs with odd sizes (1, primes, 2^k +- 1) and the real Qwen3-VL tower's widths (E 1152,
16 heads of 72). Outputs are poisoned with NaN first (the arena hands the poisoned blocks back to the op), so an
element the kernel fails to write shows up as NaN.

Tolerances (relative L2 error, written per test): fp32 paths 1e-4; f16-weight projections 1e-3 (the kernel and the
reference both round x to f16 and multiply f16 values exactly; only the fp32 summation order differs, but the
products' dynamic range is that of f16 data).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from cuda_helpers import SMEM_CAPS, poison, rel, up

from llamacmp.backends.base import Segment, SeqState, StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.config import ModelConfig

pytestmark = pytest.mark.cuda

FP32_TOL = 1e-4
F16_TOL = 1e-3
REF = NumpyBackend()


# -- dense projections (matmuls with f32 / f16 weights -> cmp_matmul_dense) ---------------------------------------

DENSE_SHAPES = [  # (T, rows, n): T <= 8 the GEMV; then the 64-tile GEMM; >= 128 big tiles the 128-tile GEMM.
    (1, 1, 1), (1, 127, 1152), (2, 33, 3), (3, 257, 31), (5, 65, 129), (8, 1, 4097),
    (9, 63, 17), (17, 97, 257), (31, 255, 1152), (65, 200, 63), (129, 33, 1025), (257, 1153, 64),
    (1025, 2049, 36), (2047, 1153, 129),
]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("T,rows,n", DENSE_SHAPES)
def test_matmul_dense(cuda_backend, dtype, T, rows, n):
    rng = np.random.default_rng(T * 7919 + rows * 31 + n)
    x = rng.standard_normal((T, n)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    w = (rng.standard_normal((rows, n)) / math.sqrt(n)).astype(np.float16 if dtype == "f16" else np.float32)
    ref = REF.matmuls(x, [REF.upload_matrix(w)])[0]
    poison(cuda_backend, (T, rows))
    got = cuda_backend.matmuls(up(cuda_backend, x), [cuda_backend.upload_matrix(w)])[0]
    assert rel(cuda_backend.to_host(got), ref) < (F16_TOL if dtype == "f16" else FP32_TOL)


def test_matmul_dense_rounds_x_for_f16_weights(cuda_backend):
    """x values that f16 cannot hold: the result must be that of the f16-rounded x (the spec), not of x."""
    rng = np.random.default_rng(11)
    x = (1.0 + rng.uniform(1e-4, 4e-4, (3, 64))).astype(np.float32)    # below f16's 2^-10 step near 1
    w = np.ones((5, 64), np.float16)
    got = cuda_backend.to_host(cuda_backend.matmuls(up(cuda_backend, x), [cuda_backend.upload_matrix(w)])[0])
    assert np.array_equal(got, np.full((3, 5), 64.0, np.float32))
    assert np.array_equal(got, REF.matmuls(x, [REF.upload_matrix(w)])[0])


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_matmul_dense_batch_invariant_when_capturing(cuda_backend, monkeypatch, dtype):
    """Each row of the GEMV (T <= 8) is summed alone: bit-identical alone or among 8; a captured step of 13 rows
    (launched 8 + 5) gives every row its alone result, as the Q8 path does for decode graphs."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((13, 257)).astype(np.float32)
    w = cuda_backend.upload_matrix(rng.standard_normal((129, 257)).astype(np.float16 if dtype == "f16" else np.float32))
    alone = np.concatenate([cuda_backend.to_host(cuda_backend.matmuls(up(cuda_backend, x[t:t + 1]), [w])[0])
                            for t in range(13)])
    assert np.array_equal(cuda_backend.to_host(cuda_backend.matmuls(up(cuda_backend, x[:8]), [w])[0]), alone[:8])
    monkeypatch.setattr(cuda_backend, "capturing", True)
    assert np.array_equal(cuda_backend.to_host(cuda_backend.matmuls(up(cuda_backend, x), [w])[0]), alone)


# -- row-wise / element-wise -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("T,N", [(1, 1), (3, 17), (129, 1152), (33, 4097)])
def test_bias_add(cuda_backend, T, N):
    rng = np.random.default_rng(T + N)
    x, b = rng.standard_normal((T, N)).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    poison(cuda_backend, (T, N))
    got = cuda_backend.bias_add(up(cuda_backend, x), cuda_backend.upload_vector(b))
    assert rel(cuda_backend.to_host(got), REF.bias_add(x, b)) < FP32_TOL


@pytest.mark.parametrize("T,D", [(1, 1), (2, 3), (7, 31), (5, 257), (65, 1152), (3, 4097)])
def test_layernorm(cuda_backend, T, D):
    rng = np.random.default_rng(T * 13 + D)
    # a large per-row offset: the two-pass variance must not cancel it away
    x = (rng.standard_normal((T, D)) + rng.uniform(-50, 50, (T, 1))).astype(np.float32)
    w, b = rng.standard_normal(D).astype(np.float32), rng.standard_normal(D).astype(np.float32)
    eps = 1e-6
    poison(cuda_backend, (T, D))
    got = cuda_backend.layernorm(up(cuda_backend, x), cuda_backend.upload_vector(w), cuda_backend.upload_vector(b),
                                 eps)
    assert rel(cuda_backend.to_host(got), REF.layernorm(x, w, b, eps)) < FP32_TOL


@pytest.mark.parametrize("T,N", [(1, 1), (7, 31), (17, 4304), (3, 4097)])
def test_gelu(cuda_backend, T, N):
    rng = np.random.default_rng(T + 3 * N)
    x = rng.uniform(-12, 12, (T, N)).astype(np.float32)
    x.flat[0] = 0.0
    poison(cuda_backend, (T, N))
    got = cuda_backend.to_host(cuda_backend.gelu(up(cuda_backend, x)))
    ref = REF.gelu(x)
    assert rel(got, ref) < FP32_TOL
    # bit-identical: the kernel looks f16(x) up in a table of the reference formula, rounded as the reference does
    assert np.array_equal(got, ref)


# -- vision rotary ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T,H,Dh,sections", [
    (1, 1, 4, (1, 1, 1, 1)),
    (7, 3, 64, (16, 16, 16, 16)),
    (33, 16, 72, (18, 18, 18, 18)),      # the real Qwen3-VL tower: E 1152, 16 heads
    (17, 5, 80, (20, 20, 20, 20)),
    (65, 2, 128, (32, 32, 32, 32)),
    (13, 3, 32, (3, 5, 2, 6)),           # uneven sections, summing to the Dh/2 pairs: every axis is reached
    (11, 2, 40, (2, 3, 1, 1)),           # the sector wraps (sum 7 < 20 pairs)
])
def test_rope_vision(cuda_backend, T, H, Dh, sections):
    rng = np.random.default_rng(T * H + Dh)
    x = rng.standard_normal((T, H * Dh)).astype(np.float32)
    pos = rng.integers(0, 64, (T, 4)).astype(np.int32)
    poison(cuda_backend, (T, H * Dh))
    got = cuda_backend.rope_vision(up(cuda_backend, x), pos, H, Dh, sections, 10000.0)
    ref = REF.rope_vision(x, pos, H, Dh, sections, 10000.0)
    assert rel(cuda_backend.to_host(got), ref) < FP32_TOL


# -- full (non-causal) attention --------------------------------------------------------------------------------------

@pytest.mark.parametrize("T,H,Dh", [
    (1, 1, 1), (2, 3, 8), (63, 2, 33), (64, 1, 64), (65, 3, 72), (127, 2, 80), (257, 2, 128), (129, 16, 72),
    (1025, 1, 72),
])
def test_attention_full(cuda_backend, smem_cap, T, H, Dh):
    """Under each older card's shared memory (smem_cap): 32 queries per block where 64 do not fit (sm_61 at the
    vision head dims 64-80); head dim 128 does not fit sm_61 at all and says so."""
    rng = np.random.default_rng(T * 17 + H * 5 + Dh)
    q, k, v = (rng.standard_normal((T, H * Dh)).astype(np.float32) * 2 for _ in range(3))
    scale = 1.0 / math.sqrt(Dh)
    poison(cuda_backend, (T, H * Dh))
    if smem_cap == SMEM_CAPS["sm61"] and Dh > 80:
        from llamacmp.lib._native import NativeError
        with pytest.raises(NativeError, match=r"attention_full_kernel needs 59392 B .* allows 49152 B"):
            cuda_backend.attention_full(up(cuda_backend, q), up(cuda_backend, k), up(cuda_backend, v), H, Dh, scale)
        return
    got = cuda_backend.attention_full(up(cuda_backend, q), up(cuda_backend, k), up(cuda_backend, v), H, Dh, scale)
    assert rel(cuda_backend.to_host(got), REF.attention_full(q, k, v, H, Dh, scale)) < FP32_TOL


def test_attention_full_fused_qkv_views(cuda_backend):
    """q, k, v as column views of one [T, 3*H*Dh] projection (the ld arguments of cmp_attention_full)."""
    T, H, Dh = 97, 3, 72
    E = H * Dh
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((T, 3 * E)).astype(np.float32)
    d = up(cuda_backend, qkv)
    out = cuda_backend.empty((T, E))
    cuda_backend.native.cmp_attention_full(d.ptr, d.ptr + 4 * E, d.ptr + 8 * E, out.ptr, T, H, Dh, 3 * E, 3 * E,
                                           3 * E, 0.125)
    ref = REF.attention_full(qkv[:, :E].copy(), qkv[:, E:2 * E].copy(), qkv[:, 2 * E:].copy(), H, Dh, 0.125)
    assert rel(cuda_backend.to_host(out), ref) < FP32_TOL


# -- the text model's attention_prep with image positions (IMROPE) --------------------------------------------------

def _cfg(Hq, Hk, Dh, n_rot, sections) -> ModelConfig:
    return ModelConfig(n_layer=4, n_embd=64, n_ff=128, n_head=Hq, n_head_kv=Hk, head_dim=Dh, n_vocab=97,
                       n_ctx_train=4096, rms_eps=1e-6, rope_base=1e7, n_rot=n_rot, rope_sections=sections,
                       conv_kernel=4, ssm_k_heads=2, ssm_v_heads=4, ssm_head_dim=32, full_attention_interval=4)


def _batch(positions, rope_pos) -> StepBatch:
    T = len(positions)
    st = SeqState(n_ctx=1 << 20, k=[], v=[], conv=[], ssm=[])
    return StepBatch(np.zeros(T, np.int32), np.asarray(positions, np.int32), [Segment(0, T, st)],
                     np.asarray([T - 1], np.int32), rope_pos=rope_pos)


@pytest.mark.parametrize("T,Hq,Hk,Dh,n_rot,sections", [
    (1, 1, 1, 32, 32, (5, 5, 6, 0)),
    (37, 4, 2, 256, 64, (11, 11, 10, 0)),    # Qwen3.5's shapes
    (17, 3, 1, 72, 24, (3, 2, 1, 0)),        # sum 6 < 12 pairs: the sector wraps, pos[e] is used
    (9, 2, 2, 64, 64, (4, 4, 4, 4)),         # a fourth section
])
def test_attention_prep_image_positions(cuda_backend, T, Hq, Hk, Dh, n_rot, sections):
    rng = np.random.default_rng(T + Dh + n_rot)
    cfg = _cfg(Hq, Hk, Dh, n_rot, sections)
    qg = rng.standard_normal((T, Hq * 2 * Dh)).astype(np.float32)
    k = rng.standard_normal((T, Hk * Dh)).astype(np.float32)
    qn, kn = rng.standard_normal(Dh).astype(np.float32), rng.standard_normal(Dh).astype(np.float32)
    p0 = 100_000                                             # long-context positions: angles in the 1e5 rad range
    pos = np.arange(p0, p0 + T, dtype=np.int32)
    rope_pos = np.stack([np.full(T, p0), p0 + rng.integers(0, 40, T), p0 + rng.integers(0, 40, T),
                         rng.integers(0, 3, T)], axis=1).astype(np.int32)
    batch = _batch(pos, rope_pos)
    ref = REF.attention_prep(qg, k, qn, kn, batch, cfg)
    poison(cuda_backend, (T, Hq, Dh), (T, Hk, Dh), (T, Hq * Dh))
    got = cuda_backend.attention_prep(up(cuda_backend, qg), up(cuda_backend, k), up(cuda_backend, qn),
                                      up(cuda_backend, kn), _batch(pos, rope_pos), cfg)
    for g, r in zip(got, ref):
        assert rel(cuda_backend.to_host(g), r) < FP32_TOL


def test_key_prep_image_positions(cuda_backend):
    """key_prep at image positions (the IMROPE kernel with Hq = 0): the reference's, and attention_prep's k to the
    bit."""
    T, Hq, Hk, Dh, n_rot = 37, 4, 2, 256, 64
    cfg = _cfg(Hq, Hk, Dh, n_rot, (11, 11, 10, 0))
    rng = np.random.default_rng(37)
    qg = rng.standard_normal((T, Hq * 2 * Dh)).astype(np.float32)
    k = rng.standard_normal((T, Hk * Dh)).astype(np.float32)
    qn, kn = rng.standard_normal(Dh).astype(np.float32), rng.standard_normal(Dh).astype(np.float32)
    pos = np.arange(100, 100 + T, dtype=np.int32)
    rope_pos = np.stack([pos, 100 + rng.integers(0, 40, T), 100 + rng.integers(0, 40, T), rng.integers(0, 3, T)],
                        axis=1).astype(np.int32)
    ref = REF.key_prep(k, kn, _batch(pos, rope_pos), cfg)
    got = cuda_backend.to_host(cuda_backend.key_prep(up(cuda_backend, k), up(cuda_backend, kn), _batch(pos, rope_pos),
                                                     cfg))
    assert rel(got, ref) < FP32_TOL
    _, k_full, _ = cuda_backend.attention_prep(up(cuda_backend, qg), up(cuda_backend, k), up(cuda_backend, qn),
                                               up(cuda_backend, kn), _batch(pos, rope_pos), cfg)
    assert np.array_equal(got, cuda_backend.to_host(k_full))


def test_attention_prep_equal_positions_is_text_rope(cuda_backend):
    """Four equal position ids per token give exactly the text path's rotation (the two CUDA kernels agree)."""
    T, Hq, Hk, Dh = 19, 4, 2, 256
    cfg = _cfg(Hq, Hk, Dh, 64, (11, 11, 10, 0))
    rng = np.random.default_rng(19)
    qg, k = up(cuda_backend, rng.standard_normal((T, Hq * 2 * Dh))), up(cuda_backend, rng.standard_normal((T, Hk * Dh)))
    qn, kn = up(cuda_backend, rng.standard_normal(Dh)), up(cuda_backend, rng.standard_normal(Dh))
    pos = np.arange(5000, 5000 + T, dtype=np.int32)
    text = cuda_backend.attention_prep(qg, k, qn, kn, _batch(pos, None), cfg)
    image = cuda_backend.attention_prep(qg, k, qn, kn, _batch(pos, np.repeat(pos[:, None], 4, axis=1)), cfg)
    for a, b in zip(text, image):
        assert np.array_equal(cuda_backend.to_host(a), cuda_backend.to_host(b))
