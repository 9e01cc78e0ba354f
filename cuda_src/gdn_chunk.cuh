// The chunked (WY) form of the gated delta rule: gdn.cu's cmp_gdn_chunked launches these two kernels. Apart from
// gdn.cu so that tools/gdn_chunk_host.cpp can run the same source on the CPU (tests/test_gdn_chunk_host.py: a block's
// threads as host threads); there warp_sum, ceil_div and pdl_wait_producers come from the harness, not common.cuh.
#pragma once

#ifdef __CUDACC__
#include "common.cuh"
#endif
#include "smem_plan.h"

namespace cmp {
namespace {

// The dynamic shared memory of both kernels (float4: 16-byte aligned for lds4).
extern __shared__ float4 gdn_smem[];

// ---- chunked (WY) form -------------------------------------------------------------------------------------------
// numpy_ref.gdn_chunk_intra then numpy_ref.gdn_chunk_state (together numpy_ref.gdn_chunked), two launches. Per chunk
// of n <= 64 tokens (rows t >= n zero-padded: k = q = v = b = g = 0, so their W, U, M rows are 0 and G stays flat,
// which makes G[63] the chunk's last cumulative decay):
//   G = cumsum(g);  A[t,s] = b_t e^(G_t-G_s) k_t.k_s (s < t);  T = (I + A)^-1;  M[t,s] = e^(G_t-G_s) q_t.k_s (s <= t)
//   W = T diag(b e^G) K;  U = T diag(b) V                                         (gdn_chunk_intra_kernel)
//   D = U - W S0;  O = diag(e^G) Q S0 + M D;  S = e^(G_63) S0 + K^T diag(e^(G_63-G)) D   (gdn_chunk_state_kernel)
// D = T diag(b) (V - diag(e^G) K S0) is the solve of (I + A) D = diag(b) (V - diag(e^G) K S0). Nothing of the
// intra part depends on the state, so it runs for every (head, chunk) at once, each product and the triangular
// inverse once per head (not per value-column slice); only the state part walks the chunks in order. U goes to o's
// rows (the state kernel reads each element of U once, in the block that then writes the output there); W, M and the
// row scales the state kernel applies to the raw q and k go to the workspace, a GdnWork record per (chunk, head).
using smem::GDN_CH;   // tokens per chunk (numpy_ref.GDN_CHUNK)
using smem::GDN_BV;   // value columns per block of the state kernel
using smem::GDN_TS;   // row stride of the [CH][CH] arrays
constexpr int GDN_NT = 256;   // threads: a 16 x 16 grid (tx, ty); rows ty + 16a, columns tx + 16c

template <int DK>
struct GdnWork {   // one (chunk, head) record of the workspace, offsets in floats
    static constexpr int W = 0;                       // [CH][DK] T diag(b e^G) K (normalised k)
    static constexpr int M = W + GDN_CH * DK;         // [CH][CH] e^(G_t-G_s) q_t.k_s, s <= t (normalised q, k)
    static constexpr int R = M + GDN_CH * GDN_CH;     // [3][CH] row scales of the raw q, k: |q|^-1 e^G / sqrt(DK),
                                                      // |k|^-1 e^(G_63-G), and e^(G_63) at [2][0]
    static constexpr int floats = R + 3 * GDN_CH;
};
// Bytes of the workspace of an L-token segment: a record per (chunk, head).
template <int DK>
size_t gdn_chunk_work_bytes(int L, int V) {
    return sizeof(float) * (size_t)ceil_div(L, GDN_CH) * V * GdnWork<DK>::floats;
}

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// A [ROWS][4*W4] block of floats from global memory (row stride ld, rows >= n read as 0) through float4 registers
// into shared memory (row stride `stride`, a multiple of 4), optionally scaling row t by scale[t]. load() issues
// every read before the first store(), so the block waits on memory once, and a caller may issue the reads early
// (the state kernel: the next chunk's W during this chunk's M D and state update; the intra kernel: v during the
// inverse). Every pointer and stride is 16-byte aligned:
// Dk is a multiple of 16, so are the qkv, o and workspace row strides and offsets.
template <int ROWS, int W4>
struct GdnTile {
    static constexpr int N4 = ROWS * W4, PER = (N4 + GDN_NT - 1) / GDN_NT;   // float4s: in all, per thread
    float4 r[PER];
    __device__ __forceinline__ void load(const float* __restrict__ src, size_t ld, int n) {
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int e = threadIdx.x + p * GDN_NT, t = e / W4;
            if (e < N4 && t < n)
                r[p] = *reinterpret_cast<const float4*>(src + (size_t)t * ld + 4 * (e % W4));
            else
                r[p] = float4{0.f, 0.f, 0.f, 0.f};
        }
    }
    __device__ __forceinline__ void store(float* dst, int stride, const float* scale = nullptr) const {
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int e = threadIdx.x + p * GDN_NT, t = e / W4;
            if (e >= N4) continue;
            float4 v = r[p];
            if (scale != nullptr) {
                const float f = scale[t];
                v = float4{v.x * f, v.y * f, v.z * f, v.w * f};
            }
            *reinterpret_cast<float4*>(dst + t * stride + 4 * (e % W4)) = v;
        }
    }
};

// Head h's g and b of the chunk's rows (0 past n) into Bs, their inclusive prefix sum G into Gs. One warp: rows
// lane and lane + 32.
__device__ __forceinline__ void gdn_chunk_gates(const float* __restrict__ g,  // [L, V] log-decay
                                                const float* __restrict__ b,  // [L, V] beta
                                                int c0, int n, int V, int h, float* Gs, float* Bs) {
    const int lane = threadIdx.x & 31;
    float g0 = lane < n ? g[(size_t)(c0 + lane) * V + h] : 0.f;
    float g1 = lane + 32 < n ? g[(size_t)(c0 + lane + 32) * V + h] : 0.f;
    Bs[lane] = lane < n ? b[(size_t)(c0 + lane) * V + h] : 0.f;
    Bs[lane + 32] = lane + 32 < n ? b[(size_t)(c0 + lane + 32) * V + h] : 0.f;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float u0 = __shfl_up_sync(0xffffffffu, g0, off), u1 = __shfl_up_sync(0xffffffffu, g1, off);
        if (lane >= off) {
            g0 += u0;
            g1 += u1;
        }
    }
    g1 += __shfl_sync(0xffffffffu, g0, 31);
    Gs[lane] = g0;
    Gs[lane + 32] = g1;
}

// The chunk's q and k rows of K head kh (raw: rows t >= n as 0) into Qs / Ks (row stride QK).
template <int DK, int QK>
__device__ __forceinline__ void gdn_chunk_load_qk(const float* __restrict__ rows,  // q of row 0; its k at + K*DK
                                                  size_t C, int n, int K, float* Qs, float* Ks) {
    GdnTile<GDN_CH, DK / 4> q, k;
    q.load(rows, C, n);
    k.load(rows + (size_t)K * DK, C, n);
    q.store(Qs, QK);
    k.store(Ks, QK);
}

// Qs / Ks rows L2-normalised in place (q also scaled by 1/sqrt(DK)), a warp per row, each lane its own elements;
// the scales into Qn / Kn. Padding rows t >= n stay exactly 0 (no 0 * (1/eps) when eps is 0).
template <int DK, int QK>
__device__ __forceinline__ void gdn_chunk_normalise(int n, float eps, float* Qs, float* Ks, float* Qn, float* Kn) {
    constexpr int PER = DK >= 32 ? DK / 32 : 1;   // elements per lane
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int t = warp; t < GDN_CH; t += GDN_NT / 32) {
        float qsum = 0.f, ksum = 0.f;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = lane + 32 * e;
            const float qv = i < DK ? Qs[t * QK + i] : 0.f, kv = i < DK ? Ks[t * QK + i] : 0.f;
            qsum += qv * qv;
            ksum += kv * kv;
        }
        qsum = warp_sum(qsum);
        ksum = warp_sum(ksum);
        const float qn = t < n ? rsqrtf((float)DK) / fmaxf(sqrtf(qsum), eps) : 0.f;
        const float kn = t < n ? 1.f / fmaxf(sqrtf(ksum), eps) : 0.f;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = lane + 32 * e;
            if (i < DK) {
                Qs[t * QK + i] *= qn;
                Ks[t * QK + i] *= kn;
            }
        }
        if (lane == 0) {
            Qn[t] = qn;
            Kn[t] = kn;
        }
    }
}

// K K^T and Q K^T, 4 x 4 tiles: kk[a][c] = k_(ty+16a) . k_(tx+16c), qk likewise with q; float4 reads along the key dim.
template <int DK, int QK>
__device__ __forceinline__ void gdn_chunk_gram(const float* Qs, const float* Ks, float (&kk)[4][4],
                                               float (&qk)[4][4]) {
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) kk[a][c] = qk[a][c] = 0.f;
#pragma unroll 2
    for (int i = 0; i < DK; i += 4) {
        float4 kt[4], qt[4], kc[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            kt[a] = lds4(&Ks[(ty + 16 * a) * QK + i]);
            qt[a] = lds4(&Qs[(ty + 16 * a) * QK + i]);
            kc[a] = lds4(&Ks[(tx + 16 * a) * QK + i]);
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                kk[a][c] = fmaf(kt[a].x, kc[c].x, fmaf(kt[a].y, kc[c].y, fmaf(kt[a].z, kc[c].z,
                           fmaf(kt[a].w, kc[c].w, kk[a][c]))));
                qk[a][c] = fmaf(qt[a].x, kc[c].x, fmaf(qt[a].y, kc[c].y, fmaf(qt[a].z, kc[c].z,
                           fmaf(qt[a].w, kc[c].w, qk[a][c]))));
            }
    }
}

// Ts = (I + A)^-1 for As [CH][TS] strictly lower triangular (numpy_ref.unit_lower_inverse), Ts zero on entry and
// As no longer changing (the caller's barrier); ends with a barrier. The four 16 x 16 diagonal blocks by forward
// substitution, a thread per column with the column in registers (no barrier inside); then the off-diagonal blocks
// one block-diagonal d at a time, each from blocks of earlier diagonals only: P = A[rows of i, 16j..16i)
// T[16j..16i, columns of j], T_ij = -T_ii P (i = j + d). 7 barriers for the whole inverse, where forward
// substitution of the whole chunk takes 63 dependent steps.
__device__ __forceinline__ void gdn_chunk_invert(const float* As, float* Ts, float* Ps) {
    const int tid = threadIdx.x;
    if (tid < GDN_CH) {
        const int d0 = (tid >> 4) * 16, col = tid & 15;   // block (d0, d0), column col
        const float* a = As + d0 * GDN_TS + d0;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {   // x_r = e_col[r] - sum_{s<r} A_rs x_s (x_s = 0 for s < col)
            float acc = r == col ? 1.f : 0.f;
#pragma unroll
            for (int s = 0; s < r; ++s) acc = fmaf(-a[r * GDN_TS + s], x[s], acc);
            x[r] = acc;
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) Ts[(d0 + r) * GDN_TS + d0 + col] = x[r];
    }
    __syncthreads();
    constexpr int PS = 16 * 17;   // one 16 x 16 product, row stride 17
    for (int d = 1; d < 4; ++d) {
        const int nb = 4 - d;     // blocks (i, i - d), i = d .. 3: element e = tid + 256 * (i - d)
        for (int e = tid; e < nb * 256; e += GDN_NT) {
            const int i = d + (e >> 8), j = i - d, r = (e >> 4) & 15, c = e & 15;
            const float* a = As + (16 * i + r) * GDN_TS;
            float p = 0.f;
            for (int u = 16 * j; u < 16 * i; ++u) p = fmaf(a[u], Ts[u * GDN_TS + 16 * j + c], p);
            Ps[(e >> 8) * PS + r * 17 + c] = p;
        }
        __syncthreads();
        for (int e = tid; e < nb * 256; e += GDN_NT) {
            const int i = d + (e >> 8), j = i - d, r = (e >> 4) & 15, c = e & 15;
            const float* t = Ts + (16 * i + r) * GDN_TS + 16 * i;
            const float* p = Ps + (e >> 8) * PS + c;
            float x = 0.f;
            for (int m = 0; m <= r; ++m) x = fmaf(t[m], p[m * 17], x);
            Ts[(16 * i + r) * GDN_TS + 16 * j + c] = -x;
        }
        __syncthreads();
    }
}

// out[t][tx + 16c] = sum_s Ts[t][s] X[s][tx + 16c] for rows t = ty + 16a < rows (out row stride ld).
template <int DK, int XS>
__device__ __forceinline__ void gdn_chunk_apply_t(const float* Ts, const float* X, float* __restrict__ out, size_t ld,
                                                  int rows) {
    constexpr int NC = DK / 16;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[4][NC];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[a][c] = 0.f;
#pragma unroll 4
    for (int s = 0; s < GDN_CH; ++s) {
        float tv[4], xv[NC];
#pragma unroll
        for (int a = 0; a < 4; ++a) tv[a] = Ts[(ty + 16 * a) * GDN_TS + s];
#pragma unroll
        for (int c = 0; c < NC; ++c) xv[c] = X[s * XS + tx + 16 * c];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int c = 0; c < NC; ++c) acc[a][c] = fmaf(tv[a], xv[c], acc[a][c]);
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int t = ty + 16 * a;
        if (t < rows)
#pragma unroll
            for (int c = 0; c < NC; ++c) out[(size_t)t * ld + tx + 16 * c] = acc[a][c];
    }
}

// Block (V head h, chunk c): everything of the chunk that does not depend on the state (see above), for every chunk
// at once. Writes U to o's rows of the chunk (head h's columns) and the GdnWork record (c, h).
template <int DK>
__global__ void __launch_bounds__(GDN_NT)
gdn_chunk_intra_kernel(const float* __restrict__ qkv,  // [L, C], C = 2*K*DK + V*DK
                       const float* __restrict__ g,    // [L, V] log-decay
                       const float* __restrict__ b,    // [L, V] beta
                       float* __restrict__ o,          // [L, V*DK]: U
                       float* __restrict__ work,       // [ceil(L/CH), V] GdnWork<DK> records
                       int L, int K, int V, float eps) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    static_assert(DK % 16 == 0, "DK must be a multiple of 16");
    using Lay = smem::GdnIntraLayout<DK>;
    using Rec = GdnWork<DK>;
    constexpr int QK = Lay::QK, XS = Lay::XS, TS = GDN_TS;
    float* Ks = reinterpret_cast<float*>(gdn_smem);    // [CH][QK] normalised k, then diag(b e^G) k
    float* Xs = Ks + GDN_CH * QK;                   // [CH][XS] normalised q; then A [CH][TS]; then diag(b) v [CH][QK]
    float* Ts = Xs + GDN_CH * XS;                   // [CH][TS] T = (I + A)^-1
    float* Ps = Ts + GDN_CH * TS;                   // [3][16][17] the inverse's off-diagonal products
    float* Gs = Ps + Lay::PS;                       // [CH] cumulative log-decay
    float* Bs = Gs + GDN_CH;                        // [CH] beta
    float* Qn = Bs + GDN_CH;                        // [CH] q's scale (1/|q| / sqrt(DK))
    float* Kn = Qn + GDN_CH;                        // [CH] k's scale (1/|k|)

    const int h = blockIdx.x, kh = h % K, c0 = blockIdx.y * GDN_CH, n = min(GDN_CH, L - c0);
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    float* rec = work + ((size_t)blockIdx.y * V + h) * Rec::floats;

    const size_t C = (size_t)(2 * K + V) * DK;
    const float* rows = qkv + (size_t)c0 * C;   // the chunk's row 0
    gdn_chunk_load_qk<DK, QK>(rows + kh * DK, C, n, K, Xs, Ks);
    if (tid < 32) gdn_chunk_gates(g, b, c0, n, V, h, Gs, Bs);
    __syncthreads();
    gdn_chunk_normalise<DK, QK>(n, eps, Xs, Ks, Qn, Kn);
    __syncthreads();

    float kk[4][4], qk[4][4];
    gdn_chunk_gram<DK, QK>(Xs, Ks, kk, qk);
    if (tid < GDN_CH) {   // the state kernel's row scales of the raw q and k
        const float glast = Gs[GDN_CH - 1];
        rec[Rec::R + tid] = Qn[tid] * __expf(Gs[tid]);
        rec[Rec::R + GDN_CH + tid] = Kn[tid] * __expf(glast - Gs[tid]);
        rec[Rec::R + 2 * GDN_CH + tid] = tid == 0 ? __expf(glast) : 0.f;
    }
    __syncthreads();   // q and k read: Xs takes A, Ks is scaled in place

    float* As = Xs;
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int t = ty + 16 * a;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int s = tx + 16 * c;
            const float decay = s <= t ? __expf(Gs[t] - Gs[s]) : 0.f;
            As[t * TS + s] = s < t ? Bs[t] * decay * kk[a][c] : 0.f;
            rec[Rec::M + t * GDN_CH + s] = decay * qk[a][c];
        }
    }
    for (int e = tid; e < GDN_CH * GDN_CH; e += GDN_NT) Ts[(e / GDN_CH) * TS + e % GDN_CH] = 0.f;
    for (int e = tid; e < GDN_CH * DK; e += GDN_NT) {
        const int t = e / DK;
        Ks[t * QK + e % DK] *= Bs[t] * __expf(Gs[t]);
    }
    __syncthreads();

    GdnTile<GDN_CH, DK / 4> v;   // v of head h (0 past n): read while the inverse computes
    v.load(rows + (size_t)2 * K * DK + (size_t)h * DK, C, n);
    gdn_chunk_invert(As, Ts, Ps);   // ends with a barrier: A is dead
    v.store(Xs, QK, Bs);            // diag(b) v
    __syncthreads();

    gdn_chunk_apply_t<DK, QK>(Ts, Ks, rec + Rec::W, DK, GDN_CH);                                 // W, all 64 rows
    gdn_chunk_apply_t<DK, QK>(Ts, Xs, o + (size_t)c0 * V * DK + (size_t)h * DK, (size_t)V * DK, n);   // U
}

// Block (V head h, value columns j0 .. j0 + BV - 1) walks the chunks in order with its slice S[:, j0:j0+BV] of the
// state in shared memory (the value columns of S evolve independently). Per chunk, from the intra kernel's record
// and U in o: D = U - W S0, O = diag(e^G) Q S0 + M D over U in o, S = e^(G_63) S0 + K^T diag(e^(G_63-G)) D, with
// the raw q and k rows and the record's row scales in place of the normalised ones. The next chunk's W (32 KB at DK
// 128, the largest read) is read into registers during this chunk's M D and state update; q, U and the row scales,
// then M and k, are waited for (reading them early too would not fit the 128 registers that leave room for 2 blocks
// an SM: 256 blocks at the 9B's 32 heads, all resident on an H200's 132 SMs).
template <int DK>
__global__ void __launch_bounds__(GDN_NT, 2)   // 2 blocks an SM (shared memory allows it from sm_80): <= 128 registers
gdn_chunk_state_kernel(const float* __restrict__ qkv,   // [L, C], C = 2*K*DK + V*DK
                       const float* __restrict__ work,  // [ceil(L/CH), V] GdnWork<DK> records
                       float* __restrict__ state,       // [V, DK, DK]
                       float* __restrict__ o,           // [L, V*DK]: U in, the output out
                       int L, int K, int V) {
    pdl_wait_producers();   // the intra kernel's writes are visible
    static_assert(DK % 16 == 0 && DK >= GDN_BV, "DK must be a multiple of 16");
    using Lay = smem::GdnStateLayout<DK>;
    using Rec = GdnWork<DK>;
    constexpr int QK = Lay::QK, XS = Lay::XS, TS = GDN_TS, DS = Lay::DS, NI = DK / 16;
    float* Xa = reinterpret_cast<float*>(gdn_smem);   // [CH][XS] W, then M [CH][TS]
    float* Xb = Xa + GDN_CH * XS;                      // [CH][QK] raw q, then raw k (0 past n)
    float* Ss = Xb + GDN_CH * QK;                      // [DK][BV] state slice
    float* Rs = Ss + DK * GDN_BV;                      // [3][CH] the record's row scales
    float* Ds = Rs + 3 * GDN_CH;                       // [CH][DS] U, then D

    const int h = blockIdx.x, kh = h % K, j0 = blockIdx.y * GDN_BV;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const size_t C = (size_t)(2 * K + V) * DK, ldo = (size_t)V * DK;
    float* S = state + (size_t)h * DK * DK;
    float* oh = o + (size_t)h * DK + j0;                // row 0 of the block's output columns
    const float* qh = qkv + kh * DK;                    // row 0's q; its k at + K * DK
    auto record = [&](int c) { return work + ((size_t)c * V + h) * Rec::floats; };

    for (int e = tid; e < DK * GDN_BV; e += GDN_NT) Ss[e] = S[(size_t)(e / GDN_BV) * DK + j0 + e % GDN_BV];
    GdnTile<GDN_CH, DK / 4> w;   // W of the next chunk to run
    w.load(record(0) + Rec::W, DK, GDN_CH);

    for (int c0 = 0, c = 0; c0 < L; c0 += GDN_CH, ++c) {
        const int n = min(GDN_CH, L - c0);
        __syncthreads();   // the previous chunk's readers of every buffer are done (and the first Ss is visible)
        w.store(Xa, XS);
        {
            GdnTile<GDN_CH, DK / 4> q;
            GdnTile<GDN_CH, GDN_BV / 4> u;   // U: the block's columns of o
            GdnTile<3, GDN_CH / 4> r;
            q.load(qh + (size_t)c0 * C, C, n);
            u.load(oh + (size_t)c0 * ldo, ldo, n);
            r.load(record(c) + Rec::R, GDN_CH, 3);
            q.store(Xb, QK);
            u.store(Ds, DS);
            r.store(Rs, GDN_CH);
        }
        __syncthreads();

        // W S0 and Q S0: rows ty + 16a, column tx
        float ws[4] = {0.f, 0.f, 0.f, 0.f}, out[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
        for (int i = 0; i < DK; i += 4) {
            const float s0 = Ss[i * GDN_BV + tx], s1 = Ss[(i + 1) * GDN_BV + tx];
            const float s2 = Ss[(i + 2) * GDN_BV + tx], s3 = Ss[(i + 3) * GDN_BV + tx];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                const float4 w = lds4(&Xa[(ty + 16 * a) * XS + i]), q = lds4(&Xb[(ty + 16 * a) * QK + i]);
                ws[a] = fmaf(w.x, s0, fmaf(w.y, s1, fmaf(w.z, s2, fmaf(w.w, s3, ws[a]))));
                out[a] = fmaf(q.x, s0, fmaf(q.y, s1, fmaf(q.z, s2, fmaf(q.w, s3, out[a]))));
            }
        }
        __syncthreads();   // W and q read: Xa takes M, Xb k

        GdnTile<GDN_CH, GDN_CH / 4> m;   // (read here, not during the products: both would not fit 128 registers)
        GdnTile<GDN_CH, DK / 4> k;
        m.load(record(c) + Rec::M, GDN_CH, GDN_CH);
        k.load(qh + (size_t)c0 * C + (size_t)K * DK, C, n);
#pragma unroll
        for (int a = 0; a < 4; ++a) {   // D = U - W S0 (the thread's own elements); the Q S0 term's row scale
            const int t = ty + 16 * a;
            Ds[t * DS + tx] -= ws[a];
            out[a] *= Rs[t];
        }
        m.store(Xa, TS);
        k.store(Xb, QK);
        __syncthreads();
        if (c0 + GDN_CH < L) w.load(record(c + 1) + Rec::W, DK, GDN_CH);   // while this chunk computes

        // O = diag(e^G) Q S0 + M D (M's rows are 0 past n, and so are D's)
#pragma unroll 2
        for (int s = 0; s < GDN_CH; s += 4) {
            const float d0 = Ds[s * DS + tx], d1 = Ds[(s + 1) * DS + tx];
            const float d2 = Ds[(s + 2) * DS + tx], d3 = Ds[(s + 3) * DS + tx];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                const float4 mv = lds4(&Xa[(ty + 16 * a) * TS + s]);
                out[a] = fmaf(mv.x, d0, fmaf(mv.y, d1, fmaf(mv.z, d2, fmaf(mv.w, d3, out[a]))));
            }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const int t = ty + 16 * a;
            if (t < n) oh[(size_t)(c0 + t) * ldo + tx] = out[a];
        }

        // S = e^(G_63) S0 + K^T diag(e^(G_63-G)) D: rows ty * NI .. ty * NI + NI - 1 (float4 reads of k), column tx
        float upd[NI];
#pragma unroll
        for (int a = 0; a < NI; ++a) upd[a] = 0.f;
        for (int t = 0; t < n; ++t) {
            const float dw = Rs[GDN_CH + t] * Ds[t * DS + tx];
            if constexpr (NI % 4 == 0) {
#pragma unroll
                for (int a = 0; a < NI; a += 4) {
                    const float4 kv = lds4(&Xb[t * QK + ty * NI + a]);
                    upd[a] = fmaf(kv.x, dw, upd[a]);
                    upd[a + 1] = fmaf(kv.y, dw, upd[a + 1]);
                    upd[a + 2] = fmaf(kv.z, dw, upd[a + 2]);
                    upd[a + 3] = fmaf(kv.w, dw, upd[a + 3]);
                }
            } else {   // DK 16, 32: fewer than 4 rows per thread
#pragma unroll
                for (int a = 0; a < NI; ++a) upd[a] = fmaf(Xb[t * QK + ty * NI + a], dw, upd[a]);
            }
        }
        const float gl = Rs[2 * GDN_CH];
#pragma unroll
        for (int a = 0; a < NI; ++a) {
            float* sp = &Ss[(ty * NI + a) * GDN_BV + tx];
            *sp = fmaf(gl, *sp, upd[a]);
        }
    }
    __syncthreads();
    for (int e = tid; e < DK * GDN_BV; e += GDN_NT) S[(size_t)(e / GDN_BV) * DK + j0 + e % GDN_BV] = Ss[e];
}

}  // namespace
}  // namespace cmp
