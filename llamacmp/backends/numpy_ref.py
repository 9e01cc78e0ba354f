"""The numpy reference backend: every op of base.Backend written plainly. This is the executable specification
that the CUDA kernels are tested against, and the fallback when no GPU is present.

Reductions run in float64 and results are stored float32, so that this reference sits closer to the exact
function than any fast path does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import kv_quant
from ..config import ModelConfig
from ..gguf_file import Q8_0_BLOCK, Q8Tensor, QuantTensor
from .base import Backend, RowSample, SeqState, StepBatch
from .cq2_ref import CQ2_VALUES, RefCQ2, cq2_gemv, quantize_cq2
from .quant_ref import Activations, RefQuant, quant_matmul, quantize_q8_blocks

GDN_CHUNK = 64


@dataclass(frozen=True, slots=True)
class RefQ8:
    """A Q8_0 matrix prepared for the reference: q [out, in/32, 32] float32 (exact small ints), d [out, in/32]."""
    q: np.ndarray
    d: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1] * Q8_0_BLOCK


def softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def rms_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """Over the last axis."""
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)


def l2_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml_l2_norm: x / max(||x||, eps) over the last axis."""
    x64 = x.astype(np.float64)
    return x64 / np.maximum(np.sqrt(np.sum(x64 * x64, axis=-1, keepdims=True)), eps)


def _rotate_neox_pairs(x: np.ndarray, theta: np.ndarray, n_rot: int) -> np.ndarray:
    """x [T, H, Dh], theta [T, n_rot/2]: pairs (i, i + n_rot/2) rotated by theta[t, i] (float64); dims past
    n_rot pass through. The rotation step that rope_neox and rope_imrope share (they differ in the angles)."""
    half = n_rot // 2
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.astype(np.float64).copy()
    x0, x1 = out[..., :half].copy(), out[..., half:n_rot].copy()
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_rot] = x0 * sin + x1 * cos
    return out


def rope_neox(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float) -> np.ndarray:
    """x [T, H, Dh], pos [T]: rotate pairs (i, i + n_rot/2) for i < n_rot/2 by pos * base^(-2i/n_rot).
    Qwen3.5's IMROPE reduces to this for text, where all four position ids are equal."""
    half = n_rot // 2
    theta = pos.astype(np.float64)[:, None] * base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    return _rotate_neox_pairs(x, theta, n_rot)


def rope_imrope(x: np.ndarray, pos4: np.ndarray, n_rot: int, base: float, sections) -> np.ndarray:
    """x [T, H, Dh], pos4 [T, 4]: NeoX pairs (i, i + n_rot/2) rotated by pos4[t, axis(i)] * base^(-2i/n_rot), the
    axis interleaved by sections as ggml's IMROPE does (see Backend.attention_prep)."""
    half = n_rot // 2
    s0, s1, s2, _ = (tuple(sections) + (0, 0, 0, 0))[:4]
    total = max(sum(sections), 1)
    sector = np.arange(half) % total
    axis = np.full(half, 3)
    axis[(sector % 3 == 0) & (sector < 3 * s0)] = 0
    axis[(sector % 3 == 2) & (sector < 3 * s2)] = 2
    axis[(sector % 3 == 1) & (sector < 3 * s1)] = 1
    p = pos4.astype(np.float64)[:, axis]                                        # [T, half]
    theta = p * base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    return _rotate_neox_pairs(x, theta, n_rot)


def _rotate(x: np.ndarray, batch: StepBatch, cfg: ModelConfig) -> np.ndarray:
    """x [T, H, Dh] (q or k heads, normed) rotated as attention_prep does: NeoX at batch.positions, IMROPE at
    batch.rope_pos when set."""
    if batch.rope_pos is None:
        return rope_neox(x, batch.positions, cfg.n_rot, cfg.rope_base)
    return rope_imrope(x, batch.rope_pos, cfg.n_rot, cfg.rope_base, cfg.rope_sections)


def rope_vision_angles(pos: np.ndarray, head_dim: int, sections, theta: float) -> np.ndarray:
    """pos [T, 4] -> angles [T, Dh/2] of ggml's VISION rope (see Backend.rope_vision): each section restarts the
    frequency ladder base^(-2j/(Dh/2)) and reads its own position column."""
    n_dims = head_dim // 2
    s = (tuple(int(v) for v in sections) + (0, 0, 0, 0))[:4]
    starts = np.cumsum((0,) + s[:3])                       # first pair of each section
    sector = np.arange(n_dims) % max(sum(s), 1)
    axis = np.searchsorted(starts, sector, side="right") - 1
    j = sector - starts[axis]
    freq = theta ** (-2.0 * j / n_dims)
    return pos.astype(np.float64)[:, axis] * freq[None, :]


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """ggml_gelu's formula (tanh approximation), elementwise, without the CPU table's f16 roundings."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


# -- the gated delta rule: the recurrence and its chunked (WY) form, which must agree ---------------------------

def gdn_recurrent(q, k, v, g, b, S):
    """One head. q, k [L, Dk], v [L, Dv], g, b [L], S [Dk, Dv] (float64) -> o [L, Dv], S."""
    o = np.empty((len(q), v.shape[1]))
    for t in range(len(q)):
        S = np.exp(g[t]) * S
        delta = b[t] * (v[t] - S.T @ k[t])
        S = S + np.outer(k[t], delta)
        o[t] = S.T @ q[t]
    return o, S


def gdn_chunked(q, k, v, g, b, S, chunk: int = GDN_CHUNK):
    """Same contract as gdn_recurrent, computed chunk by chunk in closed form.

    Within a chunk with cumulative log-decay G (gamma = exp(G)), the deltas solve the unit lower-triangular
    system (I + A) D = diag(b) (V - diag(gamma) K S0) with A[t,s] = b_t exp(G_t - G_s) k_t.k_s for s < t; then
    O = diag(gamma) Q S0 + (tril(Q K^T) * exp(G_t - G_s)) D and S = gamma_L S0 + K^T diag(exp(G_L - G)) D."""
    outs = []
    for c0 in range(0, len(q), chunk):
        qc, kc, vc, gc, bc = (a[c0:c0 + chunk] for a in (q, k, v, g, b))
        G = np.cumsum(gc)
        decay = np.exp(np.tril(G[:, None] - G[None, :]))          # [L, L], only the lower part is used
        lower = np.tril(np.ones_like(decay), -1)
        A = bc[:, None] * decay * (kc @ kc.T) * lower
        rhs = bc[:, None] * (vc - np.exp(G)[:, None] * (kc @ S))
        D = np.linalg.solve(np.eye(len(qc)) + A, rhs)
        outs.append(np.exp(G)[:, None] * (qc @ S) + (np.tril(qc @ kc.T) * decay) @ D)
        S = np.exp(G[-1]) * S + kc.T @ (np.exp(G[-1] - G)[:, None] * D)
    return np.concatenate(outs), S


def unit_lower_inverse(A, block: int = 16):
    """(I + A)^-1 for A [n, n] strictly lower triangular, n a multiple of `block`, computed as
    gdn_chunk_intra_kernel does: each diagonal block by forward substitution, then the off-diagonal blocks one
    block-diagonal d at a time, T_ij = -T_ii (A_ij T_jj + sum_{j<k<i} A_ik T_kj) (i = j + d), which reads only
    blocks of earlier diagonals (the blocks of one diagonal are independent)."""
    n = len(A)
    nb = n // block
    T = np.zeros_like(A)
    for i in range(nb):
        r = slice(i * block, (i + 1) * block)
        Aii, Tii = A[r, r], T[r, r]   # views: Tii fills T's block
        for row in range(block):      # row `row` of T_ii = e_row - A_ii[row, :row] T_ii[:row]
            Tii[row] = -Aii[row, :row] @ Tii[:row]
            Tii[row, row] = 1.0
    for d in range(1, nb):
        for i in range(d, nb):
            j = i - d
            ri, rj = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            P = A[ri, j * block:i * block] @ T[j * block:i * block, rj]
            T[ri, rj] = -T[ri, ri] @ P
    return T


def gdn_chunk_intra(q, k, v, g, b, chunk: int = GDN_CHUNK):
    """The intra-chunk half of gdn_chunked (gdn_chunk_intra_kernel), every chunk independently: one head, q, k
    [L, Dk] (normalised), v [L, Dv], g, b [L] -> W [nc, chunk, Dk], U [nc, chunk, Dv], M [nc, chunk, chunk],
    G [nc, chunk], the last chunk zero-padded (k = q = v = b = g = 0: W, U, M rows 0, G flat). With
    A[t,s] = b_t e^(G_t-G_s) k_t.k_s (s < t) and T = (I + A)^-1 (unit_lower_inverse):
    W = T diag(b e^G) K, U = T diag(b) V, M = tril(Q K^T) * e^(G_t-G_s), so gdn_chunked's deltas are
    D = T diag(b) (V - diag(e^G) K S0) = U - W S0 for any state S0."""
    nc = -(-len(q) // chunk)
    pad = nc * chunk - len(q)
    q, k, v, g, b = (np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)]).reshape(nc, chunk, *a.shape[1:])
                     for a in (q, k, v, g, b))
    G = np.cumsum(g, axis=1)
    decay = np.exp(np.tril(G[:, :, None] - G[:, None, :]))
    A = b[:, :, None] * decay * (k @ k.transpose(0, 2, 1)) * np.tril(np.ones((chunk, chunk), k.dtype), -1)
    T = np.stack([unit_lower_inverse(a) for a in A])
    W = T @ ((b * np.exp(G))[:, :, None] * k)
    U = T @ (b[:, :, None] * v)
    M = np.tril(q @ k.transpose(0, 2, 1)) * decay
    return W, U, M, G


def gdn_chunk_state(q, k, W, U, M, G, S):
    """The inter-chunk half of gdn_chunked (gdn_chunk_state_kernel): the chunks in order from state S [Dk, Dv],
    q, k [L, Dk] (normalised) and gdn_chunk_intra's W, U, M, G -> o [L, Dv], S. Per chunk D = U - W S0,
    O = diag(e^G) Q S0 + M D, S = e^(G_last) S0 + K^T diag(e^(G_last - G)) D."""
    chunk = M.shape[1]
    outs = []
    for c in range(len(W)):
        n = min(chunk, len(q) - c * chunk)
        qc = np.zeros((chunk, q.shape[1]), q.dtype)
        kc = np.zeros_like(qc)
        qc[:n], kc[:n] = q[c * chunk:c * chunk + n], k[c * chunk:c * chunk + n]
        D = U[c] - W[c] @ S
        outs.append((np.exp(G[c])[:, None] * (qc @ S) + M[c] @ D)[:n])
        S = np.exp(G[c, -1]) * S + kc.T @ (np.exp(G[c, -1] - G[c])[:, None] * D)
    return np.concatenate(outs), S


class NumpyBackend(Backend):
    name = "numpy"

    # -- memory -------------------------------------------------------------------------------------------
    def upload_matrix(self, w):
        if isinstance(w, Q8Tensor):
            rows, cols = w.shape
            return RefQ8(w.qs.reshape(rows, cols // Q8_0_BLOCK, Q8_0_BLOCK).astype(np.float32), w.d)
        if isinstance(w, QuantTensor):
            return RefQuant(w)
        if isinstance(w, np.ndarray) and w.dtype == np.float16:
            return np.ascontiguousarray(w)            # F16 weights stay f16: matmuls rounds x to f16 for them
        return np.ascontiguousarray(w, dtype=np.float32)

    def row_prefix(self, w, n: int):
        if isinstance(w, RefQ8):
            return RefQ8(w.q[:n], w.d[:n])
        if isinstance(w, RefQuant):
            return RefQuant(QuantTensor(w.tensor.type_name, w.tensor.blocks[:n]))
        if isinstance(w, RefCQ2):
            return w.rows(slice(0, n))
        return w[:n]

    def upload_vector(self, w):
        return np.ascontiguousarray(w, dtype=np.float32)

    def new_state(self, cfg: ModelConfig, n_ctx: int, kv_type: str = "f16", v_type: str | None = None) -> SeqState:
        v_type = v_type or kv_type
        for t in (kv_type, v_type):
            kv_quant.roundtrip(np.zeros((1, cfg.head_dim), np.float32), t)      # names a bad type or head dim
        kv_shape = (n_ctx, cfg.n_head_kv, cfg.head_dim)
        n_attn, n_gdn = len(cfg.attn_layers), len(cfg.gdn_layers)
        # The reference keeps what a read of the cache returns (the dequantized values), in the narrowest
        # numpy type that holds them exactly.
        dtype = lambda t: np.float16 if t == "f16" else np.float32          # noqa: E731
        return SeqState(
            n_ctx=n_ctx,
            k=[np.zeros(kv_shape, dtype(kv_type)) for _ in range(n_attn)],
            v=[np.zeros(kv_shape, dtype(v_type)) for _ in range(n_attn)],
            conv=[np.zeros((cfg.conv_kernel - 1, cfg.conv_channels), np.float32) for _ in range(n_gdn)],
            ssm=[np.zeros((cfg.ssm_v_heads, cfg.ssm_head_dim, cfg.ssm_head_dim), np.float32) for _ in range(n_gdn)],
            k_type=kv_type, v_type=v_type,
        )

    def state_to_host(self, state: SeqState) -> dict[str, list[np.ndarray]]:
        n = state.n_past
        return {"k": [a[:n].astype(np.float32) for a in state.k], "v": [a[:n].astype(np.float32) for a in state.v],
                "conv": [a.copy() for a in state.conv], "ssm": [a.copy() for a in state.ssm]}

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    def state_ops(self):
        from .state_ops import NumpyStateOps
        return NumpyStateOps()

    # -- row-wise ops ---------------------------------------------------------------------------------------
    def embed(self, table, ids):
        if isinstance(table, RefQ8):
            return (table.q[ids] * table.d[ids][..., None]).reshape(len(ids), -1).astype(np.float32)
        if isinstance(table, RefQuant):
            return table.rows(ids)
        return table[ids].astype(np.float32)

    def rmsnorm(self, x, w, eps):
        return (rms_normalize(x, eps) * w).astype(np.float32)

    def matmuls(self, x, ws: Sequence):
        xq = None
        acts = Activations(x)
        outs = []
        for w in ws:
            if isinstance(w, RefQ8):
                if xq is None:
                    xq = quantize_q8_blocks(x)
                outs.append(_q8_matmul(xq, w))
            elif isinstance(w, RefQuant):
                outs.append(quant_matmul(acts, w))
            elif w.dtype == np.float16:
                # ggml's CPU mul_mat converts the activations to the weights' F16 vec_dot type first.
                x16 = x.astype(np.float16).astype(np.float64)
                outs.append((x16 @ w.T.astype(np.float64)).astype(np.float32))
            else:
                outs.append((x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32))
        return outs

    def add(self, x, y):
        return (x + y).astype(np.float32)

    def swiglu(self, gate, up):
        return (silu(gate.astype(np.float64)) * up).astype(np.float32)

    def gather_rows(self, x, rows):
        return x[rows]

    def rows(self, x, start, n):
        return x[start:start + n]

    def write_rows(self, dst, at, src, start, n):
        if not (0 <= at and 0 < n and at + n <= len(dst) and 0 <= start and start + n <= len(src)):
            raise ValueError(f"write_rows: rows {start} .. {start + n - 1} of {len(src)} into {at} .. of {len(dst)}")
        dst[at:at + n] = src[start:start + n]
        return dst[at:at + n]

    # -- fused ops: the specification is the plain composition (a fast backend must give the same values, up to
    # its own rounding of the parts; the CUDA kernels reproduce the unfused kernels' fp32 results exactly) ------
    def rmsnorm_matmuls(self, x, w, eps, ws: Sequence):
        return self.matmuls(self.rmsnorm(x, w, eps), ws)

    def matmul_add(self, x, w, residual):
        return self.add(residual, self.matmuls(x, [w])[0])

    def swiglu_matmul_add(self, gate, up, w, residual):
        return self.matmul_add(self.swiglu(gate, up), w, residual)

    def sigmoid_mul_matmul_add(self, x, gate, w, residual):
        return self.matmul_add(self.sigmoid_mul(x, gate), w, residual)

    def gated_rmsnorm_matmul_add(self, o, z, norm_w, eps, head_dim, w, residual):
        return self.matmul_add(self.gated_rmsnorm(o, z, norm_w, eps, head_dim), w, residual)

    # -- attention -------------------------------------------------------------------------------------------
    def attention_prep(self, qg, k, q_norm, k_norm, batch, cfg):
        T, Hq, Dh = len(qg), cfg.n_head, cfg.head_dim
        qg = qg.reshape(T, Hq, 2, Dh)
        q = _rotate(rms_normalize(qg[:, :, 0], cfg.rms_eps) * q_norm, batch, cfg)
        gate = qg[:, :, 1].reshape(T, Hq * Dh)
        return q.astype(np.float32), self.key_prep(k, k_norm, batch, cfg), np.ascontiguousarray(gate)

    def key_prep(self, k, k_norm, batch, cfg):
        kk = rms_normalize(k.reshape(len(k), cfg.n_head_kv, cfg.head_dim), cfg.rms_eps) * k_norm
        return _rotate(kk, batch, cfg).astype(np.float32)

    def attention(self, q, k, v, batch, layer, cfg):
        T, Hq, Dh = q.shape
        group = Hq // cfg.n_head_kv
        out = np.empty((T, Hq, Dh), np.float32)
        self.kv_write(k, v, batch, layer, cfg)
        for seg in batch.segments:
            rows = slice(seg.start, seg.start + seg.length)
            p0, st = seg.state.n_past, seg.state
            if self.sparse is not None and self._sparse_attention(q[rows], st, p0, layer, out[rows], Dh):
                continue
            kc = st.k[layer][:p0 + seg.length].astype(np.float64)       # [S, Hk, Dh]
            vc = st.v[layer][:p0 + seg.length].astype(np.float64)
            kc, vc = np.repeat(kc, group, axis=1), np.repeat(vc, group, axis=1)   # -> [S, Hq, Dh]
            scores = np.einsum("thd,shd->hts", q[rows].astype(np.float64), kc) / np.sqrt(Dh)
            causal = np.arange(p0 + seg.length)[None, :] > (p0 + np.arange(seg.length))[:, None]
            scores[:, causal] = -np.inf
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            out[rows] = np.einsum("hts,shd->thd", p, vc)
        return out.reshape(T, Hq * Dh)

    def kv_write(self, k, v, batch, layer, cfg):
        v = v.reshape(len(v), cfg.n_head_kv, cfg.head_dim)
        for seg in batch.segments:
            rows, st, p0 = slice(seg.start, seg.start + seg.length), seg.state, seg.state.n_past
            st.k[layer][p0:p0 + seg.length] = kv_quant.roundtrip(k[rows], st.k_type)
            st.v[layer][p0:p0 + seg.length] = kv_quant.roundtrip(v[rows], st.v_type)

    def _sparse_attention(self, q, st, p0, layer, out, Dh) -> bool:
        """One segment's chunk through sparse_attn (selection from the probe statistics, exact attention over the
        kept blocks) into out [L, Hq, Dh]; False (nothing written) when the chunk stays dense."""
        from .. import sparse_attn
        if self.sparse_stats is None:
            self.sparse_stats = sparse_attn.SparseStats()
        n = p0 + len(q)
        kc, vc = st.k[layer][:n], st.v[layer][:n]
        per_list = q.shape[1] // kc.shape[1] if self.sparse.per_kv_head else 1
        chosen = sparse_attn.chunk_masks(q, kc, p0, 1 / np.sqrt(Dh), self.sparse, per_list)
        if chosen is None:
            self.sparse_stats.chunks_dense += 1
            return False
        pattern, mask = chosen
        self.sparse_stats.add(pattern, mask, sparse_attn.Chunk(p0, len(q), self.sparse.block))
        out[...] = sparse_attn.attend_chunk(q, kc, vc, p0, mask, 1 / np.sqrt(Dh), self.sparse.block)
        return True

    def sigmoid_mul(self, x, gate):
        return (x * sigmoid(gate.astype(np.float64))).astype(np.float32)

    # -- gated delta net -------------------------------------------------------------------------------------
    def gdn_gates(self, alpha, beta, dt_bias, ssm_a):
        g = softplus(alpha.astype(np.float64) + dt_bias) * ssm_a
        return g.astype(np.float32), sigmoid(beta.astype(np.float64)).astype(np.float32)

    def conv1d_silu(self, x, w, batch, layer):
        kernel = w.shape[1]
        out = np.empty_like(x)
        for seg in batch.segments:
            rows = slice(seg.start, seg.start + seg.length)
            xin = np.concatenate([seg.state.conv[layer], x[rows]]).astype(np.float64)   # [kernel-1+L, C]
            y = sum(xin[j:j + seg.length] * w[:, j] for j in range(kernel))
            out[rows] = silu(y)
            seg.state.conv[layer][...] = xin[seg.length:]
            if batch.keep_steps:     # the state after token t is the kernel-1 inputs ending at t: [L, kernel-1, C]
                steps = _steps(seg.state, "conv", layer)
                steps[:] = [xin[t + 1:t + kernel].astype(np.float32) for t in range(seg.length)]
        return out

    def gdn(self, qkv, g, b, batch, layer, cfg, chunked: bool | None = None):
        K, V, Dk = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_head_dim
        T = len(qkv)
        q = l2_normalize(qkv[:, :K * Dk].reshape(T, K, Dk), cfg.rms_eps) / np.sqrt(Dk)
        k = l2_normalize(qkv[:, K * Dk:2 * K * Dk].reshape(T, K, Dk), cfg.rms_eps)
        v = qkv[:, 2 * K * Dk:].reshape(T, V, Dk).astype(np.float64)
        out = np.empty((T, V, Dk), np.float32)
        for seg in batch.segments:
            r = slice(seg.start, seg.start + seg.length)
            if batch.keep_steps:
                self._gdn_steps(q[r], k[r], v[r], g[r], b[r], seg.state, layer, K, out[r])
                continue
            use_chunks = seg.length > 1 if chunked is None else chunked
            run = gdn_chunked if use_chunks else gdn_recurrent
            S_all = seg.state.ssm[layer]
            for h in range(V):
                o, S = run(q[r, h % K], k[r, h % K], v[r, h], g[r, h].astype(np.float64),
                           b[r, h].astype(np.float64), S_all[h].astype(np.float64))
                out[r, h] = o
                S_all[h] = S
        return out.reshape(T, V * Dk)

    @staticmethod
    def _gdn_steps(q, k, v, g, b, state, layer, K, out):
        """One segment token by token (the decode recurrence, so a verified token's output equals its decode),
        keeping the state [V, Dk, Dv] after every token."""
        steps = _steps(state, "ssm", layer)
        S = state.ssm[layer].astype(np.float64)                      # [V, Dk, Dv]
        for t in range(len(q)):
            for h in range(S.shape[0]):
                o, S[h] = gdn_recurrent(q[t:t + 1, h % K], k[t:t + 1, h % K], v[t:t + 1, h],
                                        g[t:t + 1, h].astype(np.float64), b[t:t + 1, h].astype(np.float64), S[h])
                out[t, h] = o[0]
            steps.append(S.astype(np.float32))
        state.ssm[layer][...] = S

    def restore_steps(self, state, k):
        steps, state.steps = state.steps, None
        if steps is None:
            raise ValueError("restore_steps: the state ran no keep_steps batch since its last restore")
        for name, per_layer in steps.items():
            for layer, kept in per_layer.items():
                if not 1 <= k <= len(kept):
                    raise ValueError(f"restore_steps: k={k} outside 1..{len(kept)} (the batch's tokens)")
                getattr(state, name)[layer][...] = kept[k - 1]

    def concat(self, xs, axis):
        return np.concatenate([np.asarray(x, np.float32) for x in xs], axis=axis)

    def gated_rmsnorm(self, o, z, w, eps, head_dim):
        T = len(o)
        n = rms_normalize(o.reshape(T, -1, head_dim), eps) * w
        return (n.reshape(T, -1) * silu(z.astype(np.float64))).astype(np.float32)

    # -- vision encoder ------------------------------------------------------------------------------------
    def reshape(self, x, shape):
        return np.ascontiguousarray(x).reshape(shape)

    def bias_add(self, x, b):
        return (x.astype(np.float64) + b).astype(np.float32)

    def layernorm(self, x, w, b, eps):
        x64 = x.astype(np.float64)
        c = x64 - x64.mean(axis=-1, keepdims=True)
        n = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
        return (n * w + b).astype(np.float32)

    def gelu(self, x):
        x = np.asarray(x, np.float32)
        g = gelu_tanh(x.astype(np.float16).astype(np.float64)).astype(np.float16).astype(np.float32)
        return np.where(x <= -10.0, np.float32(0.0), np.where(x >= 10.0, x, g)).astype(np.float32)

    def rope_vision(self, x, pos, n_heads, head_dim, sections, theta):
        T = len(x)
        ang = rope_vision_angles(np.asarray(pos), head_dim, sections, theta)        # [T, Dh/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        xh = x.reshape(T, n_heads, head_dim).astype(np.float64)
        half = head_dim // 2
        x0, x1 = xh[..., :half], xh[..., half:]
        out = np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
        return out.reshape(T, n_heads * head_dim).astype(np.float32)

    def attention_full(self, q, k, v, n_heads, head_dim, scale):
        T = len(q)
        qh, kh, vh = (a.reshape(T, n_heads, head_dim).astype(np.float64) for a in (q, k, v))
        scores = np.einsum("thd,shd->hts", qh, kh) * scale
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return np.einsum("hts,shd->thd", p, vh).reshape(T, n_heads * head_dim).astype(np.float32)

    # -- sampling (the device chain's algorithm, so the engine runs one path on every backend) ----------------
    SAMPLE_MAX_K = 1024       # as CudaBackend: the device chain keeps at most this many top-k candidates
    SAMPLE_MAX_WINDOW = 4096  # and takes at most this long a penalty window

    def sample_rows(self, logits, specs: Sequence[RowSample | None]) -> tuple[np.ndarray, np.ndarray]:
        """logits [R, N]; specs [R]: a RowSample (the chain, drawn at its u) or None (argmax, lowest id among
        ties, NaN never chosen) -> (ids [R] int32, candidates left for each draw [R] int32; 1 for argmax rows)."""
        x = np.asarray(logits, np.float32)
        ids, n = np.zeros(len(specs), np.int32), np.ones(len(specs), np.int32)
        for r, spec in enumerate(specs):
            if spec is None:
                ids[r] = int(np.argmax(np.where(np.isnan(x[r]), -np.inf, x[r])))
            else:
                ids[r], n[r] = sample_row_f32(x[r], spec)
        return ids, n

    def row_to_host(self, logits, row: int) -> np.ndarray:
        """logits [R, N] -> a float32 copy of row `row` [N]."""
        return np.array(logits[row], np.float32)

    # -- the MTP draft's argmax (base.Backend): the specification of cuda_src/coarse_head.cu and cmp_argmax -------
    COARSE_CHUNK = 4096       # rows of a head dequantized at a time by coarse_copy

    def argmax(self, logits, out=None):
        ids = argmax_rows(np.asarray(logits, np.float32))
        if out is None:
            return ids
        out[...] = ids
        return out

    def coarse_copy(self, w):
        rows, cols = w.shape
        if cols % CQ2_VALUES:
            raise ValueError(f"coarse_copy: rows of {cols} values are not CQ2 blocks of 32")
        codes = np.empty((rows, cols // 4), np.uint8)
        scales = np.empty((rows, cols // CQ2_VALUES), np.float16)
        for r0 in range(0, rows, self.COARSE_CHUNK):
            ids = np.arange(r0, min(rows, r0 + self.COARSE_CHUNK))
            codes[ids], scales[ids] = quantize_cq2(self.embed(w, ids))
        return RefCQ2(codes, scales)

    def coarse_logits(self, x, coarse):
        xq, xd = quantize_q8_blocks(np.asarray(x, np.float32))
        return cq2_gemv(xq.reshape(len(x), -1), xd, coarse.codes, coarse.scales)

    def coarse_argmax(self, x, coarse, exact, k, out=None):
        cand = top_ids(self.coarse_logits(x, coarse), k)
        ids = np.empty(len(x), np.int32)
        for r in range(len(x)):
            # the exact logits of the k candidates: the full head's own values (each row of a matmul is its own)
            logits = self.matmuls(x[r:r + 1], [rows_of(exact, cand[r])])[0][0]
            ids[r] = best_of(logits, cand[r])
        if out is None:
            return ids
        out[...] = ids
        return out


def _steps(state, kind: str, layer: int) -> list:
    """The list of per-token states of one layer's conv or ssm kept for restore_steps (a fresh one per batch)."""
    if state.steps is None:
        state.steps = {"conv": {}, "ssm": {}}
    state.steps[kind][layer] = []
    return state.steps[kind][layer]


def argmax_rows(x: np.ndarray) -> np.ndarray:
    """x [R, N] -> [R] int32: per row the index of the largest value, the lowest among ties, NaN never chosen (a row
    of only NaN: 0), as cmp_argmax."""
    nan = np.isnan(x)
    v = np.where(nan, -np.inf, x)
    hit = (v == v.max(axis=1, keepdims=True)) & ~nan
    return np.where(hit.any(axis=1), hit.argmax(axis=1), 0).astype(np.int32)


def top_ids(x: np.ndarray, k: int) -> np.ndarray:
    """x [R, N] -> [R, min(k, N)] int32: per row the ids of the k largest values, the larger first and the lower id
    among equal values, NaN counted as -inf (cmp_topk)."""
    v = np.where(np.isnan(x), -np.inf, np.asarray(x, np.float32))
    return np.argsort(-v, axis=1, kind="stable")[:, :k].astype(np.int32)


def best_of(values: np.ndarray, ids: np.ndarray) -> int:
    """The id of the largest of values [k] (ids [k] theirs), the lowest id among ties, NaN never chosen; all NaN: ids[0]
    (cmp_coarse_rescore)."""
    ok = ~np.isnan(values)
    if not ok.any():
        return int(ids[0])
    best = values[ok].max()
    return int(ids[ok & (values == best)].min())


def rows_of(w, ids: np.ndarray):
    """The rows `ids` of an uploaded matrix w [N, D], as an uploaded matrix [len(ids), D] of the same kind."""
    if isinstance(w, RefQ8):
        return RefQ8(w.q[ids], w.d[ids])
    if isinstance(w, RefQuant):
        return RefQuant(QuantTensor(w.tensor.type_name, w.tensor.blocks[ids]))
    return w[ids]


def _q8_matmul(xq: tuple[np.ndarray, np.ndarray], w: RefQ8) -> np.ndarray:
    """Integer block dots scaled by both block scales (float64), summed over blocks. The dots are exact in float32:
    32 products of |q| <= 128 (weights) and <= 127 (activations) stay below 2^24 in every partial sum, whatever
    order BLAS adds them in; float32 saves widening the weights to float64 on every call (5x on a 248k-row head)."""
    qx, dx = xq                                  # [T, B, 32], [T, B]: float32 holding the int8 values
    acc = np.zeros((qx.shape[0], w.q.shape[0]))
    for blk in range(qx.shape[1]):
        dots = (qx[:, blk] @ w.q[:, blk].T).astype(np.float64)
        acc += dots * dx[:, blk, None] * w.d[None, :, blk]
    return acc.astype(np.float32)


def sample_row_f32(logits: np.ndarray, spec: RowSample) -> tuple[int, int]:
    """logits [N] float32 -> (token id, candidates left for the draw): cuda_src/sampling.cu's sample_kernel step by
    step in float32 (sequential sums, the same comparisons), so that it and llamacmp/sampling.py (float64) can be
    checked against each other; the two differ only where u or a top-p / min-p cut falls within rounding of a
    boundary."""
    f32 = np.float32
    x = np.where(np.isnan(logits), -np.inf, logits).astype(f32)
    N = x.shape[0]
    for t, b in spec.bias.items():                       # logit bias (distinct ids)
        if 0 <= int(t) < N:
            x[int(t)] = f32(x[int(t)] + f32(b))
    if len(spec.window):                                 # penalties, once per distinct token of the window
        toks, counts = np.unique(np.asarray(spec.window, np.int64), return_counts=True)
        for t, c in zip(toks, counts):
            if 0 <= t < N:
                v = x[t]
                v = f32(v * f32(spec.penalty_repeat)) if v <= 0 else f32(v / f32(spec.penalty_repeat))
                x[t] = f32(f32(v - f32(c) * f32(spec.penalty_freq)) - f32(spec.penalty_present))
    k = spec.top_k
    order = np.argsort(-x, kind="stable")[:k]            # larger first, the lower id among equal values
    cv = x[order]
    keep_min, n = max(spec.min_keep, 1), k
    if spec.top_p < 1.0:
        e = np.exp(cv[:n] - cv[0]).astype(f32)
        total = np.cumsum(e, dtype=f32)[-1]
        cum = np.cumsum((e / total).astype(f32), dtype=f32)
        hit = np.flatnonzero(cum >= f32(spec.top_p))
        last = int(hit[0]) + 1 if len(hit) else n
        n = min(n, max(last, keep_min))
    if spec.min_p > 0.0:
        floor = f32(cv[0] + f32(np.log(f32(spec.min_p))))
        below = np.flatnonzero(cv[:n] < floor)
        count = int(below[0]) if len(below) else n       # sorted: the kept set is a prefix
        n = min(n, keep_min) if count < keep_min else count
    pick = 0
    if spec.temp > 0.0 and n > 1:
        w = np.exp((cv[:n] - cv[0]) * f32(1.0 / f32(spec.temp))).astype(f32)
        cum = np.cumsum(w, dtype=f32)
        target = f32(f32(spec.u) * cum[-1])
        hit = np.flatnonzero(cum > target)               # searchsorted(cdf, u, side="right")
        pick = int(hit[0]) if len(hit) else n - 1
    return int(order[pick]), (n if spec.temp > 0.0 else 1)
