"""The CUDA kernels of the block types other than Q8_0 (cuda_src/matmul_quant.cu) against the exact math: every
projection is gguf.quants.dequantize(W) @ (xq * xd)^T in float64, where xq, xd are the Q8 activations the device
makes (numpy_ref.quantize_q8_blocks, equal to cmp_quantize_q8 bit for bit: test_kernels_cuda). Fresh random valid
blocks of every type (fixtures/quant_blocks.py), odd row counts, GEMV (T <= 16) and GEMM (T > 16) sizes.

Tolerance: relative L2 error 2e-6. The kernels' only error is fp32 rounding (per sub-block products, then sums over
n / 32 sub-blocks); a wrong bit in a decoder moves the result by ~1e-2 and more. The same holds for the tensor-core
GEMMs, Volta's f16 HMMA one included (matmul_hmma.cu: the int8 codes as f16 are exact, each block's dot summed in
the f32 accumulator is the exact integer); a fragment-layout mistake there moves results by O(1), and rounding its
operands to f16 instead of using the codes by ~1e-4.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_helpers import INT8_DOTS, poison, rel, routed, up

from llamacmp.backends.arena_sizes import exact as arena_exact   # (exact: the tests' exact math)
from llamacmp.backends.numpy_ref import quantize_q8_blocks
from llamacmp.fixtures.quant_blocks import random_blocks
from llamacmp.gguf_file import QUANT_BLOCKS, Q8Tensor
from llamacmp.lib._native import CMP_DOTS, CMP_MM_GEMM_DOT_SHIFT, CMP_QUANT_TYPES

pytestmark = pytest.mark.cuda

TOL = 2e-6
# the block types with CUDA decoders, the IQ1-3 grid types included
TYPES = sorted(CMP_QUANT_TYPES)


def exact(x: np.ndarray, w) -> np.ndarray:
    """x [T, n] f32 -> float64 [T, rows]: the dequantized weights times the dequantized Q8 activations."""
    q, d = quantize_q8_blocks(x)
    xa = (q.reshape(x.shape[0], -1, 32).astype(np.float64) * d.reshape(x.shape[0], -1, 1)).reshape(x.shape)
    return xa @ w.dequantize().astype(np.float64).T


def random_q8(rng, rows: int, cols: int) -> Q8Tensor:
    return Q8Tensor.quantize(rng.standard_normal((rows, cols)).astype(np.float32))


def cols_for(type_name: str, blocks: int) -> int:
    return QUANT_BLOCKS[type_name][0] * blocks


def inputs(seed: int, T: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, n)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)


@pytest.mark.parametrize("dot", INT8_DOTS)
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("T", [1, 2, 3, 8, 16, 17, 100, 513])
def test_matmul(gemm_backend, smem_cap, type_name, T, dot):
    """GEMV (T <= 16) and GEMM (each prefill route, under each older card's shared memory: one stage on sm_61): two
    matrices of odd row counts in one call; n of 17 blocks (a lane's loop runs past one round of loads) or, for the
    GEMM sizes, 3 blocks of the 256-value types. On each route's int8 dot (the caps on DP4A: they change the tiling,
    not the dot)."""
    if smem_cap and dot != "dp4a":
        pytest.skip("the shared-memory caps change the GEMM's tiling, not its dot: tested on dp4a")
    cuda_backend = gemm_backend
    rng = np.random.default_rng(T)
    n = cols_for(type_name, 17 if T <= 16 or QUANT_BLOCKS[type_name][0] == 32 else 3)
    ws = [random_blocks(type_name, r, n, rng) for r in (37, 130)]
    x = inputs(T + 7, T, n)
    poison(cuda_backend, (T, 37), (T, 130))
    with routed(cuda_backend, dot) as be:
        got = be.matmuls(up(be, x), [be.upload_matrix(w) for w in ws])
    for g, w in zip(got, ws):
        assert rel(cuda_backend.to_host(g), exact(x, w)) < TOL


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("T", [1, 16, 100])
def test_residual_multi(gemm_backend, type_name, T):
    """Three matrices of one type in one launch, each with its residual added in the epilogue."""
    rng = np.random.default_rng(100 + T)
    n = cols_for(type_name, 2)
    ws = [random_blocks(type_name, r, n, rng) for r in (1, 33, 65)]
    x = inputs(T, T, n)
    res = [rng.standard_normal((T, w.shape[0])).astype(np.float32) for w in ws]
    be = gemm_backend
    xq, xd = be.quantize(up(be, x))
    got = be._q8_project(xq, xd, [be.upload_matrix(w) for w in ws], [up(be, r) for r in res])
    for g, w, r in zip(got, ws, res):
        assert rel(be.to_host(g), exact(x, w) + r) < TOL


@pytest.mark.parametrize("type_name", TYPES)
def test_gemm_row_chunks(gemm_backend, type_name, monkeypatch):
    """A workspace smaller than the matrix: the GEMM expands and multiplies 128 rows at a time (300 rows: three
    chunks, the last partial); the forms that read a type's planes need only the half sums of it, no chunks."""
    cuda_backend = gemm_backend
    monkeypatch.setattr(cuda_backend, "QUANT_WORK_BYTES", 1)
    rng = np.random.default_rng(5)
    n = cols_for(type_name, 2)
    w = random_blocks(type_name, 300, n, rng)
    x = inputs(9, 40, n)
    got = cuda_backend.matmuls(up(cuda_backend, x), [cuda_backend.upload_matrix(w)])[0]
    assert rel(cuda_backend.to_host(got), exact(x, w)) < TOL


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "IQ4_XS", "Q2_K"])
def test_one_stage_gemm_gives_the_same_bits(cuda_backend, type_name):
    """The DP4A GEMM with one shared stage (gemm_quant_kernel under sm_61's 48 KB) computes what the device runs
    (gemm_w16_kernel where its compute_80+ code runs, else gemm_quant_kernel's two stages), bit for bit."""
    from cuda_helpers import SMEM_CAPS
    rng = np.random.default_rng(21)
    n = cols_for(type_name, 4 if QUANT_BLOCKS[type_name][0] == 32 else 2)
    w = cuda_backend.upload_matrix(random_blocks(type_name, 200, n, rng))
    x = up(cuda_backend, inputs(4, 150, n))
    out = {}
    for cap in (SMEM_CAPS["sm61"], 0):
        cuda_backend.native.cmp_set_smem_cap(cap)
        try:
            out[cap] = cuda_backend.to_host(cuda_backend.matmuls(x, [w])[0])
        finally:
            cuda_backend.native.cmp_set_smem_cap(0)
    np.testing.assert_array_equal(out[SMEM_CAPS["sm61"]], out[0])


# A scale (and min) per 16 values (quant_blocks.cuh: PER16 true; gemm_w16.cuh's block_term16); the others have one
# per 32 values (block_term).
PER16_TYPES = ["Q2_K", "Q3_K", "Q6_K", "IQ2_XS", "IQ2_S", "IQ1_M"]
PER32_TYPES = [t for t in TYPES if t not in PER16_TYPES]
MIN_TYPES = ["Q2_K", "Q4_1", "Q4_K", "Q5_1", "Q5_K"]
# Read from their planes, no expansion pass (each block decoded in the GEMM's stage loads by expand_kernel's decode):
# by the DP4A GEMM where gemm_w16_kernel runs, up to a number of tokens a call (matmul_quant.cuh
# w16_planes_max_tokens), by the int8 tensor-core one up to its own (matmul_mma.cu; test_matmul_mma_cuda.DIRECT_TYPES).
W16_DIRECT_TYPES = {"Q2_K": 512, "Q4_K": 4096, "Q5_K": 512}
MMA_DIRECT_TYPES = ["Q2_K", "Q4_K", "Q5_K"]
# kernel bits whose GEMM expands every type (the DP2A route reads no planes): cmp_quant_work_bytes' expanded form
EXPANDED = CMP_DOTS["dp2a"] << CMP_MM_GEMM_DOT_SHIFT


@pytest.mark.parametrize("type_name", TYPES)
def test_gemm_same_bits_on_every_kernel(cuda_backend, type_name):
    """Every expanded type's GEMM (gemm_w16.cuh's block_term, or block_term16 for PER16, per output and block, in
    block order) gives the same bits on each kernel that runs it: gemm_w16_kernel (DP4A, compute_80+ code: 128 x 64
    tiles uncapped; under sm_75's 64 KB without mins (60 KB; PER16 64 KB); 128 x 128 under sm_70's 96 KB as on sm_86
    / sm_89 (80 / 88 KB; PER16 84 KB), 128 x 64 there for Q2_K (76 KB: its 100 KB tile fits neither)),
    gemm_quant_kernel's two stages (sm_75's 64 KB, the types with mins) and one (sm_61's 48 KB), and the DP2A and
    IMAD routes' gemm_quant_kernel (the same integers); and matches the reference. Where gemm_w16_kernel runs, the
    W16_DIRECT_TYPES come from their planes: the same bits as the expanded form's. 259 rows (three row tiles, the last
    of 3 rows) in two chunks of 256 rows (the workspace: ldy = 259 in the second), 200 tokens (a partial last token
    tile), a K tail (32-value types: 13 blocks, 3 stages of 4 and one block), the residual added in the epilogue."""
    from cuda_helpers import SMEM_CAPS
    be, rng = cuda_backend, np.random.default_rng(31)
    n = cols_for(type_name, 13 if QUANT_BLOCKS[type_name][0] == 32 else 3)
    blocks = random_blocks(type_name, 259, n, rng)
    x = inputs(8, 200, n)
    res = rng.standard_normal((200, 259)).astype(np.float32)
    w = be.upload_matrix(blocks)
    xq, xd = be.quantize(up(be, x))
    saved = be.QUANT_WORK_BYTES
    be.QUANT_WORK_BYTES = be.native.quant_work_bytes(w.type_id, 200, n, 256, EXPANDED)   # chunks of 256 rows
    out = {}
    try:
        for dot in INT8_DOTS:
            for cap in ("device", "sm70", "sm75", "sm61") if dot == "dp4a" else ("device",):
                be.native.cmp_set_smem_cap(SMEM_CAPS[cap])
                try:
                    with routed(be, dot):
                        out[dot, cap] = be.to_host(be._q8_project(xq, xd, [w], [up(be, res)])[0])
                finally:
                    be.native.cmp_set_smem_cap(0)
    finally:
        be.QUANT_WORK_BYTES = saved
    assert rel(out["dp4a", "device"], exact(x, blocks) + res) < TOL
    for key, got in out.items():
        np.testing.assert_array_equal(got, out["dp4a", "device"], err_msg=str(key))


@pytest.mark.parametrize("type_name", PER32_TYPES + ["Q6_K", "Q2_K"])
def test_group_in_one_launch(gemm_backend, type_name):
    """The GEMMs that store by row (gemm_out.cuh: the tensor-core ones and, where it runs, the DP4A gemm_w16_kernel)
    take a call's matrices as one run: expanded back to back into the
    workspace and multiplied in one launch per chunk (gemm_quant_run); the others one matrix at a time. The same bits
    as one call per matrix, residuals added, against the exact math. Rows 100 + 130 + 33 in chunks of 128 rows: chunk
    boundaries inside the second and third matrix, a tile holding rows of two. The int8 tensor-core GEMM reads Q2_K,
    Q4_K and Q5_K from their planes (matmul_mma.cu gemm_mma_planes), the DP4A one the W16_DIRECT_TYPES wherever it
    runs (gemm_w16.cuh's W16Planes): there the run is one launch, no expansion."""
    from cuda_helpers import captured
    be, rng, T = gemm_backend, np.random.default_rng(41), 200
    n = cols_for(type_name, 5 if QUANT_BLOCKS[type_name][0] == 32 else 1)
    blocks = [random_blocks(type_name, r, n, rng) for r in (100, 130, 33)]
    x = inputs(3, T, n)
    res = [rng.standard_normal((T, b.shape[0])).astype(np.float32) for b in blocks]
    ws = [be.upload_matrix(b) for b in blocks]
    xq, xd = be.quantize(up(be, x))
    dres = [up(be, r) for r in res]
    saved = be.QUANT_WORK_BYTES
    be.QUANT_WORK_BYTES = be.native.quant_work_bytes(ws[0].type_id, T, n, 128, EXPANDED)   # chunks of 128 rows
    try:
        group, launches = captured(be, lambda: be._q8_project(xq, xd, ws, dres))
        alone = [captured(be, lambda: be._q8_project(xq, xd, [w], [r]))[0][0] for w, r in zip(ws, dres)]
    finally:
        be.QUANT_WORK_BYTES = saved
    # (on the device's own shared memory every type's gemm_w16_kernel fits where Q8_0's does: 76 KB at most)
    one_run = be.routes.matmul_prefill == "mma" or be.native.gemm_w16_available()
    sums = int(type_name in MIN_TYPES)   # the half sums first
    mma = be.routes.matmul_prefill == "mma"
    direct = (mma and be.mma_gemm != "hmma" and be.native.mma_int8_available() and type_name in MMA_DIRECT_TYPES
              or not mma and be.native.gemm_w16_available() and type_name in W16_DIRECT_TYPES)
    # direct: one launch; one run: chunks 100 + 28 | 102 + 26 | 7 rows, 5 expansions and 3 GEMMs; else 100 |
    # 128 + 2 | 33, 4 and 4
    assert launches == sums + (1 if direct else 5 + 3 if one_run else 4 + 4)
    for g, a, b, r in zip(group, alone, blocks, res):
        np.testing.assert_array_equal(g, a)
        assert rel(g, exact(x, b) + r) < TOL


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K", "Q6_K", "Q2_K"])
def test_gemm_pieces_give_the_same_bits(cuda_backend, type_name):
    """The block types on the DP4A GEMM (gemm_w16_kernel: per 32 and PER16, without and with mins; Q4_0 and Q6_K
    expanded, Q4_K and Q2_K read from their planes) in serial pieces of K (cmp_set_serial_pieces forces 2..4 on
    every launch; 0: the plan) give the unsplit bits, residuals added, against the exact math. 2048 values of K: 16
    stages."""
    from dataclasses import replace
    be, rng, T = cuda_backend, np.random.default_rng(43), 200
    if not be.native.gemm_w16_available():
        pytest.skip("gemm_w16_kernel needs compute capability 8.0+ code for this device (cp.async stages)")
    n = cols_for(type_name, 64 if QUANT_BLOCKS[type_name][0] == 32 else 8)
    blocks = random_blocks(type_name, 300, n, rng)
    x = inputs(5, T, n)
    res = rng.standard_normal((T, 300)).astype(np.float32)
    w = be.upload_matrix(blocks)
    xq, xd = be.quantize(up(be, x))
    saved, out = be.routes, {}
    be.routes = replace(saved, matmul_prefill="dp4a")
    try:
        for pieces in (1, 2, 3, 4, 0):
            be.native.cmp_set_serial_pieces(pieces)
            out[pieces] = be.to_host(be._q8_project(xq, xd, [w], [up(be, res)])[0])
    finally:
        be.native.cmp_set_serial_pieces(0)
        be.routes = saved
    assert rel(out[1], exact(x, blocks) + res) < TOL
    for pieces, got in out.items():
        np.testing.assert_array_equal(got, out[1], err_msg=f"{pieces} pieces")


@pytest.mark.parametrize("pieces", [0, 3])
@pytest.mark.parametrize("cap", ["sm70", "device"])
@pytest.mark.parametrize("T", [17, 128, 512])
@pytest.mark.parametrize("type_name", W16_DIRECT_TYPES)
def test_w16_direct_types_in_one_launch(cuda_backend, type_name, T, cap, pieces):
    """The types the DP4A GEMM reads from their planes (gemm_w16.cuh's W16Planes: each block decoded in the stage
    loads by expand_kernel's decode): four matrices of odd row counts (1, 127, 66, 129: the first two fill the first
    128-row tile, the third and fourth meet inside the second) with residuals in one launch after the half sums (the
    types with mins), each matrix's bits those of the matrix alone and those of the expanded weights on the DP2A
    route (gemm_quant_kernel: the same integers and block terms), against the exact math. The device's shared
    memory: 128 x 64 tiles, every thread two (row, block) items a stage; sm70's cap (96 KB, as sm_86 / sm_89): 128 x
    128, one item a thread (Q2_K 128 x 64); pieces 3: each tile's K (10 stages) in three serial pieces."""
    from dataclasses import replace

    from cuda_helpers import SMEM_CAPS, captured
    be = cuda_backend
    if not be.native.gemm_w16_available():
        pytest.skip("gemm_w16_kernel needs compute capability 8.0+ code for this device (cp.async stages)")
    rng = np.random.default_rng(T * 5 + len(type_name) + pieces)
    n = cols_for(type_name, 5)
    ws = [random_blocks(type_name, r, n, rng) for r in (1, 127, 66, 129)]
    x = inputs(T + 11, T, n)
    res = [rng.standard_normal((T, w.shape[0])).astype(np.float32) for w in ws]
    saved = be.routes
    be.routes = replace(saved, matmul_prefill="dp4a")
    be.native.cmp_set_smem_cap(SMEM_CAPS[cap])
    be.native.cmp_set_serial_pieces(pieces)
    try:
        mats = [be.upload_matrix(w) for w in ws]
        xq, xd = be.quantize(up(be, x))
        dres = [up(be, r) for r in res]
        poison(be, *[(T, w.shape[0]) for w in ws])   # (after the residuals: blocks of the outputs' sizes)
        group, launches = captured(be, lambda: be._q8_project(xq, xd, mats, dres))
        alone = [captured(be, lambda: be._q8_project(xq, xd, [m], [r]))[0][0] for m, r in zip(mats, dres)]
        with routed(be, "dp2a"):
            expanded = [be.to_host(y) for y in be._q8_project(xq, xd, mats, dres)]
    finally:
        be.native.cmp_set_serial_pieces(0)
        be.native.cmp_set_smem_cap(0)
        be.routes = saved
    assert launches == int(type_name in MIN_TYPES) + 1   # the half sums, then the GEMM
    for g, a, e, w, r in zip(group, alone, expanded, ws, res):
        np.testing.assert_array_equal(g, a)
        np.testing.assert_array_equal(g, e)
        assert rel(g, exact(x, w) + r) < TOL


@pytest.mark.parametrize("type_name", W16_DIRECT_TYPES)
def test_w16_direct_types_up_to_their_tokens(cuda_backend, type_name):
    """Past its tokens a call (where the expansion pass costs less than decoding in every token tile), a type the DP4A
    GEMM reads from its planes is expanded first, as the others: more launches than the half sums and the GEMM, the
    same bits (one decode) on the tokens both calls share; and the workspace the backend asks for (the memory
    plan's measure, cmp_quant_work_bytes) is the half sums alone up to the limit, the expanded rows past it."""
    from cuda_helpers import captured, on_dp4a
    be, rng, limit = cuda_backend, np.random.default_rng(len(type_name) + 7), W16_DIRECT_TYPES[type_name]
    if not be.native.gemm_w16_available():
        pytest.skip("gemm_w16_kernel needs compute capability 8.0+ code for this device (cp.async stages)")
    n = cols_for(type_name, 5)
    w = random_blocks(type_name, 129, n, rng)
    x = inputs(limit + 3, limit + 1, n)
    ys, counts = [], []
    with on_dp4a(be):
        mat = be.upload_matrix(w)
        for T in (limit, limit + 1):
            xq, xd = be.quantize(up(be, x[:T]))
            (y,), launches = captured(be, lambda: be._q8_project(xq, xd, [mat]))
            ys.append(y)
            counts.append(launches)
        work = [be.gemm_work_bytes(type_name, T, n, 129) for T in (limit, limit + 1)]
    sums = int(type_name in MIN_TYPES)
    halves = arena_exact(limit * (n // 16) * 4)            # the half sums (every direct type has mins)
    assert work[0] == halves and work[1] > halves + 129 * n, work
    assert counts[0] == sums + 1 and counts[1] > sums + 1, counts
    np.testing.assert_array_equal(ys[0], ys[1][:limit])
    assert rel(ys[1], exact(x[:limit + 1], w)) < TOL


@pytest.mark.parametrize("long_n", [0, 4096, 4352, 12288, 12544])
@pytest.mark.parametrize("dot", INT8_DOTS)
@pytest.mark.parametrize("type_name", TYPES)
def test_gemv_batch_invariant(cuda_backend, type_name, dot, long_n):
    """Each row of a T-row GEMV equals, bit for bit, that row alone (T = 1) and within other batch sizes, on each
    route (whose results equal DP4A's bit for bit: the same integers). long_n: rows of more than T = 1's one round
    of loads (128 sub-blocks), so T = 1 runs its rolling kernel (matmul_quant.cuh, QGEMV_ROUND): 4352 = 136
    sub-blocks (a partial second round, refills bound-checked per lane), 12544 = 392 (whole-round refills, then a
    partial one, then a partial last round, at the rolling shape's U = 3: 96 sub-blocks a round), 12288 = 384 (four
    whole rounds: FFN down of the 9B); 4096: the short shape's one whole round (its loads unchecked); 0: 5 blocks."""
    rng = np.random.default_rng(11)
    n = long_n or cols_for(type_name, 5)
    blocks = random_blocks(type_name, 67, n, rng)
    w = cuda_backend.upload_matrix(blocks)
    x = inputs(3, 16, n)
    be = cuda_backend

    def run(rows: np.ndarray) -> np.ndarray:
        with routed(be, dot):
            return be.to_host(be.matmuls(up(be, rows), [w])[0])

    if dot != "dp4a":
        with routed(be, "dp4a"):
            assert np.array_equal(run(x), be.to_host(be.matmuls(up(be, x), [w])[0]))

    alone = np.concatenate([run(x[t:t + 1]) for t in range(16)])
    assert rel(alone, exact(x, blocks)) < TOL
    assert np.array_equal(run(x), alone)
    for T in (2, 3, 7, 9):
        assert np.array_equal(run(x[:T]), alone[:T]), T


@pytest.mark.parametrize("n", [2048, 4096, 12288])
@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "Q4_0", "IQ4_XS"])
def test_gemv_set_rows_bitwise(cuda_backend, type_name, n):
    """T = 1: each matrix of a multi-matrix call with residuals equals, bit for bit, that matrix alone and the
    matrix without its residual plus the residual (the same fp32 addition). Odd row counts (1, 7, 33: a warp's two
    rows run past a matrix's end, into no other matrix) and the three row lengths of the T = 1 shapes: a partial
    round (2048), the short shape's whole round (4096), the rolling shape's whole rounds (12288)."""
    be, rng = cuda_backend, np.random.default_rng(n + 3)
    blocks = [random_blocks(type_name, r, n, rng) for r in (1, 7, 33)]
    ws = [be.upload_matrix(b) for b in blocks]
    x = inputs(5, 1, n)
    res = [rng.standard_normal((1, b.shape[0])).astype(np.float32) for b in blocks]
    xq, xd = be.quantize(up(be, x))
    together = [be.to_host(g) for g in be._q8_project(xq, xd, ws, [up(be, r) for r in res])]
    for i, (w, b, r) in enumerate(zip(ws, blocks, res)):
        alone = be.to_host(be._q8_project(xq, xd, [w])[0])
        assert rel(alone, exact(x, b)) < TOL, i
        np.testing.assert_array_equal(together[i], r + alone)


@pytest.fixture
def volta(cuda_backend):
    """cuda_backend with the prefill GEMM on Volta's f16 HMMA kernel (matmul_hmma.cu), forced on any card of
    compute_70+ code (CudaBackend.mma_gemm), as an unlocked CMP 100-210 or a V100 runs it under --hw-route mma."""
    from dataclasses import replace
    be, saved = cuda_backend, cuda_backend.routes
    if not be.native.hmma_available():
        pytest.skip("Volta's f16 HMMA GEMM needs compute capability 7.0+ code for this device (mma.sync m8n8k4)")
    be.routes, be.mma_gemm = replace(saved, matmul_prefill="mma"), "hmma"
    yield be
    be.routes, be.mma_gemm = saved, "auto"


@pytest.mark.parametrize("type_name", TYPES + ["Q8_0"])
@pytest.mark.parametrize("T", [17, 100, 512])
def test_volta_gemm(volta, type_name, T):
    """Volta's GEMM on fresh random blocks of every type (and Q8_0), odd row counts (one partial row tile, one past
    a tile), 1 to 4 token tiles, against the int8 routes' reference and tolerance: each block's (PER16: half's)
    dot is the same integer (int8 codes and their products are exact in f16, their sums of < 2^19 exact in the f32
    accumulator), scaled and summed in fp32 as the DP4A GEMM does, so only fp32 rounding differs."""
    rng = np.random.default_rng(1000 + T)
    values = 32 if type_name == "Q8_0" else QUANT_BLOCKS[type_name][0]
    n = values * (7 if values == 32 else 2)
    make = (lambda r: random_q8(rng, r, n)) if type_name == "Q8_0" else (lambda r: random_blocks(type_name, r, n, rng))
    ws = [make(r) for r in (37, 131)]
    x = inputs(T, T, n)
    poison(volta, (T, 37), (T, 131))
    got = volta.matmuls(up(volta, x), [volta.upload_matrix(w) for w in ws])
    for g, w in zip(got, ws):
        assert rel(volta.to_host(g), exact(x, w)) < TOL


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K"])
def test_volta_gemm_is_the_kernel_that_runs(volta, type_name):
    """mma_gemm "hmma" changes the kernel, not only a name (its results equal the int8 kernel's up to fp32
    rounding): under a shared-memory cap too small for it the refusal (smem_opt_in, before anything runs) names
    gemm_hmma_kernel; uncapped the same call runs and matches the reference."""
    from llamacmp.lib._native import NativeError
    be, rng = volta, np.random.default_rng(7)
    n = 256
    w = random_q8(rng, 40, n) if type_name == "Q8_0" else random_blocks(type_name, 40, n, rng)
    x = inputs(2, 64, n)
    m = be.upload_matrix(w)
    be.native.cmp_set_smem_cap(8 * 1024)
    try:
        with pytest.raises(NativeError, match="gemm_hmma_kernel"):
            be.matmuls(up(be, x), [m])
    finally:
        be.native.cmp_set_smem_cap(0)
    assert rel(be.to_host(be.matmuls(up(be, x), [m])[0]), exact(x, w)) < TOL


def test_volta_gemm_field_refuses_unknown_kinds(cuda_backend):
    with pytest.raises(ValueError, match="mma_gemm 'wmma': not one of auto, hmma"):
        cuda_backend.mma_gemm = "wmma"
    assert cuda_backend.mma_gemm == "auto"


@pytest.mark.parametrize("type_name", TYPES)
def test_embed(cuda_backend, type_name):
    """Embedding rows equal gguf.quants' dequantized rows exactly."""
    rng = np.random.default_rng(2)
    table = random_blocks(type_name, 41, cols_for(type_name, 3), rng)
    ids = np.array([0, 40, 7, 7, 19], np.int32)
    got = cuda_backend.to_host(cuda_backend.embed(cuda_backend.upload_matrix(table), ids))
    assert np.array_equal(got, table.dequantize()[ids])


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K"])
def test_k_scales_every_bit(cuda_backend, type_name):
    """Q4_K/Q5_K's 12 packed scale and min bytes, which the repack rearranges for the GEMV (quant_blocks.cuh,
    k_scales_repack): rows whose scale bytes are all zero, all ones, or one bit of the 96 each, so every bit must land
    in its own sub-block's scale or min. The embedding (exact) and the T = 1 GEMV against the exact math."""
    rng = np.random.default_rng(12)
    w = random_blocks(type_name, 98, cols_for(type_name, 2), rng)
    bits = np.zeros((98, 96), np.uint8)
    bits[1] = 1
    bits[np.arange(2, 98), np.arange(96)] = 1
    w.blocks[:, :, 4:16] = np.packbits(bits, axis=1, bitorder="little")[:, None, :]
    table = cuda_backend.upload_matrix(w)
    ids = np.arange(98, dtype=np.int32)
    assert np.array_equal(cuda_backend.to_host(cuda_backend.embed(table, ids)), w.dequantize())
    x = inputs(8, 1, w.shape[1])
    assert rel(cuda_backend.to_host(cuda_backend.matmuls(up(cuda_backend, x), [table])[0]), exact(x, w)) < TOL


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q4_0"])
def test_fused_ops(cuda_backend, type_name):
    """The fused ops of base.Backend take the quantized matrices: RMSNorm + projections, projection + residual."""
    be, rng = cuda_backend, np.random.default_rng(4)
    n = cols_for(type_name, 2)
    ws = [random_blocks(type_name, r, n, rng) for r in (64, 96)]
    x = inputs(1, 3, n)
    norm_w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    xn = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6) * norm_w
    mats = [be.upload_matrix(w) for w in ws]
    got = be.rmsnorm_matmuls(up(be, x), be.upload_vector(norm_w), 1e-6, mats)
    for g, w in zip(got, ws):   # rmsnorm in fp32 on the device: an activation may round to the other Q8 code
        assert rel(be.to_host(g), exact(xn.astype(np.float32), w)) < 1e-3
    res = rng.standard_normal((3, 64)).astype(np.float32)
    got = be.matmul_add(up(be, x), mats[0], up(be, res))
    assert rel(be.to_host(got), exact(x, ws[0]) + res) < TOL


def test_bad_calls(cuda_backend):
    """Unknown type ids and a workspace too small for 128 rows are refused with messages naming them."""
    from llamacmp.lib._native import NativeError
    nat = cuda_backend.native
    with pytest.raises(NativeError, match="unknown quant type id 8"):
        nat.quant_layout(8)
    w = cuda_backend.upload_matrix(random_blocks("Q4_K", 4, 256, np.random.default_rng(0)))
    xq, xd = cuda_backend.quantize(up(cuda_backend, inputs(0, 32, 256)))
    y = cuda_backend.empty((32, 4))
    P = ctypes.c_void_p * 1
    with pytest.raises(NativeError, match="workspace of 0 bytes is too small"):
        nat.cmp_matmul_quant(w.type_id, xq.ptr, xd.ptr, 1, P(w.body.ptr), P(0), P(y.ptr), None,
                             (ctypes.c_int * 1)(4), 32, 256, 0, 0, 0)
    with pytest.raises(NativeError, match="kernel bits 0x2"):
        nat.cmp_matmul_quant(w.type_id, xq.ptr, xd.ptr, 1, P(w.body.ptr), P(0), P(y.ptr), None,
                             (ctypes.c_int * 1)(4), 32, 256, 0, 0, 2)
