"""Block-sparse prefill reference: exactness over the chosen blocks, masks that respect causality and budget, and
pattern choice that finds the structure planted in synthetic heads."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp import sparse_attn as sa

CFG = sa.SparseConfig(block=16, budget=0.3, probe=32)


def _dense(q, k, v, scale):
    return sa.block_sparse_attention(q, k, v, sa.causal_blocks(-(-len(q) // CFG.block)), scale, CFG.block)


@pytest.mark.parametrize("n", [1, 17, 64, 97])
def test_full_mask_equals_dense_attention(n):
    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((n, 8)) for _ in range(3))
    s = np.where(np.tril(np.ones((n, n), bool)), q @ k.T / np.sqrt(8), -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    np.testing.assert_allclose(_dense(q, k, v, 1 / np.sqrt(8)), (p / p.sum(1, keepdims=True)) @ v, rtol=1e-12)


def _stats(q, k, p0, rows, cfg, scale=0.35):
    """q [L, H, d], k [p0+L, H, d] -> (chunk, mass [H, P, nkb], mean [H, nqb, nkb])."""
    chunk = sa.Chunk(p0, len(q), cfg.block)
    start, end, limit = chunk.groups(rows)
    mass, mean = sa.group_stats(q, k, start, end, limit, scale, cfg.block, chunk.nkb)
    return chunk, mass[:, :len(rows)], mass, mean[:, len(rows):]


@pytest.mark.parametrize("p0, n", [(0, 33), (0, 160), (0, 257), (100, 97), (61, 256)])
def test_masks_are_causal_keep_the_diagonal_and_respect_the_budget(p0, n):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((n, 2, 8)), rng.standard_normal((p0 + n, 2, 8))
    rows = sa.probe_rows(n, CFG.probe)
    chunk, mass, _, mean = _stats(q, k, p0, rows, CFG)
    masks = sa.candidate_masks(mass, mean, rows, chunk, CFG)
    causal, own = chunk.causal(), chunk.own()
    assert masks.shape == (3, 2, chunk.nqb, chunk.nkb)
    for name, m in zip(sa.PATTERNS, masks):
        assert not (m & ~causal).any(), name
        assert (m | ~own).all(), name                         # the diagonal block is always kept
        if chunk.nkb >= 8:      # tiny prompts keep nearly everything anyway
            assert m.sum() <= 2 * 2.2 * CFG.budget * causal.sum(), name


def test_group_stats_are_softmax_mass_and_pooled_scores():
    rng = np.random.default_rng(3)
    p0, L, Hq, Hk, d = 37, 50, 4, 2, 8
    q, k = rng.standard_normal((L, Hq, d)), rng.standard_normal((p0 + L, Hk, d))
    rows = np.array([0, 20, 49])
    chunk = sa.Chunk(p0, L, CFG.block)
    start, end, limit = chunk.groups(rows)
    mass, mean = sa.group_stats(q, k, start, end, limit, 0.3, CFG.block, chunk.nkb)
    np.testing.assert_allclose(mass.sum(2), 1.0, rtol=1e-12)
    # probe row 20 of head 3 (kv head 1), key block 2: positions 32..47, all visible to position 57
    s = q[20, 3] @ k[:58, 1].T * 0.3
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(mass[3, 1, 2], p[32:48].sum(), rtol=1e-12)
    # absolute query blocks: block 2 holds positions 37..47 (rows 0..10), block 4 positions 64..79 (rows 27..42)
    assert (chunk.nqb, list(start[3:]), list(end[3:])) == (4, [0, 11, 27, 43], [11, 27, 43, 50])
    qm = q[27:43, 3].mean(0)
    np.testing.assert_allclose(mean[3, 3 + 2, 4], (k[64:80, 1] @ qm).mean() * 0.3, rtol=1e-12)
    assert np.isneginf(mean[3, 3 + 0, 4])                       # block 2 (positions 37..47) sees no key of block 4
    # the last, partial block (positions 80..86) sees only keys up to 86 of key block 5
    np.testing.assert_allclose(mean[1, 3 + 3, 5], (k[80:87, 0] @ q[43:50, 1].mean(0)).mean() * 0.3, rtol=1e-12)


def test_chunked_selection_of_a_whole_prompt_is_the_whole_prompt_choice():
    rng = np.random.default_rng(5)
    n = 200
    q, k = rng.standard_normal((n, 8)), rng.standard_normal((n, 8))
    name, mask = sa.choose_head_mask(q, k, 0.35, CFG)
    pattern, masks = sa.chunk_masks(q[:, None], k[:, None], 0, 0.35, sa.SparseConfig(
        block=CFG.block, budget=CFG.budget, probe=CFG.probe, min_len=0))
    assert sa.PATTERNS[pattern[0]] == name
    np.testing.assert_array_equal(masks[0], mask)


def test_chunks_stay_dense_below_the_threshold_and_for_decode():
    q, k = np.zeros((64, 2, 8)), np.zeros((1000, 2, 8))
    cfg = sa.SparseConfig(block=16, min_len=1000)
    assert sa.chunk_masks(q, k, 1000 - 64 - 1, 0.3, cfg) is None     # 999 keys
    assert sa.chunk_masks(q, k, 1000 - 64, 0.3, cfg) is not None
    assert sa.chunk_masks(q[:15], k, 985, 0.3, cfg) is None          # less than one block of rows


@pytest.mark.parametrize("p0", [0, 45, 128])
def test_attend_chunk_full_mask_is_dense_and_matches_whole_prompt_reference(p0):
    rng = np.random.default_rng(p0)
    L, Hq, Hk, d = 70, 4, 2, 8
    q = rng.standard_normal((L, Hq, d))
    k, v = rng.standard_normal((p0 + L, Hk, d)), rng.standard_normal((p0 + L, Hk, d))
    chunk = sa.Chunk(p0, L, CFG.block)
    full = np.broadcast_to(chunk.causal(), (Hk, chunk.nqb, chunk.nkb))
    out = sa.attend_chunk(q, k, v, p0, full, 0.3, CFG.block)
    for h in range(Hq):
        kh, vh = k[:, h // 2], v[:, h // 2]
        s = np.where(np.arange(p0 + L)[None, :] <= (p0 + np.arange(L))[:, None], q[:, h] @ kh.T * 0.3, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        np.testing.assert_allclose(out[:, h], (p / p.sum(1, keepdims=True)) @ vh, rtol=1e-10)
    if p0 == 0:     # a sparse mask agrees with the one-head whole-prompt reference
        mask = (rng.random((Hq, chunk.nqb, chunk.nkb)) < 0.5) | chunk.own()
        mask &= chunk.causal()
        out = sa.attend_chunk(q, k, v, 0, mask, 0.3, CFG.block)
        for h in range(Hq):
            ref = sa.block_sparse_attention(q[:, h], k[:, h // 2], v[:, h // 2], mask[h], 0.3, CFG.block)
            np.testing.assert_allclose(out[:, h], ref, rtol=1e-10)


def _planted_head(n: int, kind: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """q, k [n, 20] whose attention is dominated by a known structure."""
    q, k = rng.standard_normal((n, 20)) * 0.1, rng.standard_normal((n, 20)) * 0.1
    if kind == "sink_local":
        # rotary-like features at 8 frequencies: q_i.k_j = sum cos(w (i - j)) peaks at i = j and decays with distance
        w = np.geomspace(0.002, 0.05, 8)
        ang = np.arange(n)[:, None] * w[None, :]
        feats = np.hstack([np.cos(ang), np.sin(ang)]) * 2.5
        q[:, :16] += feats
        k[:, :16] += feats
        k[0, 16] += 8.0                 # and a sink at token 0
        q[:, 16] += 1.0
    else:                               # "vertical": a few scattered key tokens carry all the weight
        hot = rng.choice(n, 6, replace=False)
        k[hot, 16] += 30.0
        q[:, 16] += 1.0
    return q, k


@pytest.mark.parametrize("kind", ["sink_local", "vertical"])
def test_planted_structure_is_found_and_output_stays_close(kind):
    rng = np.random.default_rng(7)
    n, scale = 512, 1 / np.sqrt(20)
    q, k = _planted_head(n, kind, rng)
    v = rng.standard_normal((n, 20))
    name, mask = sa.choose_head_mask(q, k, scale, CFG)
    rows = sa.probe_rows(n, CFG.probe)
    assert sa.recall(mask, rows, sa.probe_attention(q, k, rows, scale), CFG.block) > 0.9, name
    # the estimate from the probe queries must hold for all of them
    every = np.arange(n)
    assert sa.recall(mask, every, sa.probe_attention(q, k, every, scale), CFG.block) > 0.85, name
    assert mask.sum() < 0.5 * sa.causal_blocks(mask.shape[0]).sum()
    out, ref = sa.block_sparse_attention(q, k, v, mask, scale, CFG.block), _dense(q, k, v, scale)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 0.2


# -- the numpy backend runs the same selection inside its attention op ---------------------------------------------

@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.fixtures.qwen_vocab import tiny_vocab
    from llamacmp.fixtures.writer import SHAPES, write_model
    from llamacmp.loader import load_model
    path = write_model(tmp_path_factory.mktemp("sp") / "m.gguf", SHAPES["tiny"], "f32", tiny_vocab(), seed=7)
    return load_model(path, NumpyBackend())


def _prefill_logits(lm, sparse, ids, chunk=80):
    from llamacmp.backends.base import StepBatch
    lm.backend.sparse, lm.backend.sparse_stats = sparse, None
    st = lm.backend.new_state(lm.cfg, len(ids))
    out = [lm.model.forward(StepBatch.build([(st, ids[c:c + chunk])], all_logits=True))
           for c in range(0, len(ids), chunk)]
    lm.backend.sparse = None
    return np.concatenate(out), lm.backend.sparse_stats


def test_numpy_backend_sparse_prefill_wiring(tiny_lm):
    ids = [int(i) for i in np.random.default_rng(1).integers(0, tiny_lm.cfg.n_vocab, 200)]
    dense, _ = _prefill_logits(tiny_lm, None, ids)
    # every causal block kept: the same function as dense
    full, st = _prefill_logits(tiny_lm, sa.SparseConfig(block=16, budget=1.0, min_len=0), ids)
    assert st.chunks_sparse == 3 and st.density == 1.0
    np.testing.assert_allclose(full, dense, rtol=1e-5, atol=1e-5)
    # below the threshold every chunk stays dense
    same, st = _prefill_logits(tiny_lm, sa.SparseConfig(block=16, budget=0.2, min_len=201), ids)
    assert st.chunks_sparse == 0 and st.chunks_dense == 3
    np.testing.assert_array_equal(same, dense)
    # a real budget: chunks from 150 keys on are sparse, fewer blocks are visited, the output moves a little
    sparse, st = _prefill_logits(tiny_lm, sa.SparseConfig(block=16, budget=0.3, min_len=150), ids)
    assert st.chunks_sparse == 2 and st.chunks_dense == 1 and st.density < 0.6
    np.testing.assert_array_equal(sparse[:80], dense[:80])
    rel = np.linalg.norm(sparse - dense) / np.linalg.norm(dense)
    assert 0 < rel < 0.2


def test_block_lists_for_the_prefill_kernel():
    mask = np.zeros((2, 3, 5), bool)
    mask[0, 0, [0]] = mask[0, 1, [0, 1]] = mask[0, 2, [0, 2, 4]] = True
    mask[1, :, 0] = True
    blocks, counts = sa.block_lists(mask)
    assert blocks.dtype == np.int32 and counts.tolist() == [[1, 2, 3], [1, 1, 1]]
    assert blocks[0].tolist() == [[0, 0, 0], [0, 1, 1], [0, 2, 4]]
    assert blocks[1, :, 0].tolist() == [0, 0, 0]


def _vertical_slash_by_definition(mass, rows, chunk, cfg):
    """The vertical_slash mask spelled out per probe, offset and block (the slow form candidate_masks computes
    with slices): mass [H, P, nkb] -> [H, nqb, nkb]."""
    H, P, nkb = mass.shape
    last, causal = chunk.last_kb, chunk.causal()
    total = cfg.budget * causal.sum()
    pkb = (chunk.p0 + rows) // cfg.block
    col_w = mass.sum(1)
    diag_w = np.zeros((H, nkb))
    for h in range(H):
        for p in range(P):
            for j in range(pkb[p] + 1):
                diag_w[h, pkb[p] - j] += mass[h, p, j]
    cost = np.array([(last >= j).sum() for j in range(nkb)])
    out = np.zeros((H, chunk.nqb, nkb), bool)
    for h in range(H):
        chosen, spent = [set(), set()], 0
        for kind, w in enumerate((col_w[h], diag_w[h])):
            for x in np.argsort(-w):
                if w[x] <= 0 or spent + cost[x] > total:
                    break
                chosen[kind].add(int(x))
                spent += cost[x]
        for i, b in enumerate(last):
            for j in range(b + 1):
                out[h, i, j] = j in chosen[0] or (b - j) in chosen[1] or j == b
    return out


@pytest.mark.parametrize("p0, L, block", [(0, 97, 16), (45, 64, 16), (300, 131, 32), (1000, 16, 16)])
def test_vertical_slash_mask_is_its_definition(p0, L, block):
    rng = np.random.default_rng(p0 + L)
    cfg = sa.SparseConfig(block=block, budget=0.3, probe=7, min_len=0)
    q, k = rng.standard_normal((L, 2, 8)), rng.standard_normal((p0 + L, 2, 8))
    k[::11] *= 4.0
    rows = sa.probe_rows(L, cfg.probe)
    chunk, mass, _, mean = _stats(q, k, p0, rows, cfg)
    # and probe mass on a few blocks only (zero elsewhere), so that the columns leave budget to the diagonals
    sparse_mass = np.where(rng.random(mass.shape) < 0.15, mass, 0.0)
    for m in (mass, sparse_mass):
        masks = sa.candidate_masks(m, mean, rows, chunk, cfg)
        np.testing.assert_array_equal(masks[1], _vertical_slash_by_definition(m, rows, chunk, cfg))


@pytest.mark.parametrize("p0, L, Hq, Hl", [(0, 64, 4, 2), (100, 97, 4, 4), (1000, 160, 8, 2), (4096, 512, 16, 4)])
def test_select_lists_is_the_host_selection(p0, L, Hq, Hl):
    """select_lists (cmp_sparse_select's contract, block lists padded to nkb) = select_from_stats + block_lists."""
    rng = np.random.default_rng(p0 + L)
    cfg = sa.SparseConfig(block=64, budget=0.3, probe=16, min_len=0)
    q, k = rng.standard_normal((L, Hq, 8)), rng.standard_normal((p0 + L, Hq // 2, 8))
    k[::29] *= 4.0
    chunk = sa.Chunk(p0, L, 64)
    rows = sa.probe_rows(L, cfg.probe)
    start, end, limit = chunk.groups(rows)
    mass, mean = (x.astype(np.float32) for x in sa.group_stats(q, k, start, end, limit, 0.35, 64, chunk.nkb))
    pattern, mask = sa.select_from_stats(mass, mean, rows, chunk, cfg, Hq // Hl)
    blocks, counts = sa.block_lists(mask)
    got_p, got_b, got_c = sa.select_lists(mass, mean, Hl=Hl, **sa.select_args(rows, chunk, cfg))
    assert got_b.shape == (Hl, chunk.nqb, chunk.nkb) and got_b.dtype == got_c.dtype == np.int32
    np.testing.assert_array_equal(got_p, pattern)
    np.testing.assert_array_equal(got_c, counts)
    np.testing.assert_array_equal(got_b[:, :, :blocks.shape[2]], blocks)
    assert (got_b[:, :, blocks.shape[2]:] == chunk.last_kb[None, :, None]).all()    # padded with the diagonal
