"""Block-sparse prefill attention (MInference-style), numpy reference: choose per head which key blocks each query
block attends to, then compute attention exactly over those blocks.

Patterns (per head, chosen per input from a cheap estimate):
  a_shape          the first `sink` blocks + the last `local` blocks before each query block (sinks + window)
  vertical_slash   the key columns and the diagonals (query - key offsets) that the last queries weight most
  block_sparse     per query block, the key blocks with the highest mean-pooled q.k score
The estimate is the exact attention of `probe` queries spread evenly over the prompt (MInference probes only the
last queries; spreading them keeps a pattern that suits only the end of the prompt from winning): each pattern's
mask is scored by how much of that attention mass it keeps (recall), and the best pattern within the budget wins. The diagonal
block is always kept, so no query ever has an empty row. Below `min_len` tokens prefill is dense.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PATTERNS = ("a_shape", "vertical_slash", "block_sparse")


@dataclass(frozen=True, slots=True)
class SparseConfig:
    block: int = 64          # query and key block size
    budget: float = 0.25     # fraction of the causal blocks a head may keep
    min_len: int = 8192      # dense below this many tokens
    probe: int = 64          # queries used to estimate each head's pattern
    sink: int = 1            # a_shape: leading blocks always kept


def causal_blocks(n_blocks: int) -> np.ndarray:
    """[nb, nb] bool: key block j is visible to query block i."""
    return np.tril(np.ones((n_blocks, n_blocks), bool))


def _budget_blocks(n_blocks: int, cfg: SparseConfig) -> int:
    """Key blocks each query block may keep on average (at least the sink and the diagonal)."""
    total = n_blocks * (n_blocks + 1) / 2
    return max(cfg.sink + 1, int(round(cfg.budget * total / n_blocks)))


def mask_a_shape(n_blocks: int, cfg: SparseConfig) -> np.ndarray:
    keep = _budget_blocks(n_blocks, cfg)
    i, j = np.indices((n_blocks, n_blocks))
    return causal_blocks(n_blocks) & ((j < cfg.sink) | (i - j < keep - cfg.sink))


def mask_vertical_slash(rows: np.ndarray, probe_attn: np.ndarray, n: int, cfg: SparseConfig) -> np.ndarray:
    """rows [P] query positions, probe_attn [P, n] their attention. Keep the key-block columns those queries weight
    most, greedily while the budget lasts (a column j costs nb - j blocks), then the heaviest block diagonals
    (query - key offsets; diagonal d costs nb - d) with what is left. The main diagonal is always kept."""
    nb = -(-n // cfg.block)
    total = cfg.budget * causal_blocks(nb).sum()
    col_weight = np.add.reduceat(probe_attn.sum(0), np.arange(0, n, cfg.block))          # per key block
    offsets = rows[:, None] // cfg.block - np.arange(n)[None, :] // cfg.block            # block diagonal index
    diag_weight = np.bincount(np.maximum(offsets, 0).ravel(), probe_attn.ravel(), nb)
    cols = _greedy(col_weight, nb - np.arange(nb), total)
    diags = _greedy(diag_weight, nb - np.arange(nb), total - (nb - cols).sum())
    i, j = np.indices((nb, nb))
    mask = np.isin(j, cols) | np.isin(i - j, diags) | (i == j)
    return mask & causal_blocks(nb)


def _greedy(weight: np.ndarray, cost: np.ndarray, budget: float) -> np.ndarray:
    """Indices by descending weight while their summed cost stays within budget (positive weights only)."""
    chosen, spent = [], 0.0
    for idx in np.argsort(-weight):
        if weight[idx] <= 0 or spent + cost[idx] > budget:
            continue
        chosen.append(idx)
        spent += cost[idx]
    return np.array(chosen, int)


def mask_block_sparse(q: np.ndarray, k: np.ndarray, cfg: SparseConfig) -> np.ndarray:
    """q, k [n, d] of one head: top blocks per query block by mean-pooled scores."""
    n = len(q)
    nb = -(-n // cfg.block)
    starts = np.arange(0, n, cfg.block)
    counts = np.diff(np.append(starts, n))[:, None]
    qp = np.add.reduceat(q, starts, axis=0) / counts
    kp = np.add.reduceat(k, starts, axis=0) / counts
    scores = np.where(causal_blocks(nb), qp @ kp.T, -np.inf)
    keep = _budget_blocks(nb, cfg)
    top = np.argsort(-scores, axis=1)[:, :keep]
    mask = np.zeros((nb, nb), bool)
    np.put_along_axis(mask, top, True, axis=1)
    return (mask | np.eye(nb, dtype=bool)) & causal_blocks(nb)


def probe_rows(n: int, probe: int) -> np.ndarray:
    """`probe` query positions spread evenly over the prompt, the last one included."""
    return np.unique(np.linspace(0, n - 1, min(probe, n)).round().astype(int))


def probe_attention(q: np.ndarray, k: np.ndarray, rows: np.ndarray, scale: float) -> np.ndarray:
    """Exact causal attention weights of the queries at `rows`: [P, n]."""
    n = len(q)
    s = (q[rows] @ k.T) * scale
    s = np.where(np.arange(n)[None, :] <= rows[:, None], s, -np.inf)
    s = np.exp(s - s.max(1, keepdims=True))
    return s / s.sum(1, keepdims=True)


def recall(mask: np.ndarray, rows: np.ndarray, probe_attn: np.ndarray, block: int) -> float:
    """Share of the probe queries' attention mass that falls in kept blocks."""
    kb = np.arange(probe_attn.shape[1]) // block
    return float((probe_attn * mask[rows // block][:, kb]).sum() / len(rows))


def choose_head_mask(q: np.ndarray, k: np.ndarray, scale: float, cfg: SparseConfig) -> tuple[str, np.ndarray]:
    """One head: (pattern name, block mask [nb, nb]) with the best estimated recall."""
    n = len(q)
    rows = probe_rows(n, cfg.probe)
    attn = probe_attention(q, k, rows, scale)
    nb = -(-n // cfg.block)
    candidates = {"a_shape": mask_a_shape(nb, cfg), "vertical_slash": mask_vertical_slash(rows, attn, n, cfg),
                  "block_sparse": mask_block_sparse(q, k, cfg)}
    best = max(candidates, key=lambda name: recall(candidates[name], rows, attn, cfg.block))
    return best, candidates[best]


def block_sparse_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
                           block: int) -> np.ndarray:
    """One head, a whole prompt: q, k [n, d], v [n, dv], mask [nb, nb] -> [n, dv]; exactly softmax over the
    causal positions inside kept blocks (float64)."""
    n = len(q)
    blocks = np.arange(n) // block
    allowed = mask[blocks][:, blocks] & (np.arange(n)[None, :] <= np.arange(n)[:, None])
    s = np.where(allowed, (q.astype(np.float64) @ k.T.astype(np.float64)) * scale, -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v.astype(np.float64)
