"""Every CUDA backend op against numpy_ref (the specification), on fresh seeded random inputs with odd sizes
(1, primes, 2^k +- 1). Outputs are poisoned with NaN before each run (the arena hands the poisoned blocks back
to the op), so an element the kernel fails to write shows up as NaN.

Tolerances (relative L2 error): fp32 paths 1e-4; Q8 paths 1e-3 (the kernels reproduce numpy_ref's quantization
bit for bit, so only fp32 summation order differs; the issue allows 1e-2).
"""
from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import INT8_DOTS, dot_bits, poison, rel, routed, up

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend, quantize_q8_blocks
from llamacmp.config import ModelConfig
from llamacmp.gguf_file import Q8Tensor
from llamacmp.lib._native import CMP_MM_MMA, CMP_MM_MMA_F16, COPY_REGION_WORDS, NativeError

pytestmark = pytest.mark.cuda

FP32_TOL = 1e-4
Q8_TOL = 1e-3
REF = NumpyBackend()


def cfg_for(Hq=4, Hk=2, Dh=64, n_rot=16, K=2, V=4, Dk=32, kernel=4, eps=1e-6) -> ModelConfig:
    return ModelConfig(n_layer=4, n_embd=64, n_ff=128, n_head=Hq, n_head_kv=Hk, head_dim=Dh, n_vocab=97,
                       n_ctx_train=4096, rms_eps=eps, rope_base=1e7, n_rot=n_rot, rope_sections=(0, 0, 0, 0),
                       conv_kernel=kernel, ssm_k_heads=K, ssm_v_heads=V, ssm_head_dim=Dk, full_attention_interval=4)


def random_q8(rng, rows, cols) -> Q8Tensor:
    return Q8Tensor.quantize(rng.standard_normal((rows, cols)).astype(np.float32))


# -- projections -----------------------------------------------------------------------------------------------

MATMUL_SHAPES = [  # (T, rows, n): T covers the GEMV (<= 8) and the tiled GEMM, odd row counts, n a multiple of 32
    (1, 1, 32), (1, 127, 4096), (2, 257, 96), (3, 31, 160), (5, 33, 64), (7, 65, 2080), (8, 129, 256),
    (9, 63, 288), (17, 97, 512), (31, 255, 1024), (33, 64, 96), (65, 200, 4096), (129, 33, 1056),
]


@pytest.mark.parametrize("dot", INT8_DOTS)
@pytest.mark.parametrize("T,rows,n", MATMUL_SHAPES)
def test_matmul_q8(gemm_backend, T, rows, n, dot):
    """The backend's unfused matmuls (v1 kernels) on each route's int8 dot (as --hw-route forces it), with the
    prefill GEMM on the int8 dot or on the tensor cores (gemm_backend)."""
    rng = np.random.default_rng(T * 1000 + rows)
    x = rng.standard_normal((T, n)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    ws = [random_q8(rng, rows, n), random_q8(rng, rows + 2, n)]
    ref = REF.matmuls(x, [REF.upload_matrix(w) for w in ws])
    poison(gemm_backend, (T, rows), (T, rows + 2))
    with routed(gemm_backend, dot) as be:
        got = be.matmuls(up(be, x), [be.upload_matrix(w) for w in ws])
    for g, r in zip(got, ref):
        assert rel(be.to_host(g), r) < Q8_TOL


@pytest.mark.parametrize("T,n", [(1, 32), (3, 96), (17, 4096), (64, 1056)])
def test_quantize_matches_reference(cuda_backend, T, n):
    rng = np.random.default_rng(n + T)
    x = (rng.standard_normal((T, n)) * 3).astype(np.float32)
    x[0, :32] = 0.0                                   # an all-zero block: d = 0, q = 0
    x[-1, -32:] = np.concatenate([[127.0], np.arange(-15, 16) + 0.5])  # amax 127: exact .5 ties, half-to-even
    q_ref, d_ref = quantize_q8_blocks(x)
    q, d = cuda_backend.quantize(up(cuda_backend, x))
    qh = np.empty((T, n), np.int8)
    cuda_backend.native.cmp_memcpy_d2h(qh.ctypes.data, q.ptr, qh.nbytes)
    assert np.array_equal(qh.reshape(q_ref.shape), q_ref.astype(np.int8))
    assert np.array_equal(cuda_backend.to_host(d), d_ref)


@pytest.mark.parametrize("T,rows,n", [(1, 1, 1), (1, 127, 4096), (3, 31, 37), (9, 65, 257), (65, 33, 100)])
def test_matmul_f32(cuda_backend, T, rows, n):
    rng = np.random.default_rng(T + rows + n)
    x = rng.standard_normal((T, n)).astype(np.float32)
    w = rng.standard_normal((rows, n)).astype(np.float32)
    ref = REF.matmuls(x, [REF.upload_matrix(w)])[0]
    poison(cuda_backend, (T, rows))
    got = cuda_backend.matmuls(up(cuda_backend, x), [cuda_backend.upload_matrix(w)])[0]
    assert rel(cuda_backend.to_host(got), ref) < FP32_TOL


def test_matmul_f16_weights(cuda_backend):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    w = rng.standard_normal((33, 96)).astype(np.float16)
    ref = REF.matmuls(x, [REF.upload_matrix(w)])[0]   # x rounded to f16 for f16 weights (base.Backend.matmuls)
    got = cuda_backend.matmuls(up(cuda_backend, x), [cuda_backend.upload_matrix(w)])[0]
    assert rel(cuda_backend.to_host(got), ref) < FP32_TOL


# -- row-wise ops ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["f32", "q8"])
@pytest.mark.parametrize("T", [1, 7, 33])
def test_embed(cuda_backend, kind, T):
    rng = np.random.default_rng(T)
    table = rng.standard_normal((97, 96)).astype(np.float32)
    if kind == "q8":
        table = Q8Tensor.quantize(table)
    ids = rng.integers(0, 97, T).astype(np.int32)
    ref = REF.embed(REF.upload_matrix(table), ids)
    poison(cuda_backend, (T, 96))
    got = cuda_backend.embed(cuda_backend.upload_matrix(table), ids)
    assert rel(cuda_backend.to_host(got), ref) < 1e-6


@pytest.mark.parametrize("T,D", [(1, 1), (2, 31), (7, 4096), (17, 257), (65, 1000)])
def test_rmsnorm(cuda_backend, T, D):
    rng = np.random.default_rng(D)
    x = (rng.standard_normal((T, D)) * 5).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    poison(cuda_backend, (T, D))
    got = cuda_backend.rmsnorm(up(cuda_backend, x), up(cuda_backend, w), 1e-6)
    assert rel(cuda_backend.to_host(got), REF.rmsnorm(x, w, 1e-6)) < FP32_TOL


@pytest.mark.parametrize("op", ["add", "swiglu", "sigmoid_mul"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 127), (65, 513)])
def test_binary_ops(cuda_backend, op, shape):
    rng = np.random.default_rng(shape[1])
    a = (rng.standard_normal(shape) * 4).astype(np.float32)
    b = (rng.standard_normal(shape) * 4).astype(np.float32)
    poison(cuda_backend, shape)
    got = getattr(cuda_backend, op)(up(cuda_backend, a), up(cuda_backend, b))
    assert rel(cuda_backend.to_host(got), getattr(REF, op)(a, b)) < FP32_TOL


def test_gather_rows(cuda_backend):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((31, 65)).astype(np.float32)
    rows = np.array([30, 0, 7, 7], np.int32)
    got = cuda_backend.gather_rows(up(cuda_backend, x), rows)
    assert np.array_equal(cuda_backend.to_host(got), x[rows])


# -- copies ----------------------------------------------------------------------------------------------------

def _copy_cases(name: str, rng) -> list[tuple[int, int, int]]:
    """(dst offset, src offset, bytes) regions with disjoint destinations (cmp_copy_regions' rule)."""
    if name == "one":              # one region over many blocks: dst and src equally misaligned (16-byte words)
        return [(5, 21, 2 * 1024 * 1024 + 27)]
    if name == "mixed":            # each word width, its head and tail, odd counts, empty
        return [(0, 0, 1), (16, 32, 16), (33, 17, 3), (64, 80, 15), (97, 1, 17), (161, 17, 31),  # 16-byte words
                (258, 6, 4097), (4500, 8, 2), (4602, 402, 65),                                   # 4-byte words
                (4800, 1, 5), (4811, 16, 1), (4900, 7, 70001), (80000, 9, 0),                    # bytes
                (81920, 4096, 1 << 20), (81920 + (1 << 20) + 3, 11, 32768 * 3 + 13)]
    out, at = [], 0                # many: random sizes and offsets, destinations in order with gaps
    for _ in range(700):
        nbytes = int(rng.choice([rng.integers(0, 40), rng.integers(0, 5000), rng.integers(30000, 70000)]))
        at += int(rng.integers(0, 40))
        out.append((at, int(rng.integers(0, 1 << 20)), nbytes))
        at += nbytes
    return out


@pytest.mark.parametrize("grid", ["max", "understated"])
@pytest.mark.parametrize("case", ["one", "mixed", "many"])
def test_copy_regions_equals_numpy(cuda_backend, case, grid):
    """cmp_copy_regions (CudaBackend.restore_steps' one launch) against numpy slice copies: every region's bytes
    land, and nothing else of the destination changes (no word past a region's end). max_bytes understated (1):
    the grid is one block wide and every region is still copied whole."""
    be = cuda_backend
    rng = np.random.default_rng(len(case) + len(grid))
    regions = _copy_cases(case, rng)
    size = max(max(d + n, s + n) for d, s, n in regions) + 64
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dst = rng.integers(0, 256, size, dtype=np.uint8)
    src_d, dst_d = be.from_host(src, "u8"), be.from_host(dst, "u8")
    table = np.array([(dst_d.ptr + d, src_d.ptr + s, n) for d, s, n in regions], np.uint64)
    assert table.shape[1] == COPY_REGION_WORDS
    table_d = be.from_host(table.view(np.uint8).ravel(), "u8")
    max_bytes = max(n for _, _, n in regions) if grid == "max" else 1
    be.native.cmp_copy_regions(table_d.ptr, len(regions), max_bytes)
    want = dst.copy()
    for d, s, n in regions:
        want[d:d + n] = src[s:s + n]
    got = np.empty(size, np.uint8)
    be.native.cmp_memcpy_d2h(got.ctypes.data, dst_d.ptr, size)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} bytes differ, first at offset {bad[:8]}"


def test_copy_regions_refuses_bad_counts(cuda_backend):
    nat = cuda_backend.native
    nat.cmp_copy_regions(None, 0, 0)                      # nothing to copy: no launch, no table needed
    for n in (-1, 65536):
        with pytest.raises(NativeError, match="cmp_copy_regions"):
            nat.cmp_copy_regions(None, n, 16)


# -- attention -------------------------------------------------------------------------------------------------

def _states(be, cfg, n_ctx, kv_type, n_past_list, rng):
    """Matching numpy and CUDA states with random cache rows below n_past."""
    pairs = []
    for n_past in n_past_list:
        s_ref = REF.new_state(cfg, n_ctx, kv_type)
        s_dev = be.new_state(cfg, n_ctx, kv_type)
        for lay in range(len(s_ref.k)):
            for a_ref, a_dev in ((s_ref.k[lay], s_dev.k[lay]), (s_ref.v[lay], s_dev.v[lay])):
                a_ref[:n_past] = rng.standard_normal(a_ref[:n_past].shape)
                be.copy_from_host(a_dev, a_ref)
        for lay in range(len(s_ref.conv)):
            s_ref.conv[lay][...] = rng.standard_normal(s_ref.conv[lay].shape)
            s_ref.ssm[lay][...] = rng.standard_normal(s_ref.ssm[lay].shape) * 0.3
            be.copy_from_host(s_dev.conv[lay], s_ref.conv[lay])
            be.copy_from_host(s_dev.ssm[lay], s_ref.ssm[lay])
        s_ref.n_past = s_dev.n_past = n_past
        pairs.append((s_ref, s_dev))
    return pairs


def _batches(pairs, lengths):
    ref = StepBatch.build([(s, [0] * n) for (s, _), n in zip(pairs, lengths)])
    dev = StepBatch.build([(s, [0] * n) for (_, s), n in zip(pairs, lengths)])
    return ref, dev


@pytest.mark.parametrize("Dh,n_rot,Hq,Hk", [(32, 8, 4, 2), (64, 16, 4, 4), (256, 64, 16, 4), (128, 128, 6, 2)])
def test_attention_prep(cuda_backend, Dh, n_rot, Hq, Hk):
    rng = np.random.default_rng(Dh + Hq)
    cfg = cfg_for(Hq=Hq, Hk=Hk, Dh=Dh, n_rot=n_rot)
    T = 13
    qg = rng.standard_normal((T, Hq * 2 * Dh)).astype(np.float32)
    k = rng.standard_normal((T, Hk * Dh)).astype(np.float32)
    qn, kn = rng.standard_normal(Dh).astype(np.float32), rng.standard_normal(Dh).astype(np.float32)
    batch = StepBatch(np.zeros(T, np.int32), rng.integers(0, 40000, T).astype(np.int32), [], np.zeros(1, np.int32))
    ref = REF.attention_prep(qg, k, qn, kn, batch, cfg)
    poison(cuda_backend, (T, Hq, Dh), (T, Hk, Dh), (T, Hq * Dh))
    got = cuda_backend.attention_prep(up(cuda_backend, qg), up(cuda_backend, k), up(cuda_backend, qn),
                                      up(cuda_backend, kn), batch, cfg)
    for g, r in zip(got, ref):
        assert rel(cuda_backend.to_host(g), r) < FP32_TOL


@pytest.mark.parametrize("Dh,n_rot,Hq,Hk", [(32, 8, 4, 2), (256, 64, 16, 4), (128, 128, 6, 2)])
def test_key_prep(cuda_backend, Dh, n_rot, Hq, Hk):
    """The k heads alone (the kernel with Hq = 0): the reference's within FP32_TOL, and attention_prep's k to the
    bit (mtp_fill's cache rows are mtp_forward's)."""
    rng = np.random.default_rng(Dh + Hk)
    cfg = cfg_for(Hq=Hq, Hk=Hk, Dh=Dh, n_rot=n_rot)
    T = 13
    qg = up(cuda_backend, rng.standard_normal((T, Hq * 2 * Dh)).astype(np.float32))
    k = rng.standard_normal((T, Hk * Dh)).astype(np.float32)
    qn, kn = rng.standard_normal(Dh).astype(np.float32), rng.standard_normal(Dh).astype(np.float32)
    batch = StepBatch(np.zeros(T, np.int32), rng.integers(0, 40000, T).astype(np.int32), [], np.zeros(1, np.int32))
    ref = REF.key_prep(k, kn, batch, cfg)
    poison(cuda_backend, (T, Hk, Dh))
    got = cuda_backend.to_host(cuda_backend.key_prep(up(cuda_backend, k), up(cuda_backend, kn), batch, cfg))
    assert got.shape == (T, Hk, Dh) and rel(got, ref) < FP32_TOL
    _, k_full, _ = cuda_backend.attention_prep(qg, up(cuda_backend, k), up(cuda_backend, qn), up(cuda_backend, kn),
                                               batch, cfg)
    assert np.array_equal(got, cuda_backend.to_host(k_full))


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
@pytest.mark.parametrize("Dh,Hq,Hk", [(32, 4, 2), (64, 3, 1), (256, 16, 4)])
@pytest.mark.parametrize("lengths,n_past", [([1], [0]), ([1], [1023]), ([17], [0]), ([65, 1, 7], [3, 600, 31]),
                                            ([2], [4097])])
def test_attention(cuda_backend, kv_type, Dh, Hq, Hk, lengths, n_past):
    rng = np.random.default_rng(sum(lengths) * 7 + Dh + sum(n_past))
    cfg = cfg_for(Hq=Hq, Hk=Hk, Dh=Dh)
    pairs = _states(cuda_backend, cfg, max(n_past) + max(lengths) + 3, kv_type, n_past, rng)
    b_ref, b_dev = _batches(pairs, lengths)
    T = sum(lengths)
    q = rng.standard_normal((T, Hq, Dh)).astype(np.float32)
    k = rng.standard_normal((T, Hk, Dh)).astype(np.float32)
    v = rng.standard_normal((T, Hk * Dh)).astype(np.float32)
    ref = REF.attention(q, k, v, b_ref, 0, cfg)
    poison(cuda_backend, (T, Hq * Dh))
    got = cuda_backend.attention(up(cuda_backend, q), up(cuda_backend, k), up(cuda_backend, v), b_dev, 0, cfg)
    assert rel(cuda_backend.to_host(got), ref) < FP32_TOL
    for (s_ref, s_dev), L in zip(pairs, lengths):
        s_ref.n_past += L
        s_dev.n_past += L
        h_ref, h_dev = REF.state_to_host(s_ref), cuda_backend.state_to_host(s_dev)
        assert rel(h_dev["k"][0], h_ref["k"][0]) < 1e-6
        assert rel(h_dev["v"][0], h_ref["v"][0]) < 1e-6


# -- gated delta net -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T,V", [(1, 1), (7, 32), (65, 5)])
def test_gdn_gates(cuda_backend, T, V):
    rng = np.random.default_rng(T * V)
    alpha = (rng.standard_normal((T, V)) * 8).astype(np.float32)   # crosses the softplus threshold of 20
    beta = (rng.standard_normal((T, V)) * 4).astype(np.float32)
    dt = rng.standard_normal(V).astype(np.float32)
    a = -np.exp(rng.standard_normal(V)).astype(np.float32)
    ref = REF.gdn_gates(alpha, beta, dt, a)
    poison(cuda_backend, (T, V), (T, V))
    got = cuda_backend.gdn_gates(*(up(cuda_backend, t) for t in (alpha, beta, dt, a)))
    for g, r in zip(got, ref):
        assert rel(cuda_backend.to_host(g), r) < FP32_TOL


@pytest.mark.parametrize("lengths", [[1], [2, 1, 5], [64], [65, 3]])
@pytest.mark.parametrize("kernel", [4, 2])
def test_conv1d_silu(cuda_backend, lengths, kernel):
    rng = np.random.default_rng(sum(lengths) + kernel)
    cfg = cfg_for(K=2, V=4, Dk=32, kernel=kernel)
    C = cfg.conv_channels
    pairs = _states(cuda_backend, cfg, 5 + max(lengths), "f32", [5] * len(lengths), rng)
    b_ref, b_dev = _batches(pairs, lengths)
    x = rng.standard_normal((sum(lengths), C)).astype(np.float32)
    w = rng.standard_normal((C, kernel)).astype(np.float32)
    ref = REF.conv1d_silu(x, w, b_ref, 0)
    poison(cuda_backend, x.shape)
    got = cuda_backend.conv1d_silu(up(cuda_backend, x), up(cuda_backend, w), b_dev, 0)
    assert rel(cuda_backend.to_host(got), ref) < FP32_TOL
    for s_ref, s_dev in pairs:
        assert rel(cuda_backend.to_host(s_dev.conv[0]), s_ref.conv[0]) < FP32_TOL


@pytest.mark.parametrize("kernel", [4, 2])
def test_conv1d_silu_chunks_equal_token_steps(cuda_backend, kernel):
    """A 100-token segment runs in blocks of 32 tokens (cmp_conv1d_silu, conv1d_silu_chunks_kernel); it gives the
    bits of 100 one-token steps (conv1d_silu_kernel), outputs and final state: the windows read across the chunk
    boundaries and chunk 0's state hand-over."""
    be = cuda_backend
    rng = np.random.default_rng(40 + kernel)
    cfg = cfg_for(K=2, V=4, Dk=32, kernel=kernel)
    C, L = cfg.conv_channels, 100
    ((s_ref, whole),) = _states(be, cfg, L, "f32", [0], rng)  # a context that holds the segment
    steps = be.new_state(cfg, L, "f32")
    be.copy_from_host(steps.conv[0], s_ref.conv[0])
    x = rng.standard_normal((L, C)).astype(np.float32)
    w = up(be, rng.standard_normal((C, kernel)).astype(np.float32))
    got = be.to_host(be.conv1d_silu(up(be, x), w, StepBatch.build([(whole, [0] * L)]), 0))
    one = [be.to_host(be.conv1d_silu(up(be, x[t:t + 1]), w, StepBatch.build([(steps, [0])]), 0)) for t in range(L)]
    assert np.array_equal(got, np.concatenate(one))
    assert np.array_equal(be.to_host(whole.conv[0]), be.to_host(steps.conv[0]))


@pytest.mark.parametrize("Dk,K,V", [(16, 2, 4), (32, 1, 3), (128, 2, 4)])
@pytest.mark.parametrize("lengths", [[1], [7], [1, 65, 2], [130]])
def test_gdn(cuda_backend, Dk, K, V, lengths):
    rng = np.random.default_rng(Dk + sum(lengths))
    cfg = cfg_for(K=K, V=V, Dk=Dk)
    pairs = _states(cuda_backend, cfg, 2 + max(lengths), "f32", [2] * len(lengths), rng)
    b_ref, b_dev = _batches(pairs, lengths)
    T = sum(lengths)
    qkv = rng.standard_normal((T, cfg.conv_channels)).astype(np.float32)
    g = -rng.uniform(0.0, 1.5, (T, V)).astype(np.float32)
    b = rng.uniform(0.0, 1.0, (T, V)).astype(np.float32)
    ref = REF.gdn(qkv, g, b, b_ref, 0, cfg)
    poison(cuda_backend, (T, V * Dk))
    got = cuda_backend.gdn(up(cuda_backend, qkv), up(cuda_backend, g), up(cuda_backend, b), b_dev, 0, cfg)
    assert rel(cuda_backend.to_host(got), ref) < FP32_TOL
    for s_ref, s_dev in pairs:
        assert rel(cuda_backend.to_host(s_dev.ssm[0]), s_ref.ssm[0]) < FP32_TOL


@pytest.mark.parametrize("T,V,Dv", [(1, 1, 16), (7, 32, 128), (33, 3, 64)])
def test_gated_rmsnorm(cuda_backend, T, V, Dv):
    rng = np.random.default_rng(T + V + Dv)
    o = rng.standard_normal((T, V * Dv)).astype(np.float32)
    z = (rng.standard_normal((T, V * Dv)) * 3).astype(np.float32)
    w = rng.standard_normal(Dv).astype(np.float32)
    poison(cuda_backend, (T, V * Dv))
    got = cuda_backend.gated_rmsnorm(up(cuda_backend, o), up(cuda_backend, z), up(cuda_backend, w), 1e-6, Dv)
    assert rel(cuda_backend.to_host(got), REF.gated_rmsnorm(o, z, w, 1e-6, Dv)) < FP32_TOL


def test_out_of_memory_names_the_flag(cuda_backend):
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.backends.cuda_memory import DeviceMemoryError
    be = CudaBackend(arena_bytes=64 << 20, native=cuda_backend.native)
    with pytest.raises(DeviceMemoryError, match=r"KV cache.*-c"):
        be.new_state(cfg_for(), 1 << 20, "f32")
    be.arena.close()


# -- chunked (WY/UT) gated delta rule --------------------------------------------------------------------------

def _gdn_case(be, Dk, K, V, lengths, seed):
    """Matching numpy/CUDA states (random S0) and inputs for one gdn call over segments of `lengths`."""
    rng = np.random.default_rng(seed)
    cfg = cfg_for(K=K, V=V, Dk=Dk)
    pairs = _states(be, cfg, 2 + max(lengths), "f32", [2] * len(lengths), rng)
    T = sum(lengths)
    qkv = rng.standard_normal((T, cfg.conv_channels)).astype(np.float32)
    g = -rng.uniform(0.0, 1.5, (T, V)).astype(np.float32)
    b = rng.uniform(0.0, 1.0, (T, V)).astype(np.float32)
    return cfg, pairs, qkv, g, b


def _run_gdn_cuda(be, cfg, pairs, lengths, qkv, g, b, chunked):
    """-> (o on the host, final states on the host); states are copied so both kernels start from the same S0."""
    from llamacmp.lib._native import CMP_ERR_UNSUPPORTED, NativeError
    states = []
    for _, s_dev in pairs:
        s = be.new_state(cfg, s_dev.n_ctx, "f32")
        be.copy_from_host(s.ssm[0], be.to_host(s_dev.ssm[0]))
        s.n_past = s_dev.n_past
        states.append(s)
    batch = StepBatch.build([(s, [0] * n) for s, n in zip(states, lengths)])
    poison(be, (len(qkv), cfg.ssm_v_heads * cfg.ssm_head_dim))
    try:
        o = be.gdn(up(be, qkv), up(be, g), up(be, b), batch, 0, cfg, chunked=chunked)
    except NativeError as e:
        if e.code == CMP_ERR_UNSUPPORTED:
            pytest.skip(f"chunked GDN kernel does not fit this device: {e.message}")
        raise
    return be.to_host(o), [be.to_host(s.ssm[0]) for s in states]


@pytest.mark.parametrize("L", [1, 63, 64, 65, 127, 200, 1000])
@pytest.mark.parametrize("Dk,K,V", [(16, 2, 4), (32, 1, 3), (64, 2, 2), (128, 2, 4)])
def test_gdn_chunked_matches_numpy_and_scan(cuda_backend, L, Dk, K, V):
    cfg, pairs, qkv, g, b = _gdn_case(cuda_backend, Dk, K, V, [L], seed=L * 131 + Dk)
    b_ref = StepBatch.build([(pairs[0][0], [0] * L)])
    ref = REF.gdn(qkv, g, b, b_ref, 0, cfg)
    o_chunk, s_chunk = _run_gdn_cuda(cuda_backend, cfg, pairs, [L], qkv, g, b, chunked=True)
    o_scan, s_scan = _run_gdn_cuda(cuda_backend, cfg, pairs, [L], qkv, g, b, chunked=False)
    assert rel(o_chunk, ref) < FP32_TOL
    assert rel(s_chunk[0], pairs[0][0].ssm[0]) < FP32_TOL
    assert rel(o_chunk, o_scan) < FP32_TOL
    assert rel(s_chunk[0], s_scan[0]) < FP32_TOL


def test_gdn_chunked_several_segments(cuda_backend):
    lengths = [65, 3, 130, 64]
    cfg, pairs, qkv, g, b = _gdn_case(cuda_backend, 32, 2, 4, lengths, seed=7)
    b_ref = StepBatch.build([(s, [0] * n) for (s, _), n in zip(pairs, lengths)])
    ref = REF.gdn(qkv, g, b, b_ref, 0, cfg)
    o, states = _run_gdn_cuda(cuda_backend, cfg, pairs, lengths, qkv, g, b, chunked=True)
    assert rel(o, ref) < FP32_TOL
    for (s_ref, _), s in zip(pairs, states):
        assert rel(s, s_ref.ssm[0]) < FP32_TOL


@pytest.mark.parametrize("Dk,K,V,L", [(64, 2, 4, 64 * 20 + 17), (128, 16, 32, 64 * 9 + 1), (128, 2, 4, 64 * 40 + 63)])
def test_gdn_chunked_many_chunks(cuda_backend, Dk, K, V, L):
    """Many chunks with a partial last one (the intra kernel's chunks all at once, the state kernel's walk over
    them), the 9B's heads among them (16 k / 32 v heads: 2 value heads per key head), from a random state."""
    cfg, pairs, qkv, g, b = _gdn_case(cuda_backend, Dk, K, V, [L], seed=L + Dk)
    ref = REF.gdn(qkv, g, b, StepBatch.build([(pairs[0][0], [0] * L)]), 0, cfg)
    o, states = _run_gdn_cuda(cuda_backend, cfg, pairs, [L], qkv, g, b, chunked=True)
    assert rel(o, ref) < FP32_TOL
    assert rel(o[-17:], ref[-17:]) < FP32_TOL      # the padded last chunk's rows
    assert rel(states[0], pairs[0][0].ssm[0]) < FP32_TOL


def test_gdn_chunked_workspace(cuda_backend):
    """cmp_gdn_chunked_work_bytes is memplan's gdn_chunk_work_bytes (what the memory plan reserves), and a
    workspace one byte short is refused before anything runs."""
    from llamacmp import memplan
    be = cuda_backend
    for Dk, K, V, L in [(128, 16, 32, 512), (128, 16, 32, 4097), (64, 2, 4, 65), (16, 2, 4, 64)]:
        assert be.native.gdn_chunked_work_bytes(L, V, Dk) == memplan.gdn_chunk_work_bytes(cfg_for(K=K, V=V, Dk=Dk), L)
    cfg, pairs, qkv, g, b = _gdn_case(be, 32, 2, 4, [100], seed=5)
    need = be.native.gdn_chunked_work_bytes(100, 4, 32)
    work = be.empty((need,), "u8", "test workspace")
    dq, dg, db, o = up(be, qkv), up(be, g), up(be, b), be.empty((100, 4 * 32))
    with pytest.raises(NativeError) as e:
        be.native.cmp_gdn_chunked(dq.ptr, dg.ptr, db.ptr, pairs[0][1].ssm[0].ptr, o.ptr, 100, 2, 4, 32, 1e-6,
                                  work.ptr, need - 1)
    assert e.value.code == 2 and "cmp_gdn_chunked_work_bytes" in e.value.message   # CMP_ERR_ARG (api.h)


def test_gdn_chunked_over_the_cap_names_kernel_and_bytes(cuda_backend):
    """Under sm_75's 64 KB the chunked kernels (89280 + 80640 B at Dk 128) do not fit: forced, the refusal names the
    first, before anything runs; by default the backend takes the scan, with the scan's result."""
    from cuda_helpers import SMEM_CAPS
    from llamacmp.lib._native import CMP_ERR_UNSUPPORTED, NativeError
    cfg, pairs, qkv, g, b = _gdn_case(cuda_backend, 128, 2, 4, [100], seed=9)
    batch = StepBatch.build([(pairs[0][1], [0] * 100)])
    cuda_backend.native.cmp_set_smem_cap(SMEM_CAPS["sm75"])
    try:
        with pytest.raises(NativeError) as e:
            cuda_backend.gdn(up(cuda_backend, qkv), up(cuda_backend, g), up(cuda_backend, b), batch, 0, cfg,
                             chunked=True)
        o_capped, _ = _run_gdn_cuda(cuda_backend, cfg, pairs, [100], qkv, g, b, chunked=None)
    finally:
        cuda_backend.native.cmp_set_smem_cap(0)
    assert e.value.code == CMP_ERR_UNSUPPORTED
    assert "gdn_chunk_intra_kernel needs 89280 B" in e.value.message and "allows 65536 B" in e.value.message
    o_scan, _ = _run_gdn_cuda(cuda_backend, cfg, pairs, [100], qkv, g, b, chunked=False)
    np.testing.assert_array_equal(o_capped, o_scan)


def test_gdn_default_switch(cuda_backend):
    """gdn_chunked on (the default) and off give the same result through the default dispatch (L >= 64)."""
    assert cuda_backend.gdn_chunked is True
    lengths = [100, 1]
    cfg, pairs, qkv, g, b = _gdn_case(cuda_backend, 16, 2, 4, lengths, seed=3)
    o_on, s_on = _run_gdn_cuda(cuda_backend, cfg, pairs, lengths, qkv, g, b, chunked=None)
    cuda_backend.gdn_chunked = False
    try:
        o_off, s_off = _run_gdn_cuda(cuda_backend, cfg, pairs, lengths, qkv, g, b, chunked=None)
    finally:
        cuda_backend.gdn_chunked = True
    assert rel(o_on, o_off) < FP32_TOL
    for a, c in zip(s_on, s_off):
        assert rel(a, c) < FP32_TOL


@pytest.mark.parametrize("Dk,K,V,S", [(16, 2, 4, 1), (32, 1, 3, 2), (64, 2, 2, 1), (64, 2, 2, 3), (128, 2, 4, 1),
                                      (128, 16, 32, 1), (128, 16, 32, 5)])
def test_gdn_decode_steps(cuda_backend, Dk, K, V, S):
    """Five decode tokens (L = 1: gdn_step_kernel for one sequence, gdn_step_rows_kernel for S >= 2), the state
    carried from token to token, against numpy_ref; and sequence 0's five tokens as one L = 5 segment through the
    sequential scan (gdn_scan_kernel, the other summation order) from the same S0 give the same outputs and state."""
    be = cuda_backend
    rng = np.random.default_rng(Dk * 31 + V + S)
    cfg = cfg_for(K=K, V=V, Dk=Dk)
    pairs = _states(be, cfg, 8, "f32", [2] * S, rng)
    ssm0 = be.to_host(pairs[0][1].ssm[0]).copy()
    steps = 5
    qkv = rng.standard_normal((steps, S, cfg.conv_channels)).astype(np.float32)
    g = -rng.uniform(0.0, 1.5, (steps, S, V)).astype(np.float32)
    b = rng.uniform(0.0, 1.0, (steps, S, V)).astype(np.float32)
    outs = []
    for t in range(steps):
        b_ref, b_dev = _batches(pairs, [1] * S)
        ref = REF.gdn(qkv[t], g[t], b[t], b_ref, 0, cfg)
        poison(be, (S, V * Dk))
        got = be.to_host(be.gdn(up(be, qkv[t]), up(be, g[t]), up(be, b[t]), b_dev, 0, cfg))
        assert rel(got, ref) < FP32_TOL, t
        for s_ref, s_dev in pairs:
            assert rel(be.to_host(s_dev.ssm[0]), s_ref.ssm[0]) < FP32_TOL, t
        outs.append(got[0])
    st = be.new_state(cfg, 8, "f32")
    be.copy_from_host(st.ssm[0], ssm0)
    st.n_past = 2
    poison(be, (steps, V * Dk))
    scan = StepBatch.build([(st, [0] * steps)])
    o_scan = be.to_host(be.gdn(up(be, qkv[:, 0]), up(be, g[:, 0]), up(be, b[:, 0]), scan, 0, cfg, chunked=False))
    assert rel(np.stack(outs), o_scan) < FP32_TOL
    assert rel(be.to_host(st.ssm[0]), be.to_host(pairs[0][1].ssm[0])) < FP32_TOL


# The state shapes the keep kernel runs at: the fixtures' (tiny Dk 16, small Dk 32, q256 V 8, heads Dk 128), Dk 64,
# and the real models' K 16 heads (0.8B V 16, 9B V 32, 27B V 48).
GDN_KEEP_SHAPES = [(16, 2, 4), (32, 2, 4), (32, 2, 8), (64, 2, 2), (128, 2, 4), (128, 16, 16), (128, 16, 32),
                   (128, 16, 48)]


@pytest.mark.parametrize("L", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("Dk,K,V", GDN_KEEP_SHAPES)
def test_gdn_keep_equals_decode_steps(cuda_backend, L, Dk, K, V):
    """cmp_gdn_keep (gdn_keep_kernel: one launch walking the L tokens of a verify, the state in registers from token
    to token) against numpy_ref's keep_steps path, and bit for bit against the same tokens one at a time through the
    decode step (cmp_gdn at L = 1: gdn_step_kernel) from the same S0: every output row, every kept state steps[t]
    (t < L-1) and the final state. At L = 1 steps is null (api.h allows it)."""
    be = cuda_backend
    rng = np.random.default_rng(Dk * 7 + K * 3 + V + 1000 * L)
    cfg = cfg_for(K=K, V=V, Dk=Dk)
    ((s_ref, s_dev),) = _states(be, cfg, 8, "f32", [2], rng)
    s0 = be.to_host(s_dev.ssm[0]).copy()
    qkv = rng.standard_normal((L, cfg.conv_channels)).astype(np.float32)
    g = -rng.uniform(0.0, 1.5, (L, V)).astype(np.float32)
    b = rng.uniform(0.0, 1.0, (L, V)).astype(np.float32)
    batch = StepBatch.build([(s_ref, [0] * L)])
    batch.keep_steps = L
    o_ref = REF.gdn(qkv, g, b, batch, 0, cfg)
    kept_ref = s_ref.steps["ssm"][0]                  # the state after each token, the last one the final state

    d_qkv, d_g, d_b = up(be, qkv), up(be, g), up(be, b)
    poison(be, (L, V * Dk), *([(L - 1, V, Dk, Dk)] if L > 1 else []))
    o = be.empty((L, V * Dk))
    steps = be.empty((L - 1, V, Dk, Dk)) if L > 1 else None
    steps_ptr = steps.ptr if steps is not None else None
    be.native.cmp_gdn_keep(d_qkv.ptr, d_g.ptr, d_b.ptr, s_dev.ssm[0].ptr, steps_ptr, o.ptr, L, K, V, Dk, cfg.rms_eps)
    o_keep = be.to_host(o)
    kept = (list(be.to_host(steps)) if steps is not None else []) + [be.to_host(s_dev.ssm[0])]
    assert rel(o_keep, o_ref) < FP32_TOL
    for t in range(L):
        assert rel(kept[t], kept_ref[t]) < FP32_TOL, t

    st = be.new_state(cfg, 8, "f32")
    be.copy_from_host(st.ssm[0], s0)
    st.n_past = 2
    for t in range(L):
        poison(be, (1, V * Dk))
        o_t = be.gdn(up(be, qkv[t:t + 1]), up(be, g[t:t + 1]), up(be, b[t:t + 1]), StepBatch.build([(st, [0])]), 0,
                     cfg)
        np.testing.assert_array_equal(o_keep[t], be.to_host(o_t)[0], err_msg=f"output of token {t}")
        np.testing.assert_array_equal(kept[t], be.to_host(st.ssm[0]), err_msg=f"state after token {t}")


# -- sampling -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("R,N", [(1, 1), (1, 97), (3, 1025), (2, 248320), (5, 4099)])
def test_argmax(cuda_backend, R, N):
    rng = np.random.default_rng(R * N)
    x = (rng.standard_normal((R, N)) * 5).astype(np.float32)
    if N > 10:
        x[0, [3, N - 2]] = x[0].max() + 1.0      # a tie: the lower index wins, as numpy.argmax
    if R > 1:
        x[1, :] = -np.inf                         # all -inf: index 0
        x[1, N // 2] = np.nan                     # NaN is never chosen
    got = cuda_backend.ids_to_host(cuda_backend.argmax(up(cuda_backend, x)))
    want = np.argmax(np.where(np.isnan(x), -np.inf, x), axis=1).astype(np.int32)
    assert np.array_equal(got, want)


def _argmax_want(x):
    """cmp_argmax's spec per row: the lowest index of the largest non-NaN value (-0 == +0; -inf counts, so NaN
    around a lone -inf gives the -inf's index, where argmax over NaN -> -inf would give 0); an all-NaN row gives 0."""
    out = []
    for row in x:
        ok = ~np.isnan(row)
        out.append(int(np.flatnonzero(ok & (row == row[ok].max()))[0]) if ok.any() else 0)
    return np.array(out, np.int32)


def _argmax_rows(rng, R, N):
    """R rows [R, N] of the cases argmax_kernel's float4 body / scalar head and tail split can get wrong: the
    maximum and ties in the head, body and tail, -0 against +0, NaN beside the maximum, all -inf, all NaN."""
    x = (rng.standard_normal((R, N)) * 5).astype(np.float32)
    for r in range(R):
        case, top = r % 8, float(x[r].max()) + 1.0
        if case == 0:
            x[r, rng.integers(0, N)] = top                           # one maximum anywhere
        elif case == 1:
            x[r, [N - 1, max(N - 3, 0)]] = top                       # tie at the tail: the lower index
        elif case == 2:
            x[r, :] = -1.0
            x[r, rng.choice(N, min(N, 3), replace=False)] = np.array([-0.0, 0.0, -0.0][:min(N, 3)])  # -0 == +0
        elif case == 3:
            x[r, :] = np.nan
            x[r, N // 2] = -np.inf                                   # NaN around a lone -inf: the -inf
        elif case == 4:
            x[r, :] = -np.inf                                        # all -inf: 0
        elif case == 5:
            x[r, :] = np.nan                                         # all NaN: 0
        elif case == 6:
            x[r, :] = 2.5                                            # every element ties: 0
        else:
            x[r, 0] = top                                            # maximum in the head, NaN beside it
            x[r, min(1, N - 1)] = np.nan if N > 1 else top
    return x


@pytest.mark.parametrize("N", [1, 2, 3, 4, 5, 7, 31, 127, 1023, 1024, 1025, 4095, 4097, 32769, 65537, 248320, 248321])
def test_argmax_edge_rows(cuda_backend, N):
    """Every R in 1..16 (batched greedy decode) at sizes 1, primes, 2^k +- 1 and the 9B vocabulary: N % 4 != 0
    gives each row its own 16-byte alignment, so the head / body / tail split differs from row to row."""
    rng = np.random.default_rng(N)
    x = _argmax_rows(rng, 16, N)
    for R in range(1, 17):
        got = cuda_backend.ids_to_host(cuda_backend.argmax(up(cuda_backend, x[:R])))
        assert np.array_equal(got, _argmax_want(x[:R])), (R, got, _argmax_want(x[:R]))


@pytest.mark.parametrize("N", [1, 6, 97, 4099, 248320])
@pytest.mark.parametrize("shift", [1, 2, 3])
def test_argmax_unaligned_base(cuda_backend, N, shift):
    """A logits pointer `shift` floats past a 16-byte boundary (a view into a larger buffer): same ids."""
    R = 5
    rng = np.random.default_rng(N * 4 + shift)
    x = _argmax_rows(rng, R, N)
    flat = np.concatenate([np.zeros(shift, np.float32), x.ravel()])
    x_d = up(cuda_backend, flat)
    assert x_d.ptr % 16 == 0
    out = cuda_backend.empty((R,), "i32", "argmax ids")
    cuda_backend.native.cmp_argmax(x_d.ptr + 4 * shift, out.ptr, R, N)
    assert np.array_equal(cuda_backend.ids_to_host(out), _argmax_want(x))


def _reference_pick(logits, params, history, u, eog_ids=frozenset()):
    """llamacmp/sampling.py's chain with the draw made at `u` (what Sampler.sample's rng.choice does with the
    uniform it draws): -> token id."""
    from llamacmp.sampling import Sampler
    s = Sampler(params, eog_ids)
    s.history.extend(history)
    c = s.chain(logits)
    if len(c.ids) == 1:
        return int(c.ids[0])
    cdf = np.cumsum(c.probs())
    return int(c.ids[min(int(np.searchsorted(cdf / cdf[-1], u, side="right")), len(c.ids) - 1)])


SAMPLING_CASES = [  # (params, history length): defaults, then each stage pushed to matter
    (dict(), 0),
    (dict(temp=0.0), 0),
    (dict(top_k=1), 0),
    (dict(top_k=1024, top_p=0.5, min_p=0.0, temp=1.3), 0),
    (dict(top_k=200, top_p=1.0, min_p=0.2, temp=0.7), 0),
    (dict(top_k=40, min_keep=60, top_p=0.9), 0),
    (dict(penalty_repeat=1.5, penalty_freq=0.3, penalty_present=0.2, penalty_last_n=64), 100),
    (dict(penalty_repeat=1.2, penalty_last_n=-1, logit_bias={5: 20.0, 7: -100.0}), 50),
    (dict(ignore_eos=True, temp=0.0), 0),
]


@pytest.mark.parametrize("case", range(len(SAMPLING_CASES)))
@pytest.mark.parametrize("N", [97, 248320])
def test_device_sampling_chain_matches_reference(cuda_backend, case, N):
    from llamacmp.sampling import SamplingParams
    kw, n_hist = SAMPLING_CASES[case]
    params = SamplingParams(seed=1, **kw)
    rng = np.random.default_rng(case * 7 + N)
    eog = frozenset({0})                                 # token 0 plays the end-of-generation token
    for trial in range(8):
        logits = (rng.standard_normal(N) * 3).astype(np.float32)
        logits[0] = logits.max() + 5.0 if kw.get("ignore_eos") else logits[0]   # EOG would win unless ignored
        logits[1:6] = logits[1]                          # a run of equal logits: ties go to the lower id
        history = [int(t) for t in rng.integers(0, min(N, 50), n_hist)]
        u = float(rng.random())
        want = _reference_pick(logits, params, history, u, eog)
        got = cuda_backend.ids_to_host(cuda_backend.sample(up(cuda_backend, logits[None]), 0, params, history, u,
                                                           eog))
        assert int(got[0]) == want, (kw, trial, u)


def test_device_sampling_refuses_what_it_cannot_do(cuda_backend):
    from llamacmp.sampling import SamplingParams
    x = up(cuda_backend, np.zeros((1, 2000), np.float32))
    for kw in (dict(top_k=0), dict(top_k=2000), dict(typ_p=0.5), dict(samplers=("temperature", "top_k"))):
        with pytest.raises(ValueError):
            cuda_backend.sample(x, 0, SamplingParams(**kw), [], 0.5)


# -- v2 projections, fused Q8 producers (matmul_q8.cu / quantize.cu) ---------------------------------------------

def _q8_ex_device(be, xq, xd, mats, T, n, kernels, residuals=None):
    """cmp_matmul_q8_ex on device inputs -> device outputs [T, rows_i] (nothing copied: a graph may capture it)."""
    import ctypes
    k = len(mats)
    outs = [be.empty((T, m.shape[0])) for m in mats]
    P = ctypes.c_void_p * k
    res = None if residuals is None else P(*(r.ptr for r in residuals))
    be.native.cmp_matmul_q8_ex(xq.ptr, xd.ptr, k, P(*(m.qs.ptr for m in mats)), P(*(m.d.ptr for m in mats)),
                               P(*(o.ptr for o in outs)), res, (ctypes.c_int * k)(*(m.shape[0] for m in mats)), T, n,
                               kernels)
    return outs


def _q8_ex(be, xq, xd, mats, T, n, kernels, residuals=None):
    """cmp_matmul_q8_ex on device inputs -> host outputs [T, rows_i] (outputs poisoned with NaN first)."""
    poison(be, *[(T, m.shape[0]) for m in mats])
    return [be.to_host(o) for o in _q8_ex_device(be, xq, xd, mats, T, n, kernels, residuals)]


# T: the v2 GEMV (1..16), the v1 GEMM below 96, the v2 GEMM from 96 (128x128 tiles, gemm_w16_kernel's 128x64: partial
# tiles, an odd count of Q8 blocks so the last 2-block stage is half empty: n = 96, 1184); rows odd / below a warp's
# row pair / above a tile.
Q8_EX_SHAPES = [(1, 1, 32), (1, 4097, 4096), (2, 3, 96), (4, 31, 1184), (5, 129, 64), (9, 65, 2080), (16, 257, 256),
                (17, 33, 96), (95, 130, 160), (96, 127, 96), (97, 129, 1184), (200, 255, 512), (257, 64, 2048)]


def _q8_set_case(be, rng, T: int, rows: int, n: int):
    """Activations x [T, n] with per-row scales over 2 decades, and two or three Q8_0 matrices that read them (rows,
    2 and, at odd T, rows + 5: the small ones ride with the big one) -> (numpy_ref outputs, device matrices, xq, xd)."""
    x = rng.standard_normal((T, n)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    ws = [random_q8(rng, r, n) for r in (rows, 2, rows + 5)[:2 + (T % 2)]]
    ref = REF.matmuls(x, [REF.upload_matrix(w) for w in ws])
    mats = [be.upload_matrix(w) for w in ws]
    xq, xd = be.quantize(up(be, x))
    return ref, mats, xq, xd


@pytest.mark.parametrize("dot", INT8_DOTS)
@pytest.mark.parametrize("kernels", [0, 1, 2, 3, CMP_MM_MMA, 3 | CMP_MM_MMA])
@pytest.mark.parametrize("T,rows,n", Q8_EX_SHAPES)
def test_matmul_q8_ex_kernels_and_residual(cuda_backend, kernels, T, rows, n, dot):
    """Every kernel generation (0 = v1, 1 = v2 GEMV, 2 = v2 GEMM, 3 = both; CMP_MM_MMA: the tensor-core GEMM
    above the GEMV's rows) against numpy_ref, two to four matrices in one call (the small ones ride with the big
    ones), with and without the residual epilogue; on each route's int8 dot, whose results equal DP4A's bit for bit
    (the same integers)."""
    be = cuda_backend
    if kernels & CMP_MM_MMA and not be.native.mma_available():
        pytest.skip("CMP_MM_MMA needs compute capability 7.5+ code for this device (int8 mma.sync)")
    rng = np.random.default_rng(T * 7919 + rows + kernels)
    ref, mats, xq, xd = _q8_set_case(be, rng, T, rows, n)
    got = _q8_ex(be, xq, xd, mats, T, n, kernels | dot_bits(dot))
    for g, r in zip(got, ref):
        assert rel(g, r) < Q8_TOL
    for g, d in zip(got, _q8_ex(be, xq, xd, mats, T, n, kernels)):
        assert np.array_equal(g, d), dot
    res = [rng.standard_normal(r.shape).astype(np.float32) for r in ref]
    got = _q8_ex(be, xq, xd, mats, T, n, kernels | dot_bits(dot), [up(be, r) for r in res])
    for g, r, a in zip(got, ref, res):
        assert rel(g, r + a) < Q8_TOL


@pytest.mark.parametrize("T,rows,n", [(96, 127, 96), (97, 129, 1184), (130, 255, 320), (200, 130, 2080)])
def test_gemm2_stage_widths_give_the_same_bits(cuda_backend, T, rows, n):
    """The v2 Q8_0 GEMM's stages of 4 blocks (gemm_w16_kernel: sm_80+ code where its 60 KB fit, smem::gemm_w16_plan:
    128 x 64 tiles uncapped and under sm_75's 64 KB cap, 128 x 128 under sm_70's 96 KB as on sm_86 / sm_89) and of 2
    (gemm2_q8_kernel: under sm_61's 48 KB, and everywhere on code older than compute_80) give the same bits: the same
    dots and, per output, the same block order. Block counts 3, 37, 10, 65: the last stage holds 3, 1, 2 and 1 of its
    4 blocks; against numpy_ref too."""
    from cuda_helpers import SMEM_CAPS
    be = cuda_backend
    rng = np.random.default_rng(T + rows + n)
    ref, mats, xq, xd = _q8_set_case(be, rng, T, rows, n)
    out = {}
    for cap in (SMEM_CAPS["sm61"], SMEM_CAPS["sm75"], SMEM_CAPS["sm70"], 0):
        be.native.cmp_set_smem_cap(cap)
        try:
            out[cap] = _q8_ex(be, xq, xd, mats, T, n, 2)   # CMP_MM_GEMM2, DP4A
        finally:
            be.native.cmp_set_smem_cap(0)
    for g, r in zip(out[0], ref):
        assert rel(g, r) < Q8_TOL
    for cap in (SMEM_CAPS["sm61"], SMEM_CAPS["sm75"], SMEM_CAPS["sm70"]):
        for a, b in zip(out[cap], out[0]):
            np.testing.assert_array_equal(a, b, err_msg=f"cap {cap}")


@pytest.mark.parametrize("dot", INT8_DOTS)
@pytest.mark.parametrize("cap", ["device", "sm70", "sm61"])
@pytest.mark.parametrize("T,rows,n", [(96, 127, 96), (200, 300, 2080), (300, 1000, 4096)])
def test_gemm_pieces_give_the_same_bits(cuda_backend, T, rows, n, cap, dot):
    """The DP4A GEMMs' serial pieces of K (serial_pieces.cuh: each tile's stages run by several blocks in turn, the
    partial sums parked in the outputs between them) give the unsplit bits, residuals added, against numpy_ref:
    gemm_w16_kernel (compute_80+ code; the device's own shared memory: 128 x 64 tiles, two blocks an SM; under sm_70's
    96 KB cap 128 x 128 tiles, as on sm_86 / sm_89) and gemm2_q8_kernel (under sm_61's 48 KB cap: gemm_w16_kernel's 60
    KB fit sm_75's 64; and on the DP2A / IMAD routes everywhere: Volta's and Pascal's GEMM).
    cmp_set_serial_pieces forces each count on every launch (a GEMM at most one a stage; 0: the launch's own plan).
    n = 96: 3 blocks, one stage of 4 (2 stages of 2), so few counts split; 2080: 65 blocks; 4096: 128. 1000 rows x
    300 tokens: 8 x 3 tiles (8 x 5 of gemm_w16_kernel's 128 x 64), fewer than a wave, so pieces wait on their tile's
    last."""
    from cuda_helpers import SMEM_CAPS
    be = cuda_backend
    if cap in ("device", "sm70") and dot == "dp4a" and not be.native.gemm_w16_available():
        pytest.skip("gemm_w16_kernel needs compute capability 8.0+ code for this device (cp.async stages)")
    rng = np.random.default_rng(T + rows + n)
    ref, mats, xq, xd = _q8_set_case(be, rng, T, rows, n)
    res = [rng.standard_normal(r.shape).astype(np.float32) for r in ref]
    out = {}
    be.native.cmp_set_smem_cap(SMEM_CAPS[cap])
    try:
        for pieces in (1, 2, 3, 4, 7, 0):
            be.native.cmp_set_serial_pieces(pieces)
            out[pieces] = _q8_ex(be, xq, xd, mats, T, n, 2 | dot_bits(dot), [up(be, r) for r in res])   # GEMM2
    finally:
        be.native.cmp_set_serial_pieces(0)
        be.native.cmp_set_smem_cap(0)
    for g, r, a in zip(out[1], ref, res):
        assert rel(g, r + a) < Q8_TOL
    for pieces, got in out.items():
        for a, b in zip(got, out[1]):
            np.testing.assert_array_equal(a, b, err_msg=f"{pieces} pieces")


# The GEMMs that read adjacent matrices as one (gemm_out.cuh): the DP4A one (CMP_MM_GEMM2, gemm_w16_kernel from
# 96 tokens), the int8 tensor-core one and Volta's f16 HMMA one; each takes the v2 GEMV below 17 tokens.
ADJACENT_GEMMS = {"dp4a": 3, "mma": 3 | CMP_MM_MMA, "hmma": 3 | CMP_MM_MMA | CMP_MM_MMA_F16}


@pytest.mark.parametrize("gemm", list(ADJACENT_GEMMS))
@pytest.mark.parametrize("T", [17, 200, 513])
def test_adjacent_q8_matrices_in_one_launch(cuda_backend, T, gemm):
    """Q8_0 matrices uploaded together (CudaBackend.upload_matrices: one after another in memory) are one launch of
    the prefill GEMM (the DP4A one where gemm_w16_kernel runs: 96 tokens and more; the tensor-core ones at every
    T above the GEMV's), one launch each when uploaded apart; the same bits either way, residuals added, against
    numpy_ref. Rows 130 + 40 + 32 + 33: the second row tile holds rows of three matrices; n = 160: five blocks, a
    4-block stage and a tail."""
    from cuda_helpers import captured
    be, n = cuda_backend, 160
    if gemm == "mma" and not be.native.mma_available():
        pytest.skip("CMP_MM_MMA needs compute capability 7.5+ code for this device (int8 mma.sync)")
    if gemm == "hmma" and not be.native.hmma_available():
        pytest.skip("Volta's f16 HMMA GEMM needs compute capability 7.0+ code for this device (mma.sync m8n8k4)")
    rng = np.random.default_rng(T)
    ws = [random_q8(rng, r, n) for r in (130, 40, 32, 33)]
    x = rng.standard_normal((T, n)).astype(np.float32)
    res = [rng.standard_normal((T, w.shape[0])).astype(np.float32) for w in ws]
    ref = REF.matmuls(x, [REF.upload_matrix(w) for w in ws])
    together, apart = be.upload_matrices(ws), [be.upload_matrix(w) for w in ws]
    assert [m.qs.ptr - together[0].qs.ptr for m in together] == [0, 130 * n, 170 * n, 202 * n]
    xq, xd = be.quantize(up(be, x))
    dres = [up(be, r) for r in res]
    got, launches = {}, {}
    for name, mats in (("together", together), ("apart", apart)):
        got[name], launches[name] = captured(
            be, lambda: _q8_ex_device(be, xq, xd, mats, T, n, ADJACENT_GEMMS[gemm], dres))
    assert launches["apart"] == 4
    one = gemm != "dp4a" or (be.native.gemm_w16_available() and T >= 96)   # matmul_q8.cu GEMM2_MIN_T
    assert launches["together"] == (1 if one else 4)
    for a, b, r, e in zip(got["together"], got["apart"], ref, res):
        np.testing.assert_array_equal(a, b)
        assert rel(a, r + e) < Q8_TOL


def test_matmul_q8_ex_rejects_unknown_kernel_bits(cuda_backend):
    from llamacmp.lib._native import NativeError
    be = cuda_backend
    m = be.upload_matrix(random_q8(np.random.default_rng(0), 4, 32))
    xq, xd = be.quantize(up(be, np.ones((1, 32))))
    for retired in (4, 16, 32, 64):   # the v3, v4 and v4-eager GEMV bits are gone: refused, not ignored
        with pytest.raises(NativeError, match="unknown kernel bits"):
            _q8_ex(be, xq, xd, [m], 1, 32, 1 | retired)


def test_routes_the_backend_lacks_are_refused_by_name(cuda_backend):
    from llamacmp.backends.routes import Routes
    be = cuda_backend
    saved = be.routes
    with pytest.raises(ValueError, match="no 'mma' route for matmul_decode"):
        be.routes = Routes(matmul_decode="mma")
    with pytest.raises(ValueError, match="no 'mma' route for attn_decode"):
        be.routes = Routes(attn_decode="mma")
    assert be.routes == saved


def test_prefill_route_picks_the_gemm(gemm_backend, monkeypatch):
    """The route reaches every projection entry point: Q8_0 (fused _q8_project and plain matmuls) and an expanded
    type (Q4_K) carry CMP_MM_MMA exactly when the route is mma, and the results stay the reference's."""
    from llamacmp.fixtures.quant_blocks import random_blocks
    be = gemm_backend
    calls = []
    def spy(name, real):
        def call(*args):
            calls.append((name, args[-1]))   # the kernel bits
            return real(*args)
        return call

    for name in ("cmp_matmul_q8_ex", "cmp_matmul_quant"):
        monkeypatch.setattr(be.native, name, spy(name, getattr(be.native, name)))
    rng = np.random.default_rng(3)
    T, n = 40, 256
    x = rng.standard_normal((T, n)).astype(np.float32)
    ws = [random_q8(rng, 65, n), random_blocks("Q4_K", 33, n, rng)]
    q, d = quantize_q8_blocks(x)   # the device's Q8 activations, bit for bit (test_quantize_matches_reference)
    xa = (q.reshape(T, -1, 32).astype(np.float64) * d.reshape(T, -1, 1)).reshape(T, n)
    ref = [xa @ w.dequantize().astype(np.float64).T for w in ws]
    mats = [be.upload_matrix(w) for w in ws]
    got = be.matmuls(up(be, x), mats)
    xq, xd = be.quantize(up(be, x))
    got_fused = be._q8_project(xq, xd, mats)
    for g, f, r in zip(got, got_fused, ref):
        assert rel(be.to_host(g), r) < Q8_TOL and rel(be.to_host(f), r) < Q8_TOL
    assert {c[0] for c in calls} == {"cmp_matmul_q8_ex", "cmp_matmul_quant"} and len(calls) == 4
    mma, f16 = be.routes.matmul_prefill == "mma", be.mma_gemm == "hmma"   # f16: Volta's GEMM forced (gemm_backend)
    assert all(bool(bits & CMP_MM_MMA) == mma and bool(bits & CMP_MM_MMA_F16) == f16 for _, bits in calls), calls


def test_mma_gemm_on_the_9b_shapes(cuda_backend):
    """The tensor-core GEMM at full tile counts (a 9B projection's 4096 columns, 12288 rows, T = 512 in 4 token
    tiles) against numpy_ref, with the residual epilogue."""
    be = cuda_backend
    if not be.native.mma_available():
        pytest.skip("CMP_MM_MMA needs compute capability 7.5+ code for this device (int8 mma.sync)")
    rng = np.random.default_rng(9)
    ref, mats, xq, xd = _q8_set_case(be, rng, 512, 12288, 4096)
    res = [rng.standard_normal(r.shape).astype(np.float32) for r in ref]
    got = _q8_ex(be, xq, xd, mats, 512, 4096, 3 | CMP_MM_MMA, [up(be, r) for r in res])
    for g, r, a in zip(got, ref, res):
        assert rel(g, r + a) < Q8_TOL


# The batch-invariant GEMV (CMP_MM_GEMV2 = 1; its PDL launch 8) on each route's int8 dot.
@pytest.mark.parametrize("kernels", [1, 1 | 8, 1 | dot_bits("dp2a"), 1 | 8 | dot_bits("dp2a"), 1 | dot_bits("imad"),
                                     1 | 8 | dot_bits("imad")])
@pytest.mark.parametrize("rows,n", [(1, 32), (67, 4096), (129, 1184), (3, 12288), (4097, 2080), (2, 1056),
                                    (32, 4128)])
def test_gemv_rows_independent_of_batch(cuda_backend, rows, n, kernels):
    """Batch invariance (engine, issue 5): each of 16 activation rows gives bit-identical outputs alone (T = 1) and
    at its position in every batch T = 2..16 (one kernel instantiation per T, each with its own shape: rows per
    warp, loads in flight; so this checks each NT's arithmetic, groups straddling the two matrices and the last
    group short of rows: totals 2 rows + 1 = 1 or 3 mod 4)."""
    be = cuda_backend
    rng = np.random.default_rng(rows * 31 + n)
    x = rng.standard_normal((16, n)).astype(np.float32) * rng.uniform(0.1, 10, (16, 1)).astype(np.float32)
    mats = [be.upload_matrix(random_q8(rng, r, n)) for r in (rows, rows + 1)]
    xq, xd = be.quantize(up(be, x))
    alone = []
    for t in range(16):
        xq1 = be.from_host(_i8_rows(be, xq, t, 1), "i8")
        xd1 = up(be, be.to_host(xd)[t:t + 1])
        alone.append(_q8_ex(be, xq1, xd1, mats, 1, n, kernels))
    for T in range(2, 17):
        got = _q8_ex(be, xq, xd, mats, T, n, kernels)
        for t in range(T):
            for m in range(2):
                assert np.array_equal(got[m][t], alone[t][m][0]), (T, t, m)


@pytest.mark.parametrize("dot", INT8_DOTS)
@pytest.mark.parametrize("rows,n", [(1, 32), (67, 4096), (3, 12288), (4097, 2080), (2, 1056), (130, 4128)])
def test_gemv_v2_gives_v1_bits(cuda_backend, rows, n, dot):
    """The batch-invariant GEMV (CMP_MM_GEMV2, plain and PDL launch) gives the bits of v1's GEMV (gemv_q8_kernel: a
    warp per row, the loop T = 1 decode ran before it took gemv_q8_batch_kernel) at every T = 1..8 that v1 takes,
    two matrices in one launch, with the residual epilogue, on each route's int8 dot. n: one chunk per lane or
    fewer (32), whole rounds of loads (4096: one at T = 1; 12288: three, with refills), partial last rounds."""
    be = cuda_backend
    rng = np.random.default_rng(rows * 13 + n)
    x = rng.standard_normal((8, n)).astype(np.float32) * rng.uniform(0.1, 10, (8, 1)).astype(np.float32)
    mats = [be.upload_matrix(random_q8(rng, r, n)) for r in (rows, rows + 1)]
    res = [rng.standard_normal((8, r)).astype(np.float32) for r in (rows, rows + 1)]
    xq, xd = be.quantize(up(be, x))
    for T in range(1, 9):   # xq, xd: their first T rows
        res_d = [up(be, r[:T]) for r in res]
        v1 = _q8_ex(be, xq, xd, mats, T, n, dot_bits(dot), res_d)
        for kernels in (1, 1 | 8):
            got = _q8_ex(be, xq, xd, mats, T, n, kernels | dot_bits(dot), res_d)
            for m in range(2):
                assert np.array_equal(got[m], v1[m]), (T, m, kernels)


@pytest.mark.parametrize("kernels", [1, 1 | 8])
@pytest.mark.parametrize("rows,n", [(61, 4096), (130, 12288), (6, 2080)])
def test_gemv_rows_independent_of_batch_with_residual(cuda_backend, rows, n, kernels):
    """Batch invariance of a full set (4 matrices, the most one launch takes: rows, 2, 2, rows + 3, like the GDN
    input projections with their alpha / beta rows) with the residual epilogue: each token's outputs at every
    T = 2..16 equal, bit for bit, that token alone (T = 1) with its residual row, and match numpy_ref."""
    be = cuda_backend
    rng = np.random.default_rng(rows * 17 + n + kernels)
    x = rng.standard_normal((16, n)).astype(np.float32) * rng.uniform(0.1, 10, (16, 1)).astype(np.float32)
    ws = [random_q8(rng, r, n) for r in (rows, 2, 2, rows + 3)]
    mats = [be.upload_matrix(w) for w in ws]
    ref = REF.matmuls(x, [REF.upload_matrix(w) for w in ws])
    res = [rng.standard_normal((16, w.shape[0])).astype(np.float32) for w in ws]
    xq, xd = be.quantize(up(be, x))
    alone = []
    for t in range(16):
        xq1 = be.from_host(_i8_rows(be, xq, t, 1), "i8")
        xd1 = up(be, be.to_host(xd)[t:t + 1])
        alone.append(_q8_ex(be, xq1, xd1, mats, 1, n, kernels, [up(be, r[t:t + 1]) for r in res]))
    for T in range(2, 17):
        got = _q8_ex(be, xq, xd, mats, T, n, kernels, [up(be, r[:T]) for r in res])   # the first T tokens
        for m in range(4):
            assert rel(got[m], ref[m][:T] + res[m][:T]) < Q8_TOL, (T, m)
            for t in range(T):
                assert np.array_equal(got[m][t], alone[t][m][0]), (T, t, m)


# The batch-invariant GEMV (CMP_MM_GEMV2 = 1, PDL launch 8): T 1..16; more rows than an H200 holds resident warps;
# n with one to twelve rounds of a lane's U chunks (q8gemv_shape: 8 at T = 1, 2 or 4 above) and partial last rounds
# (n = 1056 is 66 chunks, 2080 is 130, 4128 is 258, 12288 is 768: 3 rounds at T = 1); small matrices riding with
# big ones (three matrices at odd T).
GEMV_SHAPES = [(1, 1, 32), (1, 4097, 1024), (1, 20011, 64), (1, 4231, 4128), (1, 131, 12288), (2, 3, 96), (3, 31, 1184),
                (4, 5003, 1056), (5, 129, 64), (6, 4097, 4096), (7, 65, 12288), (8, 3203, 2080), (9, 13, 1184),
                (10, 4099, 96), (11, 8191, 256), (12, 1, 4128), (13, 2, 4128), (14, 12289, 4096), (15, 63, 12288),
                (16, 257, 256), (16, 6007, 1056)]


@pytest.mark.parametrize("T,rows,n", GEMV_SHAPES)
def test_gemv_matches_reference_with_and_without_pdl(cuda_backend, T, rows, n):
    """The batch-invariant GEMV (alone, with its PDL launch, with the GEMM bit too) against numpy_ref (Q8_TOL), each
    launch giving the plain launch's bits, with and without the residual epilogue."""
    be = cuda_backend
    rng = np.random.default_rng(T * 104729 + rows + n)
    ref, mats, xq, xd = _q8_set_case(be, rng, T, rows, n)
    res = [rng.standard_normal(r.shape).astype(np.float32) for r in ref]
    res_d = [up(be, r) for r in res]
    plain, plain_res = _q8_ex(be, xq, xd, mats, T, n, 1), _q8_ex(be, xq, xd, mats, T, n, 1, res_d)
    for kernels in (1, 1 | 8, 1 | 2 | 8):
        got = _q8_ex(be, xq, xd, mats, T, n, kernels)
        got_res = _q8_ex(be, xq, xd, mats, T, n, kernels, res_d)
        for g, gr, r, a, o, o_res in zip(got, got_res, ref, res, plain, plain_res):
            assert rel(g, r) < Q8_TOL, kernels
            assert rel(gr, r + a) < Q8_TOL, kernels
            assert np.array_equal(g, o) and np.array_equal(gr, o_res), kernels


@pytest.mark.parametrize("kernels", [1 | 8, 1 | 2 | 8])
@pytest.mark.parametrize("T,rows,n", [(1, 4096, 4096), (3, 1031, 2080)])
def test_gemv_pdl_in_graph_reads_the_fresh_inputs(cuda_backend, T, rows, n, kernels):
    """A captured graph: residual add, quantize, then the GEMV launched with PDL (it starts during quantize and must
    wait for it). Replayed on new inputs each time, it gives exactly what the eager plain launch gives on them
    (stale activations or residuals from the previous replay would differ)."""
    import ctypes
    be = cuda_backend
    rng = np.random.default_rng(rows + T)
    wh = random_q8(rng, rows, n)
    w = be.upload_matrix(wh)
    a, b = be.empty((T, rows)), be.empty((T, rows))
    x = be.empty((T, n))
    res, y = be.empty((T, rows)), be.empty((T, rows))
    xq, xd = be._q8_buffers(T, n)
    P1, I1 = ctypes.c_void_p * 1, ctypes.c_int * 1
    nat = be.native
    # an eager call first, as the engine's first decode step is: the launcher's one-time device queries (occupancy)
    # then happen outside the capture
    nat.cmp_matmul_q8_ex(xq.ptr, xd.ptr, 1, P1(w.qs.ptr), P1(w.d.ptr), P1(y.ptr), None, I1(rows), T, n, kernels)
    be.synchronize()
    nat.cmp_graph_begin()
    try:
        nat.cmp_add(a.ptr, b.ptr, res.ptr, T * rows)
        nat.cmp_quantize_q8(x.ptr, xq.ptr, xd.ptr, T, n)
        nat.cmp_matmul_q8_ex(xq.ptr, xd.ptr, 1, P1(w.qs.ptr), P1(w.d.ptr), P1(y.ptr), P1(res.ptr), I1(rows), T, n,
                             kernels)
    finally:
        exec_ = nat.graph_end()
    w_ref = REF.upload_matrix(wh)
    try:
        for i in range(3):
            xa = rng.standard_normal((T, n)).astype(np.float32) * (i + 1)
            aa, ba = rng.standard_normal((2, T, rows)).astype(np.float32)
            be.copy_from_host(x, xa)
            be.copy_from_host(a, aa)
            be.copy_from_host(b, ba)
            nat.cmp_memset(y.ptr, 0xFF, y.nbytes)
            nat.cmp_graph_launch(exec_)
            got = be.to_host(y)
            rq, rd = be.quantize(up(be, xa))
            want = _q8_ex(be, rq, rd, [w], T, n, 1, [up(be, aa + ba)])[0]
            assert np.array_equal(got, want), i
            ref = REF.matmuls(xa, [w_ref])[0]
            assert rel(got, ref + (aa + ba)) < Q8_TOL
    finally:
        nat.cmp_graph_destroy(exec_)


def _i8_rows(be, q, t0, n_rows):
    """Rows t0 .. t0+n_rows of an int8 device tensor [T, n] as a host array."""
    out = np.empty((n_rows, q.shape[1]), np.int8)
    be.native.cmp_memcpy_d2h(out.ctypes.data, q.row_ptr(t0), out.nbytes)
    return out


def _q8_to_host(be, q, d):
    return _i8_rows(be, q, 0, q.shape[0]), be.to_host(d)


# T <= 16 (DECODE_ROWS, common.cuh): w held with x (decode, verify); more: w read at the quantization; each at
# every values-per-thread count (1 .. 8, whole and partial last rounds) and past 8192 values (the reload path)
@pytest.mark.parametrize("T,D", [(1, 32), (3, 96), (7, 4096), (2, 2080), (1, 5120), (2, 8224), (17, 1056),
                                 (33, 1024), (19, 2080), (24, 3072), (18, 4096), (40, 5120), (17, 6144), (20, 7200),
                                 (17, 8192), (20, 992), (20, 8224)])
def test_rmsnorm_q8_equals_rmsnorm_then_quantize(cuda_backend, T, D):
    be = cuda_backend
    rng = np.random.default_rng(D + T)
    x = (rng.standard_normal((T, D)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)
    w = rng.uniform(0.5, 1.5, D).astype(np.float32)
    xd_, wd_ = up(be, x), up(be, w)
    q_ref, d_ref = _q8_to_host(be, *be.quantize(be.rmsnorm(xd_, wd_, 1e-6)))
    q, d = be._q8_buffers(T, D)
    be.native.cmp_rmsnorm_q8(xd_.ptr, wd_.ptr, q.ptr, d.ptr, T, D, 1e-6)
    qh, dh = _q8_to_host(be, q, d)
    assert np.array_equal(qh, q_ref) and np.array_equal(dh, d_ref)   # the same fp32 values, bit for bit
    nq, nd = quantize_q8_blocks(REF.rmsnorm(x, w, 1e-6))               # and numpy_ref's quantization
    # fp32 vs float64 norms: a q may round the other way (by 1), a scale move by one f16 step (2^-10 relative)
    assert np.abs(qh.reshape(nq.shape).astype(np.float32) - nq).max() <= 1
    assert np.all(np.abs(dh - nd) <= nd * 2.0 ** -10)


@pytest.mark.parametrize("op", [0, 1])
@pytest.mark.parametrize("T,n", [(1, 32), (5, 160), (16, 12288), (33, 64)])
def test_binary_q8_equals_op_then_quantize(cuda_backend, op, T, n):
    be = cuda_backend
    rng = np.random.default_rng(op * 100 + T + n)
    a, b = (rng.standard_normal((2, T, n)) * 3).astype(np.float32)
    ad, bd = up(be, a), up(be, b)
    unfused = be.swiglu(ad, bd) if op == 0 else be.sigmoid_mul(ad, bd)
    q_ref, d_ref = _q8_to_host(be, *be.quantize(unfused))
    q, d = be._q8_buffers(T, n)
    be.native.cmp_binary_q8(ad.ptr, bd.ptr, op, q.ptr, d.ptr, T, n)
    assert all(np.array_equal(g, r) for g, r in zip(_q8_to_host(be, q, d), (q_ref, d_ref)))


def test_q8_producers_refuse_misaligned_inputs(cuda_backend):
    """quantize_q8 and binary_q8 read 16 bytes a lane (store_block8): a pointer inside a block is refused, and the
    message names the argument; an aligned call on the same buffers runs."""
    be = cuda_backend
    x = up(be, np.ones((1, 64), np.float32))
    q, d = be._q8_buffers(1, 32)
    with pytest.raises(NativeError, match="cmp_quantize_q8: x"):
        be.native.cmp_quantize_q8(x.ptr + 4, q.ptr, d.ptr, 1, 32)
    with pytest.raises(NativeError, match="cmp_binary_q8: a, b"):
        be.native.cmp_binary_q8(x.ptr, x.ptr + 8, 0, q.ptr, d.ptr, 1, 32)
    be.native.cmp_binary_q8(x.ptr, x.ptr + 128, 0, q.ptr, d.ptr, 1, 32)
    assert abs(be.to_host(d)[0] - 1 / (1 + np.exp(-1.0)) / 127) < 2.0 ** -10 / 127   # silu(1) * 1's scale


# T <= 16: the block-per-head layout (decode, verify); more: a warp per head (quantize.cu DECODE_ROWS)
@pytest.mark.parametrize("T,V,Dv", [(1, 1, 32), (7, 32, 128), (3, 5, 256), (33, 3, 64), (20, 2, 96), (17, 5, 256),
                                    (40, 48, 128)])
def test_gated_rmsnorm_q8_equals_unfused(cuda_backend, T, V, Dv):
    be = cuda_backend
    rng = np.random.default_rng(T * V + Dv)
    o, z = rng.standard_normal((2, T, V * Dv)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, Dv).astype(np.float32)
    od, zd, wd_ = up(be, o), up(be, z), up(be, w)
    q_ref, d_ref = _q8_to_host(be, *be.quantize(be.gated_rmsnorm(od, zd, wd_, 1e-6, Dv)))
    q, d = be._q8_buffers(T, V * Dv)
    be.native.cmp_gated_rmsnorm_q8(od.ptr, zd.ptr, wd_.ptr, q.ptr, d.ptr, T, V, Dv, 1e-6)
    assert all(np.array_equal(g, r) for g, r in zip(_q8_to_host(be, q, d), (q_ref, d_ref)))


def test_gated_rmsnorm_q8_refuses_heads_past_its_registers(cuda_backend):
    """A lane holds 8 values of a head in the prefill layout (gated_rmsnorm_q8_warp_kernel; the one limit for both
    layouts): wider heads are refused, naming the limit (the backend runs them unfused: the test below)."""
    be = cuda_backend
    o = up(be, np.ones((1, 288), np.float32))
    q, d = be._q8_buffers(1, 288)
    with pytest.raises(NativeError, match="<= 256"):
        be.native.cmp_gated_rmsnorm_q8(o.ptr, o.ptr, o.ptr, q.ptr, d.ptr, 1, 1, 288, 1e-6)


def test_gated_rmsnorm_matmul_add_runs_wide_heads_unfused(cuda_backend):
    """Heads wider than the fused kernel takes (GATED_Q8_MAX_DV): the kernel refuses them (the test above), so the
    backend must route them through the unfused ops; the result is numpy_ref's within the Q8 tolerance."""
    be = cuda_backend
    rng = np.random.default_rng(288)
    T, V, Dv, D = 20, 2, 288, 64
    o, z = rng.standard_normal((2, T, V * Dv)).astype(np.float32)
    gn = rng.uniform(0.5, 1.5, Dv).astype(np.float32)
    x = rng.standard_normal((T, D)).astype(np.float32)
    w_o = random_q8(rng, D, V * Dv)
    ref = REF.gated_rmsnorm_matmul_add(o, z, gn, 1e-6, Dv, REF.upload_matrix(w_o), x)
    got = be.gated_rmsnorm_matmul_add(up(be, o), up(be, z), up(be, gn), 1e-6, Dv, be.upload_matrix(w_o), up(be, x))
    assert rel(be.to_host(got), ref) < Q8_TOL


@pytest.mark.parametrize("T", [1, 5, 16, 40, 130])
def test_fused_backend_ops_match_numpy(cuda_backend, T):
    """The five fused ops of base.Backend on the CUDA backend (fused kernels, v2 projections) against numpy_ref's
    compositions, and against the same backend with fusion and the v2 kernels switched off."""
    be = cuda_backend
    rng = np.random.default_rng(T + 5)
    D, F, V, Dv = 256, 416, 4, 64
    x = rng.standard_normal((T, D)).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, D).astype(np.float32)
    w_in = [random_q8(rng, r, D) for r in (F, F, 3)]
    w_down, w_o = random_q8(rng, D, F), random_q8(rng, D, V * Dv)
    gate, upv = rng.standard_normal((2, T, F)).astype(np.float32)
    o, z = rng.standard_normal((2, T, V * Dv)).astype(np.float32)
    gn = rng.uniform(0.5, 1.5, Dv).astype(np.float32)

    def run(bk, host):
        u = (lambda a: a) if host else (lambda a: up(bk, a))
        m = bk.upload_matrix
        h = (lambda t: t) if host else bk.to_host
        outs = bk.rmsnorm_matmuls(u(x), u(nw), 1e-6, [m(w) for w in w_in])
        outs.append(bk.matmul_add(u(gate), m(w_down), u(x)))
        outs.append(bk.swiglu_matmul_add(u(gate), u(upv), m(w_down), u(x)))
        outs.append(bk.sigmoid_mul_matmul_add(u(gate), u(upv), m(w_down), u(x)))
        outs.append(bk.gated_rmsnorm_matmul_add(u(o), u(z), u(gn), 1e-6, Dv, m(w_o), u(x)))
        return [h(t) for t in outs]

    ref = run(REF, True)
    new = run(be, False)
    saved = be.fuse_ops, be.gemv_v2, be.gemm_v2
    try:
        be.fuse_ops = be.gemv_v2 = be.gemm_v2 = False
        old = run(be, False)
    finally:
        be.fuse_ops, be.gemv_v2, be.gemm_v2 = saved
    for g, r, o_ in zip(new, ref, old):
        assert rel(g, r) < Q8_TOL and rel(g, o_) < Q8_TOL
