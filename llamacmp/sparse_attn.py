"""Block-sparse prefill attention (MInference-style), numpy reference: choose per head which key blocks each query
block attends to, then compute attention exactly over those blocks.

Patterns (per head, chosen per input from a cheap estimate):
  a_shape          the first `sink` blocks + the last blocks before each query block (sinks + window)
  vertical_slash   the key columns and the diagonals (query - key offsets) that the probe queries weight most
  block_sparse     per query block, the key blocks with the highest mean-pooled q.k score
The estimate is the exact attention of `probe` queries spread evenly over the rows being prefilled (MInference
probes only the last queries; spreading them keeps a pattern that suits only the end from winning): each pattern's
mask is scored by how much of that attention mass it keeps (recall), and the best pattern within the budget wins.
The blocks that hold a query block's own positions are always kept, so no query ever has an empty row.

The engine prefills in chunks (micro-batches of n_ubatch rows at positions p0 .. p0+L-1 over every key so far), so
everything here works on one chunk: query block i is rows [i*block, (i+1)*block) of the chunk, key block j is
positions [j*block, (j+1)*block) of the cache. The whole prompt is the chunk with p0 = 0. Dense below `min_len`
keys (the chunk's last position + 1) and for chunks shorter than one block (decode).

What the selection needs from the keys is two small per-block statistics (`group_stats`): the probe rows' softmax
mass per key block and the mean q.k score of each query block's mean query against each key block. On the GPU one
kernel computes them (cmp_sparse_probe, same contract); the selection runs on the host on those arrays, or on the
device (cmp_sparse_select, contract select_lists: no statistics copied back). So that both make the same choice,
equal weights and scores rank in index order and the pattern recalls are fp64 sums.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PATTERNS = ("a_shape", "vertical_slash", "block_sparse")


@dataclass(frozen=True, slots=True)
class SparseConfig:
    block: int = 64          # query and key block size
    budget: float = 0.25     # fraction of the causal blocks a head may keep
    min_len: int = 16384     # dense below this many keys
    probe: int = 16          # queries used to estimate each head's pattern (per chunk)
    sink: int = 1            # a_shape: leading blocks always kept
    per_kv_head: bool = True  # one block list per KV head (its q heads' probe mass summed), so that the kernel
                              # loads each K/V tile once for the whole GQA group; False: one list per q head


@dataclass(slots=True)
class SparseStats:
    """What a backend's sparse prefill did (for logs and benchmarks): chunks by path, blocks visited of the causal
    blocks, and how often each pattern won (per head list)."""
    chunks_sparse: int = 0
    chunks_dense: int = 0
    blocks_kept: int = 0
    blocks_causal: int = 0
    patterns: list = field(default_factory=lambda: [0] * len(PATTERNS))

    def add(self, pattern: np.ndarray, mask: np.ndarray, chunk: "Chunk") -> None:
        self.chunks_sparse += 1
        self.blocks_kept += int(mask.sum())
        self.blocks_causal += int(chunk.causal().sum()) * mask.shape[0]
        for i in pattern:
            self.patterns[int(i)] += 1

    def add_lists(self, pattern: np.ndarray, counts: np.ndarray, chunk: "Chunk") -> None:
        """As add, from the block lists' counts [H, nqb] (what a device-side selection returns)."""
        self.chunks_sparse += 1
        self.blocks_kept += int(counts.sum())
        self.blocks_causal += int(chunk.causal().sum()) * counts.shape[0]
        for i in pattern:
            self.patterns[int(i)] += 1

    @property
    def density(self) -> float:
        return self.blocks_kept / self.blocks_causal if self.blocks_causal else 1.0

    def summary(self) -> str:
        wins = ", ".join(f"{n} {c}" for n, c in zip(PATTERNS, self.patterns))
        return (f"sparse prefill: {self.chunks_sparse} sparse / {self.chunks_dense} dense chunk-layers, "
                f"{100 * self.density:.1f}% of causal blocks visited; patterns: {wins}")


def config_from_params(p) -> SparseConfig | None:
    """--sparse-prefill / --sparse-budget / --sparse-min-len (params.Params) -> the backend's `sparse` setting."""
    if not p.sparse_prefill:
        return None
    return SparseConfig(budget=p.sparse_budget, min_len=p.sparse_min_len)


def causal_blocks(n_blocks: int) -> np.ndarray:
    """[nb, nb] bool: key block j is visible to query block i (the whole prompt as one aligned chunk)."""
    return np.tril(np.ones((n_blocks, n_blocks), bool))


@dataclass(frozen=True)
class Chunk:
    """Where a chunk of L query rows at positions p0 .. p0+L-1 sits in block terms. Blocks are absolute, as
    cmp_attn_prefill takes them: query block qb holds positions qb*block .. qb*block+block-1 (the chunk's first and
    last may be partial), key block j keys j*block .. ; index i = qb - p0//block (0 .. nqb-1) in the arrays here."""
    p0: int
    L: int
    block: int

    @property
    def qb0(self) -> int:
        return self.p0 // self.block

    @property
    def nqb(self) -> int:
        return (self.p0 + self.L - 1) // self.block - self.qb0 + 1

    @property
    def last_kb(self) -> np.ndarray:
        """[nqb] each query block's diagonal key block (its own positions' block): qb itself."""
        return self.qb0 + np.arange(self.nqb)

    @property
    def nkb(self) -> int:
        return int(self.last_kb[-1]) + 1

    def block_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Query block index i of chunk rows."""
        return (self.p0 + np.asarray(rows)) // self.block - self.qb0

    def causal(self) -> np.ndarray:
        """[nqb, nkb] bool: key block j holds a key some row of query block i may see."""
        return np.arange(self.nkb)[None, :] <= self.last_kb[:, None]

    def own(self) -> np.ndarray:
        """[nqb, nkb] bool: the diagonal block, always kept (a row's own position is always visible)."""
        return np.arange(self.nkb)[None, :] == self.last_kb[:, None]

    def groups(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The row groups whose statistics the selection needs: each probe row alone, then each query block.
        -> (start [G], end [G], limit [G]) rows [start, end) of the chunk averaged into one query that sees keys
        0 .. limit (a position). G = len(rows) + nqb."""
        qs = np.maximum(self.last_kb * self.block, self.p0) - self.p0
        qe = np.minimum((self.last_kb + 1) * self.block, self.p0 + self.L) - self.p0
        start = np.concatenate([rows, qs]).astype(np.int32)
        end = np.concatenate([rows + 1, qe]).astype(np.int32)
        return start, end, (self.p0 + end - 1).astype(np.int32)


def probe_rows(n: int, probe: int) -> np.ndarray:
    """`probe` rows spread evenly over n rows, the last one included."""
    return np.unique(np.linspace(0, n - 1, min(probe, n)).round().astype(int))


def group_stats(q: np.ndarray, k: np.ndarray, start: np.ndarray, end: np.ndarray, limit: np.ndarray, scale: float,
                block: int, nkb: int) -> tuple[np.ndarray, np.ndarray]:
    """The probe statistics (the contract of cmp_sparse_probe).

    q [L, Hq, Dh] the chunk's queries, k [>= limit.max()+1, Hk, Dh] the keys (as the cache returns them),
    groups g = rows [start[g], end[g]) averaged into one query qg that sees keys 0 .. limit[g]; GQA: head h reads
    kv head h // (Hq/Hk). -> mass [Hq, G, nkb]: softmax(qg.k * scale) over the visible keys, summed per key block;
    mean [Hq, G, nkb]: the mean of qg.k * scale over the visible keys of each key block (-inf where none)."""
    Hq, Hk = q.shape[1], k.shape[1]
    G = len(start)
    mass = np.zeros((Hq, G, nkb))
    mean = np.full((Hq, G, nkb), -np.inf)
    kq = np.repeat(k.astype(np.float64), Hq // Hk, axis=1)                   # [n, Hq, Dh]
    for g in range(G):
        n = int(limit[g]) + 1
        qg = q[start[g]:end[g]].astype(np.float64).mean(0)                   # [Hq, Dh]
        s = np.einsum("hd,nhd->hn", qg, kq[:n]) * scale                      # [Hq, n]
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        starts = np.arange(0, n, block)
        mass[:, g, :len(starts)] = np.add.reduceat(p, starts, axis=1)
        mean[:, g, :len(starts)] = np.add.reduceat(s, starts, axis=1) / np.diff(np.append(starts, n))
    return mass, mean


def _prefix(weight: np.ndarray, cost: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Per head: the items of highest weight (positive only), taken in that order while their summed cost stays
    within the head's budget; equal weights in index order (as cmp_sparse_select ranks them). weight [H, n],
    cost [n], budget [H] -> chosen [H, n] bool."""
    rows = np.arange(weight.shape[0])[:, None]
    order = np.argsort(-weight, axis=1)
    w = weight[rows, order]
    if ((w[:, 1:] == w[:, :-1]) & (w[:, 1:] > 0)).any():   # equal positive weights: index order (rare; slower)
        order = np.argsort(-weight, axis=1, kind="stable")
    spent = np.cumsum(cost[order], axis=1)
    chosen = np.zeros(weight.shape, bool)
    chosen[rows, order] = (spent <= budget[:, None]) & (weight[rows, order] > 0)
    return chosen


def select_chunk(mass: np.ndarray, mean: np.ndarray, rows: np.ndarray, chunk: Chunk,
                 cfg: SparseConfig) -> tuple[np.ndarray, np.ndarray]:
    """Choose each head's pattern for one chunk.

    mass [H, P, nkb]: the probe rows' attention mass per key block (group_stats of the probe groups),
    mean [H, nqb, nkb]: the query blocks' mean-pooled scores (group_stats of the block groups), rows [P] the probe
    rows. -> (pattern index into PATTERNS [H], mask [H, nqb, nkb] bool: key blocks each query block visits)."""
    masks = candidate_masks(mass, mean, rows, chunk, cfg)                        # [3, H, nqb, nkb]
    qb = chunk.block_of_rows(rows)
    m64 = mass.astype(np.float64)
    recall = np.stack([np.einsum("hpj,hpj->h", m64, m[:, qb, :]) for m in masks]) / len(rows)   # [3, H]
    best = recall.argmax(0)
    return best, masks[best, np.arange(mass.shape[0])]


def candidate_masks(mass: np.ndarray, mean: np.ndarray, rows: np.ndarray, chunk: Chunk,
                    cfg: SparseConfig) -> np.ndarray:
    """The three patterns' masks for every head (arguments as select_chunk) -> [3, H, nqb, nkb] bool, in the
    order of PATTERNS."""
    total, keep = selection_budget(chunk, cfg)
    return _candidates(mass, mean, chunk.block_of_rows(rows), chunk, total, keep, cfg.sink)


def selection_budget(chunk: Chunk, cfg: SparseConfig) -> tuple[float, int]:
    """-> (total: the block-costs a head may spend, budget x the chunk's causal blocks; keep: key blocks per query
    block on average, at least sink + 1)."""
    total = cfg.budget * chunk.causal().sum()
    return total, max(cfg.sink + 1, int(round(total / chunk.nqb)))


def _candidates(mass: np.ndarray, mean: np.ndarray, pqb: np.ndarray, chunk: Chunk, total: float, keep: int,
                sink: int) -> np.ndarray:
    """candidate_masks with the probes given by their query blocks pqb [P] and the budget spelled out."""
    H, P, nkb = mass.shape
    nqb, last = chunk.nqb, chunk.last_kb
    causal, own = chunk.causal(), chunk.own()
    j = np.arange(nkb)
    pkb = chunk.qb0 + pqb                                        # each probe's own key block
    # a_shape: sinks + a window of keep - sink blocks ending at the diagonal
    a_shape = ((j[None, :] < sink) | (j[None, :] > last[:, None] - (keep - sink))) & causal | own
    # vertical_slash: columns by probe mass (a column costs the query blocks that see it), then block diagonals
    # (offset d = diagonal block - key block; it costs the query blocks that reach back that far) with the rest
    col_w = mass.sum(1)                                                          # [H, nkb]
    # diag_w[h, d] = sum over probes p of mass[h, p, pkb[p] - d] (float64, probes in order); a probe's mass past
    # its own block is zero (those keys are after it), so offsets below 0 carry nothing
    diag_w = np.zeros((H, nkb))
    for p, b in enumerate(pkb):
        diag_w[:, :b + 1] += mass[:, p, b::-1]
    col_cost = (last[:, None] >= j[None, :]).sum(0)
    cols = _prefix(col_w, col_cost, np.full(H, total))
    diags = _prefix(diag_w, col_cost, total - (cols * col_cost).sum(1))          # offset d costs as column d does
    # query block i keeps key block j <= last[i] when column j or offset last[i] - j is chosen: offsets read
    # backwards from last[i] are a slice of the reversed diagonal list
    vs = np.zeros((H, nqb, nkb), bool)
    rdiags = diags[:, ::-1]
    for i, b in enumerate(last):
        vs[:, i, :b + 1] = cols[:, :b + 1] | rdiags[:, nkb - 1 - b:]
    vs |= own
    # block_sparse: the top `keep` key blocks of each query block by pooled score (equal scores in index order):
    # all above the keep-th highest score, then as many of those equal to it as fit, first ones first
    if keep < nkb:
        scores = np.where(causal, mean, -np.inf)
        kth = np.partition(scores, nkb - keep, axis=2)[:, :, nkb - keep, None]
        above, tied = scores > kth, scores == kth
        room = keep - above.sum(2, keepdims=True)
        if (tied.sum(2, keepdims=True) > room).any():       # more equal to the k-th than fit: first ones first
            tied &= np.cumsum(tied, axis=2) <= room
        bs = (above | tied) & causal
    else:
        bs = np.broadcast_to(causal, (H, nqb, nkb)).copy()
    bs |= own
    return np.stack([np.broadcast_to(a_shape, (H, nqb, nkb)), vs, bs])


def choose_head_mask(q: np.ndarray, k: np.ndarray, scale: float, cfg: SparseConfig) -> tuple[str, np.ndarray]:
    """One head, the whole prompt: q, k [n, d] -> (pattern name, block mask [nb, nb])."""
    n = len(q)
    chunk = Chunk(0, n, cfg.block)
    rows = probe_rows(n, cfg.probe)
    start, end, limit = chunk.groups(rows)
    mass, mean = group_stats(q[:, None], k[:, None], start, end, limit, scale, cfg.block, chunk.nkb)
    best, mask = select_chunk(mass[:, :len(rows)], mean[:, len(rows):], rows, chunk, cfg)
    return PATTERNS[best[0]], mask[0]


def probe_attention(q: np.ndarray, k: np.ndarray, rows: np.ndarray, scale: float) -> np.ndarray:
    """Exact causal attention weights of the queries at `rows`: [P, n] (tests and analysis)."""
    n = len(q)
    s = (q[rows] @ k.T) * scale
    s = np.where(np.arange(n)[None, :] <= rows[:, None], s, -np.inf)
    s = np.exp(s - s.max(1, keepdims=True))
    return s / s.sum(1, keepdims=True)


def recall(mask: np.ndarray, rows: np.ndarray, probe_attn: np.ndarray, block: int) -> float:
    """Share of the probe queries' attention mass that falls in kept blocks (whole-prompt mask [nb, nb])."""
    kb = np.arange(probe_attn.shape[1]) // block
    return float((probe_attn * mask[rows // block][:, kb]).sum() / len(rows))


def chunk_masks(q: np.ndarray, k: np.ndarray, p0: int, scale: float, cfg: SparseConfig,
                heads_per_list: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
    """The whole selection for one prefill chunk, as the numpy backend runs it: q [L, Hq, Dh] (after RoPE),
    k [p0+L, Hk, Dh] the cache as it reads back. -> (pattern [Hl], mask [Hl, nqb, nkb]) with one list per
    `heads_per_list` consecutive q heads (their masses summed: a GQA group can share one list), or None when the
    chunk stays dense (fewer keys than min_len or fewer rows than one block)."""
    L, Hq = q.shape[:2]
    if p0 + L < cfg.min_len or L < cfg.block:
        return None
    chunk = Chunk(p0, L, cfg.block)
    rows = probe_rows(L, cfg.probe)
    start, end, limit = chunk.groups(rows)
    mass, mean = group_stats(q, k[:p0 + L], start, end, limit, scale, cfg.block, chunk.nkb)
    return select_from_stats(mass, mean, rows, chunk, cfg, heads_per_list)


def select_from_stats(mass_all: np.ndarray, mean_all: np.ndarray, rows: np.ndarray, chunk: Chunk,
                      cfg: SparseConfig, heads_per_list: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """select_chunk on group_stats output for all G = P + nqb groups ([Hq, G, nkb] each), heads pooled by
    `heads_per_list` (mass summed, mean score averaged)."""
    P = len(rows)
    Hq = mass_all.shape[0]
    g = heads_per_list
    mass = mass_all[:, :P].reshape(Hq // g, g, P, -1).sum(1, dtype=np.float32)
    mean = mean_all[:, P:].reshape(Hq // g, g, chunk.nqb, -1).mean(1, dtype=np.float32)
    return select_chunk(mass, mean, rows, chunk, cfg)


def attend_chunk(q: np.ndarray, k: np.ndarray, v: np.ndarray, p0: int, mask: np.ndarray, scale: float,
                 block: int) -> np.ndarray:
    """Exact attention over the kept blocks for one chunk: q [L, Hq, Dh], k, v [p0+L, Hk, Dh] (the cache),
    mask [Hl, nqb, nkb] over Chunk(p0, L, block)'s blocks (Hl divides Hq: q head h uses list h // (Hq/Hl))
    -> [L, Hq, Dh] float64."""
    L, Hq, Dh = q.shape
    Hk, Hl = k.shape[1], mask.shape[0]
    n = p0 + L
    rb, kb = Chunk(p0, L, block).block_of_rows(np.arange(L)), np.arange(n) // block
    visible = np.arange(n)[None, :] <= (p0 + np.arange(L))[:, None]
    out = np.empty((L, Hq, Dh))
    for h in range(Hq):
        allowed = mask[h // (Hq // Hl)][rb][:, kb] & visible
        kh, vh = k[:n, h // (Hq // Hk)].astype(np.float64), v[:n, h // (Hq // Hk)].astype(np.float64)
        s = np.where(allowed, (q[:, h].astype(np.float64) @ kh.T) * scale, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        out[:, h] = (p / p.sum(1, keepdims=True)) @ vh
    return out


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


def block_lists(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mask [Hk, nqb, nkb] -> cmp_attn_prefill's (blocks [Hk, nqb, max_blocks] int32: the kept key blocks of each
    query block, ascending, padded with the last; counts [Hk, nqb] int32). Every row keeps at least one block."""
    counts = mask.sum(2, dtype=np.int32)
    width = max(1, int(counts.max()))
    h, i, j = np.nonzero(mask)                                   # row-major: ascending j within each row
    starts = (np.cumsum(counts.ravel()) - counts.ravel()).astype(np.int64)
    rank = np.arange(len(j)) - np.repeat(starts, counts.ravel())
    last = j[starts + np.maximum(counts.ravel(), 1) - 1].reshape(counts.shape)
    blocks = np.repeat(last[..., None], width, axis=2).astype(np.int32)
    blocks[h, i, rank] = j
    return blocks, counts


def select_lists(mass: np.ndarray, mean: np.ndarray, pqb: np.ndarray, Hl: int, nqb: int, nkb: int, qb0: int,
                 keep: int, sink: int, total: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole selection from the probe statistics to the kernel's block lists (the contract of
    cmp_sparse_select, so that it can run on the device without a round trip to the host).

    mass, mean [Hq, G, nkb] (group_stats / cmp_sparse_probe, G = P + nqb: the P probe groups, then the query
    blocks), pqb [P] each probe's query block (0 .. nqb-1), Hl lists (Hq / Hl consecutive q heads pooled: mass
    summed, mean averaged), query blocks qb0 .. qb0+nqb-1 over key blocks 0 .. nkb-1 (nkb = qb0 + nqb), keep and
    total from selection_budget. -> (pattern [Hl] int32, blocks [Hl, nqb, nkb] int32: the kept key blocks
    ascending, padded to nkb with the last (the diagonal), counts [Hl, nqb] int32). Same choice as
    select_from_stats + block_lists with the same statistics."""
    P, Hq = len(pqb), mass.shape[0]
    g = Hq // Hl
    pm = mass[:, :P].reshape(Hl, g, P, nkb).sum(1, dtype=np.float32)
    pmean = mean[:, P:].reshape(Hl, g, nqb, nkb).mean(1, dtype=np.float32)
    chunk = Chunk(qb0, nqb, 1)                   # block terms only: query blocks qb0 .., key blocks 0 .. nkb-1
    masks = _candidates(pm, pmean, np.asarray(pqb), chunk, total, keep, sink)
    recall = np.stack([np.einsum("hpj,hpj->h", pm.astype(np.float64), m[:, pqb, :]) for m in masks]) / P
    best = recall.argmax(0)
    blocks, counts = block_lists(masks[best, np.arange(Hl)])
    pad = np.repeat(blocks[:, :, -1:], nkb - blocks.shape[2], axis=2)
    return best.astype(np.int32), np.concatenate([blocks, pad], axis=2), counts


def select_args(rows: np.ndarray, chunk: Chunk, cfg: SparseConfig) -> dict:
    """select_lists' scalar arguments for a chunk and its probe rows (all but the statistics and Hl)."""
    total, keep = selection_budget(chunk, cfg)
    return dict(pqb=chunk.block_of_rows(rows).astype(np.int32), nqb=chunk.nqb, nkb=chunk.nkb, qb0=chunk.qb0,
                keep=keep, sink=cfg.sink, total=float(total))


def select_work_bytes(Hl: int, P: int, nqb: int, nkb: int) -> int:
    """cmp_sparse_select's scratch: fp64 diagonal weights, fp32 pooled mass / scores / column weights, byte flags."""
    n = Hl * nkb
    return 8 * n + 4 * n * (P + nqb + 1) + 2 * n + n * nqb
