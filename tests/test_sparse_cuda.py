"""Block-sparse prefill on the GPU: the probe kernel (cmp_sparse_probe) against sparse_attn.group_stats on fresh
random inputs (odd chunk sizes and offsets, every KV format), and the whole chunked prefill with --sparse-prefill
against the numpy backend running the same selection."""
from __future__ import annotations

import math

import numpy as np
import pytest

from llamacmp import kv_quant
from llamacmp import sparse_attn as sa
from llamacmp.lib._native import SIGNATURES

pytestmark = pytest.mark.cuda

KV_CODES = {"f32": 0, "f16": 1, "q8_0": 2, "q4_0": 3, "tq3": 4}


def _cache(be, k: np.ndarray, k_type: str):
    """k [n, Hk, Dh] f32 -> (device cache of k_type, what a read of it returns [n, Hk, Dh] f32)."""
    if k_type in ("f32", "f16"):
        return be.from_host(k, k_type, "test K cache"), kv_quant.roundtrip(k, k_type)
    if "cmp_kv_write_q" not in SIGNATURES:
        pytest.skip("this library has no quantized KV write (cmp_kv_write_q) yet")
    n, Hk, Dh = k.shape
    row = kv_quant.cache_bytes(k_type, 1, 1, Dh)
    kc = be.zeros((n * Hk * row,), "u8", "test K cache")
    vc = be.zeros((n * Hk * row,), "u8", "test V cache")
    kd = be.from_host(k.astype(np.float32), "f32")
    pos = be.from_host(np.arange(n, dtype=np.int32), "i32")
    be.native.cmp_kv_write_q(kd.ptr, kd.ptr, pos.ptr, kc.ptr, vc.ptr, KV_CODES[k_type], KV_CODES[k_type], n, Hk, Dh)
    return kc, kv_quant.roundtrip(k, k_type)


@pytest.mark.parametrize("k_type", ["f32", "f16", "q8_0", "q4_0", "tq3"])
@pytest.mark.parametrize("p0, L, Hq, Hk, Dh", [(0, 1, 4, 2, 64), (0, 64, 4, 4, 128), (37, 97, 16, 4, 256),
                                               (128, 65, 8, 2, 128), (1000, 31, 4, 1, 64)])
def test_probe_kernel_matches_group_stats(cuda_backend, k_type, p0, L, Hq, Hk, Dh):
    be = cuda_backend
    rng = np.random.default_rng(p0 + L + Dh)
    n = p0 + L
    q = rng.standard_normal((L, Hq, Dh)).astype(np.float32)
    k = (rng.standard_normal((n, Hk, Dh)) * 0.7).astype(np.float32)
    k[::53] *= 4.0                                           # a few heavy keys, so mass is uneven
    kc, k_read = _cache(be, k, k_type)
    chunk = sa.Chunk(p0, L, 64)
    rows = sa.probe_rows(L, 7)
    start, end, limit = chunk.groups(rows)
    G, nkb, scale = len(start), chunk.nkb, 1 / math.sqrt(Dh)
    want_mass, want_mean = sa.group_stats(q, k_read, start, end, limit, scale, 64, nkb)
    g_d = be.from_host(np.stack([start, end, limit]).astype(np.int32), "i32")
    mass, mean = be.empty((Hq, G, nkb)), be.empty((Hq, G, nkb))
    work = be.empty((G * Hq * Dh + 4 * Hq * G * nkb,))
    qd = be.from_host(q, "f32")
    be.native.cmp_sparse_probe(qd.ptr, kc.ptr, KV_CODES[k_type], g_d.ptr, g_d.row_ptr(1), g_d.row_ptr(2), mass.ptr,
                               mean.ptr, work.ptr, L, G, Hq, Hk, Dh, scale, nkb, n)
    got_mass, got_mean = be.to_host(mass), be.to_host(mean)
    np.testing.assert_allclose(got_mass, want_mass, atol=2e-5, rtol=1e-4)
    np.testing.assert_array_equal(np.isneginf(got_mean), np.isneginf(want_mean))
    fin = np.isfinite(want_mean)
    # mean scores: fp32 dots of Dh terms; tq3 keys are read in the rotated domain (the query is rotated instead)
    np.testing.assert_allclose(got_mean[fin], want_mean[fin], atol=1e-4 * math.sqrt(Dh), rtol=1e-4)


@pytest.mark.parametrize("device_select", [False, True])
def test_sparse_prefill_matches_the_numpy_backend(fixture_gguf, cuda_backend, device_select):
    """The chunked prefill with block-sparse attention on the GPU against the numpy backend running the same
    selection on the same fixture (the chosen blocks may differ where two candidates' recalls tie within fp32);
    the selection on the host from the copied statistics, or on the device (cmp_sparse_select)."""
    if "cmp_attn_prefill" not in SIGNATURES:
        pytest.skip("this library has no block-sparse prefill kernel (cmp_attn_prefill) yet")
    if device_select and "cmp_sparse_select" not in SIGNATURES:
        pytest.skip("this library has no device selection (cmp_sparse_select) yet")
    from llamacmp.backends.base import StepBatch
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.loader import load_model
    path = fixture_gguf("small", "f32")
    cfg_sp = sa.SparseConfig(budget=0.3, min_len=256)
    out, stats, ids = {}, {}, None
    for name, be in (("numpy", NumpyBackend()), ("cuda", cuda_backend)):
        lm = load_model(path, be)
        if ids is None:
            ids = [int(i) for i in np.random.default_rng(11).integers(0, lm.cfg.n_vocab, 640)]
        be.sparse, be.sparse_stats = cfg_sp, None
        if name == "cuda":
            be.sparse_device_select = device_select
        try:
            st = be.new_state(lm.cfg, len(ids))
            rows = [be.to_host(lm.model.forward(StepBatch.build([(st, ids[c:c + 128])], all_logits=True)))
                    for c in range(0, len(ids), 128)]
        finally:
            be.sparse = None
            if name == "cuda":
                be.sparse_device_select = False
        out[name], stats[name] = np.concatenate(rows), be.sparse_stats
    assert stats["cuda"].chunks_sparse == stats["numpy"].chunks_sparse > 0
    assert abs(stats["cuda"].density - stats["numpy"].density) < 0.05
    ref = out["numpy"]
    # dense, this F32 fixture holds 1e-2 (test_model_cuda); a block chosen differently on an fp32 near-tie of
    # two candidates' scores may add a little more
    assert np.linalg.norm(out["cuda"] - ref) / np.linalg.norm(ref) < 3e-2


@pytest.mark.parametrize("Hq, Hl, P, nqb, qb0", [(4, 2, 1, 1, 0), (16, 4, 16, 8, 1016), (8, 8, 7, 3, 60),
                                                 (6, 2, 5, 32, 97), (16, 4, 16, 8, 4088), (2, 1, 3, 2, 1)])
@pytest.mark.parametrize("ties", [False, True])
def test_select_kernel_matches_select_lists(cuda_backend, Hq, Hl, P, nqb, qb0, ties):
    """cmp_sparse_select against sparse_attn.select_lists on random statistics shaped as the probe's (mass zero past
    each probe's own block, mean -inf past each query block's diagonal); with ties: values from a few levels, so
    that equal weights and scores must be ranked in index order. The pattern may differ only where two patterns'
    recalls agree to 1e-9 (an fp64 sum in another order); the lists must then be that pattern's."""
    if "cmp_sparse_select" not in SIGNATURES:
        pytest.skip("this library has no device selection (cmp_sparse_select) yet")
    be = cuda_backend
    rng = np.random.default_rng(Hq * 1000 + nqb * 10 + qb0 + ties)
    nkb, G = qb0 + nqb, P + nqb
    pqb = np.sort(rng.integers(0, nqb, P)).astype(np.int32)
    pqb[-1] = nqb - 1
    if ties:
        mass = rng.integers(0, 4, (Hq, G, nkb)).astype(np.float32) / 7
        mean = rng.integers(-3, 3, (Hq, G, nkb)).astype(np.float32) / 4
    else:
        mass = rng.exponential(1.0, (Hq, G, nkb)).astype(np.float32) ** 3
        mass *= rng.random(mass.shape) < 0.05         # mostly zero: the columns leave budget to the diagonals
        mean = rng.standard_normal((Hq, G, nkb)).astype(np.float32)
    mass[:, :P] = np.where(np.arange(nkb)[None, :] <= (qb0 + pqb)[:, None], mass[:, :P], 0.0)
    mean[:, P:] = np.where(np.arange(nkb)[None, :] <= (qb0 + np.arange(nqb))[:, None], mean[:, P:], -np.inf)
    cfg = sa.SparseConfig(budget=0.25)
    chunk = sa.Chunk(qb0 * 64, nqb * 64, 64)
    total, keep = sa.selection_budget(chunk, cfg)
    args = dict(nqb=nqb, nkb=nkb, qb0=qb0, keep=keep, sink=cfg.sink, total=float(total))
    want_p, want_b, want_c = sa.select_lists(mass, mean, pqb, Hl, **args)
    out_p, out_b, out_c = be.empty((Hl,), "i32"), be.empty((Hl, nqb, nkb), "i32"), be.empty((Hl, nqb), "i32")
    work = be.empty((sa.select_work_bytes(Hl, P, nqb, nkb),), "u8")
    md, ed, qd = be.from_host(mass, "f32"), be.from_host(mean, "f32"), be.from_host(pqb, "i32")
    be.native.cmp_sparse_select(md.ptr, ed.ptr, qd.ptr, out_p.ptr, out_b.ptr, out_c.ptr, work.ptr, Hq, Hl, P, nqb,
                                nkb, qb0, keep, cfg.sink, float(total))
    # to_host hands every dtype back as float32: ids and counts come back as integers for indexing
    got_p, got_b, got_c = (be.to_host(t).astype(np.int64) for t in (out_p, out_b, out_c))
    # the reference's candidates and recalls, to tell a real disagreement from an fp64 tie
    pm = mass[:, :P].reshape(Hl, Hq // Hl, P, nkb).sum(1, dtype=np.float32)
    pmean = mean[:, P:].reshape(Hl, Hq // Hl, nqb, nkb).mean(1, dtype=np.float32)
    cand = sa._candidates(pm, pmean, pqb, sa.Chunk(qb0, nqb, 1), total, keep, cfg.sink)      # [3, Hl, nqb, nkb]
    for h in range(Hl):
        if got_p[h] != want_p[h]:
            r = [float((pm[h].astype(np.float64) * cand[pat, h][pqb]).sum()) for pat in (got_p[h], want_p[h])]
            assert abs(r[0] - r[1]) <= 1e-9 * max(r), (h, got_p[h], want_p[h], r)
        blocks, counts = sa.block_lists(cand[got_p[h], h][None])
        np.testing.assert_array_equal(got_c[h], counts[0])
        np.testing.assert_array_equal(got_b[h, :, :blocks.shape[2]], blocks[0])
        assert (got_b[h, :, blocks.shape[2]:] == (qb0 + np.arange(nqb))[:, None]).all()
    np.testing.assert_array_equal(want_c, [sa.block_lists(cand[want_p[h], h][None])[1][0] for h in range(Hl)])
