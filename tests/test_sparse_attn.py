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


@pytest.mark.parametrize("n", [33, 160, 257])
def test_masks_are_causal_keep_the_diagonal_and_respect_the_budget(n):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((n, 8)), rng.standard_normal((n, 8))
    nb = -(-n // CFG.block)
    rows = sa.probe_rows(n, CFG.probe)
    for name, mask in (("a_shape", sa.mask_a_shape(nb, CFG)),
                       ("vertical_slash", sa.mask_vertical_slash(rows, sa.probe_attention(q, k, rows, 0.35), n, CFG)),
                       ("block_sparse", sa.mask_block_sparse(q, k, CFG))):
        assert not (mask & ~sa.causal_blocks(nb)).any(), name
        assert mask.diagonal().all(), name
        if nb >= 8:      # tiny prompts keep nearly everything anyway
            assert mask.sum() <= 2.2 * CFG.budget * sa.causal_blocks(nb).sum(), name


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
