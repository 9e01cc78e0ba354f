"""The two-kernel split of the chunked delta rule (cuda_src/gdn.cu: gdn_chunk_intra_kernel, then
gdn_chunk_state_kernel), checked on the CPU: numpy_ref's gdn_chunk_intra (T = (I + A)^-1 by blocked inversion,
W, U, M) followed by gdn_chunk_state (the chunk recurrence D = U - W S0) equals gdn_chunked and the recurrence, in
float64 to rounding and in float32 to the CUDA tests' tolerance."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.backends.numpy_ref import (gdn_chunk_intra, gdn_chunk_state, gdn_chunked, gdn_recurrent,
                                         unit_lower_inverse)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _case(L, dk, dv, seed, dtype=np.float64):
    """Inputs as the kernels see them: q, k L2-normalised (q scaled by 1/sqrt(dk)), g <= 0, b in [0, 1]."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((L, dk))
    k = rng.standard_normal((L, dk))
    q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((L, dv))
    g = -rng.uniform(0.0, 1.5, L)
    b = rng.uniform(0.0, 1.0, L)
    S0 = rng.standard_normal((dk, dv))
    return tuple(a.astype(dtype) for a in (q, k, v, g, b, S0))


@pytest.mark.parametrize("n", [16, 32, 64])
def test_blocked_unit_lower_inverse(n):
    rng = np.random.default_rng(n)
    A = np.tril(rng.standard_normal((n, n)), -1) * 0.5
    T = unit_lower_inverse(A)
    assert np.allclose(T, np.tril(T))                      # unit lower triangular
    assert np.allclose(np.diag(T), 1.0)
    assert np.abs((np.eye(n) + A) @ T - np.eye(n)).max() < 1e-9


@pytest.mark.parametrize("L", [1, 63, 64, 65, 200, 1000])
@pytest.mark.parametrize("dk", [64, 128])
def test_wy_split_equals_chunked_fp64(L, dk):
    q, k, v, g, b, S0 = _case(L, dk, dk, seed=L + dk)
    W, U, M, G = gdn_chunk_intra(q, k, v, g, b)
    assert W.shape == (-(-L // 64), 64, dk) and M.shape[1:] == (64, 64)
    n_last = L - (len(W) - 1) * 64                          # padding rows are exactly 0, G flat past them
    assert not W[-1, n_last:].any() and not U[-1, n_last:].any() and not M[-1, n_last:].any()
    assert np.all(G[-1, n_last:] == G[-1, n_last - 1])
    o, S = gdn_chunk_state(q, k, W, U, M, G, S0)
    o_c, S_c = gdn_chunked(q, k, v, g, b, S0)
    assert _rel(o, o_c) < 1e-10 and _rel(S, S_c) < 1e-10
    if L <= 200:
        o_r, S_r = gdn_recurrent(q, k, v, g, b, S0)
        assert _rel(o, o_r) < 1e-10 and _rel(S, S_r) < 1e-10


def test_wy_deltas_are_the_solve():
    """D = U - W S0 is gdn_chunked's D = (I + A)^-1 diag(b) (V - diag(e^G) K S0), chunk 0."""
    q, k, v, g, b, S0 = _case(64, 32, 16, seed=3)
    W, U, _, G = gdn_chunk_intra(q, k, v, g, b)
    decay = np.exp(np.tril(G[0][:, None] - G[0][None, :]))
    A = b[:, None] * decay * (k @ k.T) * np.tril(np.ones((64, 64)), -1)
    D = np.linalg.solve(np.eye(64) + A, b[:, None] * (v - np.exp(G[0])[:, None] * (k @ S0)))
    assert _rel(U[0] - W[0] @ S0, D) < 1e-12


@pytest.mark.parametrize("L,dk", [(1000, 128), (130, 64), (77, 16)])
def test_wy_split_fp32(L, dk):
    """In float32 throughout (the kernels' precision) the split stays within FP32_TOL of the fp64 reference."""
    q, k, v, g, b, S0 = _case(L, dk, dk, seed=L)
    o_ref, S_ref = gdn_chunked(q, k, v, g, b, S0)
    f = [a.astype(np.float32) for a in (q, k, v, g, b, S0)]
    W, U, M, G = gdn_chunk_intra(*f[:5])
    assert {a.dtype for a in (W, U, M, G)} == {np.dtype(np.float32)}
    o, S = gdn_chunk_state(f[0], f[1], W, U, M, G, f[5])
    assert o.dtype == np.float32
    assert _rel(o, o_ref) < 1e-4 and _rel(S, S_ref) < 1e-4
