// Q8_0 projections: y [T, rows] = x [T, n] . W [rows, n]^T (+ res [T, rows]: the model's residual add, fused into
// the epilogue so that it costs no pass of its own). W is repacked Q8_0 (qs [rows, n] int8, d [rows, n/32] f16), x is
// Q8 (cmp_quantize_q8). Every output is a sum over 32-blocks of an exact integer dot scaled by d_w * d_x and
// accumulated in fp32 with each rounding explicit: the numpy reference's arithmetic, and the same bits on every
// int8 route (the dot is the route's template parameter D, common.cuh: DP4A = IDP.4A in SASS, DP2A = IDP.2A, or
// IMAD; chosen per call by cmp_matmul_*'s kernels bits). No tensor-core instruction here (matmul_mma.cu has them).
//  - Decode, T <= 16: every weight byte is read once per step for a handful of tokens, so the time is the weight
//    stream's; the GEMVs are shaped to keep HBM busy (enough 16-byte loads in flight per SM, all rows in one wave)
//    and to give each row the same bits at every T (batch invariance: MTP verification and several slots decode the
//    tokens a single slot would): gemv_q8_batch_kernel at every T, 2 or 4 rows per warp (each activation load
//    serves them all) whose loads are refilled as they are used, so the stream never drains while the warp
//    multiplies; its shape per T (rows per warp, loads in flight, blocks per SM) is q8gemv_shape's.
//  - Prefill: the dots bound it, so tiled GEMMs reuse each loaded weight for 64 or 128 tokens (64x64 below
//    GEMM2_MIN_T, where the 128-token tile would idle; 128x128 with double-buffered shared memory above, or
//    gemm_w16_kernel's 128 x 64 where it runs).
//  - `kernels` (CMP_MM_* bits of cmp_matmul_q8_ex) picks the kernels per call, so that any one can be switched off
//    or measured against another: 0 = v1, gemv_q8_kernel to T = 8 under no launch bound, then the 64x64 GEMM (the
//    fallback); CMP_MM_GEMV2 = the batch-invariant GEMV above to T = 16; CMP_MM_GEMV_PDL = its launch with
//    programmatic dependent launch on sm_90+ (its weight loads start while the kernel before it drains);
//    CMP_MM_GEMM2 = the v2 GEMM (128x128; gemm_w16_kernel 128 x 64) from T = 96; CMP_MM_MMA = the tensor-core
//    GEMM (matmul_mma.cu) above the GEMV.
#include <algorithm>
#include <array>
#include <utility>

#include "gemm_w16.cuh"
#include "matmul_mma.cuh"
#include "smem_plan.h"

namespace cmp {
namespace {

constexpr int GEMV_WARPS = 4;     // rows per block of the GEMV
#ifndef CMP_GEMV_UNROLL
#define CMP_GEMV_UNROLL 4
#endif
constexpr int GEMV_UNROLL = CMP_GEMV_UNROLL;  // v1: 16-byte weight loads in flight per lane before any arithmetic
constexpr int GEMV_MAX_T = 8;    // v1 GEMV up to 8 rows of activations, then the GEMM
constexpr int GEMV2_MAX_T = DECODE_ROWS;   // the batch-invariant GEMV (CMP_MM_GEMV2) up to 16 (decode batches)
constexpr int GEMM2_MIN_T = 96;   // v2 GEMM (128-token tile) from this many tokens; the 64x64 tile below
constexpr int GEMV_MAX_MATS = 4;
constexpr int TILE = 64;          // GEMM tile: 64 weight rows x 64 tokens, 256 threads, 4x4 outputs each
constexpr int GEMM_BK = 4;        // Q8 blocks (of 32) per shared-memory stage

// ==== kernels =====================================================================================================

// Up to GEMV_MAX_MATS weight matrices that read the same activations, launched as one grid: the warps are
// numbered over the concatenated rows, so small matrices (e.g. GDN alpha/beta, 32 rows) ride along with big ones
// instead of paying a launch and a mostly idle grid each.
struct GemvSet {
    const int8_t* wq[GEMV_MAX_MATS];  // [rows_i, n]
    const __half* wd[GEMV_MAX_MATS];  // [rows_i, n/32]
    float* y[GEMV_MAX_MATS];          // [T, rows_i]
    const float* res[GEMV_MAX_MATS];  // [T, rows_i] added to y, or null
    int row_end[GEMV_MAX_MATS];       // cumulative rows
    int count;
    int total;                        // row_end[count-1], so that no index into the struct is dynamic
};

// One matrix of a set (compile-time indices into the parameter struct only), and a row's index in it.
struct GemvGroup {
    const int8_t* wq;  // [rows, n]
    const __half* wd;  // [rows, n/32]
    float* y;          // [T, rows]
    const float* res;  // [T, rows] or null
    int rows, row0;
};

// The matrix of concatenated row `row` and the row within it.
__device__ __forceinline__ GemvGroup gemv_locate_row(const GemvSet& set, int row) {
    GemvGroup g{set.wq[0], set.wd[0], set.y[0], set.res[0], set.row_end[0], 0};
    int row0 = 0;
#pragma unroll
    for (int i = 1; i < GEMV_MAX_MATS; ++i) {
        if (i < set.count && row >= set.row_end[i - 1]) {
            g.wq = set.wq[i];
            g.wd = set.wd[i];
            g.y = set.y[i];
            g.res = set.res[i];
            row0 = set.row_end[i - 1];
            g.rows = set.row_end[i] - row0;
        }
    }
    g.row0 = row - row0;
    return g;
}

// 64 weight rows x 64 tokens per block; thread (tx, ty) owns rows tx + 16i and tokens ty + 16j (i, j < 4), so the
// stores along rows are coalesced and the shared-memory reads of W (row stride 33 ints) are conflict-free while
// those of X are broadcasts. Each stage holds GEMM_BK Q8 blocks of both operands. D: the int8 dot (common.cuh).
template <class D>
__global__ void __launch_bounds__(256)
gemm_q8_kernel(const int8_t* __restrict__ xq,  // [T, n]
               const float* __restrict__ xd,   // [T, n/32]
               const int8_t* __restrict__ wq,  // [rows, n]
               const __half* __restrict__ wd,  // [rows, n/32]
               const float* __restrict__ res,  // [T, rows] added to y, or null
               float* __restrict__ y,          // [T, rows]
               int T, int rows, int n) {
    constexpr int KI = GEMM_BK * 8;  // ints per row per stage
    __shared__ int Ws[TILE][KI + 1], Xs[TILE][KI + 1];
    __shared__ float Wd[TILE][GEMM_BK], Xd[TILE][GEMM_BK];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int row0 = blockIdx.x * TILE, tok0 = blockIdx.y * TILE, nb = n / QK;
    float acc[4][4] = {};

    for (int b0 = 0; b0 < nb; b0 += GEMM_BK) {
        for (int i = tid; i < TILE * KI; i += 256) {
            const int r = i / KI, k = i % KI, blk = b0 + k / 8;
            const int gr = row0 + r, gt = tok0 + r;
            Ws[r][k] = (gr < rows && blk < nb) ? reinterpret_cast<const int*>(wq + (size_t)gr * n + (size_t)b0 * QK)[k] : 0;
            Xs[r][k] = (gt < T && blk < nb) ? reinterpret_cast<const int*>(xq + (size_t)gt * n + (size_t)b0 * QK)[k] : 0;
        }
        for (int i = tid; i < TILE * GEMM_BK; i += 256) {
            const int r = i / GEMM_BK, kb = i % GEMM_BK, blk = b0 + kb;
            Wd[r][kb] = (row0 + r < rows && blk < nb) ? __half2float(wd[(size_t)(row0 + r) * nb + blk]) : 0.f;
            Xd[r][kb] = (tok0 + r < T && blk < nb) ? xd[(size_t)(tok0 + r) * nb + blk] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kb = 0; kb < GEMM_BK; ++kb) {
            int s[4][4] = {};
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                int a[4], bb[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) a[i] = Ws[tx + 16 * i][kb * 8 + k];
#pragma unroll
                for (int j = 0; j < 4; ++j) bb[j] = Xs[ty + 16 * j][kb * 8 + k];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) s[i][j] = D::dot4(a[i], bb[j], s[i][j]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += (float)s[i][j] * (Wd[tx + 16 * i][kb] * Xd[ty + 16 * j][kb]);
        }
        __syncthreads();
    }
    store_tile<16, 16>(acc, tok0 + ty, T, row0 + tx, rows, rows, res, y);
}

// ---- GEMV ----------------------------------------------------------------------------------------------------------

// v1's GEMV (no kernel bits, T <= 8): a warp per weight row; lane l reads 16-byte chunks l, l+32, ... of the row
// (chunk c is half of Q8 block c/2), so a warp load is 512 contiguous bytes; GEMV_UNROLL such loads are issued
// before the dots; activations (T rows, a few KB) stay in L1/L2. The per-chunk arithmetic is written out so that a
// row's result depends on nothing but the row and its token: acc = fma(float(dot), d_w * d_x, acc), each rounding
// explicit (no contraction left to the compiler), chunks in increasing order per lane, then warp_sum's fixed
// butterfly. gemv_q8_batch_kernel repeats exactly this per row and token, so v1 and the batch-invariant GEMV give
// the same bits. D: the int8 dot of the route (common.cuh).
template <int NT, class D = DotDp4a>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_q8_kernel(const int8_t* __restrict__ xq,  // [NT, n]
                const float* __restrict__ xd,   // [NT, n/32]
                const GemvSet set, int n) {
    constexpr int U = GEMV_UNROLL;  // 16-byte loads in flight per lane
    const int row = blockIdx.x * GEMV_WARPS + threadIdx.y;
    if (row >= set.total) return;
    const int lane = threadIdx.x, nchunk = n / 16, nb = n / QK;
    const GemvGroup g = gemv_locate_row(set, row);
    const int4* w = reinterpret_cast<const int4*>(g.wq + (size_t)g.row0 * n);
    const __half* dw = g.wd + (size_t)g.row0 * nb;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;

    for (int c0 = lane; c0 < nchunk; c0 += 32 * U) {
        int4 wv[U];
        float ws[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u;
            wv[u] = c < nchunk ? __ldg(w + c) : make_int4(0, 0, 0, 0);
            ws[u] = c < nchunk ? __half2float(dw[c >> 1]) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u;
            if (c >= nchunk) break;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int4 xv = *reinterpret_cast<const int4*>(xq + (size_t)t * n + (size_t)c * 16);
                const float sx = xd[(size_t)t * nb + (c >> 1)];
                acc[t] = __fmaf_rn(__int2float_rn(dot16<D>(wv[u], xv)), __fmul_rn(ws[u], sx), acc[t]);
            }
        }
    }
    const int r = g.row0, rows = g.rows;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) g.y[(size_t)t * rows + r] = g.res ? g.res[(size_t)t * rows + r] + v : v;
    }
}

// The batch GEMV's shape at NT tokens: weight rows per warp R, 16-byte chunks in flight per lane and row U (rolling:
// a slot is refilled as soon as its chunk is multiplied, so R * U loads per lane stay in flight through the whole
// row instead of draining every round), and the launch bound's blocks per SM. Why these, sm_90 per SM (H200: ~16.4
// bytes of HBM per cycle at the copy rate, so 512 weight bytes = one warp chunk-row every ~31 cycles):
//  - Bytes in flight: a matrix of `rows` rows keeps rows / 132 * U * 512 bytes per SM in flight while its grid fits in
//    one wave, whatever R is (fewer warps of more rows): one wave on the 4096-row matrices (out proj, FFN down) needs
//    32 rows per SM, R * blocks per SM >= 8. A grid of several waves (the fused FFN gate+up, 24576 rows; GDN in, q+k+v,
//    lm_head) keeps blocks * 4 * R * U * 512 bytes per SM in flight. Slots refilled only after the whole round (the
//    kernel before: R = 2, U = 2) had 32 KB at most and next to none while the warp multiplied: T = 4 took 1.18x
//    T = 1's time on 4096x12288. So U = 4 (64 KB) to T = 4, 3 to T = 8; at T >= 9 the sums take the registers (U = 2,
//    ~32 KB) and the FMA pipe bounds the kernel rather than the stream (below).
//  - T = 1 (decode): R = 2, U = 8 at 4 blocks per SM, 128 KB per SM in both regimes, in 128 registers. U = 4 there
//    would give the 64 KB this kernel has at T = 2, where it took 0.86x the time of the warp-per-row T = 1 kernel
//    (4 loads per lane, drained every round; RESULTS.md, 2026-12-02 fifth session) on the one-wave 4096x12288 and
//    4096x4096, but 1.03x on the multi-wave 12288x4096, where both keep ~64-72 KB per SM in flight at their peak:
//    only more bytes in flight can gain there, and multi-wave launches carry most of decode's weight bytes. At
//    n = 4096 (8 chunks per lane) a lane requests its two rows whole before pdl_wait_producers. R = 1 at U = 8
//    would need 8 blocks per SM (64 registers) for one wave: it spills. No more than this fits 128 registers.
//    Measured against the warp-per-row kernel (H200, RESULTS.md 2026-12-02 sixth session): 4096x12288 19.6 -> 17.0
//    us, 4096x4096 6.7 -> 6.3, but 12288x4096 15.9 -> 16.4 (the multi-wave shape did not gain); 9B tg128 +1.9%.
//  - L1: per token, a warp reads a 512-byte activation chunk (4 wavefronts) and its scale (1) for the R rows'
//    chunks (4 + 1 wavefronts each with its scale); per 512 weight bytes that is 5 + 5 NT / R: 15 at NT = 4, R = 2;
//    25 at NT = 8, R = 2 against ~31 cycles (an estimate: one wavefront per cycle, not profiled), 15 at R = 4. So
//    R = 4 from T = 9.
//  - T = 5..8: T = 2..4's R = 2 at 4 blocks per SM (16 warps, one wave on 4096 rows) with U = 3 (48 KB per SM): U = 4
//    takes 128 registers at T = 5..7 but spills 4 bytes at T = 8 on DP4A (sm_90) and 4-12 bytes at T = 5..7 on DP2A
//    (sm_70..sm_80). With R = 4 at 2 blocks (8 warps), T = 5 took 1.43x T = 1's time on 4096x12288 (27.8 us; 23.5 for
//    the round-refilled R = 2, U = 2 kernel before, <= 32 KB in flight; RESULTS.md, 2026-12-02 fifth session): each
//    slot's step is R * NT = 20 dot chains behind NT activation loads, and two warps per scheduler hide little of it.
//    R = 2 halves the step and gives each scheduler four warps. R = 2, U = 4 at 3 blocks (12 warps, 64 KB) would keep U
//    but take 24 rows per SM: a 4096-row matrix in 1.29 waves (512 blocks in 396 slots), the last 116 blocks with 16 KB
//    per SM in flight.
//  - The FMA pipe: per chunk-row and token 4 IDP.4A + FMUL + FFMA (+ I2FP on the ALU); IDP.4A takes 2 cycles of an
//    SMSP's FMA-heavy pipe, so ~2 NT SM cycles per 512 weight bytes: half of the stream's 31 cycles at T = 8, all of
//    them at T = 16 (T = 16 cannot reach T = 1's time here).
//  - Registers (ptxas -v, sm_90, nvcc 13.0, DP4A): 128 / 105 / 113 / 124 at T = 1 / 2 / 3 / 4 under a 4-block cap (16
//    warps per SM; a 4096-row matrix is one wave of 512 blocks in 528 slots), 108-128 at T = 5..8 (U = 3); 190-254 at
//    T = 9..16 under a 2-block cap (8 warps of 4 rows; 256 blocks for 4096 rows, one wave). No spills on DP4A / DP2A
//    (sm_90, sm_80, sm_75 with nvcc 13; sm_70, sm_61 with nvcc 12.4), nor at T = 1 on any route (126-128 registers
//    everywhere). The IMAD route (OPS = 8 instructions per dot4: bound by issue, not by the stream, once T >= 2) keeps
//    U = 2 from T = 2: at U = 4 its byte unpacking spilled 48-72 bytes at T = 4 and T = 8; it spills 8 bytes at T = 14,
//    15 on sm_90 and 12-28 at T = 15, 16 on sm_61.
struct Q8GemvShape { int rows, unroll, min_blocks; };
template <int NT, int OPS>
constexpr Q8GemvShape q8gemv_shape() {
    constexpr int U = OPS >= 8 ? 2 : 4;
    if (NT == 1) return {2, 8, 4};
    if (NT <= 4) return {2, U, 4};
    if (NT <= 8) return {2, OPS >= 8 ? 2 : 3, 4};
    return {4, 2, 2};
}

// The sums of V values per lane over the warp (V a power of two), warp_sum's butterfly for each, as a reduce-
// scatter: at offset o a lane keeps half of its values (the upper half where lane & o) and adds its partner's copy
// of them, sending the other half. Each kept partial is the sum warp_sum forms in the same lane (the partner's
// term added to the lane's own: float addition commutes, so it has the bits every lane of that step's pair gets),
// so each value's result has warp_sum's bits. Cost: V / 2 + V / 4 + ... shuffles (62 at V = 64; V - 1 plus one per
// step left at V < 32) instead of 5 V.
// After it lane l holds max(V / 32, 1) values: value i of the lane is original index scatter_index<V>(lane, i).
template <int K, int O = 16>   // K: values the lane holds before the step at offset O
__device__ __forceinline__ void warp_sum_scatter(float* v, int lane) {
    static_assert(K >= 1 && (K & (K - 1)) == 0, "a power of two");
    if constexpr (O > 0) {
        if constexpr (K > 1) {
            const bool up = lane & O;
#pragma unroll
            for (int i = 0; i < K / 2; ++i) {
                const float keep = up ? v[i + K / 2] : v[i], send = up ? v[i] : v[i + K / 2];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            warp_sum_scatter<K / 2, O / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
            warp_sum_scatter<1, O / 2>(v, lane);
        }
    }
}

// The original index of value i (< max(V / 32, 1)) that lane `lane` holds after warp_sum_scatter<V>: the kept
// halves' offsets, from the top lane bit down.
template <int V>
__device__ __forceinline__ int scatter_index(int lane, int i) {
    int j = i;
#pragma unroll
    for (int s = 0; s < 5; ++s)
        if ((V >> s) > 1 && (lane & (16 >> s))) j += V >> (s + 1);
    return j;
}

// The batch GEMV (CMP_MM_GEMV2 at T = 1..16: decode, MTP verification, several slots): warp per R weight rows,
// q8gemv_shape above. Lane l takes chunks l, l+32, ... of each row in increasing order, as v1's gemv_q8_kernel; each
// weight chunk and scale is read once for the NT tokens, and each activation chunk and scale once for the R rows. A
// row's arithmetic per token is gemv_q8_kernel's (same chunk order per lane, same explicit roundings, warp_sum's
// butterfly through warp_sum_scatter), so every row gets the same bits at every T and R (batch invariance) and in v1.
// The first loads go out before pdl_wait_producers (weights never change; x, res and y belong to the kernels before
// this one), and the kernel lets its PDL consumer launch at once (as gemv_quant_kernel: every kernel launched with PDL
// waits for this grid before it touches memory), so the next kernel's blocks can take the SMs this grid's last wave
// leaves idle. A group past the last row re-reads the last row and stores nothing for it. D: the int8 dot of the route.
template <int NT, int R, int U, int MINB, class D>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
gemv_q8_batch_kernel(const int8_t* __restrict__ xq,  // [NT, n]
                     const float* __restrict__ xd,   // [NT, n/32]
                     const GemvSet set, int n) {
    const int first = (blockIdx.x * GEMV_WARPS + threadIdx.y) * R;
    if (first >= set.total) return;
    const int lane = threadIdx.x, nchunk = n / 16, nb = n / QK;
    const int4* x = reinterpret_cast<const int4*>(xq);
    const int4* w[R];
    const __half* dw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {  // only the weight rows stay live through the loop; the outputs are located after
        const GemvGroup g = gemv_locate_row(set, min(first + r, set.total - 1));
        w[r] = reinterpret_cast<const int4*>(g.wq + (size_t)g.row0 * n);
        dw[r] = g.wd + (size_t)g.row0 * nb;
    }
    int4 wv[R][U];   // slot u of row r: the lane's chunk c0 + 32 u of the current round
    float ws[R][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = lane + 32 * u;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            wv[r][u] = c < nchunk ? __ldg(w[r] + c) : make_int4(0, 0, 0, 0);
            ws[r][u] = c < nchunk ? __half2float(__ldg(dw[r] + (c >> 1))) : 0.f;
        }
    }
    pdl_allow_consumers();
    pdl_wait_producers();
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;

    for (int c0 = lane; c0 < nchunk; c0 += 32 * U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u, cn = c + 32 * U;
            if (c >= nchunk) break;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int4 xv = __ldg(x + (size_t)t * nchunk + c);
                const float sx = __ldg(xd + (size_t)t * nb + (c >> 1));
#pragma unroll
                for (int r = 0; r < R; ++r)
                    acc[r][t] = __fmaf_rn(__int2float_rn(dot16<D>(wv[r][u], xv)), __fmul_rn(ws[r][u], sx), acc[r][t]);
            }
            // The slot's refill, with the chunk one round ahead, once its last dot is issued: loading it before
            // (into a copy) kept one more slot in flight during the dots but cost a MOV per register per round
            // (232 of the 1425 instructions of the loop at T = 8, and 248 registers instead of 235). While the warp
            // waits for a slot's data, which is where a stream-bound warp spends its time, all R * U are in flight
            // either way.
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (cn < nchunk) {
                    wv[r][u] = __ldg(w[r] + cn);
                    ws[r][u] = __half2float(__ldg(dw[r] + (cn >> 1)));
                }
            }
        }
    }
    // Every output's warp sum, scattered: lane l ends with K values, value i being output j = scatter_index(l, i)
    // = r * NT + t (padding past R * NT is never stored); the lane with the low bits clear stores it.
    static_assert(R * NT <= 64, "at most 64 sums per lane");
    constexpr int V0 = R * NT, V = V0 <= 1 ? 1 : V0 <= 2 ? 2 : V0 <= 4 ? 4 : V0 <= 8 ? 8 : V0 <= 16 ? 16
                                 : V0 <= 32 ? 32 : 64;
    constexpr int K = V > 32 ? V / 32 : 1;
    float v[V];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = j < V0 ? acc[j / NT][j % NT] : 0.f;
    warp_sum_scatter<V>(v, lane);
    constexpr int LOW = V < 32 ? 32 / V - 1 : 0;   // lane bits below the ones that tell the lane's values apart
    if (lane & LOW) return;
#pragma unroll
    for (int i = 0; i < K; ++i) {
        const int j = scatter_index<V>(lane, i), r = j / NT, t = j % NT;
        if (j >= V0 || first + r >= set.total) continue;
        const GemvGroup g = gemv_locate_row(set, first + r);
        const size_t at = (size_t)t * g.rows + g.row0;
        g.y[at] = g.res ? g.res[at] + v[i] : v[i];
    }
}

constexpr int TILE2 = smem::G2TILE;  // v2 GEMM tile: 128 weight rows x 128 tokens (256 threads of 8x8 outputs;
                                     // gemm_w16_kernel's 128 x 64: 256 threads of 4x8)
constexpr int GEMM2_BK = 2;          // Q8 blocks per stage of the 8-warp v2 GEMM
using Gemm2Stage = smem::G2Stage<GEMM2_BK>;  // one stage of both operands (smem_plan.h), two buffers

// Weight rows held in registers at once: all 8 on sm_80+ (254 registers, no spill with nvcc 13); on sm_70/75 (the
// register prefetch of the next stage needs room) two groups of 4, the X block read twice from shared memory.
// Known cost: clang 19 for sm_70 still spills ~280 B per thread (about 90 local accesses per 1024 DP4A in the
// loop; splitting further did not change it): unmeasured on Volta; CudaBackend(gemm_v2=False) keeps the v1 GEMM.
// nvcc 12.4 for sm_70 (tools/get_cuda12.sh) does not spill it: 254 registers, 0 bytes (2026-12-02).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int GEMM2_IH = 2;
#else
constexpr int GEMM2_IH = 1;
#endif

// Thread (tx, ty) = (tid % 16, tid / 16) owns rows tx + 16i and tokens ty + 16j (i, j < 8): its 16-byte reads of a
// Q8 block of W touch 16 consecutive rows per warp (conflict-free: the row stride is odd in 16-byte units), those of
// X two tokens (broadcasts). Per Q8 block and output: 8 DP4A on the whole 32-byte block, one exact int->float, one
// fma with d_w * d_x. Stages of GEMM2_BK = 2 blocks (45 KB, every card) are double-buffered: stage s+1 is fetched
// (cp.async on sm_80+, into registers on sm_70/75) while stage s is multiplied; one barrier per stage. D: the int8
// dot (common.cuh). Where stages of 4 blocks run on DP4A (gemm_w16_shape: compute_80+ code, 60 KB:
// smem::gemm_w16_plan) gemm_w16_kernel takes them (gemm_w16.cuh: the same arithmetic, every output's blocks in
// increasing order, two blocks of 8 warps an SM on 128 x 64 tiles), so both give the same bits. This kernel's own
// 4-block stages (the figures below) ran on no route once gemm_w16_kernel took them over, and were deleted (git
// history: gemm2_q8_kernel<D, BK>).
// The loop's SASS (DotDp4a, one stage = 2 blocks = 1024 IDP.4A per thread; tools: cuobjdump -sass, the loop between
// the backward branch and its target; 2026-12-02, issue 20 item 5):
//   before: sm_90 (nvcc 13.0) 1707 instructions: IDP 1024, IADD3 140, FADD / FMUL / FFMA 128 each, LDS 84, ~75
//           of per-row guards and addresses; sm_70 (nvcc 12.4) 1718: the same shape, IMAD 16.
//   now:    sm_90 1560 (IDP 1024, I2FP 128, FMUL 128, FFMA 128, LDS 84, 68 other); sm_70 1588 (I2F for I2FP,
//           IMAD 13). 254 registers, no spills on both (ptxas -v). sm_90 with 4-block stages (deleted): 3075
//           per 2048 IDP (1537 per 1024: LDS 149, the loader's addresses once per 4 blocks) and half the barriers.
// What bounds it is the FMA pipe, not issue: IDP.4A, FADD/FMUL/FFMA and IMAD share it (common.cuh, chain_to_f32),
// 2 cycles per warp instruction each, so on Volta the FP32 epilogue costs what a dot costs. FMA-pipe instructions
// per 1024 IDP: 1424 before (72% of the DP4A rate at best), 1293 now (79%). The rest of the count change (the IADD3
// of the old int->float, the per-row guards: a row or token past the end now reads the last one and stores
// nothing) is issue slots only. What stays: FMUL d_w * d_x and the FFMA per output and block (the arithmetic is the
// numpy reference's order), so 80% is this kernel's ceiling on Volta; beyond it needs fewer fp32 operations per
// dot (e.g. two blocks' integer dots combined before scaling), which changes the results.
// SPLIT (serial_pieces.cuh): the kernel of split launches, each tile's stages run by `pieces` blocks in turn, the
// partial sums parked in the tile's outputs (the same bits); whole tiles run the kernel without that code (at 254
// registers here, its registers and schedule stay the unsplit loop's). Where this kernel runs (Volta, Pascal, sm_75;
// DP2A / IMAD) an 80-SM CMP 100-210 takes the 9B's 4096-row launches (128 tiles: 1.6 waves) in 3 pieces.
template <class D, bool SPLIT>
__global__ void __launch_bounds__(256, 1)
gemm2_q8_kernel(const int8_t* __restrict__ xq,  // [T, n]
                const float* __restrict__ xd,   // [T, n/32]
                const int8_t* __restrict__ wq,  // [rows, n]
                const __half* __restrict__ wd,  // [rows, n/32]
                const float* __restrict__ res,  // [T, rows] added to y, or null (not y itself when split)
                float* __restrict__ y,          // [T, rows]
                int T, int rows, int n,
                int pieces) {                   // serial pieces of K per tile (SPLIT; else 1)
    constexpr int BK = GEMM2_BK;
    using Stage = Gemm2Stage;
    extern __shared__ __align__(16) unsigned char g2smem[];   // Stage[2]
    Stage* st = reinterpret_cast<Stage*>(g2smem);
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, nb = n / QK;
    int tile = 0, piece = 0;
    if constexpr (SPLIT) {
        const int unit = split_unit(g2smem), tiles = gridDim.x * gridDim.y;   // (before the stages overwrite it)
        tile = unit % tiles;
        piece = unit / tiles;
    } else {
        pieces = 1;
    }
    const int row0 = (SPLIT ? tile % gridDim.x : blockIdx.x) * TILE2;
    const int tok0 = (SPLIT ? tile / gridDim.x : blockIdx.y) * TILE2;
    const int nstage_all = (nb + BK - 1) / BK;
    const int s_first = SPLIT ? piece * nstage_all / pieces : 0;
    const int nstage = SPLIT ? (piece + 1) * nstage_all / pieces - s_first : nstage_all;
    // Loader roles: 128 rows x 2 BK 16-byte chunks per operand per stage, BK per thread; consecutive threads take
    // consecutive chunks of one row, so a warp reads whole 32 BK-byte row segments. Scales: BK / 2 per thread.
    constexpr int CPR = 2 * BK, RSTEP = 256 / CPR, SPT = BK / 2;
    const int lr = tid / CPR, lc = tid % CPR;     // chunk p: row lr + RSTEP p, chunk lc (16 bytes = 4 ints)
    const int sr = tid >> 1, sk = (tid & 1) * SPT;  // scales: row sr, blocks sk .. sk + SPT - 1 of the stage
    // Per-thread sources, set once: a row past `rows` (a token past T) reads the last one instead (its outputs are
    // never stored), so only the K tail (the last stage's blocks past nb) needs a guard.
    const int8_t* srcw[BK];
    const int8_t* srcx[BK];
#pragma unroll
    for (int p = 0; p < BK; ++p) {
        srcw[p] = wq + (size_t)min(row0 + lr + RSTEP * p, rows - 1) * n + lc * 16;
        srcx[p] = xq + (size_t)min(tok0 + lr + RSTEP * p, T - 1) * n + lc * 16;
    }
    const __half* srcwd = wd + (size_t)min(row0 + sr, rows - 1) * nb + sk;
    const float* srcxd = xd + (size_t)min(tok0 + sr, T - 1) * nb + sk;

    struct Pending { int4 w[BK], x[BK]; float wd[SPT], xd[SPT]; };  // sm_70/75: the next stage in registers
    auto fetch = [&](int s, Stage& b, Pending& pd) {   // s: the piece's stage (the tile's s_first + s)
        if constexpr (SPLIT) s += s_first;
        const bool ok = s * BK + (lc >> 1) < nb;             // the Q8 block this thread's chunks lie in exists
        const size_t off = ok ? (size_t)s * BK * QK : 0;     // (else an in-bounds address, zeros written)
#pragma unroll
        for (int p = 0; p < BK; ++p) {
            const int r = lr + RSTEP * p;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
            copy16(&b.w[r][lc * 4], srcw[p] + off, ok);
            copy16(&b.x[r][lc * 4], srcx[p] + off, ok);
#else
            (void)b; (void)r;
            pd.w[p] = ok ? __ldg(reinterpret_cast<const int4*>(srcw[p] + off)) : make_int4(0, 0, 0, 0);
            pd.x[p] = ok ? __ldg(reinterpret_cast<const int4*>(srcx[p] + off)) : make_int4(0, 0, 0, 0);
#endif
        }
#pragma unroll
        for (int q = 0; q < SPT; ++q) {
            const bool oks = s * BK + sk + q < nb;
            pd.wd[q] = oks ? __half2float(srcwd[s * BK + q]) : 0.f;
            pd.xd[q] = oks ? srcxd[s * BK + q] : 0.f;
        }
    };
    auto publish = [&](Stage& b, const Pending& pd) {
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#pragma unroll
        for (int p = 0; p < BK; ++p) {
            *reinterpret_cast<int4*>(&b.w[lr + RSTEP * p][lc * 4]) = pd.w[p];
            *reinterpret_cast<int4*>(&b.x[lr + RSTEP * p][lc * 4]) = pd.x[p];
        }
#else
        cp_async_wait();
#endif
#pragma unroll
        for (int q = 0; q < SPT; ++q) {
            b.wd[sr][sk + q] = pd.wd[q];
            b.xd[sr][sk + q] = pd.xd[q];
        }
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    Pending pd;
    fetch(0, st[0], pd);
    if (SPLIT && piece > 0) {   // the piece before parked the tile's sums in its outputs
        split_wait(tile, piece);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int t = tok0 + ty + 16 * j, r = row0 + tx + 16 * i;
                if (t < T && r < rows) acc[i][j] = load_cg(y + (size_t)t * rows + r);
            }
    }
    publish(st[0], pd);
    __syncthreads();
    for (int s = 0; s < nstage; ++s) {
        Stage& cur = st[s & 1];
        Stage& nxt = st[(s & 1) ^ 1];
        const bool more = s + 1 < nstage;
        if (more) fetch(s + 1, nxt, pd);  // nxt was last read before the previous barrier
#pragma unroll
        for (int kb = 0; kb < BK; ++kb) {
#pragma unroll
            for (int h = 0; h < GEMM2_IH; ++h) {  // GEMM2_IH groups of 8 / GEMM2_IH weight rows in registers
                constexpr int NI = 8 / GEMM2_IH;
                int4 a[NI][2];
                float sw[NI];
#pragma unroll
                for (int ii = 0; ii < NI; ++ii) {
                    const int i = h * NI + ii;
                    a[ii][0] = *reinterpret_cast<const int4*>(&cur.w[tx + 16 * i][kb * 8]);
                    a[ii][1] = *reinterpret_cast<const int4*>(&cur.w[tx + 16 * i][kb * 8 + 4]);
                    sw[ii] = cur.wd[tx + 16 * i][kb];
                }
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int4 b0 = *reinterpret_cast<const int4*>(&cur.x[ty + 16 * j][kb * 8]);
                    const int4 b1 = *reinterpret_cast<const int4*>(&cur.x[ty + 16 * j][kb * 8 + 4]);
                    const float sx = cur.xd[ty + 16 * j][kb];
#pragma unroll
                    for (int ii = 0; ii < NI; ++ii) {
                        const int d = dot16<D>(a[ii][1], b1, dot16<D>(a[ii][0], b0, dot_chain_init()));
                        acc[h * NI + ii][j] = __fmaf_rn(chain_to_f32(d), __fmul_rn(sw[ii], sx), acc[h * NI + ii][j]);
                    }
                }
            }
        }
        if (more) publish(nxt, pd);
        __syncthreads();
    }
    if (SPLIT && piece + 1 < pieces) {   // park the sums for the tile's next piece (no residual yet)
        store_tile<16, 16>(acc, tok0 + ty, T, row0 + tx, rows, rows, nullptr, y);
        split_parked(tile, piece);
        return;
    }
    store_tile<16, 16>(acc, tok0 + ty, T, row0 + tx, rows, rows, res, y);
    if (SPLIT) split_finished(tile, gridDim.x * gridDim.y * (unsigned)pieces);
}

// ==== launchers ===================================================================================================

// The v2 GEMM's 8-warp kernel with 2-block stages: where gemm_w16_kernel (gemm_w16.cuh) does not run
// (gemm_w16_shape), and on DP2A / IMAD always (their byte unpacking needs the registers that 4 blocks would take).
// Serial pieces where the tiles fill the waves badly (gemm_chunks.h serial_pieces; cmp_set_serial_pieces forces a
// count): a piece keeps at least 8 stages (16 blocks, as gemm_w16's 4 of 4).
template <class D>
int launch_gemm2(const int8_t* xq, const float* xd, const int8_t* wq, const void* wd, const float* res, float* y,
                 int T, int rows, int n) {
    constexpr size_t bytes = 2 * sizeof(Gemm2Stage);
    const dim3 tiles2(ceil_div(rows, TILE2), ceil_div(T, TILE2));
    const int tiles = tiles2.x * tiles2.y, stages = ceil_div(n / QK, GEMM2_BK);
    int wave = 0;
    CMP_TRY(wave_blocks("gemm2_q8_kernel", gemm2_q8_kernel<D, false>, 256, bytes, &wave));
    const int pieces = res == y ? 1 : launch_pieces(tiles, SPLIT_MAX_TILES, wave, stages, 8);
    auto kernel = pieces > 1 ? gemm2_q8_kernel<D, true> : gemm2_q8_kernel<D, false>;
    CMP_TRY(smem_opt_in("gemm2_q8_kernel", kernel, bytes));
    kernel<<<dim3(tiles2.x, tiles2.y, pieces), 256, bytes, stream()>>>(xq, xd, wq, static_cast<const __half*>(wd), res,
                                                                       y, T, rows, n, pieces);
    return check_launch("gemm2_q8_kernel");
}

// The end of the run of matrices from i on that lie one after another in memory, codes and scales alike
// (CudaBackend.upload_matrices): gemm_w16_kernel and the tensor-core GEMMs read such a run as one matrix in one
// launch.
int adjacent_run(const int8_t* const* wq, const void* const* wd, const int* rows, int i, int count, int n) {
    auto d = [&](int k) { return static_cast<const __half*>(wd[k]); };
    int j = i + 1;
    while (j < count && wq[j] == wq[j - 1] + (size_t)rows[j - 1] * n &&
           d(j) == d(j - 1) + (size_t)rows[j - 1] * (n / QK))
        ++j;
    return j;
}

// gemm_w16_kernel on DP4A (at its shape here, s): each run of adjacent matrices in one launch (gemm_out.cuh).
int launch_w16_runs(const int8_t* xq, const float* xd, int count, const int8_t* const* wq, const void* const* wd,
                    float* const* y, const float* const* res, const int* rows, int T, int n, const W16Shape& s) {
    for (int i = 0, j; i < count; i = j) {
        j = adjacent_run(wq, wd, rows, i, count, n);
        CMP_TRY((launch_gemm_w16<W16Q8, DotDp4a>(xq, xd, nullptr, wq[i], W16Q8{static_cast<const __half*>(wd[i])},
                                                 run_out(y, res, rows, i, j), T, n, s)));
    }
    return CMP_OK;
}

using GemvLaunch = int (*)(const int8_t*, const float*, const GemvSet&, int, int);

template <int NT, class D>
int launch_gemv(const int8_t* xq, const float* xd, const GemvSet& set, int total_rows, int n) {
    gemv_q8_kernel<NT, D><<<ceil_div(total_rows, GEMV_WARPS), dim3(32, GEMV_WARPS), 0, stream()>>>(
        xq, xd, set, n);
    return check_launch("gemv_q8_kernel");
}

// The batch-invariant GEMV: every row in one launch of gemv_q8_batch_kernel at q8gemv_shape's shape for NT; with
// `pdl` and compute_90+ code the launch may overlap the previous kernel (the kernel waits for it before it reads
// activations).
using Gemv2Launch = int (*)(const int8_t*, const float*, const GemvSet&, int, bool);

template <int NT, class D>
int launch_gemv2(const int8_t* xq, const float* xd, const GemvSet& set, int n, bool pdl) {
    bool has_pdl = false;
    if (pdl) CMP_TRY(compute90_code(&has_pdl));
    constexpr Q8GemvShape sh = q8gemv_shape<NT, D::OPS>();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ceil_div(set.total, GEMV_WARPS * sh.rows));
    cfg.blockDim = dim3(32, GEMV_WARPS);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream();
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = has_pdl ? 1 : 0;
    CMP_TRY(check_cuda(cudaLaunchKernelEx(&cfg, gemv_q8_batch_kernel<NT, sh.rows, sh.unroll, sh.min_blocks, D>, xq,
                                          xd, set, n),
                       "gemv_q8_batch_kernel launch"));
    return check_launch("gemv_q8_batch_kernel");
}

template <class D, int... NT>
constexpr auto gemv2_table(std::integer_sequence<int, NT...>) {
    return std::array<Gemv2Launch, sizeof...(NT)>{launch_gemv2<NT + 1, D>...};
}

template <class D, int... NT>
constexpr auto gemv_table(std::integer_sequence<int, NT...>) {
    return std::array<GemvLaunch, sizeof...(NT)>{launch_gemv<NT + 1, D>...};
}

int matmul_q8_set(const int8_t* xq, const float* xd, int count, const int8_t* const* wq, const void* const* wd,
                  float* const* y, const float* const* res, const int* rows, int T, int n, int kernels) {
    CMP_REQUIRE(count >= 1 && count <= GEMV_MAX_MATS, "cmp_matmul_q8_multi: %d matrices (1..%d)", count,
                GEMV_MAX_MATS);
    CMP_REQUIRE(T >= 0 && n > 0 && n % QK == 0, "cmp_matmul_q8: bad shape T=%d n=%d (n a multiple of 32)", T, n);
    constexpr int dot_bits = 3 << CMP_MM_GEMV_DOT_SHIFT | 3 << CMP_MM_GEMM_DOT_SHIFT;
    CMP_REQUIRE((kernels & ~(CMP_MM_GEMV2 | CMP_MM_GEMM2 | CMP_MM_GEMV_PDL | CMP_MM_MMA | CMP_MM_MMA_F16 |
                             dot_bits)) == 0,
                "cmp_matmul_q8_ex: unknown kernel bits 0x%x (CMP_MM_GEMV2, CMP_MM_GEMM2, CMP_MM_GEMV_PDL, CMP_MM_MMA, "
                "CMP_MM_MMA_F16 and the dot fields)", kernels);
    const int gemv_dot = kernels >> CMP_MM_GEMV_DOT_SHIFT & 3, gemm_dot = kernels >> CMP_MM_GEMM_DOT_SHIFT & 3;
    for (int i = 0; i < count; ++i) CMP_REQUIRE(rows[i] > 0, "cmp_matmul_q8: matrix %d has %d rows", i, rows[i]);
    if (T == 0) return CMP_OK;
    const bool v2 = kernels & CMP_MM_GEMV2;
    if (T <= (v2 ? GEMV2_MAX_T : GEMV_MAX_T)) {
        GemvSet set{};
        int total = 0;
        for (int i = 0; i < count; ++i) {
            set.wq[i] = wq[i];
            set.wd[i] = static_cast<const __half*>(wd[i]);
            set.y[i] = y[i];
            set.res[i] = res ? res[i] : nullptr;
            set.row_end[i] = total += rows[i];
        }
        set.count = count;
        set.total = total;
        return dispatch_dot(gemv_dot, "cmp_matmul_q8_ex", [&](auto dot) {
            using D = decltype(dot);
            if (v2) {
                static constexpr auto table2 = gemv2_table<D>(std::make_integer_sequence<int, GEMV2_MAX_T>{});
                return table2[T - 1](xq, xd, set, n, kernels & CMP_MM_GEMV_PDL);
            }
            static constexpr auto table = gemv_table<D>(std::make_integer_sequence<int, GEMV_MAX_T>{});
            return table[T - 1](xq, xd, set, total, n);
        });
    }
    if (kernels & CMP_MM_MMA) {   // the tensor cores: each run of adjacent matrices in one launch, as on DP4A
        for (int i = 0, j; i < count; i = j) {
            j = adjacent_run(wq, wd, rows, i, count, n);
            const GemmOut out = run_out(y, res, rows, i, j);
            const MmaOperands op{xq, xd, nullptr, wq[i], wd[i], nullptr, out, T, out.end[out.count - 1], n};
            CMP_TRY(gemm_mma(MMA_Q8, false, op, kernels & CMP_MM_MMA_F16));
        }
        return CMP_OK;
    }
    // The 128-token tile wastes most of its work below ~96 tokens; the 64x64 one fills the GPU better there.
    const bool big = (kernels & CMP_MM_GEMM2) && T >= GEMM2_MIN_T;
    if (big && gemm_dot == CMP_DOT_DP4A) {
        W16Shape w16{};
        CMP_TRY((gemm_w16_shape<W16Q8, DotDp4a>(&w16)));
        if (w16.tok) return launch_w16_runs(xq, xd, count, wq, wd, y, res, rows, T, n, w16);
    }
    return dispatch_dot(gemm_dot, "cmp_matmul_q8_ex", [&](auto dot) {
        using D = decltype(dot);
        for (int i = 0; i < count; ++i) {
            const float* r = res ? res[i] : nullptr;
            if (big) {
                CMP_TRY(launch_gemm2<D>(xq, xd, wq[i], wd[i], r, y[i], T, rows[i], n));
            } else {
                gemm_q8_kernel<D><<<dim3(ceil_div(rows[i], TILE), ceil_div(T, TILE)), 256, 0, stream()>>>(
                    xq, xd, wq[i], static_cast<const __half*>(wd[i]), r, y[i], T, rows[i], n);
                CMP_TRY(check_launch("gemm_q8_kernel"));
            }
        }
        return (int)CMP_OK;
    });
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_gemm_w16_available(int* yes) {
    bool runs = false;
    CMP_TRY((gemm_w16_runs<W16Q8, DotDp4a>(&runs)));
    *yes = runs ? 1 : 0;
    return CMP_OK;
}

extern "C" int cmp_matmul_q8(const int8_t* xq, const float* xd, const int8_t* wq, const void* wd, float* y, int T,
                             int rows, int n) {
    return matmul_q8_set(xq, xd, 1, &wq, &wd, &y, nullptr, &rows, T, n, 0);
}

extern "C" int cmp_matmul_q8_multi(const int8_t* xq, const float* xd, int count, const int8_t* const* wq,
                                   const void* const* wd, float* const* y, const int* rows, int T, int n) {
    return matmul_q8_set(xq, xd, count, wq, wd, y, nullptr, rows, T, n, 0);
}

extern "C" int cmp_matmul_q8_ex(const int8_t* xq, const float* xd, int count, const int8_t* const* wq,
                                const void* const* wd, float* const* y, const float* const* res, const int* rows,
                                int T, int n, int kernels) {
    return matmul_q8_set(xq, xd, count, wq, wd, y, res, rows, T, n, kernels);
}
