"""The tensor-core prefill GEMM's weight forms (cuda_src/matmul_mma.cu) beyond test_quant_cuda's sweep per route.

The types with mins take their own stage layout and epilogue there: PER32 (Q4_1, Q5_1, Q4_K, Q5_K) one min per
32-value block, multiplied by the block's activation sum (the two half sums added) and added by one FFMA; Q2_K
(PER16) one FFMA per half. They run here at row and token counts that leave partial 128 x 128 tiles, rows long enough
for many stages (and a K tail where the stage's blocks do not divide the row), several matrices with residuals in
one call, under each shared-memory size that picks another ring (sm_75's 64 KB: two stages of 2 blocks; sm_70's
96 KB: four of 2; the device's: four of 4), against the exact math at test_quant_cuda's tolerance (2e-6). The forms
without mins keep the DP4A GEMM's arithmetic bit for bit (scaled_dot takes the magic bias off inside the scale's
FMA: the same rounding), so their results equal the DP4A route's. The int8 kernel reads Q2_K, Q4_K and Q5_K from
their repacked planes (no expansion pass: matmul_mma.cu's direct form) up to a number of tokens a call (4096, Q5_K
1024), decoding each block as expand_kernel does, so these tests cover that form for those types.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cuda_helpers import SMEM_CAPS, captured, poison, rel, up
from test_quant_cuda import TOL, exact, inputs

from llamacmp.backends.arena_sizes import exact as arena_exact
from llamacmp.fixtures.quant_blocks import random_blocks
from llamacmp.gguf_file import GRID_TYPES, QUANT_BLOCKS

pytestmark = pytest.mark.cuda

MIN_TYPES = ["Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q2_K"]
NO_MIN_TYPES = ["Q4_0", "Q5_0", "IQ4_NL", "IQ4_XS", "Q3_K", "Q6_K", *GRID_TYPES]
PER16_TYPES = {"Q3_K", "Q6_K", "Q2_K", "IQ2_XS", "IQ2_S", "IQ1_M"}   # a scale per 16-value half
# read from their planes by the int8 kernel (gemm_mma_planes) up to these tokens a call (planes_max_tokens)
DIRECT_TYPES = {"Q2_K": 4096, "Q4_K": 4096, "Q5_K": 1024}


@pytest.fixture
def mma_backend(cuda_backend):
    """cuda_backend with the prefill GEMM on the device's tensor-core route (the int8 kernel from compute_75 code)."""
    be, saved = cuda_backend, cuda_backend.routes
    if not be.native.mma_available():
        pytest.skip("the mma route needs compute capability 7.0+ code for this device (mma.sync)")
    be.routes = replace(saved, matmul_prefill="mma")
    yield be
    be.routes = saved


def long_n(type_name: str) -> int:
    """A row of many stages: 37 blocks of 32 (9 stages of 4 and a 1-block tail, 18 of 2 and a tail) or 5 blocks of
    256 (40 sub-blocks: 10 stages of 4)."""
    values = QUANT_BLOCKS[type_name][0]
    return values * (37 if values == 32 else 5)


@pytest.mark.parametrize("cap", ["sm75", "sm70", "device"])
@pytest.mark.parametrize("T", [17, 131, 300])
@pytest.mark.parametrize("type_name", MIN_TYPES)
def test_min_forms(mma_backend, type_name, T, cap):
    """Three matrices (1, 129 and 257 rows) of a type with mins, each with its residual, in one call."""
    be = mma_backend
    rng = np.random.default_rng(T * 7 + len(type_name))
    n = long_n(type_name)
    ws = [random_blocks(type_name, r, n, rng) for r in (1, 129, 257)]
    x = inputs(T + 3, T, n)
    res = [rng.standard_normal((T, w.shape[0])).astype(np.float32) for w in ws]
    be.native.cmp_set_smem_cap(SMEM_CAPS[cap])
    try:
        poison(be, *[(T, w.shape[0]) for w in ws])
        xq, xd = be.quantize(up(be, x))
        got = be._q8_project(xq, xd, [be.upload_matrix(w) for w in ws], [up(be, r) for r in res])
        for g, w, r in zip(got, ws, res):
            assert rel(be.to_host(g), exact(x, w) + r) < TOL
    finally:
        be.native.cmp_set_smem_cap(0)


@pytest.mark.parametrize("type_name", MIN_TYPES)
def test_min_forms_large_mins(mma_backend, type_name):
    """Activations all positive: every block's activation sum is large and of one sign, so the mins' terms are a
    large share of each output and add up over the blocks instead of averaging out (200 rows, 150 tokens)."""
    be = mma_backend
    rng = np.random.default_rng(31)
    n = long_n(type_name)
    w = random_blocks(type_name, 200, n, rng)
    x = np.abs(inputs(8, 150, n)) + 0.5   # all positive: the activation sums, and so the min terms, add up
    got = be.to_host(be.matmuls(up(be, x), [be.upload_matrix(w)])[0])
    assert rel(got, exact(x, w)) < TOL


@pytest.mark.parametrize("gemm", ["auto", "hmma"])
@pytest.mark.parametrize("type_name", NO_MIN_TYPES)
def test_forms_without_mins_equal_the_dp4a_route(mma_backend, type_name, gemm):
    """Without mins the tensor-core GEMMs' fp32 arithmetic is the DP4A GEMM's, in the same block order: the same bits
    (rows and tokens past one tile, several stages). Volta's f16 HMMA GEMM (gemm "hmma", and what "auto" runs on
    compute_70 code) scales each half of a PER16 block on its own: those types within fp32 rounding of the DP4A route."""
    be = mma_backend
    if gemm == "hmma" and not be.native.hmma_available():
        pytest.skip("Volta's f16 HMMA GEMM needs compute capability 7.0+ code for this device (mma.sync m8n8k4)")
    halves_alone = (gemm == "hmma" or not be.native.mma_int8_available()) and type_name in PER16_TYPES
    rng = np.random.default_rng(41)
    n = long_n(type_name)
    w = be.upload_matrix(random_blocks(type_name, 131, n, rng))
    x = up(be, inputs(5, 140, n))
    saved = be.routes
    be.mma_gemm = gemm
    try:
        mma = be.to_host(be.matmuls(x, [w])[0])
        be.routes = replace(saved, matmul_prefill="dp4a")
        dp4a = be.to_host(be.matmuls(x, [w])[0])
    finally:
        be.routes, be.mma_gemm = saved, "auto"
    if halves_alone:
        assert rel(mma, dp4a) < 1e-6   # fp32 rounding of the per-half terms: ~1e-7 over a row's blocks
    else:
        np.testing.assert_array_equal(mma, dp4a)


@pytest.mark.parametrize("cap", ["sm75", "device"])
@pytest.mark.parametrize("T", [17, 128, 513])
@pytest.mark.parametrize("type_name", list(DIRECT_TYPES))
def test_direct_types_in_one_launch(mma_backend, type_name, T, cap):
    """The types the int8 kernel decodes in its stage loads: four matrices of odd row counts (1, 127, 66, 129: the
    first two fill the first 128-row tile, the third and fourth meet inside the second) with residuals in one
    launch after the half sums (all of them have mins), each matrix's bits those of the matrix alone, against the
    exact math. sm75's cap: stages of 2 blocks (half the threads hold a weight item); the device's: 4 blocks (every
    thread one)."""
    be = mma_backend
    if not be.native.mma_int8_available():
        pytest.skip("the direct form is the int8 kernel's (compute_75+ code)")
    rng = np.random.default_rng(T * 3 + len(type_name))
    n = long_n(type_name)
    ws = [random_blocks(type_name, r, n, rng) for r in (1, 127, 66, 129)]
    x = inputs(T + 5, T, n)
    res = [rng.standard_normal((T, w.shape[0])).astype(np.float32) for w in ws]
    saved = be.routes
    be.native.cmp_set_smem_cap(SMEM_CAPS[cap])
    try:
        poison(be, *[(T, w.shape[0]) for w in ws])
        mats = [be.upload_matrix(w) for w in ws]
        xq, xd = be.quantize(up(be, x))
        dres = [up(be, r) for r in res]
        group, launches = captured(be, lambda: be._q8_project(xq, xd, mats, dres))
        alone = [captured(be, lambda: be._q8_project(xq, xd, [m], [r]))[0][0] for m, r in zip(mats, dres)]
    finally:
        be.native.cmp_set_smem_cap(0)
    assert launches == 2   # the half sums, then the GEMM
    for g, a, w, r in zip(group, alone, ws, res):
        np.testing.assert_array_equal(g, a)
        assert rel(g, exact(x, w) + r) < TOL


@pytest.mark.parametrize("type_name", list(DIRECT_TYPES))
def test_direct_types_up_to_their_tokens(mma_backend, type_name):
    """Past its tokens a call (where the expansion pass costs less than decoding in every token tile), a direct
    type is expanded first, as the others: more launches than the half sums and the GEMM, the same bits (one
    decode) on the tokens both calls share; the workspace the backend asks for (the memory plan's measure) is the
    half sums alone up to the limit, the expanded rows past it."""
    be, rng, limit = mma_backend, np.random.default_rng(len(type_name)), DIRECT_TYPES[type_name]
    if not be.native.mma_int8_available():
        pytest.skip("the direct form is the int8 kernel's (compute_75+ code)")
    n = long_n(type_name)
    w = random_blocks(type_name, 129, n, rng)
    x = inputs(limit + 9, limit + 1, n)
    mat = be.upload_matrix(w)
    ys, counts = [], []
    for T in (limit, limit + 1):
        xq, xd = be.quantize(up(be, x[:T]))
        (y,), launches = captured(be, lambda: be._q8_project(xq, xd, [mat]))
        ys.append(y)
        counts.append(launches)
    assert counts[0] == 2 and counts[1] > 2, counts
    np.testing.assert_array_equal(ys[0], ys[1][:limit])
    halves = arena_exact(limit * (n // 16) * 4)            # the half sums (every direct type has mins)
    work = [be.gemm_work_bytes(type_name, T, n, 129) for T in (limit, limit + 1)]
    assert work[0] == halves and work[1] > halves + 129 * n, work
    assert rel(ys[1], exact(x[:limit + 1], w)) < TOL
