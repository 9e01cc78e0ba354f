// Gated DeltaNet: the causal depthwise conv1d (+SiLU) with its rolling state, and the gated delta rule.
// The delta rule runs either as a sequential scan over the segment's tokens (exact for decode and prefill alike)
// or, for prefill, in the chunked WY closed form of numpy_ref.gdn_chunked (64 tokens per chunk), which replaces
// 64 dependent rank-1 updates by a few small matrix products per chunk: the state-independent part (a 64-row
// triangular inverse among them) for all chunks at once, then three products per chunk in order.
#include <type_traits>

#include "common.cuh"
#include "gdn_chunk.cuh"
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

// The chunked form: both kernels' shared memory (smem_plan.h: 89280 + 80640 B at DK 128) is more than the 48 KiB
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
