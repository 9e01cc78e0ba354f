"""The v2 attention kernels (cuda_src/attention.cu: cmp_kv_write_q, cmp_attn_prefill, cmp_attn_decode) against
numpy_ref / kv_quant / sparse_attn, on fresh seeded random inputs with odd lengths.

Tolerances (relative L2 error of the attention output): f32 and f16 caches 1e-4 (numpy_ref reads the same
f16-rounded values, so only the fp32 summation order differs); q8_0 / q4_0 1e-3 (the CUDA write reproduces
kv_quant's codes bit for bit); tq3 1e-2 (float32 vs float64 rotation can flip a code that sits on a threshold).
"""
from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import rel, up

from llamacmp import kv_layout, kv_quant, sparse_attn
from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.config import ModelConfig

pytestmark = pytest.mark.cuda

REF = NumpyBackend()
TOL = {"f32": 1e-4, "f16": 1e-4, "q8_0": 1e-3, "q4_0": 1e-3, "tq3": 1e-2}
# The tensor-core prefill (attn_prefill "mma", f16 caches) rounds Q and the probabilities to f16: ~3e-4 typical
MMA_TOL = 2e-3


def cfg_for(Hq, Hk, Dh) -> ModelConfig:
    return ModelConfig(n_layer=4, n_embd=64, n_ff=128, n_head=Hq, n_head_kv=Hk, head_dim=Dh, n_vocab=97,
                       n_ctx_train=1 << 18, rms_eps=1e-6, rope_base=1e7, n_rot=16, rope_sections=(0, 0, 0, 0),
                       conv_kernel=4, ssm_k_heads=2, ssm_v_heads=4, ssm_head_dim=32, full_attention_interval=4)


def make_pair(be, cfg, n_ctx, kt, vt, n_past, rng):
    """numpy and CUDA states holding the same random prefix of n_past rows (the CUDA cache in its byte layout,
    the numpy one as what a read returns)."""
    s_ref, s_dev = REF.new_state(cfg, n_ctx, kt, vt), be.new_state(cfg, n_ctx, kt, vt)
    for lay in range(len(s_ref.k)):
        for a_ref, a_dev, t in ((s_ref.k[lay], s_dev.k[lay], kt), (s_ref.v[lay], s_dev.v[lay], vt)):
            x = rng.standard_normal((n_ctx, cfg.n_head_kv, cfg.head_dim)).astype(np.float32)
            x[n_past:] = 0
            a_ref[:n_past] = kv_quant.roundtrip(x[:n_past], t)
            be.copy_from_host(a_dev, kv_layout.encode(x, t))
    s_ref.n_past = s_dev.n_past = n_past
    return s_ref, s_dev


def run_both(be, cfg, pairs, lengths, rng, block_lists=None):
    """One attention call on both backends over segments of these lengths -> (cuda out, numpy out)."""
    T, Hq, Hk, Dh = sum(lengths), cfg.n_head, cfg.n_head_kv, cfg.head_dim
    q = rng.standard_normal((T, Hq, Dh)).astype(np.float32)
    k = rng.standard_normal((T, Hk, Dh)).astype(np.float32)
    v = rng.standard_normal((T, Hk * Dh)).astype(np.float32)
    b_ref = StepBatch.build([(s, [0] * n) for (s, _), n in zip(pairs, lengths)])
    b_dev = StepBatch.build([(s, [0] * n) for (_, s), n in zip(pairs, lengths)])
    ref = REF.attention(q, k, v, b_ref, 0, cfg)
    got = be.attention(up(be, q), up(be, k), up(be, v), b_dev, 0, cfg, block_lists=block_lists)
    return be.to_host(got), ref, (q, k, v)


# -- KV write ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kv_type", kv_quant.KV_TYPES)
@pytest.mark.parametrize("Dh", [64, 128, 256])
def test_kv_write_layout(cuda_backend, kv_type, Dh):
    be, rng = cuda_backend, np.random.default_rng(Dh + len(kv_type))
    cfg = cfg_for(4, 2, Dh)
    s_ref, s_dev = make_pair(be, cfg, 80, kv_type, kv_type, 5, rng)
    L = 67
    run_both(be, cfg, [(s_ref, s_dev)], [L], rng)
    s_ref.n_past += L
    s_dev.n_past += L
    raw = be.kv_rows_raw(s_dev.k[0], s_ref.n_past)
    dec = kv_layout.decode(raw, kv_type, Dh)
    want = s_ref.k[0][:s_ref.n_past].astype(np.float32)
    if kv_type in ("f32", "f16", "q8_0", "q4_0"):
        np.testing.assert_array_equal(dec, want)          # bit-exact codes and scales
    else:
        codes_equal = np.mean(np.isclose(dec, want, rtol=2e-3, atol=1e-6))
        assert codes_equal > 0.995, codes_equal
        assert rel(dec, want) < 5e-3
    host = be.state_to_host(s_dev)
    assert rel(host["v"][0], s_ref.v[0][:s_ref.n_past]) < (1e-6 if kv_type != "tq3" else 5e-3)


# -- prefill ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Hq,Hk,Dh", [(16, 4, 256), (4, 2, 64), (6, 2, 128), (3, 3, 64)])
@pytest.mark.parametrize("L", [1, 63, 65, 127, 257, 1000])
@pytest.mark.parametrize("n_past", [0, 100])
def test_prefill(attn_backend, smem_cap, monkeypatch, Hq, Hk, Dh, L, n_past):
    """Every segment through the prefill kernel of each route (fp32: cmp_attn_prefill; mma: cmp_attn_prefill_mma),
    the fp32 one also sized for older cards' shared memory per block (smem_cap)."""
    if Dh == 256 and L == 1000 and n_past:
        pytest.skip("covered by the smaller heads (keeps the numpy reference fast)")
    cuda_backend = attn_backend
    monkeypatch.setattr(cuda_backend, "DECODE_MAX_L", 0)      # every segment through the prefill kernel
    rng = np.random.default_rng(L * 31 + Dh + n_past)
    cfg = cfg_for(Hq, Hk, Dh)
    pair = make_pair(cuda_backend, cfg, n_past + L + 3, "f16", "f16", n_past, rng)
    got, ref, _ = run_both(cuda_backend, cfg, [pair], [L], rng)
    assert rel(got, ref) < (MMA_TOL if cuda_backend.routes.attn_prefill == "mma" else TOL["f16"])


def test_prefill_mma_route_runs_the_tensor_core_kernel(cuda_backend, monkeypatch):
    """attn_prefill "mma" changes the kernel, not only the name: its f16 rounding gives other bits than the fp32
    kernel on the same inputs (both within their tolerances of numpy), and an f32 cache keeps the fp32 kernel."""
    from dataclasses import replace
    if not cuda_backend.native.attn_mma_available():
        pytest.skip("the mma attention route needs compute capability 8.0+ code for this device (f16 mma.sync)")
    monkeypatch.setattr(cuda_backend, "DECODE_MAX_L", 0)
    cfg = cfg_for(16, 4, 256)
    outs = {}
    saved = cuda_backend.routes
    try:
        for kv in ("f16", "f32"):
            for route in ("fp32", "mma"):
                cuda_backend.routes = replace(saved, attn_prefill=route)
                rng = np.random.default_rng(77)
                pair = make_pair(cuda_backend, cfg, 200, kv, kv, 60, rng)
                outs[kv, route], ref, _ = run_both(cuda_backend, cfg, [pair], [130], rng)
                assert rel(outs[kv, route], ref) < (MMA_TOL if (kv, route) == ("f16", "mma") else TOL[kv])
    finally:
        cuda_backend.routes = saved
    assert not np.array_equal(outs["f16", "mma"], outs["f16", "fp32"])
    assert np.array_equal(outs["f32", "mma"], outs["f32", "fp32"])


def test_prefill_f32_cache_and_segments(cuda_backend):
    rng = np.random.default_rng(5)
    cfg = cfg_for(8, 2, 128)
    pairs = [make_pair(cuda_backend, cfg, 700, "f32", "f32", p, rng) for p in (0, 31, 600)]
    got, ref, _ = run_both(cuda_backend, cfg, pairs, [65, 9, 33], rng)
    assert rel(got, ref) < TOL["f32"]


# -- decode -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_past", [0, 1, 127, 128, 129, 4095, 16383, 16385, 40000])
@pytest.mark.parametrize("L", [1, 3])
def test_decode_depths(cuda_backend, n_past, L):
    rng = np.random.default_rng(n_past + L)
    cfg = cfg_for(16, 4, 256)
    pair = make_pair(cuda_backend, cfg, n_past + L + 1, "f16", "f16", n_past, rng)
    got, ref, _ = run_both(cuda_backend, cfg, [pair], [L], rng)
    assert rel(got, ref) < TOL["f16"]


@pytest.mark.parametrize("Hq,Hk,Dh", [(4, 2, 64), (6, 1, 128), (8, 8, 256), (24, 4, 256)])
def test_decode_groups(cuda_backend, Hq, Hk, Dh):
    rng = np.random.default_rng(Hq * Dh)
    cfg = cfg_for(Hq, Hk, Dh)
    pairs = [make_pair(cuda_backend, cfg, 3000, "f16", "f16", p, rng) for p in (2900, 7)]
    got, ref, _ = run_both(cuda_backend, cfg, pairs, [1, 2], rng)
    assert rel(got, ref) < TOL["f16"]


def test_decode_is_batch_and_graph_invariant(cuda_backend, monkeypatch):
    """A row's result is bit-identical alone, next to other segments, and with the grid sized for the whole
    context (as a captured graph does): its split count depends only on its own key count."""
    be, rng = cuda_backend, np.random.default_rng(11)
    cfg = cfg_for(16, 4, 256)
    Hq, Hk, Dh = 16, 4, 256
    # a: 3001 keys (24 splits) while the capture-sized grid is 128 splits; b: a longer neighbour
    a = make_pair(be, cfg, 40000, "f16", "f16", 3000, rng)[1]
    b = make_pair(be, cfg, 40000, "f16", "f16", 20000, rng)[1]
    q = rng.standard_normal((2, Hq, Dh)).astype(np.float32)
    k = rng.standard_normal((2, Hk, Dh)).astype(np.float32)
    v = rng.standard_normal((2, Hk * Dh)).astype(np.float32)

    def run(states, capturing=False):
        monkeypatch.setattr(be, "capturing", capturing)
        batch = StepBatch.build([(s, [0]) for s in states])
        n = len(states)
        return be.to_host(be.attention(up(be, q[:n]), up(be, k[:n]), up(be, v[:n]), batch, 0, cfg))[0]
    alone = run([a])
    assert np.array_equal(alone, run([a, b]))
    assert np.array_equal(alone, run([a], capturing=True))


# -- KV types ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kt", kv_quant.KV_TYPES)
@pytest.mark.parametrize("vt", kv_quant.KV_TYPES)
@pytest.mark.parametrize("L", [1, 70])
def test_kv_type_pairs(cuda_backend, kt, vt, L):
    rng = np.random.default_rng(len(kt) * 7 + len(vt) + L)
    cfg = cfg_for(8, 2, 256) if L == 1 else cfg_for(4, 2, 128)
    pair = make_pair(cuda_backend, cfg, 400 + L, kt, vt, 300, rng)
    got, ref, _ = run_both(cuda_backend, cfg, [pair], [L], rng)
    assert rel(got, ref) < max(TOL[kt], TOL[vt])


# Quantized rows staged in shared memory by cp.async on sm_80+ (tq3 K and V at Dh 256; q4_0 V; q8_0 too large to
# stage: direct loads beside staged ones): splits of several tiles, so both buffers are refilled.
@pytest.mark.parametrize("kt,vt", [("q4_0", "q4_0"), ("q8_0", "tq3"), ("tq3", "q8_0"), ("q4_0", "tq3"), ("f16", "tq3"),
                                   ("tq3", "f16"), ("q8_0", "q8_0")])
@pytest.mark.parametrize("n_past,L", [(5000, 1), (16385, 3)])
def test_decode_quantized_long(cuda_backend, kt, vt, n_past, L):
    rng = np.random.default_rng(n_past + len(kt) * 3 + len(vt))
    cfg = cfg_for(16, 4, 256)
    pair = make_pair(cuda_backend, cfg, n_past + L + 1, kt, vt, n_past, rng)
    got, ref, _ = run_both(cuda_backend, cfg, [pair], [L], rng)
    assert rel(got, ref) < max(TOL[kt], TOL[vt])


def test_tq3_small_head_dim(cuda_backend):
    """Dh 64: tq3 blocks of 64 values (the 32/64-value sign vectors are prefixes of the 128 one)."""
    rng = np.random.default_rng(64)
    cfg = cfg_for(4, 2, 64)
    pair = make_pair(cuda_backend, cfg, 200, "tq3", "tq3", 99, rng)
    got, ref, _ = run_both(cuda_backend, cfg, [pair], [17], rng)
    assert rel(got, ref) < TOL["tq3"]


# -- block-sparse prefill -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("Hq,Hk,Dh,L,n_past", [(16, 4, 256, 300, 100), (4, 2, 64, 513, 0), (6, 2, 128, 200, 64),
                                               (3, 1, 64, 129, 1000)])
def test_block_sparse_prefill(cuda_backend, smem_cap, Hq, Hk, Dh, L, n_past):
    be, rng = cuda_backend, np.random.default_rng(L + n_past)
    cfg = cfg_for(Hq, Hk, Dh)
    s_ref, s_dev = make_pair(be, cfg, n_past + L + 2, "f16", "f16", n_past, rng)
    chunk = sparse_attn.Chunk(n_past, L, 64)
    mask = (rng.random((Hk, chunk.nqb, chunk.nkb)) < 0.4) & chunk.causal()[None]
    mask |= chunk.own()[None]                                   # the diagonal is always kept
    blocks, counts = sparse_attn.block_lists(mask)
    got, _, (q, k, v) = run_both(be, cfg, [(s_ref, s_dev)], [L], rng, block_lists=[(blocks, counts)])
    kc = np.asarray(s_ref.k[0][:n_past + L], np.float32)       # numpy state now holds the new rows too
    vc = np.asarray(s_ref.v[0][:n_past + L], np.float32)
    want = sparse_attn.attend_chunk(q, kc, vc, n_past, mask, 1 / np.sqrt(Dh), 64).reshape(L, Hq * Dh)
    assert rel(got, want) < TOL["f16"]
    # the mask really drops blocks: the dense causal result is far from it
    full = np.ones_like(mask) & chunk.causal()[None]
    dense = sparse_attn.attend_chunk(q, kc, vc, n_past, full, 1 / np.sqrt(Dh), 64).reshape(L, Hq * Dh)
    assert rel(got, dense) > 10 * TOL["f16"]


# -- prefill under older cards' shared memory (smem_cap above runs the tests under each) -------------------------

@pytest.mark.parametrize("Dh", [64, 128, 256])
def test_prefill_rows_per_block_give_the_same_bits(cuda_backend, monkeypatch, Dh):
    """Fewer rows per block (smem_plan.h: 16 / 32 where shared memory is short) change no row's arithmetic: the
    output under every cap equals the device's own configuration bit for bit."""
    from cuda_helpers import SMEM_CAPS
    monkeypatch.setattr(cuda_backend, "DECODE_MAX_L", 0)
    cfg = cfg_for(8, 2, Dh)
    outs = {}
    for name, cap in SMEM_CAPS.items():
        rng = np.random.default_rng(Dh)
        pair = make_pair(cuda_backend, cfg, 300, "q8_0", "f16", 100, rng)
        cuda_backend.native.cmp_set_smem_cap(cap)
        try:
            outs[name] = run_both(cuda_backend, cfg, [pair], [150], rng)[0]
        finally:
            cuda_backend.native.cmp_set_smem_cap(0)
    for name, out in outs.items():
        np.testing.assert_array_equal(out, outs["device"], err_msg=name)


@pytest.mark.parametrize("kt,vt", [("f16", "f16"), ("q8_0", "tq3")])
@pytest.mark.parametrize("Hq,Hk,Dh,L,n_past", [(24, 4, 256, 200, 300), (6, 2, 128, 513, 0), (4, 2, 64, 65, 1000)])
def test_prefill_pieces_give_the_same_bits(cuda_backend, monkeypatch, kt, vt, Hq, Hk, Dh, L, n_past):
    """The FP32 prefill's serial pieces of the key range (attention.cu: a row tile's key tiles run by several
    blocks in turn, the unnormalised sums parked in the output rows, each thread's max and sum in attn_pf_carry)
    give the unsplit bits, against numpy_ref. cmp_set_serial_pieces forces a count on every dense launch (0: the
    launch's plan; 7: more pieces than some row tiles have key tiles, which then only carry the state through)."""
    from dataclasses import replace
    be = cuda_backend
    monkeypatch.setattr(be, "DECODE_MAX_L", 0)      # every segment through the prefill kernel
    monkeypatch.setattr(be, "routes", replace(be.routes, attn_prefill="fp32"))
    cfg = cfg_for(Hq, Hk, Dh)
    outs = {}
    for pieces in (1, 2, 3, 7, 0):
        rng = np.random.default_rng(L + n_past + Dh)
        pair = make_pair(be, cfg, n_past + L + 3, kt, vt, n_past, rng)
        be.native.cmp_set_serial_pieces(pieces)
        try:
            outs[pieces], ref, _ = run_both(be, cfg, [pair], [L], rng)
        finally:
            be.native.cmp_set_serial_pieces(0)
    assert rel(outs[1], ref) < max(TOL[kt], TOL[vt])
    for pieces, out in outs.items():
        np.testing.assert_array_equal(out, outs[1], err_msg=f"{pieces} pieces")


def test_prefill_over_the_cap_names_kernel_and_bytes(cuda_backend, monkeypatch):
    """Below the smallest configuration (36 KB at Dh 256) nothing runs and the error says which kernel needs how
    much; the cap is visible through cmp_smem_limit."""
    from llamacmp.lib._native import CMP_ERR_UNSUPPORTED, NativeError
    monkeypatch.setattr(cuda_backend, "DECODE_MAX_L", 0)
    cfg = cfg_for(4, 2, 256)
    rng = np.random.default_rng(1)
    pair = make_pair(cuda_backend, cfg, 80, "f16", "f16", 0, rng)
    own = cuda_backend.native.smem_limit()
    cuda_backend.native.cmp_set_smem_cap(32 * 1024)
    try:
        assert cuda_backend.native.smem_limit() == 32 * 1024
        with pytest.raises(NativeError) as e:
            run_both(cuda_backend, cfg, [pair], [70], rng)
    finally:
        cuda_backend.native.cmp_set_smem_cap(0)
    assert cuda_backend.native.smem_limit() == own >= 48 * 1024
    assert e.value.code == CMP_ERR_UNSUPPORTED
    assert "attn_prefill_kernel needs 36864 B" in e.value.message and "allows 32768 B" in e.value.message


# -- the round-1 kernel: the head dims the v2 kernels do not take ----------------------------------------------------

@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("Dh", [32, 96, 192])
def test_round1_head_dims_match(cuda_backend, smem_cap, Dh, kv_type):
    """Prefill (several tiles) and decode (one split and several) of the round-1 kernel, also under each older
    card's shared memory: at Dh 192 sm_61's 48 KB takes 8 rows per block with V loaded over K."""
    assert Dh not in cuda_backend.V2_HEAD_DIMS
    rng = np.random.default_rng(Dh)
    cfg = cfg_for(8, 2, Dh)
    pairs = [make_pair(cuda_backend, cfg, 700, kv_type, kv_type, p, rng) for p in (0, 600)]
    got, ref, _ = run_both(cuda_backend, cfg, pairs, [70, 1], rng)
    assert rel(got, ref) < TOL[kv_type]


# tq3 K and V at Dh 256 (the 9B's cache at 128K): partial and single tiles, one and several splits (128-key chunks
# from 129 keys on, a short last split), groups of 1 .. 4 (3: a padding head) and 5, 6 (the 8-head instantiation),
# several rows per segment.
@pytest.mark.parametrize("n_past", [0, 1, 62, 63, 64, 127, 128, 129, 1000, 4095, 16385])
@pytest.mark.parametrize("L", [1, 3])
def test_decode_tq3_depths(cuda_backend, n_past, L):
    rng = np.random.default_rng(1000 + n_past + L)
    cfg = cfg_for(16, 4, 256)
    pair = make_pair(cuda_backend, cfg, n_past + L + 1, "tq3", "tq3", n_past, rng)
    got, ref, _ = run_both(cuda_backend, cfg, [pair], [L], rng)
    assert rel(got, ref) < TOL["tq3"]


@pytest.mark.parametrize("Hq,Hk", [(8, 8), (8, 4), (6, 2), (24, 4), (5, 1)])
def test_decode_tq3_groups(cuda_backend, Hq, Hk):
    rng = np.random.default_rng(Hq * 31 + Hk)
    cfg = cfg_for(Hq, Hk, 256)
    pairs = [make_pair(cuda_backend, cfg, 3000, "tq3", "tq3", p, rng) for p in (2900, 7)]
    got, ref, _ = run_both(cuda_backend, cfg, pairs, [1, 2], rng)
    assert rel(got, ref) < TOL["tq3"]
