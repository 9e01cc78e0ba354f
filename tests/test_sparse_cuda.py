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


def test_sparse_prefill_matches_the_numpy_backend(fixture_gguf, cuda_backend):
    """The chunked prefill with block-sparse attention on the GPU against the numpy backend running the same
    selection on the same fixture (the chosen blocks may differ where two candidates' recalls tie within fp32)."""
    if "cmp_attn_prefill" not in SIGNATURES:
        pytest.skip("this library has no block-sparse prefill kernel (cmp_attn_prefill) yet")
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
        try:
            st = be.new_state(lm.cfg, len(ids))
            rows = [be.to_host(lm.model.forward(StepBatch.build([(st, ids[c:c + 128])], all_logits=True)))
                    for c in range(0, len(ids), 128)]
        finally:
            be.sparse = None
        out[name], stats[name] = np.concatenate(rows), be.sparse_stats
    assert stats["cuda"].chunks_sparse == stats["numpy"].chunks_sparse > 0
    assert abs(stats["cuda"].density - stats["numpy"].density) < 0.05
    ref = out["numpy"]
    # dense, this F32 fixture holds 1e-2 (test_model_cuda); a block chosen differently on an fp32 near-tie of
    # two candidates' scores may add a little more
    assert np.linalg.norm(out["cuda"] - ref) / np.linalg.norm(ref) < 3e-2
