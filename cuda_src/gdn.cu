// Gated DeltaNet: the causal depthwise conv1d (+SiLU) with its rolling state, and the gated delta rule.
// The delta rule runs either as a sequential scan over the segment's tokens (exact for decode and prefill alike)
// or, for prefill, in the chunked WY closed form of numpy_ref.gdn_chunked (64 tokens per chunk), which replaces
// 64 dependent rank-1 updates by a few small matrix products per chunk: the state-independent part (a 64-row
// triangular inverse among them) for all chunks at once, then three products per chunk in order.
#include <type_traits>

#include "common.cuh"
#include "smem_plan.h"

namespace cmp {
namespace {

constexpr int CONV_MAX_K = 8;

// ==== kernels =====================================================================================================

// One token of one channel: the input enters window slot kernel-1, *out = SiLU(sum_j win[j] * wc[j]) (fma in slot
// order, so every caller computes the same bits), then the window shifts by one, ready for the next token.
__device__ __forceinline__ void conv1d_silu_step(float (&win)[CONV_MAX_K], const float (&wc)[CONV_MAX_K], float x,
                                                 float* __restrict__ out, int kernel) {
    win[kernel - 1 < CONV_MAX_K ? kernel - 1 : 0] = x;
    float y = 0.f;
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j)
        if (j < kernel) y = fmaf(win[j], wc[j], y);
    *out = siluf_(y);
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; ++j)
        if (j < kernel - 1) win[j] = win[j + 1];
}

// Thread per channel, walking the tokens with the last kernel-1 inputs in registers.
__device__ __forceinline__ void conv1d_silu(const float* __restrict__ x,  // [L, C]
                                            const float* __restrict__ w,  // [C, kernel]
                                            float* __restrict__ state,    // [kernel-1, C]
                                            float* __restrict__ out,      // [L, C]
                                            int L, int C, int kernel,
                                            float* __restrict__ steps = nullptr) {  // [L, kernel-1, C] or null
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float win[CONV_MAX_K], wc[CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) {
        wc[j] = j < kernel ? w[(size_t)c * kernel + j] : 0.f;
        win[j] = j < kernel - 1 ? state[(size_t)j * C + c] : 0.f;
    }
    for (int t = 0; t < L; ++t) {
        conv1d_silu_step(win, wc, x[(size_t)t * C + c], &out[(size_t)t * C + c], kernel);
        if (steps != nullptr) {   // speculative verification: the state after token t, for cmp restore
#pragma unroll
            for (int j = 0; j < CONV_MAX_K - 1; ++j)
                if (j < kernel - 1) steps[((size_t)t * (kernel - 1) + j) * C + c] = win[j];
        }
    }
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j)
        if (j < kernel - 1) state[(size_t)j * C + c] = win[j];
}

__global__ void conv1d_silu_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ state,
                                   float* __restrict__ out, int L, int C, int kernel, float* __restrict__ steps) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    conv1d_silu(x, w, state, out, L, C, kernel, steps);
}

// Prefill: block (128 channels, chunk blockIdx.y of CONV_TL tokens), so the tokens run in parallel (one thread per
// channel walking all L tokens left 64 blocks on the GPU, latency-bound: 9% of a 9B prefill). A thread reads its
// window's kernel-1 earlier inputs from x, or from the old state before token 0, then walks its chunk with
// conv1d_silu's step (conv1d_silu_step: the same bits). Only chunk 0 reads the old state, and it writes the
// new one (the last kernel-1 inputs: from x, or for a short segment from the old state, slot L + j, read before
// it is overwritten since slots are written in increasing order), so no block reads what another writes.
constexpr int CONV_TL = 32;

__global__ void conv1d_silu_chunks_kernel(const float* __restrict__ x,  // [L, C]
                                          const float* __restrict__ w,  // [C, kernel]
                                          float* __restrict__ state,    // [kernel-1, C]
                                          float* __restrict__ out,      // [L, C]
                                          int L, int C, int kernel) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int t0 = blockIdx.y * CONV_TL, t1 = min(t0 + CONV_TL, L);
    float win[CONV_MAX_K], wc[CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) {
        const int t = t0 - (kernel - 1) + j;   // the input in window slot j before token t0
        wc[j] = j < kernel ? w[(size_t)c * kernel + j] : 0.f;
        win[j] = j >= kernel - 1 ? 0.f : t >= 0 ? x[(size_t)t * C + c] : state[(size_t)(t + kernel - 1) * C + c];
    }
    for (int t = t0; t < t1; ++t) {
        conv1d_silu_step(win, wc, x[(size_t)t * C + c], &out[(size_t)t * C + c], kernel);
    }
    if (blockIdx.y != 0) return;
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; ++j) {
        const int t = L - (kernel - 1) + j;
        if (j < kernel - 1) state[(size_t)j * C + c] = t >= 0 ? x[(size_t)t * C + c] : state[(size_t)(L + j) * C + c];
    }
}

// A decode batch: sequence s = blockIdx.y has one token, row s of x / out, and its own state states[s]; each
// sequence computes exactly what conv1d_silu_kernel computes for it alone.
__global__ void conv1d_silu_rows_kernel(const float* __restrict__ x,      // [S, C]
                                        const float* __restrict__ w,      // [C, kernel]
                                        float* const* __restrict__ states,  // [S] -> [kernel-1, C]
                                        float* __restrict__ out,          // [S, C]
                                        int C, int kernel) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t s = blockIdx.y;
    conv1d_silu(x + s * C, w, states[s], out + s * C, 1, C, kernel);
}

// Block (V head h, 32 value columns); lane owns column j of S_h ([Dk, Dv], S[i][j]) in DK registers, so the whole
// token update (decay, delta, rank-1 update, output) needs no cross-lane reduction. q and k of the head's K group
// (h % K) are L2-normalised by the warp into shared memory each token. The next token's inputs are loaded before
// the current update so the global-load latency overlaps the arithmetic.
template <int DK>
__device__ __forceinline__ void gdn_scan(const float* __restrict__ qkv,  // [L, C], C = 2*K*DK + V*DK
                                         const float* __restrict__ g,    // [L, V] log-decay
                                         const float* __restrict__ b,    // [L, V] beta
                                         float* __restrict__ state,      // [V, DK, DK]
                                         float* __restrict__ o,          // [L, V*DK]
                                         int L, int K, int V, float eps) {
    constexpr int PER = DK >= 32 ? DK / 32 : 1;  // q/k elements per lane
    __shared__ float qs[DK], ks[DK];
    const int h = blockIdx.x, kh = h % K, lane = threadIdx.x;
    const int j = blockIdx.y * 32 + lane;
    const bool col = j < DK;
    const size_t C = (size_t)(2 * K + V) * DK;
    float* S = state + (size_t)h * DK * DK;
    float s[DK];
#pragma unroll
    for (int i = 0; i < DK; ++i) s[i] = col ? S[(size_t)i * DK + j] : 0.f;
    const float qscale = rsqrtf((float)DK);

    auto load = [&](int t, float* qv, float* kv, float& vj, float& gt, float& bt) {
        const float* row = qkv + (size_t)t * C;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = lane + 32 * e;
            qv[e] = i < DK ? row[kh * DK + i] : 0.f;
            kv[e] = i < DK ? row[(size_t)K * DK + kh * DK + i] : 0.f;
        }
        vj = col ? row[(size_t)2 * K * DK + (size_t)h * DK + j] : 0.f;
        gt = g[(size_t)t * V + h];
        bt = b[(size_t)t * V + h];
    };
    float qv[PER], kv[PER], vj = 0.f, gt = 0.f, bt = 0.f;
    if (L > 0) load(0, qv, kv, vj, gt, bt);
    for (int t = 0; t < L; ++t) {
        float qsum = 0.f, ksum = 0.f;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            qsum += qv[e] * qv[e];
            ksum += kv[e] * kv[e];
        }
        const float qn = qscale / fmaxf(sqrtf(warp_sum(qsum)), eps);
        const float kn = 1.f / fmaxf(sqrtf(warp_sum(ksum)), eps);
        __syncwarp();  // previous token's readers of qs/ks are done
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = lane + 32 * e;
            if (i < DK) {
                qs[i] = qv[e] * qn;
                ks[i] = kv[e] * kn;
            }
        }
        const float decay = __expf(gt), beta = bt, v_now = vj;
        if (t + 1 < L) load(t + 1, qv, kv, vj, gt, bt);
        __syncwarp();
        float kS = 0.f;
#pragma unroll
        for (int i = 0; i < DK; ++i) kS = fmaf(s[i], ks[i], kS);
        const float delta = beta * (v_now - decay * kS);
        float out = 0.f;
#pragma unroll
        for (int i = 0; i < DK; ++i) {
            s[i] = fmaf(decay, s[i], ks[i] * delta);
            out = fmaf(s[i], qs[i], out);
        }
        if (col) o[(size_t)t * V * DK + (size_t)h * DK + j] = out;
    }
#pragma unroll
    for (int i = 0; i < DK; ++i)
        if (col) S[(size_t)i * DK + j] = s[i];
}

template <int DK>
__global__ void __launch_bounds__(32)
gdn_scan_kernel(const float* __restrict__ qkv, const float* __restrict__ g, const float* __restrict__ b,
                float* __restrict__ state, float* __restrict__ o, int L, int K, int V, float eps) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    gdn_scan<DK>(qkv, g, b, state, o, L, K, V, eps);
}

// ---- the decode step (L = 1) -------------------------------------------------------------------------------------
// gdn_scan's block is one warp whose lanes each walk two DK-long dependent FMA chains (k.S, then update + output) over
// a column held in DK registers: at DK 128 and V 32 (9B) that is 128 warps on the whole GPU, each latency-bound
// (7.37 us per layer on the H200; ptxas also spills gdn_scan_kernel<128> at its 255 registers). For one token the state's rows split over GDN_STEP_NW<DK> warps of the block
// (warp w: rows w*RW .. w*RW+RW-1 of the lane's column, RW = 32): chains RW long, NW times the warps in flight. The
// partial k.S and outputs meet in shared memory, summed in warp order 0..NW-1 by every warp alike (so every warp
// takes the same delta). Only the summation order of k.S and of the output differs from gdn_scan (fp32, ~1e-7
// relative); DK 16 and 32 stay one warp, gdn_scan's arithmetic exactly.
template <int DK>
constexpr int GDN_STEP_NW = DK >= 64 ? DK / 32 : 1;   // row warps per block

// Block (V head h, 32 value columns), GDN_STEP_NW<DK> warps; threadIdx.x = warp * 32 + lane; warp w holds rows
// w*RW .. w*RW+RW-1 of the lane's column j of S_h in registers. A token is two parts so that a kernel walking several
// tokens (gdn_keep_kernel) can load token t+1's inputs while token t computes: gdn_step_load reads the lane's inputs,
// gdn_step_update runs the token on the registers. Every step kernel calls the same two on the same values, so a
// token's output and state are the same bits in each.
template <int DK>
struct GdnStepIn {
    static constexpr int PER = DK >= 32 ? DK / 32 : 1;   // q/k elements per lane for the norms
    float q[PER], k[PER];   // elements lane + 32e of the head's K group (h % K): every warp normalises all of q and k
    float v, g, b;          // column j of v (0 past DK), the head's log-decay and beta
};

template <int DK>
__device__ __forceinline__ GdnStepIn<DK> gdn_step_load(const float* __restrict__ qkv,  // [C], C = 2*K*DK + V*DK
                                                       const float* __restrict__ g,    // [V] log-decay
                                                       const float* __restrict__ b,    // [V] beta
                                                       int K) {
    GdnStepIn<DK> in;
    const int h = blockIdx.x, kh = h % K, lane = threadIdx.x & 31, j = blockIdx.y * 32 + lane;
#pragma unroll
    for (int e = 0; e < GdnStepIn<DK>::PER; ++e) {
        const int i = lane + 32 * e;
        in.q[e] = i < DK ? qkv[kh * DK + i] : 0.f;
        in.k[e] = i < DK ? qkv[(size_t)K * DK + kh * DK + i] : 0.f;
    }
    in.v = j < DK ? qkv[(size_t)2 * K * DK + (size_t)h * DK + j] : 0.f;
    in.g = g[h];
    in.b = b[h];
    return in;
}

// The lane's rows of head h's state (S: [V, DK, DK]) into registers.
template <int DK, int RW = DK / GDN_STEP_NW<DK>>
__device__ __forceinline__ void gdn_step_state(float (&s)[RW], const float* S) {
    const int h = blockIdx.x, lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * RW, j = blockIdx.y * 32 + lane;
    S += (size_t)h * DK * DK;
#pragma unroll
    for (int i = 0; i < RW; ++i) s[i] = j < DK ? S[(size_t)(r0 + i) * DK + j] : 0.f;
}

// One token on the registers s: the state after it goes to S_out ([V, DK, DK], head h's rows; may be the buffer s was
// read from, so not __restrict__) and the output to o ([V*DK]). The shared arrays are reused token after token: a
// caller running another token after this one calls __syncwarp() first (qs / ks are written and read by their own
// warp only; with NW > 1 the two __syncthreads() order part_ks and part_o between tokens).
template <int DK, int RW = DK / GDN_STEP_NW<DK>>
__device__ __forceinline__ void gdn_step_update(float (&s)[RW], const GdnStepIn<DK>& in, float* S_out,
                                                float* __restrict__ o, float eps) {
    constexpr int NW = GDN_STEP_NW<DK>, PER = GdnStepIn<DK>::PER;
    static_assert(RW * NW == DK, "rows per warp");
    __shared__ float qs[DK], ks[DK];
    __shared__ float part_ks[NW][32], part_o[NW][32];
    const int h = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, r0 = w * RW;
    const int j = blockIdx.y * 32 + lane;
    const bool col = j < DK;
    float qsum = 0.f, ksum = 0.f;
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        qsum += in.q[e] * in.q[e];
        ksum += in.k[e] * in.k[e];
    }
    const float decay = __expf(in.g), beta = in.b;
    const float qn = rsqrtf((float)DK) / fmaxf(sqrtf(warp_sum(qsum)), eps);
    const float kn = 1.f / fmaxf(sqrtf(warp_sum(ksum)), eps);
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        const int i = lane + 32 * e;
        if (i < DK && i >= r0 && i < r0 + RW) {   // this warp's rows only: no other warp reads them
            qs[i] = in.q[e] * qn;
            ks[i] = in.k[e] * kn;
        }
    }
    __syncwarp();
    float kS = 0.f;
#pragma unroll
    for (int i = 0; i < RW; ++i) kS = fmaf(s[i], ks[r0 + i], kS);
    if (NW > 1) {
        part_ks[w][lane] = kS;
        __syncthreads();
        kS = part_ks[0][lane];
#pragma unroll
        for (int u = 1; u < NW; ++u) kS += part_ks[u][lane];
    }
    const float delta = beta * (in.v - decay * kS);
    float out = 0.f;
#pragma unroll
    for (int i = 0; i < RW; ++i) {
        s[i] = fmaf(decay, s[i], ks[r0 + i] * delta);
        out = fmaf(s[i], qs[r0 + i], out);
    }
    S_out += (size_t)h * DK * DK;
#pragma unroll
    for (int i = 0; i < RW; ++i)
        if (col) S_out[(size_t)(r0 + i) * DK + j] = s[i];
    if (NW > 1) {
        part_o[w][lane] = out;
        __syncthreads();
        if (w == 0) {
            out = part_o[0][lane];
#pragma unroll
            for (int u = 1; u < NW; ++u) out += part_o[u][lane];
        }
    }
    if (w == 0 && col) o[(size_t)h * DK + j] = out;
}

// One token, the state updated in place (a decode step: gdn_step_kernel, gdn_step_rows_kernel).
template <int DK>
__device__ __forceinline__ void gdn_step(const float* __restrict__ qkv,  // [C] one token
                                         const float* __restrict__ g,    // [V]
                                         const float* __restrict__ b,    // [V]
                                         float* state,                   // [V, DK, DK]
                                         float* __restrict__ o,          // [V*DK]
                                         int K, float eps) {
    float s[DK / GDN_STEP_NW<DK>];
    gdn_step_state<DK>(s, state);
    gdn_step_update<DK>(s, gdn_step_load<DK>(qkv, g, b, K), state, o, eps);
}

// One sequence's decode token (cmp_gdn with L = 1).
template <int DK>
__global__ void __launch_bounds__(32 * GDN_STEP_NW<DK>)
gdn_step_kernel(const float* __restrict__ qkv,  // [1, C]
                const float* __restrict__ g,    // [1, V]
                const float* __restrict__ b,    // [1, V]
                float* __restrict__ state,      // [V, DK, DK]
                float* __restrict__ o,          // [1, V*DK]
                int K, int V, float eps) {
    pdl_allow_consumers();  // first: the Q8 producer and the GEMV after it launch and wait (weights stream)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    gdn_step<DK>(qkv, g, b, state, o, K, eps);
}

// A speculative verification of one segment (cmp_gdn_keep), one launch: the L tokens in turn, each gdn_step's
// arithmetic (so a verified token's output is its decode's, bit for bit), the lane's rows of the state in registers
// from token to token and token t+1's inputs loaded before token t's update. The state after token t goes to
// steps[t] for t < L-1, after the last token to the state itself. A launch per token (the decode step's kernel) read
// the state before every token back from memory: at n_max 3 four launches and 8 MiB read a 9B layer, here one and
// 2 MiB; the writes (every kept state) are the same.
template <int DK>
__global__ void __launch_bounds__(32 * GDN_STEP_NW<DK>)
gdn_keep_kernel(const float* __restrict__ qkv,  // [L, C]
                const float* __restrict__ g,    // [L, V]
                const float* __restrict__ b,    // [L, V]
                float* __restrict__ state,      // [V, DK, DK]
                float* __restrict__ steps,      // [L-1, V, DK, DK] (null for L = 1)
                float* __restrict__ o,          // [L, V*DK]
                int L, int K, int V, float eps) {
    pdl_allow_consumers();  // first: the Q8 producer and the GEMV after it launch and wait (weights stream)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t C = (size_t)(2 * K + V) * DK, VDD = (size_t)V * DK * DK;
    float s[DK / GDN_STEP_NW<DK>];
    gdn_step_state<DK>(s, state);
    GdnStepIn<DK> in = gdn_step_load<DK>(qkv, g, b, K);
    for (int t = 0; t < L; ++t) {
        const bool more = t + 1 < L;
        GdnStepIn<DK> next = in;
        if (more) next = gdn_step_load<DK>(qkv + (t + 1) * C, g + (size_t)(t + 1) * V, b + (size_t)(t + 1) * V, K);
        gdn_step_update<DK>(s, in, more ? steps + t * VDD : state, o + (size_t)t * V * DK, eps);
        in = next;
        __syncwarp();   // this token's readers of qs / ks are done before the next token writes them
    }
}

// A decode batch: sequence s = blockIdx.z has one token (row s of qkv / g / b / o) and its own state states[s]; the
// grid holds every sequence's (head, column) blocks at once, and each sequence runs gdn_step as gdn_step_kernel does
// for it alone (bit for bit: tests/test_decode_cuda.py).
template <int DK>
__global__ void __launch_bounds__(32 * GDN_STEP_NW<DK>)
gdn_step_rows_kernel(const float* __restrict__ qkv,      // [S, C]
                     const float* __restrict__ g,        // [S, V]
                     const float* __restrict__ b,        // [S, V]
                     float* const* __restrict__ states,  // [S] -> [V, DK, DK]
                     float* __restrict__ o,              // [S, V*DK]
                     int K, int V, float eps) {
    pdl_allow_consumers();  // first: the Q8 producer and the GEMV after it launch and wait (weights stream)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t s = blockIdx.z, C = (size_t)(2 * K + V) * DK;
    gdn_step<DK>(qkv + s * C, g + s * V, b + s * V, states[s], o + s * V * DK, K, eps);
}

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

// The chunk's q and k rows of K head kh, L2-normalised (q also scaled by 1/sqrt(DK)) into Qs / Ks (row stride QK),
// a warp per row; the scales into Qn / Kn. Padding rows t >= n stay exactly 0 (no 0 * (1/eps) when eps is 0).
template <int DK, int QK>
__device__ __forceinline__ void gdn_chunk_load_qk(const float* __restrict__ qkv,  // [L, C], C = 2*K*DK + V*DK
                                                  int c0, int n, int K, int V, int kh, float eps, float* Qs,
                                                  float* Ks, float* Qn, float* Kn) {
    constexpr int PER = DK >= 32 ? DK / 32 : 1;   // elements per lane
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t C = (size_t)(2 * K + V) * DK;
    for (int t = warp; t < GDN_CH; t += GDN_NT / 32) {
        const float* row = qkv + (size_t)(c0 + t) * C;
        float qv[PER], kv[PER], qsum = 0.f, ksum = 0.f;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = lane + 32 * e;
            const bool ok = t < n && i < DK;
            qv[e] = ok ? row[kh * DK + i] : 0.f;
            kv[e] = ok ? row[(size_t)K * DK + kh * DK + i] : 0.f;
            qsum += qv[e] * qv[e];
            ksum += kv[e] * kv[e];
        }
        qsum = warp_sum(qsum);
        ksum = warp_sum(ksum);
        const float qn = t < n ? rsqrtf((float)DK) / fmaxf(sqrtf(qsum), eps) : 0.f;
        const float kn = t < n ? 1.f / fmaxf(sqrtf(ksum), eps) : 0.f;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = lane + 32 * e;
            if (i < DK) {
                Qs[t * QK + i] = qv[e] * qn;
                Ks[t * QK + i] = kv[e] * kn;
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
    extern __shared__ float4 smem4[];               // float4: 16-byte aligned for lds4
    float* Ks = reinterpret_cast<float*>(smem4);    // [CH][QK] normalised k, then diag(b e^G) k
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

    gdn_chunk_load_qk<DK, QK>(qkv, c0, n, K, V, kh, eps, Xs, Ks, Qn, Kn);
    if (tid < 32) gdn_chunk_gates(g, b, c0, n, V, h, Gs, Bs);
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

    gdn_chunk_invert(As, Ts, Ps);   // ends with a barrier: A is dead

    const size_t C = (size_t)(2 * K + V) * DK;
    for (int e = tid; e < GDN_CH * DK; e += GDN_NT) {   // diag(b) v of head h (0 past n)
        const int t = e / DK, j = e % DK;
        Xs[t * QK + j] = t < n ? Bs[t] * qkv[(size_t)(c0 + t) * C + (size_t)2 * K * DK + (size_t)h * DK + j] : 0.f;
    }
    __syncthreads();

    gdn_chunk_apply_t<DK, QK>(Ts, Ks, rec + Rec::W, DK, GDN_CH);                                 // W, all 64 rows
    gdn_chunk_apply_t<DK, QK>(Ts, Xs, o + (size_t)c0 * V * DK + (size_t)h * DK, (size_t)V * DK, n);   // U
}

// Block (V head h, value columns j0 .. j0 + BV - 1) walks the chunks in order with its slice S[:, j0:j0+BV] of the
// state in shared memory (the value columns of S evolve independently). Per chunk, from the intra kernel's record
// and U in o: D = U - W S0, O = diag(e^G) Q S0 + M D over U in o, S = e^(G_63) S0 + K^T diag(e^(G_63-G)) D, with
// the raw q and k rows and the record's row scales in place of the normalised ones.
template <int DK>
__global__ void __launch_bounds__(GDN_NT)
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
    extern __shared__ float4 smem4[];
    float* Xa = reinterpret_cast<float*>(smem4);   // [CH][XS] W, then M [CH][TS]
    float* Xb = Xa + GDN_CH * XS;                   // [CH][QK] raw q, then raw k (0 past n)
    float* Ss = Xb + GDN_CH * QK;                   // [DK][BV] state slice
    float* Rs = Ss + DK * GDN_BV;                   // [3][CH] the record's row scales
    float* Ds = Rs + 3 * GDN_CH;                    // [CH][DS] U, then D

    const int h = blockIdx.x, kh = h % K, j0 = blockIdx.y * GDN_BV;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const size_t C = (size_t)(2 * K + V) * DK, ldo = (size_t)V * DK;
    float* S = state + (size_t)h * DK * DK;
    float* oh = o + (size_t)h * DK + j0;

    for (int e = tid; e < DK * GDN_BV; e += GDN_NT) Ss[e] = S[(size_t)(e / GDN_BV) * DK + j0 + e % GDN_BV];

    for (int c0 = 0, c = 0; c0 < L; c0 += GDN_CH, ++c) {
        const int n = min(GDN_CH, L - c0);
        const float* rec = work + ((size_t)c * V + h) * Rec::floats;
        const float* rows = qkv + (size_t)c0 * C + kh * DK;   // row t's q; its k at + K * DK
        __syncthreads();   // the previous chunk's readers of every buffer are done (and the first Ss is visible)

        for (int e = tid; e < GDN_CH * DK; e += GDN_NT) {
            const int t = e / DK, i = e % DK;
            Xa[t * XS + i] = rec[Rec::W + e];
            Xb[t * QK + i] = t < n ? rows[(size_t)t * C + i] : 0.f;
        }
        for (int e = tid; e < 3 * GDN_CH; e += GDN_NT) Rs[e] = rec[Rec::R + e];
        for (int e = tid; e < GDN_CH * GDN_BV; e += GDN_NT) {
            const int t = e / GDN_BV, j = e % GDN_BV;
            Ds[t * DS + j] = t < n ? oh[(size_t)(c0 + t) * ldo + j] : 0.f;
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

#pragma unroll
        for (int a = 0; a < 4; ++a) {   // D = U - W S0 (the thread's own elements); the Q S0 term's row scale
            const int t = ty + 16 * a;
            Ds[t * DS + tx] -= ws[a];
            out[a] *= Rs[t];
        }
        for (int e = tid; e < GDN_CH * GDN_CH; e += GDN_NT) Xa[(e / GDN_CH) * TS + e % GDN_CH] = rec[Rec::M + e];
        for (int e = tid; e < GDN_CH * DK; e += GDN_NT) {
            const int t = e / DK, i = e % DK;
            Xb[t * QK + i] = t < n ? rows[(size_t)t * C + (size_t)K * DK + i] : 0.f;
        }
        __syncthreads();

        // O = diag(e^G) Q S0 + M D (M's rows are 0 past n, and so are D's)
        for (int s = 0; s < GDN_CH; s += 4) {
            const float d0 = Ds[s * DS + tx], d1 = Ds[(s + 1) * DS + tx];
            const float d2 = Ds[(s + 2) * DS + tx], d3 = Ds[(s + 3) * DS + tx];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                const float4 m = lds4(&Xa[(ty + 16 * a) * TS + s]);
                out[a] = fmaf(m.x, d0, fmaf(m.y, d1, fmaf(m.z, d2, fmaf(m.w, d3, out[a]))));
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
                    const float4 k = lds4(&Xb[t * QK + ty * NI + a]);
                    upd[a] = fmaf(k.x, dw, upd[a]);
                    upd[a + 1] = fmaf(k.y, dw, upd[a + 1]);
                    upd[a + 2] = fmaf(k.z, dw, upd[a + 2]);
                    upd[a + 3] = fmaf(k.w, dw, upd[a + 3]);
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

// ==== launchers ===================================================================================================

// L = 1 (a decode token) takes the row-split step kernel; longer segments the sequential scan.
template <int DK>
int launch_gdn_scan(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K, int V,
                    float eps) {
    if (L == 1)
        return launch("gdn_step_kernel", gdn_step_kernel<DK>, dim3(V, ceil_div(DK, 32)), dim3(32 * GDN_STEP_NW<DK>), 0,
                      qkv, g, b, state, o, K, V, eps);
    return launch("gdn_scan_kernel", gdn_scan_kernel<DK>, dim3(V, ceil_div(DK, 32)), dim3(32), 0, qkv, g, b, state, o,
                  L, K, V, eps);
}

// One launch for the segment: the state after token t goes to steps[t] for t < L-1, after the last token to the
// sequence's state itself, so without a restore the state is the one after the whole segment, as cmp_gdn's.
template <int DK>
int launch_gdn_keep(const float* qkv, const float* g, const float* b, float* state, float* steps, float* o, int L,
                    int K, int V, float eps) {
    return launch("gdn_keep_kernel", gdn_keep_kernel<DK>, dim3(V, ceil_div(DK, 32)), dim3(32 * GDN_STEP_NW<DK>), 0,
                  qkv, g, b, state, steps, o, L, K, V, eps);
}

template <int DK>
int launch_gdn_scan_rows(const float* qkv, const float* g, const float* b, float* const* states, float* o, int S, int K,
                         int V, float eps) {
    return launch("gdn_step_rows_kernel", gdn_step_rows_kernel<DK>, dim3(V, ceil_div(DK, 32), S),
                  dim3(32 * GDN_STEP_NW<DK>), 0, qkv, g, b, states, o, K, V, eps);
}

// The chunked form: both kernels' shared memory (smem_plan.h: 89280 + 80896 B at DK 128) is more than the 48 KiB
// default, so the launcher raises their limits, both before either runs: where the device cannot give that much
// (sm_75 at DK 128: 64 KiB; sm_61 at DK 64) it reports CMP_ERR_UNSUPPORTED with nothing run, and the caller takes
// the scan instead. work: gdn_chunk_work_bytes<DK>(L, V) bytes, checked by the caller.
template <int DK>
int launch_gdn_chunked(const float* qkv, const float* g, const float* b, float* state, float* o, float* work, int L,
                       int K, int V, float eps) {
    constexpr size_t intra = smem::GdnIntraLayout<DK>::bytes, inter = smem::GdnStateLayout<DK>::bytes;
    CMP_TRY(smem_opt_in("gdn_chunk_intra_kernel", gdn_chunk_intra_kernel<DK>, intra));
    CMP_TRY(smem_opt_in("gdn_chunk_state_kernel", gdn_chunk_state_kernel<DK>, inter));
    CMP_TRY(launch("gdn_chunk_intra_kernel", gdn_chunk_intra_kernel<DK>, dim3(V, ceil_div(L, GDN_CH)), dim3(GDN_NT),
                   intra, qkv, g, b, o, work, L, K, V, eps));
    return launch("gdn_chunk_state_kernel", gdn_chunk_state_kernel<DK>, dim3(V, DK / GDN_BV), dim3(GDN_NT), inter,
                  qkv, (const float*)work, state, o, L, K, V);
}

// Calls launch(std::integral_constant<int, DK>{}) for the state sizes the kernels are built for (one switch for
// every entry point); any other size is CMP_ERR_UNSUPPORTED, naming the entry point `who`.
template <typename Launch>
int dispatch_dk(int Dk, const char* who, Launch&& launch) {
    switch (Dk) {
        case 16: return launch(std::integral_constant<int, 16>{});
        case 32: return launch(std::integral_constant<int, 32>{});
        case 64: return launch(std::integral_constant<int, 64>{});
        case 128: return launch(std::integral_constant<int, 128>{});
        default: return fail(CMP_ERR_UNSUPPORTED, "%s: state size %d not supported (16/32/64/128)", who, Dk);
    }
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_conv1d_silu(const float* x, const float* w, float* state, float* out, int L, int C, int kernel) {
    CMP_REQUIRE(L >= 0 && C > 0 && kernel >= 1 && kernel <= CONV_MAX_K,
                "cmp_conv1d_silu: bad shape L=%d C=%d kernel=%d (kernel <= %d)", L, C, kernel, CONV_MAX_K);
    if (L == 0) return CMP_OK;
    CMP_REQUIRE(ceil_div(L, CONV_TL) <= 65535, "cmp_conv1d_silu: L=%d tokens in one segment (at most %d)", L,
                65535 * CONV_TL);
    if (L <= CONV_TL)   // one chunk (decode, short segments): the walk over all tokens is the same arithmetic
        return launch("conv1d_silu_kernel", conv1d_silu_kernel, dim3(ceil_div(C, 128)), dim3(128), 0, x, w, state, out,
                      L, C, kernel, (float*)nullptr);
    return launch("conv1d_silu_chunks_kernel", conv1d_silu_chunks_kernel, dim3(ceil_div(C, 128), ceil_div(L, CONV_TL)),
                  dim3(128), 0, x, w, state, out, L, C, kernel);
}

extern "C" int cmp_conv1d_silu_keep(const float* x, const float* w, float* state, float* steps, float* out, int L,
                                    int C, int kernel) {
    CMP_REQUIRE(L >= 0 && C > 0 && kernel >= 2 && kernel <= CONV_MAX_K && steps != nullptr,
                "cmp_conv1d_silu_keep: bad shape L=%d C=%d kernel=%d (2 <= kernel <= %d) or no steps buffer", L, C,
                kernel, CONV_MAX_K);
    if (L == 0) return CMP_OK;
    return launch("conv1d_silu_kernel", conv1d_silu_kernel, dim3(ceil_div(C, 128)), dim3(128), 0, x, w, state, out, L,
                  C, kernel, steps);
}

extern "C" int cmp_gdn_keep(const float* qkv, const float* g, const float* b, float* state, float* steps, float* o,
                            int L, int K, int V, int Dk, float eps) {
    CMP_REQUIRE(L >= 0 && K > 0 && V > 0 && V % K == 0 && (L <= 1 || steps != nullptr),
                "cmp_gdn_keep: bad shape L=%d K=%d V=%d or no steps buffer", L, K, V);
    if (L == 0) return CMP_OK;
    return dispatch_dk(Dk, "cmp_gdn_keep", [&](auto dk) {
        return launch_gdn_keep<decltype(dk)::value>(qkv, g, b, state, steps, o, L, K, V, eps);
    });
}

extern "C" int cmp_gdn(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K, int V,
                       int Dk, float eps) {
    CMP_REQUIRE(L >= 0 && K > 0 && V > 0 && V % K == 0, "cmp_gdn: bad shape L=%d K=%d V=%d", L, K, V);
    if (L == 0) return CMP_OK;
    return dispatch_dk(Dk, "cmp_gdn", [&](auto dk) {
        return launch_gdn_scan<decltype(dk)::value>(qkv, g, b, state, o, L, K, V, eps);
    });
}

extern "C" int cmp_conv1d_silu_rows(const float* x, const float* w, float* const* states, float* out, int S, int C,
                                    int kernel) {
    CMP_REQUIRE(S >= 0 && S <= 65535 && C > 0 && kernel >= 1 && kernel <= CONV_MAX_K,
                "cmp_conv1d_silu_rows: bad shape S=%d C=%d kernel=%d (S <= 65535, kernel <= %d)", S, C, kernel,
                CONV_MAX_K);
    if (S == 0) return CMP_OK;
    return launch("conv1d_silu_rows_kernel", conv1d_silu_rows_kernel, dim3(ceil_div(C, 128), S), dim3(128), 0, x, w,
                  states, out, C, kernel);
}

extern "C" int cmp_gdn_rows(const float* qkv, const float* g, const float* b, float* const* states, float* o, int S,
                            int K, int V, int Dk, float eps) {
    CMP_REQUIRE(S >= 0 && S <= 65535 && K > 0 && V > 0 && V % K == 0, "cmp_gdn_rows: bad shape S=%d K=%d V=%d", S, K,
                V);
    if (S == 0) return CMP_OK;
    return dispatch_dk(Dk, "cmp_gdn_rows", [&](auto dk) {
        return launch_gdn_scan_rows<decltype(dk)::value>(qkv, g, b, states, o, S, K, V, eps);
    });
}

extern "C" int cmp_gdn_chunked_work_bytes(int L, int V, int Dk, size_t* bytes) {
    CMP_REQUIRE(L >= 0 && V > 0 && bytes != nullptr, "cmp_gdn_chunked_work_bytes: bad arguments L=%d V=%d", L, V);
    return dispatch_dk(Dk, "cmp_gdn_chunked_work_bytes", [&](auto dk) {
        *bytes = gdn_chunk_work_bytes<decltype(dk)::value>(L, V);
        return CMP_OK;
    });
}

extern "C" int cmp_gdn_chunked(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K,
                               int V, int Dk, float eps, void* work, size_t work_bytes) {
    CMP_REQUIRE(L >= 0 && K > 0 && V > 0 && V % K == 0, "cmp_gdn_chunked: bad shape L=%d K=%d V=%d", L, K, V);
    CMP_REQUIRE(ceil_div(L, GDN_CH) <= 65535, "cmp_gdn_chunked: L=%d tokens in one segment (at most %d)", L,
                65535 * GDN_CH);
    if (L == 0) return CMP_OK;
    return dispatch_dk(Dk, "cmp_gdn_chunked", [&](auto dk) {
        constexpr int DK = decltype(dk)::value;
        const size_t need = gdn_chunk_work_bytes<DK>(L, V);
        CMP_REQUIRE(work != nullptr && work_bytes >= need,
                    "cmp_gdn_chunked: workspace of %zu B for L=%d V=%d Dk=%d needs %zu B (cmp_gdn_chunked_work_bytes)",
                    work_bytes, L, V, DK, need);
        return launch_gdn_chunked<DK>(qkv, g, b, state, o, static_cast<float*>(work), L, K, V, eps);
    });
}
