// The tensor-core route of the prefill projections (issue 20): y [T, R] = x [T, n] . W [R, n]^T over int8 codes,
// the integer dot of each 32-value block on the tensor cores (mma.sync s8: m16n8k32 on sm_80+, four m8n8k16 on
// sm_75; PER16 types take each 16-value half alone: m16n8k16 / two m8n8k16), then scaled and summed in fp32 with
// the arithmetic of the DP4A GEMMs (matmul_q8.cu gemm2, matmul_quant.cu gemm_quant), in the same block order, but
// for the mins: each min's term is one FFMA into the sum (PER32: the block's one min times the block's activation
// sum, rounded once), where the DP4A GEMM rounds the two halves' terms and subtracts them (last bits differ).
// Tiles of 128 weight rows x 128 tokens, 16 warps of 32 x 32 outputs; codes staged in shared memory by cp.async
// (sm_80+; plain loads on sm_75) in a ring of stages of WIDE_BK (or 2) blocks, read into fragments with ldmatrix;
// the scales go through registers, stored after the stage's math. The loop is issue-bound (one warp instruction
// per clock per scheduler), so the epilogue per output and block is kept to FP32 instructions that do work: Q8_0
// three (FADD of the biased dot, FMUL of the scales, FFMA; also PER32 without mins, whose bits then equal the DP4A
// route's: gemm_w16.cuh's block_term), PER32 with mins two (scaled_dot's FFMA takes the bias off, FFMA into the
// sum) plus the min's, PER16 four (plus two mins); the dots start from a magic bias (no integer-to-float add), rows
// past the edges read the last row (no row guards), and each thread's source pointers are set once.
// compute_70 and older builds have no kernel body here: gemm_mma hands their calls to Volta's f16 HMMA GEMM
// (matmul_hmma.cu), which refuses code below compute_70.
// The weights come expanded (matmul_quant.cu's expand_kernel writes int8 codes and f32 scales / mins per chunk of
// rows into a workspace first), or for Q2_K, Q4_K and Q5_K straight from their repacked planes (gemm_mma_planes,
// the "direct" form): a stage's 128 rows x BK blocks are one (row, block) item a thread (BK = 4; at BK = 2 the first
// half of the threads), its block loaded as the type's Raw (Q::load) where an expanded row's scale item would be
// loaded, before the stage's math, and decoded after it by expand_kernel's Q::decode into the codes and scale / min
// that cp.async and the scale item would have brought: the same tiles, so the same bits, without the expansion pass
// (1.25-1.5 bytes per value written and read back each ubatch: ~4.4% of a 27B Q4_K_M pp512 on an H100) or its
// chunked launches. Its price is in the loop (sm_90, nvcc 13.0, BK = 4, 4 stages: all instructions per stage,
// expanded -> direct): Q4_K 619 -> 632, Q5_K 619 -> 654, Q2_K 1112 -> 1141 (the decode; the Raw is held across the
// math in registers, 8 for Q4_K), and Q4_K, Q5_K reload 5-6 loop-invariant words from the stack per stage (20-24
// bytes spilled, where their expanded forms spill none). The pass is a fixed cost per matrix, the decode one per
// token tile: measured (H100, 2026-12-06, bench_gemv.py --quant --gemm-mma on the three 9B matrices, direct against
// expanded at T = 512 / 4096) Q4_K +15-20% / +0-2%, Q2_K +7-12% / +0-2%, Q5_K +8-13% / -5-7%, so each type reads its
// planes up to planes_max_tokens. Q6_K (779 -> 855, 32 bytes spilled) lost at both: -6-9% / -15-18% (the 9B Q6_K
// file's pp512 -7%), and stays expanded, as do Q3_K (779 -> 882) and IQ4_XS (594 -> 671) by its measure; the 32-value
// types would need a K tail.
// The main loop's SASS per 4-block stage (sm_90, nvcc 13.0, gemm_mma_kernel<SC, MIN, 4, 4>: tools/mma_sass.py),
// IMMA / FP32 (FFMA, FMUL, FADD) / LDS / all, before -> after issue 18's min rework (2026-12-02):
//   Q8_0                         32 / 384 / 35 /  600 -> 32 / 384 / 35 /  575  (18.8 -> 18.0 per IMMA)
//   PER32 (Q4_0, Q5_0, IQ4_*)    32 / 384 / 35 /  615 -> 32 / 272 / 35 /  472  (19.2 -> 14.8)
//     (since the DP4A route's block_term, 2026-12-03: Q8_0's form again, for the DP4A route's bits)
//   PER32 + MIN (Q4_K, Q5_K, ..) 32 / 768 / 99 / 1114 -> 32 / 401 / 35 /  621  (34.8 -> 19.4)
//   PER16 (Q6_K, Q3_K)           64 / 640 / 51 /  918 -> 64 / 528 / 51 /  765  (14.3 -> 12.0)
//   PER16 + MIN (Q2_K)           64 / 1024 / 115 / 1409 -> 64 / 784 / 115 / 1114  (22.0 -> 17.4)
// The Q4_K form had twice Q8_0's instructions (its GEMMs took 72.8 of a 9B Q4_K_M pp512's 100.3 ms of kernels on
// the H200): per output and block six FP32 (FADD, FMUL, FFMA as Q8_0, then FMUL + FFMA + FADD for the two half
// mins), and per block 16 more LDS a warp (each half's min and activation sum alone); now the min is one FFMA,
// the bias comes off in the scale's FFMA, a row's scale and min are one LDS.64, a token pair's scales and sums one
// LDS.128, and the scale loads no longer branch on whether an item is a row's or a token's (all forms: the Q8_0
// loop's 25 fewer). Registers 128 (the launch bound's cap) in every form; spills at BK = 4 24 -> 4 bytes (Q4_K).
#include "matmul_mma.cuh"
#include "quant_blocks.cuh"

namespace cmp {
namespace {

#ifndef CMP_MMA_WIDE_BK
#define CMP_MMA_WIDE_BK 4
#endif
constexpr int MT = 128;          // weight rows per block
constexpr int NT = 128;          // tokens per block
constexpr int WIDE_BK = CMP_MMA_WIDE_BK;  // 32-value blocks per stage where the shared memory allows (sm_80+)
constexpr int WARPS_M = 4, WARPS_N = 4;            // warps along the rows and the tokens of a tile
constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int WTM = MT / WARPS_M, WTN = NT / WARPS_N;  // a warp's rows and tokens: 32 x 32
constexpr int MI = WTM / 16, NI = WTN / 8;             // its m16 and n8 tiles
static_assert(MT == NT && NI % 2 == 0, "stage loads and B fragments assume this shape");

// Bytes per staged row of BK blocks: 16-byte aligned, an odd number of 16-byte groups, so the 8 rows of one
// ldmatrix phase start in 8 distinct bank groups (no conflicts).
__host__ __device__ constexpr int row_bytes(int BK) { return BK * 32 + 16; }

// The scales are stored [block][row] so that a thread's two tokens (2t, 2t + 1) are one 8-byte load.
template <int SC, bool MIN, int BK, bool PACKED = SC == MMA_PER32 && MIN>
struct __align__(16) MmaStage {
    int8_t w[MT][row_bytes(BK)];
    int8_t x[NT][row_bytes(BK)];
    float ws[SC == MMA_PER16 ? 2 * BK : BK][MT];   // weight scale per block (per half for PER16)
    float wm[MIN ? 2 * BK : 1][MT];                // weight min per half (with mins: PER16, else PACKED below)
    float xd[BK][NT];                              // activation scale per block
    float xs[MIN ? 2 * BK : 1][NT];                // activation half sum times scale
};

// PER32 types with mins (Q4_K, Q5_K, Q4_1, Q5_1) have one min per block (expand_kernel writes the same min in both
// halves: quant_blocks.cuh), so the stage holds it once, and the activation's block sum (the two half sums added)
// once; a row's scale and min lie side by side (one 8-byte load), and so do a token pair's scales and sums (one
// 16-byte load).
template <int SC, bool MIN, int BK>
struct __align__(16) MmaStage<SC, MIN, BK, true> {
    int8_t w[MT][row_bytes(BK)];
    int8_t x[NT][row_bytes(BK)];
    float2 wp[BK][MT];        // {scale, min} per block and row
    float4 xp[BK][NT / 2];    // {scale 2p, scale 2p + 1, sum 2p, sum 2p + 1} per block and token pair p
};

// The integer dots start from MAGIC instead of 0: the float with MAGIC's bits is 1.5 * 2^23, whose unit in the last
// place is 1, so for |dot| < 2^22 the bits MAGIC + dot are the float 1.5 * 2^23 + dot exactly, and one FADD gives
// the dot as float (the DP4A GEMMs' i2f, without its integer add).
constexpr int MAGIC = 0x4B400000;
__device__ __forceinline__ float dot_f32(int biased) { return __int_as_float(biased) - 12582912.f; }
// s * dot rounded once, as __fmul_rn(s, dot_f32(biased)), in one FFMA: c = s * -12582912 is exact (3 * 2^22 times a
// scale of at most 21 significant bits; every expanded type's is an f16 times an integer below 2^8: 19), so the FMA
// computes s * (1.5 * 2^23 + dot) - s * 1.5 * 2^23 = s * dot exactly before its one rounding.
__device__ __forceinline__ float scaled_dot(int biased, float s, float c) {
    return __fmaf_rn(__int_as_float(biased), s, c);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
// Four 8x8 b16 matrices from shared memory: lanes 8i..8i+7 give the row addresses of matrix i, which lands in r[i]
// (lane l holds row l/4, bytes 4(l%4)..+3 of each).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], unsigned s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

#if __CUDA_ARCH__ < 800
// sm_75: d (row g, tokens 2t, 2t+1) += a (row g, k 4t..4t+3) . b (token g, k 4t..4t+3), 8x8x16.
__device__ __forceinline__ void mma8(int& d0, int& d1, uint32_t a, uint32_t b) {
    asm("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
        : "+r"(d0), "+r"(d1)
        : "r"(a), "r"(b));
}
#endif

// d [16 rows x 8 tokens] = MAGIC + a [16 x 32] . b [32 x 8], in the m16n8k32 fragment layouts: a = ldmatrix of
// rows 0-7 / 8-15 x bytes 0-15 / 16-31 (a[0] a[1] a[2] a[3]), b = tokens x bytes 0-15 / 16-31; d[0..1] row g,
// d[2..3] row g + 8, tokens 2t, 2t + 1 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MAGIC));
#else
    d[0] = d[1] = d[2] = d[3] = MAGIC;
    mma8(d[0], d[1], a[0], b0);
    mma8(d[0], d[1], a[2], b1);
    mma8(d[2], d[3], a[1], b0);
    mma8(d[2], d[3], a[3], b1);
#endif
}

// The same over one 16-value half: a0 = rows 0-7, a1 = rows 8-15 of the half's bytes, b = its tokens' bytes.
__device__ __forceinline__ void mma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(MAGIC));
#else
    d[0] = d[1] = d[2] = d[3] = MAGIC;
    mma8(d[0], d[1], a0, b);
    mma8(d[2], d[3], a1, b);
#endif
}
#endif  // __CUDA_ARCH__ >= 750

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait_pending() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// One (row or token, block) of a stage's scales: a weight row's scale(s) and min halves, or a token's scale and
// half sums.
struct ScaleItem {
    float a, b, c, d;
};

// The kernel's weight source where it is not a quant type: codes and scales as expanded (MmaOperands.wq, ws, wm).
struct Expanded {
    struct Raw {};
};

// Q: Expanded (the weights' codes and scales from op), or the quant type whose planes it reads (gemm_mma_planes;
// SC and MIN then its form, planes its matrices' planes).
template <int SC, bool MIN, int BK, int STAGES, class Q>
__global__ void __launch_bounds__(THREADS, 1) gemm_mma_kernel(const MmaOperands op, const GemmPlanes planes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    using Stage = MmaStage<SC, MIN, BK>;
    using Raw = typename Q::Raw;
    constexpr bool PACKED = SC == MMA_PER32 && MIN;
    constexpr bool DIRECT = !std::is_same_v<Q, Expanded>;
    constexpr int KS = row_bytes(BK);
    constexpr int ROW_CHUNKS = BK * 2;                          // 16-byte chunks of one staged row
    constexpr int CODE_PER_THREAD = MT * ROW_CHUNKS / THREADS;  // chunks of each operand a thread copies per stage
    constexpr int SCALE_PER_THREAD = 2 * MT * BK / THREADS;     // (row, block) of W, then (token, block) of x
    static_assert(MT * ROW_CHUNKS % THREADS == 0 && 2 * MT * BK % THREADS == 0, "whole loads per thread");
    // Direct: the weight items are thread tid's item 0 (tid < MT * BK: every thread at BK = 4, half at BK = 2).
    static_assert(!DIRECT || (MT * BK <= THREADS && (MT * BK) % 32 == 0), "direct: one weight item per thread");
    extern __shared__ __align__(16) unsigned char mma_smem[];
    Stage* st = reinterpret_cast<Stage*>(mma_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wr = (warp % WARPS_M) * WTM, wt = (warp / WARPS_M) * WTN;  // the warp's first row and token
    const int g = lane >> 2, tq = lane & 3;
    const int row0 = blockIdx.x * MT, tok0 = blockIdx.y * NT;
    const int nsub = op.n / 32, nh = op.n / 16, nk = (nsub + BK - 1) / BK;

    // This thread's code copies: chunk q of rows cr + j * (THREADS / ROW_CHUNKS). Rows past R or T read the last
    // row instead (their outputs are never stored), so only the K tail needs a guard.
    const int q = tid % ROW_CHUNKS, cr = tid / ROW_CHUNKS;
    const int8_t* wsrc[CODE_PER_THREAD];
    const int8_t* xsrc[CODE_PER_THREAD];
#pragma unroll
    for (int j = 0; j < CODE_PER_THREAD; ++j) {
        const int r = cr + j * (THREADS / ROW_CHUNKS);
        if constexpr (!DIRECT) wsrc[j] = op.wq + (size_t)min(row0 + r, op.R - 1) * op.n + q * 16;
        xsrc[j] = op.xq + (size_t)min(tok0 + r, max(op.T - 1, 0)) * op.n + q * 16;
    }
    auto fetch_codes = [&](int s, Stage& b) {
        const int col = s * BK * 32;
        const bool ok = col + q * 16 < op.n;
#pragma unroll
        for (int j = 0; j < CODE_PER_THREAD; ++j) {
            const int r = cr + j * (THREADS / ROW_CHUNKS);
            if constexpr (!DIRECT) copy16(reinterpret_cast<int*>(&b.w[r][q * 16]), ok ? wsrc[j] + col : op.wq, ok);
            copy16(reinterpret_cast<int*>(&b.x[r][q * 16]), ok ? xsrc[j] + col : op.xq, ok);
        }
    };
    // Scale item i: i < MT * BK a weight row's (r, k) = (i / BK, i % BK), else a token's (consecutive threads read
    // consecutive blocks of one row). is_w(j): whether a thread's item j is a weight row's, a constant where the
    // weight items fill whole rounds of the threads (BK = 4: item 0 weights, item 1 tokens; no branch on it).
    auto is_w = [&](int j) {
        return (MT * BK) % THREADS == 0 ? j * THREADS < MT * BK : tid + j * THREADS < MT * BK;
    };
    auto load_item = [&](int s, int i, bool w) {
        ScaleItem v{0.f, 0.f, 0.f, 0.f};
        const int r = (w ? i : i - MT * BK) / BK, blk = s * BK + (i % BK);
        if (blk >= nsub) return v;
        if (w) {
            const size_t row = (size_t)min(row0 + r, op.R - 1);
            if (SC == MMA_Q8) {
                v.a = __half2float(static_cast<const __half*>(op.ws)[row * nsub + blk]);
            } else {
                const float2 s2 = reinterpret_cast<const float2*>(static_cast<const float*>(op.ws) + row * nh)[blk];
                v.a = s2.x;
                v.b = s2.y;
            }
            if (MIN) {
                const float2 m2 = reinterpret_cast<const float2*>(op.wm + row * nh)[blk];
                v.c = m2.x;   // PACKED: m2.y == m2.x
                v.d = m2.y;
            }
        } else {
            const size_t tok = (size_t)min(tok0 + r, op.T - 1);
            v.a = op.xd[tok * nsub + blk];
            if (MIN) {
                // PACKED: the block's sum xd * (S0 + S1), exact as each half's is (an f16-precision scale times a
                // 12-bit integer), so the min term below rounds once where the halves' form rounds three times.
                const float2 e2 = reinterpret_cast<const float2*>(op.xs + tok * nh)[blk];
                v.b = PACKED ? e2.x + e2.y : e2.x;
                v.c = e2.y;
            }
        }
        return v;
    };
    auto store_item = [&](Stage& b, int i, bool w, const ScaleItem& v) {
        const int r = (w ? i : i - MT * BK) / BK, k = i % BK;
        if constexpr (PACKED) {
            if (w) {
                b.wp[k][r] = float2{v.a, v.c};
            } else {
                float* p = reinterpret_cast<float*>(&b.xp[k][r >> 1]) + (r & 1);
                p[0] = v.a;
                p[2] = v.b;
            }
        } else if (w) {
            if (SC == MMA_PER16) {
                b.ws[2 * k][r] = v.a;
                b.ws[2 * k + 1][r] = v.b;
            } else {
                b.ws[k][r] = v.a;
            }
            if (MIN) {
                b.wm[2 * k][r] = v.c;
                b.wm[2 * k + 1][r] = v.d;
            }
        } else {
            b.xd[k][r] = v.a;
            if (MIN) {
                b.xs[2 * k][r] = v.b;
                b.xs[2 * k + 1][r] = v.c;
            }
        }
    };
    // Direct: this thread's weight item (row wrow, block wk of each stage), its planes found once (rows past R read
    // the last row). Its block is loaded as the type's Raw where an expanded item's scales would be, and decoded
    // after the stage's math by expand_kernel's decode: its codes go where fetch_codes would have copied the
    // expanded ones, its scale and min through store_item as load_item would have read them (the same bits).
    const bool has_w = MT * BK == THREADS || tid < MT * BK;
    const int wrow = tid / BK, wk = tid % BK;
    PlaneRow<Q> wplane{};
    if constexpr (DIRECT) wplane = PlaneRow<Q>::at(planes, op.out, min(row0 + wrow, op.R - 1), op.n);
    auto store_weight = [&](Stage& b, int s, const Raw& raw) {
        if constexpr (DIRECT) {
            // no K tail: n is a multiple of Q::BV (gemm_mma_planes), so a row's blocks fill whole stages
            static_assert((Q::BV / 32) % BK == 0, "direct: a type's blocks fill whole stages");
            SubBlock sb;
            Q::decode(raw, (unsigned)(s * BK + wk) % (Q::BV / 32), sb);   // unsigned: a mask
            int4* dst = reinterpret_cast<int4*>(&b.w[wrow][wk * 32]);
            dst[0] = make_int4(sb.q[0], sb.q[1], sb.q[2], sb.q[3]);
            dst[1] = make_int4(sb.q[4], sb.q[5], sb.q[6], sb.q[7]);
            store_item(b, tid, true, ScaleItem{sb.s[0], sb.s[1], sb.m[0], sb.m[1]});
        }
    };

    // A stage's register-borne items: its scale items (direct: the tokens' only) and the direct weight item's Raw.
    using Scales = ScaleItem[SCALE_PER_THREAD];
    auto load_scales = [&](int s, Scales& v, Raw& raw) {
        if constexpr (DIRECT)
            if (has_w) raw = wplane.load(s * BK + wk);
#pragma unroll
        for (int j = 0; j < SCALE_PER_THREAD; ++j)
            if (!DIRECT || !is_w(j)) v[j] = load_item(s, tid + j * THREADS, is_w(j));
    };
    auto store_scales = [&](Stage& b, int s, const Scales& v, const Raw& raw) {
        if constexpr (DIRECT)
            if (has_w) store_weight(b, s, raw);
#pragma unroll
        for (int j = 0; j < SCALE_PER_THREAD; ++j)
            if (!DIRECT || !is_w(j)) store_item(b, tid + j * THREADS, is_w(j), v[j]);
    };

    float acc[MI][NI][4];  // [row tile mi][token tile ni][fragment element]
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    // ldmatrix row addresses of this lane within a stage (shared-window offsets), per operand.
    const unsigned smem0 = (unsigned)__cvta_generic_to_shared(mma_smem);
    const unsigned a_off = (unsigned)((wr + (lane & 15)) * KS + (lane >> 4) * 16);
    const unsigned b_off = (unsigned)(MT * KS + (wt + (lane & 7) + ((lane >> 4) << 3)) * KS + ((lane >> 3) & 1) * 16);

    // One stage's math: per block kb, per 16-row tile mi and 8-token tile ni, the integer dots on the tensor core,
    // then per output the DP4A GEMMs' fp32 expression.
    auto compute = [&](const Stage& b, unsigned base) {
#pragma unroll
        for (int kb = 0; kb < BK; ++kb) {
            uint32_t bf[NI][2];  // [ni][bytes 0-15 / 16-31]
#pragma unroll
            for (int nj = 0; nj < NI / 2; ++nj) {
                uint32_t r[4];
                ldmatrix_x4(r, base + b_off + nj * 16 * KS + kb * 32);
                bf[2 * nj][0] = r[0];
                bf[2 * nj][1] = r[1];
                bf[2 * nj + 1][0] = r[2];
                bf[2 * nj + 1][1] = r[3];
            }
            float2 sx[NI], e0[NI], e1[NI];  // [ni] tokens 2t, 2t + 1: scales, sums (PACKED: the block's)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                const int t = wt + ni * 8 + 2 * tq;
                if constexpr (PACKED) {
                    const float4 p = b.xp[kb][t >> 1];
                    sx[ni] = float2{p.x, p.y};
                    e0[ni] = float2{p.z, p.w};
                    e1[ni] = float2{0.f, 0.f};
                } else {
                    sx[ni] = *reinterpret_cast<const float2*>(&b.xd[kb][t]);
                    e0[ni] = MIN ? *reinterpret_cast<const float2*>(&b.xs[2 * kb][t]) : float2{0.f, 0.f};
                    e1[ni] = MIN ? *reinterpret_cast<const float2*>(&b.xs[2 * kb + 1][t]) : float2{0.f, 0.f};
                }
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                uint32_t a[4];
                ldmatrix_x4(a, base + a_off + mi * 16 * KS + kb * 32);
                // [row g / g + 8]: scales, mins (PACKED: the block's one min) and the scales times -MAGIC's float
                // (c0, c1: scaled_dot)
                float s0[2], s1[2], c0[2], c1[2], m0[2], m1[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = wr + mi * 16 + g + 8 * h;
                    if constexpr (PACKED) {
                        const float2 p = b.wp[kb][r];
                        s0[h] = p.x;
                        m0[h] = p.y;
                        s1[h] = m1[h] = 0.f;
                    } else {
                        s0[h] = SC == MMA_PER16 ? b.ws[2 * kb][r] : b.ws[kb][r];
                        s1[h] = SC == MMA_PER16 ? b.ws[2 * kb + 1][r] : 0.f;
                        m0[h] = MIN ? b.wm[2 * kb][r] : 0.f;
                        m1[h] = MIN ? b.wm[2 * kb + 1][r] : 0.f;
                    }
                    c0[h] = __fmul_rn(s0[h], -12582912.f);
                    c1[h] = __fmul_rn(s1[h], -12582912.f);
                }
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                    int d0[4], d1[4];
                    if (SC == MMA_PER16) {
                        mma_k16(d0, a[0], a[1], bf[ni][0]);
                        mma_k16(d1, a[2], a[3], bf[ni][1]);
                    } else {
                        mma_k32(d0, a, bf[ni][0], bf[ni][1]);
                    }
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int h = e >> 1;
                        const float sxj = e & 1 ? sx[ni].y : sx[ni].x, e0j = e & 1 ? e0[ni].y : e0[ni].x;
                        float& o = acc[mi][ni][e];
                        if (SC == MMA_Q8 || (SC == MMA_PER32 && !MIN)) {
                            // without mins, the DP4A GEMMs' block_term (gemm_w16.cuh): the dot times the product
                            // of the scales, so these forms give the DP4A route's bits
                            o = __fmaf_rn(dot_f32(d0[e]), __fmul_rn(s0[h], sxj), o);
                        } else {
                            // s0 * dot (PER16: + s1 * dot1) with the bits of the DP4A GEMM's expression, the
                            // magic bias taken off by the FMA's addend rather than an FADD per dot
                            const float v = SC == MMA_PER16
                                ? __fmaf_rn(s0[h], dot_f32(d0[e]), scaled_dot(d1[e], s1[h], c1[h]))
                                : scaled_dot(d0[e], s0[h], c0[h]);
                            o = __fmaf_rn(v, sxj, o);
                            // the min term: one FFMA per value and min into the sum (PER32: the block's one min)
                            if (MIN) o = __fmaf_rn(-m0[h], e0j, o);
                            if (MIN && SC == MMA_PER16) o = __fmaf_rn(-m1[h], e & 1 ? e1[ni].y : e1[ni].x, o);
                        }
                    }
                }
            }
        }
    };

    // The ring: stage s lives in slot s % STAGES. A slot is refilled at the top of the iteration after the one that
    // read it (the barrier in between), its codes by cp.async and its scales (direct: and its weight codes) stored
    // after this iteration's math; either way before the barrier that opens the slot's own iteration.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) {
            fetch_codes(s, st[s]);
            Scales v;
            Raw raw;
            load_scales(s, v, raw);
            store_scales(st[s], s, v, raw);
        }
        cp_async_commit();
    }
    int slot = 0;  // kt % STAGES
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait_pending<STAGES - 2>();
        __syncthreads();
        const int f = kt + STAGES - 1, fslot = slot == 0 ? STAGES - 1 : slot - 1;  // f % STAGES
        Scales v;
        Raw raw;
        if (f < nk) {
            fetch_codes(f, st[fslot]);
            load_scales(f, v, raw);
        }
        cp_async_commit();
        compute(st[slot], smem0 + slot * (unsigned)sizeof(Stage));
        if (f < nk) store_scales(st[fslot], f, v, raw);
        slot = slot == STAGES - 1 ? 0 : slot + 1;
    }

    // fragment element e: row g + 8 (e >> 1), token 2 tq + (e & 1)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + wr + mi * 16 + g + 8 * h;
            if (r >= op.R) continue;
            const RowOut o = row_out(op.out, r);
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int t = tok0 + wt + ni * 8 + 2 * tq + e;
                    if (t < op.T) o.store(t, acc[mi][ni][2 * h + e]);
                }
        }
#endif  // __CUDA_ARCH__ >= 750
}

template <int SC, bool MIN, int BK, int STAGES, class Q>
int launch_stages(const MmaOperands& op, const GemmPlanes& planes) {
    constexpr int smem = STAGES * (int)sizeof(MmaStage<SC, MIN, BK>);
    constexpr auto kernel = gemm_mma_kernel<SC, MIN, BK, STAGES, Q>;
    CMP_TRY(smem_opt_in("gemm_mma_kernel", kernel, smem));
    kernel<<<dim3(ceil_div(op.R, MT), ceil_div(op.T, NT)), THREADS, smem, stream()>>>(op, planes);
    return check_launch("gemm_mma_kernel");
}

// The deepest ring the device's shared memory per block allows: 4 or 3 stages of WIDE_BK blocks (sm_90: 227 KB,
// sm_80: 163 KB; fewer barriers per block), else 4 or 2 stages of 2 blocks (sm_86/89: 99 KB; sm_75: 64 KB). Calls
// f(BK, STAGES) with both as std::integral_constant.
template <int SC, bool MIN, class F>
int with_form(F&& f) {
    using std::integral_constant;
    size_t have = 0;                    // the device's shared memory per block (or the tests' cap)
    CMP_TRY(smem_limit(&have));
    const size_t wide = sizeof(MmaStage<SC, MIN, WIDE_BK>), narrow = sizeof(MmaStage<SC, MIN, 2>);
    if (have >= 4 * wide) return f(integral_constant<int, WIDE_BK>{}, integral_constant<int, 4>{});
    if (have >= 3 * wide) return f(integral_constant<int, WIDE_BK>{}, integral_constant<int, 3>{});
    if (have >= 4 * narrow) return f(integral_constant<int, 2>{}, integral_constant<int, 4>{});
    return f(integral_constant<int, 2>{}, integral_constant<int, 2>{});   // below 2 stages: smem_opt_in says so
}

template <int SC, bool MIN, class Q = Expanded>
int launch_form(const MmaOperands& op, const GemmPlanes& planes = {}) {
    return with_form<SC, MIN>([&](auto bk, auto st) {
        return launch_stages<SC, MIN, decltype(bk)::value, decltype(st)::value, Q>(op, planes);
    });
}

// f(Q{}) for the types whose planes the kernel reads (the K-quants of the large models' prefill; each costs its
// four forms' instantiations per arch), other() for the rest.
template <class F, class G>
int with_planes_type(int type, F&& f, G&& other) {
    switch (type) {
        case QID_Q2_K: return f(Q2_K{});
        case QID_Q4_K: return f(Q4_K{});
        case QID_Q5_K: return f(Q5_K{});
        default: return other();
    }
}

template <int SC, bool MIN>
int form_wave(int* blocks) {
    return with_form<SC, MIN>([&](auto bk, auto st) {
        constexpr int BK = decltype(bk)::value, STAGES = decltype(st)::value;
        constexpr int smem = STAGES * (int)sizeof(MmaStage<SC, MIN, BK>);
        return wave_blocks("gemm_mma_kernel", gemm_mma_kernel<SC, MIN, BK, STAGES, Expanded>, THREADS, smem, blocks);
    });
}

PerDevice g_mma_code;   // mma_int8_available

}  // namespace

// A compute_70 build (or its PTX JIT-compiled on a newer GPU) has the int8 kernels empty.
int mma_int8_available(bool* yes) {
    return code_at_least(gemm_mma_kernel<MMA_Q8, false, 2, 2, Expanded>, 75, g_mma_code, yes);
}

int gemm_mma(MmaScales scales, bool mins, const MmaOperands& op, bool f16) {
    CMP_REQUIRE(op.T >= 0 && op.R > 0 && op.n > 0 && op.n % 32 == 0, "gemm_mma: bad shape T=%d R=%d n=%d", op.T, op.R,
                op.n);
    bool ok = false;
    CMP_TRY(mma_int8_available(&ok));
    if (f16 || !ok) return gemm_hmma(scales, mins, op);   // Volta's code (compute_70), or asked for
    if (op.T == 0) return CMP_OK;
    return dispatch_scales(scales, mins, "gemm_mma", [&](auto sc, auto min) {
        return launch_form<decltype(sc)::value, decltype(min)::value>(op);
    });
}

// The most tokens of a call at which reading a type's planes beats expanding them (the header's measure: lines of
// time against T through its two points cross at ~4600-8500 tokens for Q4_K and Q2_K, ~1000-1450 for Q5_K).
static int planes_max_tokens(int type) { return type == QID_Q5_K ? 1024 : 4096; }

int mma_planes_available(int type, bool f16, int T, bool* yes) {
    bool ok = false;
    CMP_TRY(mma_int8_available(&ok));
    const bool decodes = with_planes_type(type, [](auto) { return 1; }, [] { return 0; });
    *yes = ok && !f16 && decodes && T <= planes_max_tokens(type);
    return CMP_OK;
}

int gemm_mma_planes(int type, const MmaOperands& op, const GemmPlanes& planes) {
    CMP_REQUIRE(op.T >= 0 && op.R > 0 && op.n > 0 && op.out.count >= 1 && op.out.count <= GEMM_MAX_OUTS &&
                    op.out.end[op.out.count - 1] == op.R,
                "gemm_mma_planes: bad shape T=%d R=%d n=%d (%d matrices)", op.T, op.R, op.n, op.out.count);
    bool int8 = false;
    CMP_TRY(mma_int8_available(&int8));
    CMP_REQUIRE(int8, "gemm_mma_planes: this device's code has no int8 mma kernel (compute_75+)");
    if (op.T == 0) return CMP_OK;
    return with_planes_type(
        type,
        [&](auto q) -> int {
            using Q = decltype(q);
            CMP_REQUIRE(op.n % Q::BV == 0, "gemm_mma_planes: n=%d is not a multiple of %d", op.n, Q::BV);
            return launch_form<Q::PER16 ? MMA_PER16 : MMA_PER32, Q::MIN, Q>(op, planes);
        },
        [&] { return fail(CMP_ERR_ARG, "gemm_mma_planes: type %d is multiplied expanded, not read directly", type); });
}

int gemm_mma_wave(MmaScales scales, bool mins, bool f16, int* blocks) {
    bool ok = false;
    CMP_TRY(mma_int8_available(&ok));
    if (f16 || !ok) return gemm_hmma_wave(scales, mins, blocks);
    return dispatch_scales(scales, mins, "gemm_mma_wave", [&](auto sc, auto min) {
        return form_wave<decltype(sc)::value, decltype(min)::value>(blocks);
    });
}

}  // namespace cmp

using namespace cmp;

extern "C" int cmp_mma_int8_available(int* yes) {
    bool ok = false;
    CMP_TRY(mma_int8_available(&ok));
    *yes = ok ? 1 : 0;
    return CMP_OK;
}

extern "C" int cmp_mma_available(int* yes) {
    bool int8 = false, f16 = false;
    CMP_TRY(mma_int8_available(&int8));
    CMP_TRY(hmma_available(&f16));
    *yes = int8 || f16 ? 1 : 0;
    return CMP_OK;
}
