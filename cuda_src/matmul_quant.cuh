// The int8-dot-templated half of matmul_quant.cu (projections over the block-quantized weight types other than
// Q8_0): the GEMV and GEMM kernels and their launchers, included by one translation unit per dot route
// (matmul_quant_dp4a.cu, matmul_quant_dp2a.cu, matmul_quant_imad.cu) so that the routes' instantiations (11 types x
// 16 GEMV token counts x 2 GEMM stage counts each) compile in parallel rather than in one file; matmul_quant.cu
// holds the entry points, repack, embedding and the weight expansion (one expand_kernel per type, not per route).
// Against the same Q8 activations as matmul_q8.cu (xq [T, n] int8, xd [T, n/32] f32 from cmp_quantize_q8 and the
// fused producers). Per 32-value sub-block of a weight row and token: two int8 dots of 16 codes (DP4A, or the
// route's DP2A / IMAD: common.cuh), scaled by the half's scale, less the half's min times the activation half's sum
// (the dot with 0x01010101), times the activation scale.
//  - GEMV (T <= 16: decode, MTP verification, several slots): warp per two weight rows, lane l takes sub-blocks l,
//    l + 32, ... in increasing order, several loads in flight; each sub-block decoded once, then the T tokens' dots
//    from registers (activation loads and half sums once per warp, not per row); each row's result is the same for
//    every T (batch invariant: every rounding explicit, tokens never interact, a fixed butterfly sum). Up to 4
//    matrices of one type per launch, optional residual added in the epilogue. T = 1 (decode) is bound by the
//    weight stream and, on 4-bit types, by instruction issue as much (qgemv_shape below has the arithmetic): rows of
//    up to 4096 values go out as one round of loads per lane, longer rows as a rolling stream; at small T the code
//    bias of Q4_0 / Q5_0 / Q3_K / Q6_K comes off the integer dots, not off each code (gemv_quant_kernel's BIAS).
//  - GEMM (T > 16, prefill): per chunk of weight rows, an expansion kernel writes int8 codes + an f32 scale and min
//    per 16 values into the caller's workspace, then one GEMM multiplies that form: on DP4A, wherever compute_80+
//    code and its shared memory run (60 KB, 66 with mins; PER16 64, 76 with mins: smem_plan.h), Q8_0's DP4A GEMM
//    (gemm_w16.cuh) with the min term per block, every type (PER16 too: Q6_K, Q3_K, Q2_K) and a call's matrices in
//    one launch (Q2_K, Q4_K, Q5_K there not expanded up to their tokens a call: it decodes their planes in its
//    stage loads, gemm_w16_direct); else gemm_quant_kernel (128x128 tiles, 8x8 outputs per thread, double-buffered
//    shared memory as matmul_q8.cu's v2 GEMM), which adds each block by the same block_term (per 32) or block_term16
//    (PER16), so both give the same bits. The activation half sums times their scale come from a small kernel first.
// No tensor-core instruction anywhere. The int8 dot is the route's (common.cuh: DP4A = IDP.4A in SASS, DP2A =
// IDP.2A, or IMAD), a template parameter of the kernels that take one, chosen per call by cmp_matmul_*'s kernels bits;
// CMP_MM_MMA multiplies the expanded weights on the tensor cores instead (matmul_mma.cu), but for the types whose
// planes its int8 kernel decodes itself (Q2_K, Q4_K, Q5_K up to a number of tokens: gemm_mma_direct, no expansion, no
// chunks; Volta's f16 GEMM still takes them expanded).
// The kernels keep internal linkage (each route's TU has its own); only the declarations below cross TUs.
#pragma once
#include <algorithm>

#include "gemm_chunks.h"
#include "gemm_w16.cuh"
#include "matmul_mma.cuh"
#include "quant_blocks.cuh"
#include "smem_plan.h"

namespace cmp {

// One cmp_matmul_quant call with T > 0, its arguments checked there (api.h has their meaning).
struct QuantMatmul {
    int type;                  // ggml type id (QuantId)
    const int8_t* xq;          // [T, n]
    const float* xd;           // [T, n/32]
    int count;                 // matrices, 1..4
    const void* const* body;   // [count] -> [rows_i, nb * BODY]
    const void* const* head;   // [count] -> [rows_i, nb * HEAD]
    float* const* y;           // [count] -> [T, rows_i]
    const float* const* res;   // [count] -> [T, rows_i] added to y, or null
    const int* rows;           // [count]
    int T, n;
    void* work;                // the GEMM's workspace (cmp_quant_work_bytes)
    size_t work_bytes;
    bool mma;                  // CMP_MM_MMA: the GEMM on the tensor cores
    bool mma_f16;              // CMP_MM_MMA_F16: there on Volta's f16 HMMA GEMM
};

// The call on one dot route, and its workspace (cmp_quant_work_bytes: count 1, rows[0] the run's rows), each defined
// in its own translation unit (the file named).
int matmul_quant_dot(DotDp4a, const QuantMatmul& m);  // matmul_quant_dp4a.cu
int matmul_quant_dot(DotDp2a, const QuantMatmul& m);  // matmul_quant_dp2a.cu
int matmul_quant_dot(DotImad, const QuantMatmul& m);  // matmul_quant_imad.cu
int matmul_quant_work_dot(DotDp4a, const QuantMatmul& m, size_t* bytes);
int matmul_quant_work_dot(DotDp2a, const QuantMatmul& m, size_t* bytes);
int matmul_quant_work_dot(DotImad, const QuantMatmul& m, size_t* bytes);


// Rows [0, R) of a chunk of type `type`'s weights (body, head: the chunk's first row) expanded into the GEMM's form:
// codes wq [R, n] int8, scales ws [R, n/16], mins wm [R, n/16] (MIN types only). matmul_quant.cu.
int expand_quant(int type, const uint8_t* body, const uint8_t* head, int8_t* wq, float* ws, float* wm, int R, int n);

namespace {

constexpr int QGEMV_WARPS = 4;
constexpr int QGEMV_MAX_T = 16;
constexpr int QMAX_MATS = 4;
using smem::QTILE;   // GEMM tile: 128 weight rows x 128 tokens
using smem::QBK;     // sub-blocks of 32 per shared-memory stage
using smem::QKP;     // row stride in ints
using smem::QStage;  // one stage of the GEMM's operands (smem_plan.h, which sizes it)
constexpr int ONES = 0x01010101;
// A GEMV round's refills (gemv_quant_kernel): none, every slot (the next round is whole), the slots that have one.
enum { QR_NONE, QR_ALL, QR_SOME };

template <class D>
__device__ __forceinline__ int sum16(const int4 b) { return dot16<D>(make_int4(ONES, ONES, ONES, ONES), b); }

// An int of magnitude < 2^22 as float, exactly (add to the mantissa of 1.5 * 2^23, subtract it again).
__device__ __forceinline__ float i2f(int s) { return __int_as_float(0x4B400000 + s) - 12582912.f; }

// One sub-block's weighted dot: s0 * dot(codes 0..15, x0) + s1 * dot(16..31, x1) - (m0 * e0 + m1 * e1), where e0, e1
// are the activation halves' sums (sum16: a function of the activations only, so the GEMV computes them once for all
// the rows it holds); activation scale not applied. Every rounding explicit so that the result is a function of its
// inputs only. BIAS: w0, w1 are the codes as stored (decode_biased), and dot(code - BIAS, x) = dot(code, x) - BIAS *
// e is the same integer. D: the int8 dot of the route (common.cuh).
template <bool PER16, bool MIN, int BIAS, class D>
__device__ __forceinline__ float sub_dot(const int4 w0, const int4 w1, float s0, float s1, float m0, float m1,
                                        const int4 x0, const int4 x1, int e0, int e1) {
    const int d0 = dot16<D>(w0, x0) - BIAS * e0, d1 = dot16<D>(w1, x1) - BIAS * e1;
    float v = PER16 ? __fmaf_rn(s0, i2f(d0), __fmul_rn(s1, i2f(d1))) : __fmul_rn(s0, i2f(d0 + d1));
    if (MIN) v = __fsub_rn(v, PER16 ? __fmaf_rn(m0, i2f(e0), __fmul_rn(m1, i2f(e1))) : __fmul_rn(m0, i2f(e0 + e1)));
    return v;
}

// The same at T = 1 in fewer instructions: the activation side first (x_sums, once for the R rows: the bias times
// the half sums as a dot chain's start, -BIAS e, and for the mins the sums as floats), then per row the dots as one
// chain over the sub-block where the type has one scale (d0 + d1: the same integer as two) started from -BIAS e, and
// the ints as floats by the conversion (chain_to_f32: I2FP on sm_90, one instruction where i2f is an IADD3 and an
// FADD; exact either way, |v| < 2^22). The same floats and float operations in the same order: the same bits as
// sub_dot. (Not at T >= 2: there it changed ptxas's allocation, DP2A spilled more.)
struct XSums { int b0, b1; float f0, f1; };   // PER16: per half; else b0, f0 over the sub-block (e0 + e1)

template <bool PER16, bool MIN, int BIAS, class D>
__device__ __forceinline__ XSums x_sums(const int4 x0, const int4 x1) {
    XSums e{0, 0, 0.f, 0.f};
    if (!MIN && BIAS == 0) return e;
    if (PER16) {
        const int e0 = sum16<D>(x0), e1 = sum16<D>(x1);
        e.b0 = -BIAS * e0, e.b1 = -BIAS * e1;
        if (MIN) e.f0 = chain_to_f32(e0), e.f1 = chain_to_f32(e1);
    } else {
        const int s = dot16<D>(make_int4(ONES, ONES, ONES, ONES), x1, sum16<D>(x0));
        e.b0 = -BIAS * s;
        if (MIN) e.f0 = chain_to_f32(s);
    }
    return e;
}

template <bool PER16, bool MIN, class D>
__device__ __forceinline__ float sub_dot1(const int4 w0, const int4 w1, float s0, float s1, float m0, float m1,
                                         const int4 x0, const int4 x1, const XSums& e) {
    if (PER16) {
        const int d0 = dot16<D>(w0, x0, e.b0), d1 = dot16<D>(w1, x1, e.b1);
        float v = __fmaf_rn(s0, chain_to_f32(d0), __fmul_rn(s1, chain_to_f32(d1)));
        if (MIN) v = __fsub_rn(v, __fmaf_rn(m0, e.f0, __fmul_rn(m1, e.f1)));
        return v;
    }
    const int d = dot16<D>(w1, x1, dot16<D>(w0, x0, e.b0));
    float v = __fmul_rn(s0, chain_to_f32(d));
    if (MIN) v = __fsub_rn(v, __fmul_rn(m0, e.f0));
    return v;
}

// ---- GEMV ---------------------------------------------------------------------------------------------------------

struct QuantSet {
    const uint8_t* body[QMAX_MATS];  // [rows_i, nb * BODY]
    const uint8_t* head[QMAX_MATS];  // [rows_i, nb * HEAD]
    float* y[QMAX_MATS];             // [T, rows_i]
    const float* res[QMAX_MATS];     // [T, rows_i] added to y, or null
    int rows[QMAX_MATS];
    int row_end[QMAX_MATS];          // cumulative rows
    int group_end[QMAX_MATS];        // cumulative warp groups (ceil(rows_i / R): the launcher's R; T = 1 only)
    int count, total, groups;
};

// Weight row `grow` of a set: the matrix it belongs to and the row within it (T >= 2: a warp's rows may lie in two).
struct SetRow { int mat, row, rows; };

__device__ __forceinline__ SetRow locate_row(const QuantSet& set, int grow) {
    int i = 0;
#pragma unroll
    for (int k = 1; k < QMAX_MATS; ++k) i = k < set.count && grow >= set.row_end[k - 1] ? k : i;
    const int row0 = i ? set.row_end[i - 1] : 0;
    return {i, grow - row0, set.row_end[i] - row0};
}

// Warp group g of a set at T = 1: R consecutive rows of one matrix (its last group may run past its end), so that
// the matrix is looked up once per warp, not per row.
struct SetGroup { int mat, row, rows; };

template <int R>
__device__ __forceinline__ SetGroup locate_group(const QuantSet& set, int g) {
    int i = 0;
#pragma unroll
    for (int k = 1; k < QMAX_MATS; ++k) i = k < set.count && g >= set.group_end[k - 1] ? k : i;
    return {i, (g - (i ? set.group_end[i - 1] : 0)) * R, set.rows[i]};
}

// A GEMV lane's cursor in one weight row, at the sub-block c where its current round starts (c = lane + 32 i); load(nb,
// c, k) gives sub-block c + k (k a multiple of 32, known at compile time). With LANE and where the type has one:
// Q::Lane (its planes' addresses at c, advanced a round at a time: loads at constant offsets, no address arithmetic
// per load; one 64-bit pointer per plane and row); else Q::load's arithmetic from the row's planes at each load.
template <class Q, bool LANE, class = void>
struct GemvLane {
    const uint8_t *body, *head;
    static __device__ __forceinline__ GemvLane at(const uint8_t* body, const uint8_t* head, int, int) {
        return {body, head};
    }
    __device__ __forceinline__ typename Q::Raw load(int nb, int c, int k) const {
        return Q::load(body, head, nb, c + k);
    }
    __device__ __forceinline__ void advance(int) {}
    static constexpr bool WHOLE_ROUNDS = false;
};
template <class Q>
struct GemvLane<Q, true, std::void_t<typename Q::Lane>> : Q::Lane {
    static __device__ __forceinline__ GemvLane at(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {Q::Lane::at(body, head, nb, c)};
    }
    __device__ __forceinline__ typename Q::Raw load(int, int, int k) const { return Q::Lane::load(k); }
};

// The grid types' tables in shared memory for the GEMV (quant_blocks_iq.cuh's GridSmem): every block stages its
// copy (all threads, 4-byte words: the generated tables are only 4- or 8-byte aligned) before its first decode, so
// a table costs its bytes of L2 traffic per block of 2 QGEMV_WARPS rows (IQ3_XXS 1 KB, IQ2_XXS / IQ3_S 2 KB, IQ2_XS
// 4 KB, IQ2_S 8 KB, IQ1_S / IQ1_M 16 KB). Why: through L1 a warp's 32 random 8-byte lookups cost one wavefront per
// distinct 128-byte line, in shared memory a few bank conflicts. Measured (H100, bench_gemv T = 1, 2, 4 over 4096 x
// 12288, 12288 x 4096, 4096 x 4096; 2026-12-05, A B C A): 0.83-0.94x main's time for IQ1_S / IQ1_M, 0.87x IQ2_S,
// 0.90x IQ2_XS / IQ3_S, 0.91-1.02x IQ2_XXS / IQ3_XXS; staging all but the IQ1 tables left those at 1.00x.
template <class Q, class = void>
struct GemvGrid { static constexpr int BYTES = 0; };
template <class Q>
struct GemvGrid<Q, std::void_t<decltype(Q::GRID_BYTES)>> { static constexpr int BYTES = Q::GRID_BYTES; };

// Q's grid table into `copy` by all the block's threads, then the block's barrier (each thread reaches it once).
template <class Q>
__device__ __forceinline__ void stage_grid(unsigned* copy) {
    constexpr int WORDS = GemvGrid<Q>::BYTES / 4;
    const unsigned* table = static_cast<const unsigned*>(Q::grid_table());
    // nvcc unrolls this loop (a trip count known per block size); clang cannot, the start being the thread's index,
    // and warned at every instantiation in CI's sm_61 / sm_70 build. A loop with a constant trip count would
    // silence both but guards every word: the tested sm_90 code stays as it is.
#if defined(__NVCC__)
#pragma unroll
#endif
    for (int i = threadIdx.y * 32 + threadIdx.x; i < WORDS; i += QGEMV_WARPS * 32) copy[i] = __ldg(table + i);
    __syncthreads();
}

// The GEMV's shape at NT tokens: rows per warp R, sub-blocks in flight per lane and row U, whether a slot is refilled
// as soon as it is decoded (roll) or all U after the round, and the launch bound's blocks per SM (MINB).
//  - T = 1 (decode): two rows per warp as T >= 2. Why, from sm_90 SASS (static counts, nvcc 13.0) and the H200's
//    rate: streaming 4.3 TB/s over 132 SMs at ~1.98 GHz is ~16.4 bytes per SM-cycle, and a 4096-wide Q4_K row is
//    2304 bytes, so a kernel spending N warp-instructions per row needs N / 140 of the SM's 4 issue slots per cycle.
//    The earlier T = 1 kernel (a row per warp, U = 4, 8 blocks per SM under a 64-register cap: 44-77% of copy on
//    the 9B shapes, H200 2026-12-02) spent ~465 per row (3.3 issue slots per cycle at the roofline): the activation
//    loads and half sums (3 loads + 8 DP4A per sub-block), the row lookup, the addresses and the reduction were all
//    per row. Shared by two rows it is ~360. Rows of at most QGEMV_ROUND sub-blocks (n <= 4096 for every type: all
//    of the 9B's projections but FFN down) load every sub-block of both rows at once (U = 4: 16 loads of 16 bytes
//    per lane before the first use, no refill code), 4 blocks per SM under the 128-register cap, so 32 rows per SM
//    are in flight (64 KB of codes) and a 4096-row matrix is one wave (512 blocks, 528 slots), as it was. Longer
//    rows (FFN down, n = 12288: three rounds, each waiting out the full latency in the earlier kernel) roll: U = 3,
//    each slot refilled as soon as it is decoded, 4 blocks per SM (128-register cap): 6 loads per lane in flight,
//    ~47 KB of codes per SM. What is in flight depends on the blocks a matrix gives each SM, not on the launch
//    bound: FFN down's 4096 rows are 512 blocks, ~3.9 per SM, so U = 2 at 5 blocks per SM (102 registers) kept
//    only ~31 KB, half the row-per-warp kernel's 64 KB (with it IQ4_XS at n = 12288 went 58 -> 51% of copy, Q4_K,
//    whose issue savings were larger, 61 -> 67%; H200 2026-12-02), and the Q8_0 GEMV gained 13-14% from more
//    bytes in flight per SM on such one-wave shapes. U = 4 (~64 KB) spills on sm_90 DP4A (Q4_K 28 bytes, Q3_K 8).
//    Over 528 blocks (> 4224 rows) the 4-block bound costs a second, partial wave where 5 fitted one. Neither
//    shape spills on sm_90 DP4A or DP2A for any type (ptxas -v; IMAD: Q5_K 20 bytes at U = 3, 100 at U = 2). More
//    bytes in flight cannot help the 4096x4096 matrices: the short-row shape already holds each SM's whole share
//    at once (their gap to copy is the ramp: first-byte latency, the last blocks' reductions). Earlier T = 1
//    measurements (H200, 2026-12-01): at a row per warp, 7 blocks per SM instead of 8 (72 registers, a second wave
//    on 4096-row matrices) cost 25-30%, U = 8 under a 128 cap (two waves) 10-30%: the one-wave rule comes from there.
//  - T >= 2: two rows per warp, so each activation load, scale and half sum serves both; rolling refills keep 4
//    loads per lane in flight while the warp multiplies. Without a cap ptxas takes 150-250 registers (it hoists the
//    activation loads of every token) and 2-3 blocks fit per SM; the caps below (128 registers to T = 8, 168 above)
//    hold 4 and 3 without spills (ptxas -v, sm_90, Q4_K/Q5_K/Q6_K/IQ4_XS; at T = 16 a 128 cap spilled 88-136 bytes).
struct QGemvShape { int rows, unroll; bool roll; int min_blocks; };
template <int NT, bool LONG>
constexpr QGemvShape qgemv_shape() {
    if (NT == 1) return LONG ? QGemvShape{2, 3, true, 4} : QGemvShape{2, 4, false, 4};
    return NT <= 8 ? QGemvShape{2, 2, true, 4} : QGemvShape{2, 2, true, 3};
}
// T = 1 rows longer than this many sub-blocks (one round of the short-row shape: 32 lanes x 4) take the LONG shape.
constexpr int QGEMV_ROUND = 32 * qgemv_shape<1, false>().unroll;

// Warp per R weight rows; lane l takes the rows' sub-blocks l, l + 32, ... in increasing order (each a contiguous
// run of every body plane, so a warp's load of one plane is one contiguous span). Each sub-block's codes and scales
// are decoded once into registers (and, with ROLL, its slot refilled at once with the load U sub-blocks ahead), then
// the NT tokens' dots run from those registers: per token the activation codes, their scale and (MIN types) their
// half sums are read and computed once for the R rows. A row's arithmetic does not depend on R, U or NT (tokens
// never interact; the same order, roundings and butterfly sum), so each row gets the same bits for every T (batch
// invariance). The first loads go out before pdl_wait_producers (weights never change; x, res and y belong to the
// kernels before this one), and the kernel lets its PDL consumer launch at once (every kernel launched with PDL
// waits for this grid before it touches memory), so the next kernel's blocks take the SMs this grid's last wave
// leaves idle (H200, T = 1: without the early trigger 5-24% slower (Q4_K, Q6_K); launch() uses PDL where
// cmp_set_pdl is on).
// T = 1 trims (issue 18; the arithmetic unchanged, so the same bits): a warp's rows lie in one matrix (located once,
// QuantSet.group_end); Q4_K/Q5_K/Q6_K load through lane cursors (GemvLane: constant offsets, no 64-bit address
// arithmetic per load); the short shape's round has no bound checks where it is whole (n = 4096); the rolling
// shape's rounds whose next round is whole refill every slot unpredicated (no register copies; Q4_K, Q6_K on DP4A:
// Q5_K and DP2A spilled with it); both rows' butterfly sums run as one (lanes 16-31 the second row); sub_dot1 (one
// dot chain, ints to floats by I2FP). Dynamic SASS instructions per warp of two rows (sm_90 DP4A, nvcc 13.0,
// counted along the path the SASS takes at that n; not yet measured on a GPU), main -> this:
//   Q4_K n = 4096   671 -> 512   (to the last weight load 165 -> 102; after the last sub-block ~105 -> ~47)
//   Q5_K n = 4096   873 -> 643
//   Q6_K n = 4096   899 -> 618   (to the last weight load 281 -> 133)
//   Q4_K n = 12288 ~1960 -> ~1400 (a round of 3 sub-blocks x 2 rows: 423 -> 295)
//   Q5_K n = 12288 ~2500 -> ~2160 (546 -> 496)
//   Q6_K n = 12288 ~2560 -> ~1830 (554 -> 382)
// Registers (the 128 cap), short / rolling: Q4_K 119 -> 96 / 115 -> 128, Q5_K 121 -> 106 / 128 -> 120, Q6_K 121 ->
// 96 / 102 -> 126; no spills at T = 1 on any route. T >= 2 keeps the code before these (ptxas -v: with them it
// spilled there); its allocation still moved a little (DP4A: Q5_0 at T = 7, 8 bytes; benchmarks/RESULTS.md).
template <class Q, int NT, int R, int U, bool ROLL, int MINB, class D>
__global__ void __launch_bounds__(QGEMV_WARPS * 32, MINB)
gemv_quant_kernel(const int8_t* __restrict__ xq,  // [NT, n]
                  const float* __restrict__ xd,   // [NT, n/32]
                  const QuantSet set, int n) {
    constexpr int NSUB = Q::BV / 32;
    // A type's code bias (Q4_0, Q5_0, Q3_K, Q6_K) comes off the integer dots (BIAS times the activation half sums:
    // 8 dot4 per token and sub-block, shared by the R rows) rather than off each code (unbias: 24 instructions per
    // row and sub-block on sm_90) where that is cheaper: NT < 3 R on DP4A (T <= 5), T = 1 on DP2A, never on IMAD
    // (D::OPS); the same integers either way. SUMS: the kernel needs the half sums (for the mins or the bias).
    constexpr int BIAS = NT * 8 * D::OPS < R * 24 ? Q::BIAS : 0;
    constexpr bool SUMS = Q::MIN || BIAS != 0;
    // T = 1 takes the trims below (warp groups, the cursors, whole rounds, the paired sums, sub_dot1); T >= 2 is as
    // before them (rows located one by one, a warp's rows possibly in two matrices): with them ptxas spilled there.
    constexpr bool T1 = NT == 1;
    static_assert(!T1 || R == 2, "T = 1's epilogue sums two rows");
    // A grid type's table, staged (GemvGrid) by every warp, those without rows too, before its first decode.
    constexpr int GRID = GemvGrid<Q>::BYTES;
    __shared__ __align__(16) unsigned grid_copy[GRID ? GRID / 4 : 1];   // (8-byte entries: LDS.64)
    const int warp = blockIdx.x * QGEMV_WARPS + threadIdx.y, first = warp * R;
    if (T1 ? warp >= set.groups : first >= set.total) {
        if constexpr (GRID != 0) stage_grid<Q>(grid_copy);
        return;
    }
    const int lane = threadIdx.x, nb = n / Q::BV, nsub = n / 32, j = lane % NSUB;
    using Lane = GemvLane<Q, T1>;
    Lane src[R];   // at the lane's current round
    // Rows past the matrix's (T >= 2: the set's) last re-read it and store nothing. Only the cursors stay live
    // through the loop; the outputs are located again after it (registers: every shape runs under a cap).
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const uint8_t *b, *h;
        if constexpr (T1) {
            const SetGroup at = locate_group<R>(set, warp);
            const size_t row = min(at.row + r, at.rows - 1);
            b = set.body[at.mat] + row * nb * Q::BODY, h = set.head[at.mat] + row * nb * Q::HEAD;
        } else {
            const SetRow at = locate_row(set, min(first + r, set.total - 1));
            b = set.body[at.mat] + (size_t)at.row * nb * Q::BODY, h = set.head[at.mat] + (size_t)at.row * nb * Q::HEAD;
        }
        src[r] = Lane::at(b, h, nb, lane);
    }
    typename Q::Raw raw[R][U];
    // Slot u of every row <- the lane's sub-block lane + 32 u; WHOLE: all U exist (no per-slot bound check).
    auto fetch_first = [&](auto whole) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (decltype(whole)::value || lane + 32 * u < nsub) raw[r][u] = src[r].load(nb, lane, 32 * u);
    };
    float acc[R][NT];
    auto start = [&] {   // after the first loads
        if constexpr (GRID != 0) stage_grid<Q>(grid_copy);
        pdl_allow_consumers();
        pdl_wait_producers();
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
    };
    // One round: the lane's sub-blocks c0 + 32 u, u < U. WHOLE: all exist. REFILL (ROLL): each slot, once decoded,
    // takes its sub-block of the next round (c + 32 U): QR_NONE never, QR_ALL always (the next round is whole: no
    // bound check, no predicated load), QR_SOME where it exists.
    auto round = [&](int c0, auto whole, auto refill) {
        constexpr bool WHOLE = decltype(whole)::value;
        constexpr int REFILL = decltype(refill)::value;
        // QR_SOME: whether the next round has any sub-block and whether it is whole (both warp-uniform).
        const bool next_any = c0 - lane + 32 * U < nsub, next_full = c0 - lane + 64 * U <= nsub;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u;
            if (!WHOLE && c >= nsub) break;
            int4 w0[R], w1[R];
            float s0[R], s1[R], m0[R], m1[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                SubBlock sb;
                if constexpr (BIAS != 0) Q::decode_biased(raw[r][u], j, sb);
                else if constexpr (GRID != 0) Q::decode(raw[r][u], j, sb, GridSmem{grid_copy});
                else Q::decode(raw[r][u], j, sb);
                w0[r] = make_int4(sb.q[0], sb.q[1], sb.q[2], sb.q[3]);
                w1[r] = make_int4(sb.q[4], sb.q[5], sb.q[6], sb.q[7]);
                s0[r] = sb.s[0], s1[r] = sb.s[1], m0[r] = sb.m[0], m1[r] = sb.m[1];
                if (REFILL == QR_SOME && next_any && (next_full || c + 32 * U < nsub))
                    raw[r][u] = src[r].load(nb, c0, 32 * (u + U));
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int4* xv = reinterpret_cast<const int4*>(xq + (size_t)t * n + (size_t)c * 32);
                const int4 x0 = __ldg(xv), x1 = __ldg(xv + 1);
                const float sx = __ldg(xd + (size_t)t * nsub + c);
                if constexpr (T1) {
                    const XSums e = x_sums<Q::PER16, Q::MIN, BIAS, D>(x0, x1);
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        acc[r][t] = __fmaf_rn(sub_dot1<Q::PER16, Q::MIN, D>(w0[r], w1[r], s0[r], s1[r], m0[r], m1[r],
                                                                            x0, x1, e), sx, acc[r][t]);
                } else {
                    const int e0 = SUMS ? sum16<D>(x0) : 0, e1 = SUMS ? sum16<D>(x1) : 0;
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        acc[r][t] = __fmaf_rn(sub_dot<Q::PER16, Q::MIN, BIAS, D>(w0[r], w1[r], s0[r], s1[r], m0[r],
                                                                                 m1[r], x0, x1, e0, e1), sx, acc[r][t]);
                }
            }
            // QR_ALL: after the dots, when the decoded codes are dead (registers: before them Q3_K/Q4_K/Q5_K
            // spilled under the cap).
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (REFILL == QR_ALL) raw[r][u] = src[r].load(nb, c0, 32 * (u + U));
        }
#pragma unroll
        for (int r = 0; r < R; ++r) src[r].advance(32 * U);
    };
    using Yes = std::true_type;
    using No = std::false_type;
    if constexpr (ROLL) {
        fetch_first(No{});
        start();
        int c0 = lane;
        // The rounds whose next round is whole, then the rest. DP4A only: on DP2A Q6_K spilled with it (and there
        // the dots outweigh the refills' instructions).
        if constexpr (T1 && Lane::WHOLE_ROUNDS && D::OPS == 1) {
            const int steady = nsub / (32 * U) - 1;
            for (int i = 0; i < steady; ++i) round(lane + 32 * U * i, Yes{}, std::integral_constant<int, QR_ALL>{});
            c0 = lane + 32 * U * max(steady, 0);
        }
        for (; c0 < nsub; c0 += 32 * U) round(c0, No{}, std::integral_constant<int, QR_SOME>{});
    } else {  // one round (the launcher's rows have at most 32 U sub-blocks)
        if (nsub == 32 * U) fetch_first(Yes{});
        else fetch_first(No{});
        start();
        round(lane, No{}, std::integral_constant<int, QR_NONE>{});
    }
    if constexpr (T1 && R == 2) {
        // Both rows' butterfly sums in one: lanes 16-31 take the second row (first step: each half adds the other
        // half's partial of its row), then the steps 8, 4, 2, 1 within each half. Lane 16's additions are lane 0's
        // of warp_sum over that row (the first one with its operands swapped: the same bits), so each row's result
        // is warp_sum's; lanes 0 and 16 store.
        const SetGroup at = locate_group<R>(set, warp);
        float* y = set.y[at.mat];
        const float* res = set.res[at.mat];
        const bool hi = lane >= 16;
        const int row = at.row + hi;
        float v = hi ? acc[1][0] : acc[0][0];
        v += __shfl_xor_sync(0xffffffffu, hi ? acc[0][0] : acc[1][0], 16);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if ((lane & 15) == 0 && row < at.rows) y[row] = res ? res[row] + v : v;
    } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (first + r >= set.total) break;
            const SetRow at = locate_row(set, first + r);
            float* y = set.y[at.mat] + at.row;
            const float* res = set.res[at.mat] ? set.res[at.mat] + at.row : nullptr;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float v = warp_sum(acc[r][t]);
                if (lane == 0) y[(size_t)t * at.rows] = res ? res[(size_t)t * at.rows] + v : v;
            }
        }
    }
}

template <class Q, int NT, bool LONG, class D>
int launch_gemv_shape(const int8_t* xq, const float* xd, const QuantSet& set, int n) {
    constexpr QGemvShape sh = qgemv_shape<NT, LONG>();
    QuantSet s = set;   // T = 1: warps by groups of one matrix's rows; T >= 2: by rows of the set
    s.groups = 0;
    for (int i = 0; i < s.count; ++i) s.group_end[i] = s.groups += (s.rows[i] + sh.rows - 1) / sh.rows;
    const int warps = NT == 1 ? s.groups : ceil_div(s.total, sh.rows);
    return launch("gemv_quant_kernel", gemv_quant_kernel<Q, NT, sh.rows, sh.unroll, sh.roll, sh.min_blocks, D>,
                  dim3(ceil_div(warps, QGEMV_WARPS)), dim3(32, QGEMV_WARPS), 0, xq, xd, s, n);
}

template <class Q, int NT, class D>
int launch_gemv_quant(const int8_t* xq, const float* xd, const QuantSet& set, int n) {
    if constexpr (NT == 1)
        if (n / 32 > QGEMV_ROUND) return launch_gemv_shape<Q, 1, true, D>(xq, xd, set, n);
    return launch_gemv_shape<Q, NT, false, D>(xq, xd, set, n);
}

template <class Q, class D, int... NT>
int gemv_quant_by_t(int T, const int8_t* xq, const float* xd, const QuantSet& set, int n,
                    std::integer_sequence<int, NT...>) {
    using Fn = int (*)(const int8_t*, const float*, const QuantSet&, int);
    static constexpr Fn table[] = {launch_gemv_quant<Q, NT + 1, D>...};
    return table[T - 1](xq, xd, set, n);
}

// ---- GEMM (T > QGEMV_MAX_T) ----------------------------------------------------------------------------------------

// xs [T, n/16] = xd * (sum of the 16 activation codes of each half): exact (an f16-precision scale times an 11-bit
// integer). Only for types with a min.
template <class D>
__global__ void half_sums_kernel(const int8_t* __restrict__ xq,  // [T, n]
                                 const float* __restrict__ xd,   // [T, n/32]
                                 float* __restrict__ xs,         // [T, n/16]
                                 size_t halves) {
    const size_t h = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (h >= halves) return;
    xs[h] = xd[h >> 1] * (float)sum16<D>(__ldg(reinterpret_cast<const int4*>(xq + 16 * h)));
}

// half_sums_kernel over the T x n/16 halves (xs [T, n/16]).
template <class D>
int half_sums(const int8_t* xq, const float* xd, float* xs, int T, int n) {
    const size_t halves = (size_t)T * (n / 16);
    half_sums_kernel<D><<<ceil_div(halves, 256), 256, 0, stream()>>>(xq, xd, xs, halves);
    return check_launch("half_sums_kernel");
}

// The expanded weights times the activations: thread (tx, ty) = (tid % 16, tid / 16) owns rows tx + 16i and tokens
// ty + 16j (i, j < 8), rows in registers 4 at a time. Per sub-block and output: PER16, two 16-code DP4A dots with
// their half scales, times the activation scale, less the mins times the activation half sums (block_term16); else
// one 32-code dot and block_term (gemm_w16.cuh: the arithmetic of gemm_w16_kernel, which runs every type on DP4A
// where it can).
// Stages of QBK sub-blocks, double-buffered (codes by cp.async on sm_80+; scales through registers), one barrier per
// stage; STAGES 1 where shared memory holds one stage only (smem::gemm_quant_plan: sm_61): the next stage waits in
// registers while the current one is multiplied, then a second barrier before it overwrites it. The arithmetic is
// the same.
// The loop's SASS per 2-stage (1024 IDP.4A per thread; 2026-12-02, issue 20 item 5; sm_90 nvcc 13.0 / sm_70 nvcc
// 12.4), before -> now (the int->float by the conversion, chain_to_f32 in common.cuh; rows past the end read the
// last one, only the K tail guarded):
//   Q4_K form (MIN):   2144 / 2155 -> 2008 / 2007 instructions; FMA-pipe ones (IDP, FADD/FMUL/FFMA, IMAD) on
//                      sm_70 1810 -> 1680: a ceiling of 57% -> 61% of the DP4A rate. The min term (FMUL + FFMA +
//                      FADD per output and sub-block) is most of what stays; sm_70 spills 12 B -> none.
//                      Since the min per 32 values (block_term, issue 18/20; sm_90): 2008 -> 1761 instructions, FMA
//                      pipe 1674 -> 1419 (FMUL 256 -> 128, FFMA 256, FADD 128 -> 1); the loop DP2A / IMAD and the
//                      cards without gemm_w16_kernel run.
//   Q6_K form (PER16): 2092 / 2107 -> 1819 / 1830; sm_70 FMA pipe 1680 -> 1416 (61% -> 72%), 256 I2F on the XU
//                      (16 per SM and clock on Volta: ~70% busy at that rate); sm_70 spills 0 -> 24 B (3 LDL).
//   Q4_0 form:         1716 / - -> 1572 (sm_90).
// Registers 227-255 (one block of 256 threads per SM, as before).
template <bool PER16, bool MIN, class D, int STAGES>
__global__ void __launch_bounds__(256, 1)
gemm_quant_kernel(const int8_t* __restrict__ xq,  // [T, n]
                  const float* __restrict__ xd,   // [T, n/32]
                  const float* __restrict__ xs,   // [T, n/16] (MIN)
                  const int8_t* __restrict__ wq,  // [R, n]
                  const float* __restrict__ ws,   // [R, n/16]
                  const float* __restrict__ wm,   // [R, n/16] (MIN)
                  const float* __restrict__ res,  // [T, ldy] added to y, or null
                  float* __restrict__ y,          // [T, ldy], columns [0, R)
                  int T, int R, int n, int ldy) {
    extern __shared__ __align__(16) unsigned char qsmem[];  // QStage[STAGES]: 27 KB each
    QStage* st = reinterpret_cast<QStage*>(qsmem);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr bool ASYNC = STAGES > 1;   // cp.async straight into the next stage (one stage: it is being read)
#else
    constexpr bool ASYNC = false;
#endif
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int row0 = blockIdx.x * QTILE, tok0 = blockIdx.y * QTILE, nsub = n / 32, nh = n / 16;
    const int nstage = (nsub + QBK - 1) / QBK;
    const int lr = tid >> 2, lc = tid & 3;  // code chunk p: row lr + 64p, 16-byte chunk lc of the stage's 64 bytes
    const int sr = tid >> 1, sk = tid & 1;  // scale loads: row sr, sub-block sk of the stage

    struct Pending { int4 w[2], x[2]; float2 ws, wm, xs; float xd; };
    // Per-thread sources, set once: a row past R (a token past T) reads the last one instead (its outputs are never
    // stored), so only the K tail (the last stage's second sub-block when nsub is odd) needs a guard.
    const int8_t* srcw[2];
    const int8_t* srcx[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        srcw[k] = wq + (size_t)min(row0 + lr + 64 * k, R - 1) * n + lc * 16;
        srcx[k] = xq + (size_t)min(tok0 + lr + 64 * k, T - 1) * n + lc * 16;
    }
    const size_t srow = (size_t)min(row0 + sr, R - 1), stok = (size_t)min(tok0 + sr, T - 1);
    const float2* srcws = reinterpret_cast<const float2*>(ws + srow * nh) + sk;
    const float2* srcwm = reinterpret_cast<const float2*>((MIN ? wm : ws) + srow * nh) + sk;
    const float2* srcxs = reinterpret_cast<const float2*>((MIN ? xs : ws) + stok * nh) + sk;
    const float* srcxd = xd + stok * nsub + sk;
    auto fetch = [&](int s, QStage& b, Pending& p) {
        const bool ok = s * QBK + (lc >> 1) < nsub;          // the sub-block this thread's chunks lie in exists
        const size_t off = ok ? (size_t)s * QBK * 32 : 0;     // (else an in-bounds address, zeros written)
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int r = lr + 64 * k;
            if constexpr (ASYNC) {
                copy16(&b.w[r][lc * 4], srcw[k] + off, ok);
                copy16(&b.x[r][lc * 4], srcx[k] + off, ok);
            } else {
                (void)b; (void)r;
                p.w[k] = ok ? __ldg(reinterpret_cast<const int4*>(srcw[k] + off)) : make_int4(0, 0, 0, 0);
                p.x[k] = ok ? __ldg(reinterpret_cast<const int4*>(srcx[k] + off)) : make_int4(0, 0, 0, 0);
            }
        }
        const bool oks = s * QBK + sk < nsub;
        const float2 z = make_float2(0.f, 0.f);
        p.ws = oks ? srcws[s * QBK] : z;
        p.wm = MIN && oks ? srcwm[s * QBK] : z;
        p.xs = MIN && oks ? srcxs[s * QBK] : z;
        p.xd = oks ? srcxd[s * QBK] : 0.f;
    };
    auto publish = [&](QStage& b, const Pending& p) {
        if constexpr (ASYNC) {
            cp_async_wait();
        } else {
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                *reinterpret_cast<int4*>(&b.w[lr + 64 * k][lc * 4]) = p.w[k];
                *reinterpret_cast<int4*>(&b.x[lr + 64 * k][lc * 4]) = p.x[k];
            }
        }
        b.ws[sr][2 * sk] = p.ws.x;
        b.ws[sr][2 * sk + 1] = p.ws.y;
        b.wm[sr][2 * sk] = p.wm.x;
        b.wm[sr][2 * sk + 1] = p.wm.y;
        b.xs[sr][2 * sk] = PER16 ? p.xs.x : p.xs.x + p.xs.y;   // per 32: the block's sum (exact: block_term)
        b.xs[sr][2 * sk + 1] = p.xs.y;
        b.xd[sr][sk] = p.xd;
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    Pending p;
    fetch(0, st[0], p);
    publish(st[0], p);
    __syncthreads();
    for (int s = 0; s < nstage; ++s) {
        QStage& cur = st[s % STAGES];
        QStage& nxt = st[(s + 1) % STAGES];
        const bool more = s + 1 < nstage;
        if (more) fetch(s + 1, nxt, p);  // nxt was last read before the previous barrier
#pragma unroll
        for (int kb = 0; kb < QBK; ++kb) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // 4 weight rows in registers at a time
                int4 a[4][2];
                float s0[4], s1[4], m0[4], m1[4];
#pragma unroll
                for (int ii = 0; ii < 4; ++ii) {
                    const int r = tx + 16 * (4 * h + ii);
                    a[ii][0] = *reinterpret_cast<const int4*>(&cur.w[r][kb * 8]);
                    a[ii][1] = *reinterpret_cast<const int4*>(&cur.w[r][kb * 8 + 4]);
                    s0[ii] = cur.ws[r][2 * kb];
                    s1[ii] = PER16 ? cur.ws[r][2 * kb + 1] : 0.f;
                    m0[ii] = MIN ? cur.wm[r][2 * kb] : 0.f;
                    m1[ii] = MIN && PER16 ? cur.wm[r][2 * kb + 1] : 0.f;
                }
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int c = ty + 16 * j;
                    const int4 b0 = *reinterpret_cast<const int4*>(&cur.x[c][kb * 8]);
                    const int4 b1 = *reinterpret_cast<const int4*>(&cur.x[c][kb * 8 + 4]);
                    const float sx = cur.xd[c][kb];
                    // e0: the half's sum (PER16) or the block's
                    const float e0 = MIN ? cur.xs[c][2 * kb] : 0.f, e1 = MIN && PER16 ? cur.xs[c][2 * kb + 1] : 0.f;
#pragma unroll
                    for (int ii = 0; ii < 4; ++ii) {
                        float& o = acc[4 * h + ii][j];
                        // PER16: a dot chain per half; else one chain over the sub-block, as gemm_w16_kernel adds it
                        const int d0 = dot16<D>(a[ii][0], b0, dot_chain_init());
                        const int d1 = dot16<D>(a[ii][1], b1, PER16 ? dot_chain_init() : d0);
                        if constexpr (PER16) {
                            o = block_term16<MIN>(o, d0, d1, s0[ii], s1[ii], sx, m0[ii], m1[ii], e0, e1);
                        } else {
                            o = block_term<MIN>(o, d1, s0[ii], sx, m0[ii], e0);
                        }
                    }
                }
            }
        }
        if (STAGES == 1) __syncthreads();   // every thread done with cur before the next stage overwrites it
        if (more) publish(nxt, p);
        __syncthreads();
    }
    store_tile<16, 16>(acc, tok0 + ty, T, row0 + tx, R, ldy, res, y);
}

// Workspace of the GEMM path: the activation half sums (MIN types), then per chunk of rows the expanded weights.
struct GemmWork {
    float* xs;
    int8_t* wq;
    float* ws;
    float* wm;
    int chunk;  // rows per chunk (a multiple of QTILE), 0 when the workspace is too small
};

constexpr size_t align256(size_t b) { return (b + 255) / 256 * 256; }

template <class Q>
size_t expanded_row_bytes(int n) { return (size_t)n + (size_t)(n / 16) * 4 * (Q::MIN ? 2 : 1); }

template <class Q>
size_t half_sums_bytes(int T, int n) { return Q::MIN ? align256((size_t)T * (n / 16) * 4) : 0; }

template <class Q>
GemmWork split_work(void* work, size_t bytes, int T, int n, int rows) {
    GemmWork g{};
    const size_t xsb = half_sums_bytes<Q>(T, n);
    if (bytes < xsb) return g;
    const size_t per_row = expanded_row_bytes<Q>(n);
    size_t chunk = (bytes - xsb - 3 * 256) / per_row / QTILE * QTILE;
    chunk = std::min(chunk, (size_t)(rows + QTILE - 1) / QTILE * QTILE);
    if (chunk == 0) return g;
    uint8_t* p = static_cast<uint8_t*>(work);
    g.xs = reinterpret_cast<float*>(p);
    p += xsb;
    g.wq = reinterpret_cast<int8_t*>(p);
    p += align256(chunk * n);
    g.ws = reinterpret_cast<float*>(p);
    p += align256(chunk * (n / 16) * 4);
    g.wm = Q::MIN ? reinterpret_cast<float*>(p) : nullptr;
    g.chunk = (int)chunk;
    return g;
}

template <bool PER16, bool MIN, class D, int STAGES>
int gemm_quant_wave(int* blocks) {
    return wave_blocks("gemm_quant_kernel", gemm_quant_kernel<PER16, MIN, D, STAGES>, 256, STAGES * sizeof(QStage),
                       blocks);
}

template <bool PER16, bool MIN, class D, int STAGES>
int launch_gemm_quant(const int8_t* xq, const float* xd, const GemmWork& g, const float* res, float* y, int T, int R,
                      int n, int ldy) {
    constexpr size_t bytes = STAGES * sizeof(QStage);
    auto kernel = gemm_quant_kernel<PER16, MIN, D, STAGES>;
    CMP_TRY(smem_opt_in("gemm_quant_kernel", kernel, bytes));
    kernel<<<dim3(ceil_div(R, QTILE), ceil_div(T, QTILE)), 256, bytes, stream()>>>(xq, xd, g.xs, g.wq, g.ws, g.wm,
                                                                                  res, y, T, R, n, ldy);
    return check_launch("gemm_quant_kernel");
}

// One matrix on gemm_quant_kernel (the routes and codes without a run GEMM below), chunk by chunk.
template <class Q, class D>
int gemm_quant(const int8_t* xq, const float* xd, const uint8_t* body, const uint8_t* head, float* y, const float* res,
               int rows, int T, int n, const GemmWork& g) {
    const int nb = n / Q::BV;
    size_t limit = 0;
    CMP_TRY(smem_limit(&limit));
    const int stages = smem::gemm_quant_plan(limit).config;   // 2, else 1 (sm_61); 0: the 1-stage error below
    // the launches' wave, and from it the rows per chunk (gemm_chunks.h)
    int wave = 0;
    CMP_TRY((stages == 2 ? gemm_quant_wave<Q::PER16, Q::MIN, D, 2>(&wave)
                         : gemm_quant_wave<Q::PER16, Q::MIN, D, 1>(&wave)));
    const int chunk = chunks::wave_chunk(rows, g.chunk, T, QTILE, QTILE, wave).rows;
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int R = std::min(chunk, rows - r0);
        CMP_TRY(expand_quant(Q::ID, body + (size_t)r0 * nb * Q::BODY, head + (size_t)r0 * nb * Q::HEAD, g.wq, g.ws,
                             g.wm, R, n));
        const auto run = stages == 2 ? launch_gemm_quant<Q::PER16, Q::MIN, D, 2>
                                    : launch_gemm_quant<Q::PER16, Q::MIN, D, 1>;
        CMP_TRY(run(xq, xd, g, res ? res + r0 : nullptr, y + r0, T, R, n, rows));
    }
    return CMP_OK;
}

// All `count` matrices as one run of rows (their rows one after another) through a GEMM that stores by GemmOut (the
// DP4A gemm_w16_kernel, the tensor-core GEMMs): each chunk of the run (gemm_chunks.h over all rows, `wave` blocks of
// QTILE rows x tok_tile tokens resident) is expanded into the workspace matrix by matrix, back to back, and
// multiplied by one launch(out, rows) whose GemmOut sends each matrix's rows to its own output. The GDN's z + beta +
// alpha of a Q4_K_M file (4096 + 32 + 32 rows) are then one wave at 512 tokens on an H200, not three.
template <class Q, class L>
int gemm_quant_run(int count, const void* const* body, const void* const* head, float* const* y,
                   const float* const* res, const int* rows, int T, int n, const GemmWork& g, int tok_tile, int wave,
                   L&& launch) {
    const int nb = n / Q::BV;
    int total = 0;
    for (int i = 0; i < count; ++i) total += rows[i];
    const int chunk = chunks::wave_chunk(total, g.chunk, T, QTILE, tok_tile, wave).rows;
    for (int c0 = 0; c0 < total; c0 += chunk) {
        const int c1 = std::min(c0 + chunk, total);
        GemmOut out{};
        for (int i = 0, s0 = 0; i < count; s0 += rows[i++]) {
            const int a = std::max(c0, s0), b = std::min(c1, s0 + rows[i]);   // run rows [a, b): matrix i's
            if (a >= b) continue;
            const int r0 = a - s0, k = out.count++;
            const size_t at = a - c0;                                         // their first workspace row
            CMP_TRY(expand_quant(Q::ID, static_cast<const uint8_t*>(body[i]) + (size_t)r0 * nb * Q::BODY,
                                 static_cast<const uint8_t*>(head[i]) + (size_t)r0 * nb * Q::HEAD, g.wq + at * n,
                                 g.ws + at * (n / 16), Q::MIN ? g.wm + at * (n / 16) : nullptr, b - a, n));
            out.y[k] = y[i] + r0;
            out.res[k] = res && res[i] ? res[i] + r0 : nullptr;
            out.ldy[k] = rows[i];
            out.end[k] = b - c0;
        }
        CMP_TRY(launch(out, c1 - c0));
    }
    return CMP_OK;
}

// The GEMMs' direct forms (a type's planes decoded in the stage loads: gemm_mma_direct, gemm_w16_direct) need of
// the workspace only the activation half sums (types with mins), computed here into its start: xs, else null.
template <class Q, class D>
int direct_half_sums(const int8_t* xq, const float* xd, int T, int n, void* work, size_t work_bytes, float** xs) {
    CMP_REQUIRE(work_bytes >= half_sums_bytes<Q>(T, n),
                "cmp_matmul_quant: a workspace of %zu bytes is too small for T=%d n=%d (need %zu)", work_bytes, T, n,
                half_sums_bytes<Q>(T, n));
    *xs = Q::MIN ? static_cast<float*>(work) : nullptr;
    if (Q::MIN) CMP_TRY(half_sums<D>(xq, xd, *xs, T, n));
    return CMP_OK;
}

// A call's `count` matrices' planes (body[i], head[i]) as one run's (gemm_out.cuh).
inline GemmPlanes run_planes(const void* const* body, const void* const* head, int count) {
    static_assert(QMAX_MATS <= GEMM_MAX_OUTS, "a call's matrices are one launch's outputs");
    GemmPlanes planes{};
    for (int i = 0; i < count; ++i) {
        planes.body[i] = static_cast<const uint8_t*>(body[i]);
        planes.head[i] = static_cast<const uint8_t*>(head[i]);
    }
    return planes;
}

// The tensor-core GEMM over a type it decodes itself (gemm_mma_planes: Q2_K, Q4_K, Q5_K on the int8 kernel):
// only the activation half sums (types with mins) in the workspace, then all `count` matrices as one run of rows in
// one launch, as matmul_q8.cu's Q8_0 run; no expansion and no chunks (the workspace's expanded part goes unused).
template <class Q, class D>
int gemm_mma_direct(const int8_t* xq, const float* xd, int count, const void* const* body, const void* const* head,
                    float* const* y, const float* const* res, const int* rows, int T, int n, void* work,
                    size_t work_bytes) {
    float* xs = nullptr;
    CMP_TRY((direct_half_sums<Q, D>(xq, xd, T, n, work, work_bytes, &xs)));
    const GemmOut out = run_out(y, res, rows, 0, count);
    return gemm_mma_planes(Q::ID, MmaOperands{xq, xd, xs, nullptr, nullptr, nullptr, out, T, out.end[count - 1], n},
                           run_planes(body, head, count));
}

// The DP4A GEMM's direct weight source (gemm_w16.cuh, W::DIRECT): a run's matrices of type Q as repacked; each
// (row, 32-value block) item of a stage loaded as Q::Raw (Q::load, through PlaneRow) and decoded by Q::decode,
// expand_kernel's own, so the stage holds the codes, scales and mins that the expansion would have written.
template <class Type>
struct W16Planes {
    using Q = Type;
    static constexpr bool MIN = Q::MIN, PER16 = Q::PER16, DIRECT = true;
    static_assert((Q::BV / 32) % W16_BK == 0, "a type's blocks fill whole stages: no K tail");
    using Row = PlaneRow<Q>;
    using Raw = typename Q::Raw;
    GemmPlanes planes;
    // launch row r's planes
    __device__ __forceinline__ Row row(const GemmOut& out, int r, int n) const { return Row::at(planes, out, r, n); }
    // block c of a row (c counts the row's 32-value blocks) as expand_kernel decodes it
    static __device__ __forceinline__ SubBlock decode(const Raw& raw, int c) {
        SubBlock sb;
        Q::decode(raw, (unsigned)c % (Q::BV / 32), sb);   // unsigned: a mask
        return sb;
    }
};

// The most tokens of a call at which the DP4A GEMM reads a type's planes (gemm_w16_direct), wherever
// gemm_w16_kernel runs; 0: always expanded. Measured against the expanded form in one pass (H100, 2026-12-06,
// bench_gemv.py --quant --gemm-all --gemm-ts on the 9B's three matrices, direct time against expanded at T = 512 /
// 1024 / 4096): Q4_K -5-7% / -2% / +-1%, Q2_K -2% / +1-3% / +4-5%, Q5_K -1-4% / -1 to +3% / +3-4%, Q6_K +3-5% /
// +5-8% / +7-9% (its decode, the heaviest, +7.9% instructions a stage). The expansion pass is a cost per matrix,
// the decode one per token tile, as on the mma route (matmul_mma.cu planes_max_tokens).
template <class Q>
constexpr int w16_planes_max_tokens() {
    return Q::ID == QID_Q4_K ? 4096 : Q::ID == QID_Q2_K || Q::ID == QID_Q5_K ? 512 : 0;
}

// Which form a GEMM call (T > 16) of type Q takes on route D: the tensor-core GEMM's direct form (mma), the DP4A
// GEMM's (w16.tok != 0: its shape), or neither (the weights expanded into the workspace first).
struct DirectForm {
    bool mma = false;
    W16Shape w16{};
    bool any() const { return mma || w16.tok != 0; }
};

template <class Q, class D>
int direct_form(int T, bool mma, bool mma_f16, DirectForm* f) {
    *f = DirectForm{};
    if (mma) return mma_planes_available(Q::ID, mma_f16, T, &f->mma);
    if constexpr (D::OPS == 1 && w16_planes_max_tokens<Q>() > 0)
        if (T <= w16_planes_max_tokens<Q>()) return gemm_w16_shape<W16Planes<Q>, D>(&f->w16);
    return CMP_OK;
}

// The DP4A GEMM over a type it reads from its planes (W16Planes), where gemm_w16_kernel runs (s: the direct
// kernel's shape): only the activation half sums in the workspace, then all `count` matrices as one run of rows in
// one launch (in serial pieces of K as the expanded form's launches); no expansion pass, no chunks.
template <class Q, class D>
int gemm_w16_direct(const int8_t* xq, const float* xd, int count, const void* const* body, const void* const* head,
                    float* const* y, const float* const* res, const int* rows, int T, int n, void* work,
                    size_t work_bytes, const W16Shape& s) {
    float* xs = nullptr;
    CMP_TRY((direct_half_sums<Q, D>(xq, xd, T, n, work, work_bytes, &xs)));
    return launch_gemm_w16<W16Planes<Q>, D>(xq, xd, xs, nullptr, W16Planes<Q>{run_planes(body, head, count)},
                                            run_out(y, res, rows, 0, count), T, n, s);
}

// The GEMV (1 <= T <= QGEMV_MAX_T) of `count` matrices as one launch.
template <class Q, class D>
int gemv_quant(const int8_t* xq, const float* xd, int count, const void* const* body, const void* const* head,
               float* const* y, const float* const* res, const int* rows, int T, int n) {
    QuantSet set{};
    for (int i = 0; i < count; ++i) {
        set.body[i] = static_cast<const uint8_t*>(body[i]);
        set.head[i] = static_cast<const uint8_t*>(head[i]);
        set.y[i] = y[i];
        set.res[i] = res ? res[i] : nullptr;
        set.rows[i] = rows[i];
        set.row_end[i] = set.total += rows[i];
    }
    set.count = count;   // group_end, groups: launch_gemv_shape (they depend on the shape's rows per warp)
    return gemv_quant_by_t<Q, D>(T, xq, xd, set, n, std::make_integer_sequence<int, QGEMV_MAX_T>{});
}

// D: the int8 dot of this call's path (the GEMV's route for T <= 16, else the GEMM's).
template <class Q, class D>
int matmul_quant(const int8_t* xq, const float* xd, int count, const void* const* body, const void* const* head,
                 float* const* y, const float* const* res, const int* rows, int T, int n, void* work,
                 size_t work_bytes, bool mma, bool mma_f16) {
    CMP_REQUIRE(n % Q::BV == 0, "cmp_matmul_quant: n=%d is not a multiple of the type's %d-value blocks", n, Q::BV);
    if (T <= QGEMV_MAX_T) return gemv_quant<Q, D>(xq, xd, count, body, head, y, res, rows, T, n);
    DirectForm form;
    CMP_TRY((direct_form<Q, D>(T, mma, mma_f16, &form)));
    if (form.mma) return gemm_mma_direct<Q, D>(xq, xd, count, body, head, y, res, rows, T, n, work, work_bytes);
    if constexpr (D::OPS == 1 && w16_planes_max_tokens<Q>() > 0)
        if (form.w16.tok)
            return gemm_w16_direct<Q, D>(xq, xd, count, body, head, y, res, rows, T, n, work, work_bytes, form.w16);
    // All the matrices in one run of rows on the tensor cores, and on DP4A through Q8_0's DP4A GEMM (gemm_w16.cuh)
    // wherever it runs; else matrix by matrix.
    using W = W16Expanded<Q::MIN, Q::PER16>;
    W16Shape w16s{};   // tok 0: gemm_w16_kernel does not run (or not on this route)
    if constexpr (D::OPS == 1)
        if (!mma) CMP_TRY((gemm_w16_shape<W, D>(&w16s)));
    const bool w16 = w16s.tok != 0;
    int max_rows = 0, total = 0;
    for (int i = 0; i < count; ++i) max_rows = std::max(max_rows, rows[i]), total += rows[i];
    const GemmWork g = split_work<Q>(work, work_bytes, T, n, w16 || mma ? total : max_rows);
    CMP_REQUIRE(g.chunk > 0, "cmp_matmul_quant: a workspace of %zu bytes is too small for T=%d n=%d (need %zu)",
                work_bytes, T, n, half_sums_bytes<Q>(T, n) + 3 * 256 + QTILE * expanded_row_bytes<Q>(n));
    if (Q::MIN) CMP_TRY(half_sums<D>(xq, xd, g.xs, T, n));
    int wave = 0;
    if (mma) {
        constexpr MmaScales form = Q::PER16 ? MMA_PER16 : MMA_PER32;
        CMP_TRY(gemm_mma_wave(form, Q::MIN, mma_f16, &wave));
        return gemm_quant_run<Q>(count, body, head, y, res, rows, T, n, g, QTILE, wave, [&](const GemmOut& out, int R) {
            return gemm_mma(form, Q::MIN, MmaOperands{xq, xd, g.xs, g.wq, g.ws, g.wm, out, T, R, n}, mma_f16);
        });
    }
    if constexpr (D::OPS == 1)
        if (w16)
            return gemm_quant_run<Q>(count, body, head, y, res, rows, T, n, g, w16s.tok, w16s.wave,
                                     [&](const GemmOut& out, int) {
                                         return launch_gemm_w16<W, D>(xq, xd, g.xs, g.wq, W{g.ws, g.wm}, out, T, n,
                                                                      w16s);
                                     });
    for (int i = 0; i < count; ++i)
        CMP_TRY((gemm_quant<Q, D>(xq, xd, static_cast<const uint8_t*>(body[i]), static_cast<const uint8_t*>(head[i]),
                                  y[i], res ? res[i] : nullptr, rows[i], T, n, g)));
    return CMP_OK;
}


// The body of matmul_quant_dot on route D (one instantiation per route's translation unit).
template <class D>
int matmul_quant_route(const QuantMatmul& m) {
    return dispatch_quant(m.type, "cmp_matmul_quant", [&](auto q) {
        return matmul_quant<decltype(q), D>(m.xq, m.xd, m.count, m.body, m.head, m.y, m.res, m.rows, m.T, m.n, m.work,
                                            m.work_bytes, m.mma, m.mma_f16);
    });
}

// The body of matmul_quant_work_dot on route D: the workspace matmul_quant needs to take m.rows[0] rows of m.type in
// one pass at m.T tokens (the pointers unused): none for the GEMV, the half sums alone where the GEMM reads the
// type's planes (direct_form), else the half sums, the expanded rows and their alignment.
template <class D>
int matmul_quant_work_route(const QuantMatmul& m, size_t* bytes) {
    return dispatch_quant(m.type, "cmp_quant_work_bytes", [&](auto q) -> int {
        using Q = decltype(q);
        *bytes = 0;
        if (m.T <= QGEMV_MAX_T) return CMP_OK;
        DirectForm form;
        CMP_TRY((direct_form<Q, D>(m.T, m.mma, m.mma_f16, &form)));
        const size_t tiles = ((size_t)m.rows[0] + QTILE - 1) / QTILE;
        *bytes = half_sums_bytes<Q>(m.T, m.n) + (form.any() ? 0 : 3 * 256 + tiles * QTILE * expanded_row_bytes<Q>(m.n));
        return CMP_OK;
    });
}

}  // namespace
}  // namespace cmp
