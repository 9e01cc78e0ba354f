// The DP4A GEMM of int8 codes in 32-value blocks with an activation scale per block: Q8_0 (matmul_q8.cu, weights
// repacked: f16 scale per block) and every expanded block type (matmul_quant.cuh's workspace: an f32 scale and min
// per 16 values): those with one scale (and min) per 32 values, held in both halves (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
// Q4_K, Q5_K, IQ4_XS), and the PER16 ones with one per 16 (Q6_K, Q3_K; Q2_K with mins); Q2_K, Q4_K and Q5_K
// it reads unexpanded up to a number of tokens a call, from their repacked planes (the direct form:
// gemm_w16_kernel's header). One kernel source for all; each including translation unit instantiates its own
// (internal linkage). block_term (per 32) and block_term16
// (PER16) are the arithmetic per output and block that every DP4A GEMM of such weights adds, this one and
// gemm_quant_kernel (where this one does not run: DP2A / IMAD routes, code older than compute_80, sm_75's shared
// memory with mins, sm_61's), so the outputs have the same bits whichever runs.
#pragma once
#include <type_traits>

#include <algorithm>

#include "common.cuh"
#include "gemm_chunks.h"
#include "gemm_out.cuh"
#include "serial_pieces.cuh"
#include "smem_plan.h"

namespace cmp {
namespace {

// One 32-value block's term of an output: the block's exact integer dot d as float times (weight scale times
// activation scale) added to acc, then with mins less the weight min m times e (the activation block's code sum
// times its scale: exact, an f16's 11 bits times an integer below 2^12). Each rounding explicit, in this order.
template <bool MIN>
__device__ __forceinline__ float block_term(float acc, int d, float sw, float sx, float m, float e) {
    acc = __fmaf_rn(chain_to_f32(d), __fmul_rn(sw, sx), acc);
    return MIN ? __fmaf_rn(-m, e, acc) : acc;
}

// The term of a PER16 block (a scale, and min, per 16 values: Q6_K, Q3_K, Q2_K expanded), the arithmetic
// gemm_quant_kernel has always added for them: each half's exact dot d0, d1 (two chains of 16 codes) as float times
// its half's scale s0, s1, summed, times the activation scale sx, added to acc; with mins less m0 e0 + m1 e1 (e0, e1:
// the activation halves' code sums times its scale). Written as that kernel wrote it (the build's --use_fast_math
// leaves nothing here to contract: each product feeds an fmaf's addend or a subtraction), so both kernels' outputs
// have the same bits.
template <bool MIN>
__device__ __forceinline__ float block_term16(float acc, int d0, int d1, float s0, float s1, float sx, float m0,
                                              float m1, float e0, float e1) {
    acc = fmaf(fmaf(s0, chain_to_f32(d0), s1 * chain_to_f32(d1)), sx, acc);
    return MIN ? acc - fmaf(m0, e0, m1 * e1) : acc;
}

// The weights' scales as gemm_w16_kernel reads them, by flat block index row * (n / 32) + block, beside their codes
// (its wq); DIRECT: the other kind of source, a type's planes (W16Planes, matmul_quant.cuh).
struct W16Q8 {                 // Q8_0 repacked
    static constexpr bool MIN = false, PER16 = false, DIRECT = false;
    const __half* d;           // [rows, n/32]
    __device__ __forceinline__ float scale(int i) const { return __half2float(d[i]); }
    __device__ __forceinline__ float min(int) const { return 0.f; }
};
// An expanded type (matmul_quant.cuh's workspace). Without PER16 both halves of a block hold its scale (and min),
// read once (scale, min); PER16 reads both (scales, mins: the first half's in x).
template <bool M, bool P16>
struct W16Expanded {
    static constexpr bool MIN = M, PER16 = P16, DIRECT = false;
    const float* s;            // [rows, n/16]
    const float* m;            // [rows, n/16] (MIN)
    __device__ __forceinline__ float scale(int i) const { return s[2 * i]; }
    __device__ __forceinline__ float min(int i) const { return MIN ? m[2 * i] : 0.f; }
    __device__ __forceinline__ float2 scales(int i) const { return reinterpret_cast<const float2*>(s)[i]; }
    __device__ __forceinline__ float2 mins(int i) const {
        return MIN ? reinterpret_cast<const float2*>(m)[i] : make_float2(0.f, 0.f);
    }
};

// A direct source's per-thread items (W::DIRECT): a weight row's planes, found once (Row), and a block as loaded
// (Raw); empty for the sources whose codes come staged in wq.
template <class W, bool = W::DIRECT>
struct W16Items {
    struct Row {};
    struct Raw {};
};
template <class W>
struct W16Items<W, true> {
    using Row = typename W::Row;
    using Raw = typename W::Raw;
};

// A thread's outputs of its tile, as store_tile (common.cuh) visits them: f(o, i, j, t) for row r0 + RS i < rows and
// token t = t0 + TS j < T, o the row's destination (gemm_out.cuh; its matrix found once per row, after the loop).
template <int TS, int RS, int I, int J, class F>
__device__ __forceinline__ void each_output(int t0, int T, int r0, int rows, const GemmOut& out, F&& f) {
#pragma unroll
    for (int i = 0; i < I; ++i) {
        const int r = r0 + RS * i;
        if (r >= rows) continue;   // (a row or token past the end: its sums are never stored nor used)
        const RowOut o = row_out(out, r);
#pragma unroll
        for (int j = 0; j < J; ++j)
            if (t0 + TS * j < T) f(o, i, j, t0 + TS * j);
    }
}

// The outputs, residual added; a tile's partial sums parked in them and taken up again (serial pieces, below).
template <int TS, int RS, int I, int J>
__device__ __forceinline__ void store_rows(const float (&acc)[I][J], int t0, int T, int r0, int rows,
                                           const GemmOut& out) {
    each_output<TS, RS, I, J>(t0, T, r0, rows, out,
                              [&](const RowOut& o, int i, int j, int t) { o.store(t, acc[i][j]); });
}
template <int TS, int RS, int I, int J>
__device__ __forceinline__ void park_rows(const float (&acc)[I][J], int t0, int T, int r0, int rows,
                                          const GemmOut& out) {
    each_output<TS, RS, I, J>(t0, T, r0, rows, out,
                              [&](const RowOut& o, int i, int j, int t) { o.park(t, acc[i][j]); });
}
template <int TS, int RS, int I, int J>
__device__ __forceinline__ void unpark_rows(float (&acc)[I][J], int t0, int T, int r0, int rows, const GemmOut& out) {
    each_output<TS, RS, I, J>(t0, T, r0, rows, out,
                              [&](const RowOut& o, int i, int j, int t) { acc[i][j] = o.unpark(t); });
}

// Serial pieces of K (serial_pieces.cuh): a unit of piece p > 0 takes up the partial sums its tile's piece p - 1
// parked in the tile's outputs, runs its stages and parks its sums for the next (or stores the outputs with the
// residual).

// The tile: G2TILE = 128 weight rows x TOK tokens (64 or 128: smem::gemm_w16_plan), 4 TOK threads of 4 rows x 8
// tokens each. Its stage by the weights' scales (smem_plan.h).
template <bool MIN, bool PER16, int BK, int TOK>
using W16Stage = std::conditional_t<
    PER16, std::conditional_t<MIN, smem::G2Per16MinStage<BK, TOK>, smem::G2Per16Stage<BK, TOK>>,
    std::conditional_t<MIN, smem::G2MinStage<BK, TOK>, smem::G2Stage<BK, TOK>>>;

// 8 warps (256 threads of <= 128 registers), two blocks an SM, on tiles of 128 weight rows x 64 tokens (TOK = 64), or
// 16 warps, one block an SM, on 128 x 128 (TOK = 128: where two 64-token blocks do not fit an SM, sm_86 / sm_89): the
// DP4A route's kernel wherever stages of 4 blocks by cp.async run (gemm_w16_runs: compute_80+ code, 60 KB of shared
// memory a block, 66 KB with mins, PER16 64 / 76 KB; 80 / 88 KB at TOK = 128, PER16 84 KB: smem_plan.h). Why this loop
// (issue 20 item 5; sm_90 SASS, nvcc 13.0, per stage of 4 blocks, 2048 IDP.4A per warp): the 8-warp gemm2_q8_kernel's
// loop (its 4-block stages, since deleted) is not issue-bound (3075 instructions per 2048 IDP: IDP 2048, FMUL + FFMA
// 512, I2FP 256, LDS 149, 110 other; one instruction per clock per scheduler against an IDP every 2 clocks leaves room
// for 4096). What bounds it by ptxas's own schedule is the FMA port: it spaces an FMUL / FFMA after an IDP.4A like
// another IDP.4A (2 clocks), so one warp's loop is 5008 clocks of static stalls for 4096 of dot issue: 82% of the DP4A
// rate at most, and the FP32 per output and block (FMUL d_w * d_x, FFMA) is the numpy reference's arithmetic. The H200
// reached 62% (77.6 TOPS at pp512, 131 measured): with 254 registers only 2 warps share a scheduler, so every stall of
// one (an LDS result, the stage barrier, its partner's lead: a warp that runs alone issues at its static 82%) leaves
// the FMA port to the other alone. Here each thread owns 4 weight rows x 8 tokens (32 outputs, 128 registers: 4 warps
// per scheduler) and the arithmetic per output is the same expression in the same block order, so both kernels give the
// same bits (test_gemm2_stage_widths_give_the_same_bits compares it with the 2-block stages). Thread (tx, ty) = (tid %
// 32, tid / 32) owns rows tx + 32i (i < 4) and tokens ty + (TOK / 8) j (j < 8): a warp's 16-byte reads of W cover 32
// consecutive rows (conflict-free: the row stride is an odd number of 16-byte units), its reads of X one token (a
// broadcast).
// Until branch next/w16x2 the kernel was TOK = 128 everywhere: the same per-thread work and arithmetic, so the same
// bits. Its Q8_0 loop (sm_90, nvcc 13.0, one stage = 1024 IDP.4A per warp): 1635 instructions (IDP 1024, FMUL + FFMA 256,
// I2FP 128, LDS 148: 96 of 16 bytes and 52 scalar, LDGSTS 4, LDL 3: the loader's row indices, 72 other), 2657 clocks
// of static stalls (one warp alone: 77% of the DP4A rate; 4 share a scheduler); 128 registers, 12 bytes of spill,
// loaded once per stage. Shared-memory wavefronts per SM and stage ~3460 (W 4 per 16-byte read, X and its scales 1)
// against 8192 clocks of DP4A issue: 42%, twice the 8-warp kernel's share. Measured (H200, 2026-12-02 22:36, same
// run): the 9B GEMMs 88.6-90.4 -> 91.2-92.9 TOPS; pp512 / pp4096 of the 9B Q8_0 file on the DP4A route +2.5% / +2.4%.
// The expanded types (issue 18/20: K-quant prefill on the DP4A route) ran gemm_quant_kernel's 8 warps of 8x8 outputs
// with the min per 16 values (FMUL + FFMA + FADD per output and block, on top of the scale's FMUL + FFMA): on the H200,
// 9B Q4_K_M at pp512, ~65 TOPS against Q8_0's 91-93 here. The per-32 ones now take this loop, with mins plus the
// block's weight min and activation sum (a scalar LDS per row and per token) and one FFMA per output and block. Loop
// SASS of the 16-warp kernel (sm_90, nvcc 13.0, per stage = 1024 IDP.4A per warp; 2026-12-02): without mins (Q4_0,
// Q5_0, IQ4_NL, IQ4_XS) Q8_0's loop, the same count of each opcode (1635; 128 registers, 12 B spill); with mins
// (Q4_1, Q5_1, Q4_K, Q5_K) 1813 instructions: IDP 1024, FMUL 128, FFMA 256, I2FP 128, LDS 195, IMAD 14, FADD 1, LDL
// 1, 66 other; 128 registers, 4 B spill. FMA pipe per 1024 IDP: 1423 (a ceiling of 72% of the DP4A rate) against
// Q8_0's 1292 (79%) and gemm_quant_kernel's 1674 for Q4_K before (61%; 1419 since its min is per block too, but with
// its 2 warps per scheduler). Not yet measured on a GPU: Q8_0's 91-93 TOPS times 1292 / 1423 would be ~83-85 for
// Q4_K / Q5_K.
// Two blocks of 8 warps instead of one of 16 (issue 20, the 27B's DP4A prefill): ncu on the
// H200 (the 16-warp kernel, T = 512, the 27B's matrices) showed issue slots 56% busy, 4 warps per scheduler but only
// 1.89 eligible, no eligible warp in 42% of cycles, top stall "not selected": the one block's 16 warps move through
// each stage in lockstep (one __syncthreads a stage), all waiting at the barrier and for the stage's copies at once,
// then all wanting the FMA port at once. Two independent blocks an SM keep 4 warps per scheduler and each thread's
// loop, but their barriers fall at different times, so one block's warps can issue while the other's wait. Per output
// the shared-memory reads are the same (148 LDS per warp and stage); what grows is the staging: each block copies
// its tile's 128 W rows for 64 tokens, so an SM's cp.async bytes (L2 -> shared) per 128 x 128 outputs and stage are
// 60 KB instead of 40, and each thread issues 6 copies and 3 scale loads a stage instead of 4 and 2. Loop SASS (sm_90,
// nvcc 13.0, per stage = 1024 IDP.4A per warp): Q8_0 and the types without mins 1664 instructions (IDP 1024, FMUL +
// FFMA 256, I2FP 128, LDS 148, LDGSTS 6, LDG 3, STS 3, LDL 6, 90 other), 128 registers, 24 B spill (sm_80: 24 B);
// with mins 1844 (IDP 1024, FFMA 256, FMUL 128, I2FP 128, LDS 195, LDGSTS 6, LDG 6, STS 6, 95 other), 121
// registers, no spill (pairing each block's scale and min, and scale and sum, as one 8-byte load: 195 -> 147 LDS
// a stage, but 6 spill loads; +0.0-1.0% on the Q4_K / Q5_K / Q4_1 GEMMs, none end to end on the 27B Q4_K_M: H100,
// 2026-12-05, not kept). Measured (H200, 2026-12-04 19:45, same call, against TOK = 128, `llamacmp-bench --hw-route
// dp4a`, two rounds within 0.1%): 27B Q8_0 pp512 / pp4096 / pp16384 +3.7% / +3.7% / +3.2%, 27B Q4_K_M +3.9% / +3.8%
// / +3.4%, 9B Q8_0 +0.7% / +0.5% / +0.5%, 9B Q4_K_M -1.5% / -1.5% / -1.3%. sm_86 / sm_89's 100 KB per SM would hold
// one 64-token block (8 warps): TOK = 128 there.
// PER16 (issue 20: in a Q4_K_M file half the layers' ffn_down and the GDN attn_qkv are Q6_K, ~21% of the 27B's GEMM
// time on gemm_quant_kernel at ~65 TOPS): the same tile and loop with each block's two half scales (and mins) from the
// stage, two dot chains of 16 codes and block_term16, gemm_quant_kernel's PER16 arithmetic, so both give the same bits.
// Loop SASS (sm_90, nvcc 13.0, per stage = 1024 IDP.4A per warp, TOK = 64 unsplit): Q6_K / Q3_K 1918 instructions (IDP
// 1024, FFMA 256, FMUL 128, I2FP 256, LDS 163), 125 registers, no spill; Q2_K 2420 (IDP 1024, FFMA 384, FMUL 256, FADD
// 128, I2FP 256, LDS 260, LDL 3), 128 registers, 16 B spill. The FP32 work per output and block is gemm_quant_kernel's
// (its loop: 1819 / 2267 instructions for the same 1024 IDP, at 2 warps per scheduler); what changes is 4 warps per
// scheduler and the one launch for a call's matrices: the 27B Q4_K_M's DP4A prefill +4-5% (H200, 2026-12-05).
// The direct form (W::DIRECT: W16Planes, matmul_quant.cuh; Q2_K, Q4_K, Q5_K up to w16_planes_max_tokens): no expansion
// pass and no workspace but the half sums, the weights read from the run's repacked planes, as matmul_mma.cu's direct
// form. A stage's 128 rows x 4 blocks are the scale loads' (row, block) items (two a thread at TOK = 64, one at 128),
// each row found once in its matrix's planes (PlaneRow); an item's block is loaded as the type's Raw (Q::load) where an
// expanded row's scale and min are, before the stage's math, and decoded after it by expand_kernel's own Q::decode into
// the codes cp.async would have copied and the scales / mins the loads would have brought: the same stage, so the same
// bits, published by the same barrier. Its price in the loop (sm_90, nvcc 13.0, per stage = 1024 IDP.4A a warp,
// unsplit; tools/w16_sass.py), expanded -> direct at TOK = 64 / 128: Q4_K 1844 -> 1892 / 1818 -> 1846, Q5_K 1844 ->
// 1939 / 1818 -> 1873, Q2_K 2420 -> 2506 / 2397 -> 2435, Q6_K 1918 -> 2070 / 1909 -> 1983 instructions (sm_80, sm_86
// within 5). What it adds is integer unpacking (LOP3, SHF, PRMT, IADD3: +35, +83, +66, +140 at TOK = 64) on the ALU
// pipe, 4 I2F and 4 FMUL a stage (Q2_K 8 each; the FMUL on the FMA pipe), and up to 12 reloads (LDL) of loop-invariant
// row addresses: the Raw lives through the math (8 registers an item for Q4_K), so at TOK = 64 it spills (sm_90
// unsplit: Q4_K 40 bytes, Q5_K 28, Q2_K 48, Q6_K none; sm_80: 36, 28, 48, 32; TOK = 128 on sm_86 / sm_89: none, Q2_K 8;
// all at the 128-register bound). Why it may come almost free here, unlike the tensor-core loop: this one is bound by
// the FMA pipe, (IDP + FP32) x 2 clocks = 2818 a stage for Q4_K / Q5_K (2816 Q6_K, 3584 Q2_K) against 1844 issue slots,
// and the direct forms add 8 clocks there (Q2_K 16: +0.3%) while their 1892-2506 slots stay below it; the mma loop is
// issue-bound, where Q6_K's +9.8% lost 6-18%. Measured (H100, 2026-12-06) the count was too kind: against the expanded
// form in one pass, direct won at T = 512 (Q4_K 5-7%, Q2_K 2%, Q5_K 1-4%) and lost past it as the pass's share fell (at
// 4096 Q2_K 4-5%, Q5_K 3-4%; Q4_K even), Q6_K 3-9% at every T: so the token limits of matmul_quant.cuh
// w16_planes_max_tokens and Q6_K expanded. With them the 27B Q4_K_M's DP4A pp512 / pp4096 +4.1% / +3.9%, and +9.3% /
// +8.9% where a 16 GB card's workspace takes 80 MiB passes (RESULTS.md, thirty-third session, s33b).
// SPLIT: the kernel of split launches (pieces > 1); whole tiles run the kernel without the pieces' code, whose
// registers and schedule are the unsplit loop's (with it the 9B's unsplit GEMMs lost ~1%: 124 registers instead of
// 128, another schedule; H200, 2026-12-04).
template <class W, class D, int BK, bool SPLIT, int TOK>
__global__ void __launch_bounds__(4 * TOK, TOK == 64 ? 2 : 1)
gemm_w16_kernel(const int8_t* __restrict__ xq,  // [T, n]
                const float* __restrict__ xd,   // [T, n/32]
                const float* __restrict__ xs,   // [T, n/16] activation half sums times their scale (W::MIN)
                const int8_t* __restrict__ wq,  // [rows, n]: the launch's matrices one after another (W::DIRECT: null)
                const W w,                      // the weights' scales (and mins), or (W::DIRECT) their planes
                const GemmOut out,              // where each matrix's rows go
                int T, int rows, int n,
                int pieces) {                   // serial pieces of K per tile (SPLIT; else 1)
    constexpr int TILE = smem::G2TILE, THREADS = 4 * TOK, TS = THREADS / 32;
    static_assert(TILE == 4 * 32 && TOK == 8 * TS, "a thread owns rows tx + 32i (i < 4), tokens ty + TS j (j < 8)");
    static_assert(TOK * BK == THREADS && TILE % TOK == 0, "stages of 4 blocks: per thread one X scale, W's TILE / TOK");
    using Stage = W16Stage<W::MIN, W::PER16, BK, TOK>;
    extern __shared__ __align__(16) unsigned char w16smem[];   // Stage[2]
    Stage* st = reinterpret_cast<Stage*>(w16smem);
    const int tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;
    const int row_tiles = gridDim.x, tiles = row_tiles * gridDim.y, nb = n / QK;
    int tile = blockIdx.x + row_tiles * blockIdx.y, piece = 0;
    if constexpr (SPLIT) {
        const int unit = split_unit(w16smem);   // (before the first stage's copies overwrite the word)
        tile = unit % tiles;
        piece = unit / tiles;
    } else {
        pieces = 1;
    }
    const int row0 = (SPLIT ? tile % row_tiles : blockIdx.x) * TILE;
    const int tok0 = (SPLIT ? tile / row_tiles : blockIdx.y) * TOK;
    const int nstage_all = (nb + BK - 1) / BK;
    const int s_first = SPLIT ? piece * nstage_all / pieces : 0;
    const int nstage = SPLIT ? (piece + 1) * nstage_all / pieces - s_first : nstage_all;
    // Loader roles: per stage TILE rows of W and TOK of X, 2 BK 16-byte chunks each, RSTEP rows per pass of the
    // block (consecutive threads take consecutive chunks of one row): W in NPW passes, X in NPX. Scales: row tid / BK
    // (and + SSTEP: W's NSW of them), block tid % BK.
    constexpr int CPR = 2 * BK, RSTEP = THREADS / CPR, NPW = TILE / RSTEP, NPX = TOK / RSTEP;
    constexpr int SSTEP = THREADS / BK, NSW = TILE / SSTEP;
    static_assert(TILE % RSTEP == 0 && TOK % RSTEP == 0 && SSTEP == TOK, "whole passes");
    const int lr = tid / CPR, lc = tid % CPR;
    const int sr = tid / BK, sk = tid % BK;
    // Rows past `rows` (tokens past T) read the last one (their outputs are never stored): only the K tail is guarded.
    // Row indices, not pointers: the bases are kernel parameters, so a source costs one register instead of two (at
    // 128 registers the pointers spilled).
    int wrow[NPW], xrow[NPX], wds[NSW];
#pragma unroll
    for (int p = 0; p < NPW; ++p) wrow[p] = min(row0 + lr + RSTEP * p, rows - 1);
#pragma unroll
    for (int p = 0; p < NPX; ++p) xrow[p] = min(tok0 + lr + RSTEP * p, T - 1);
#pragma unroll
    for (int q = 0; q < NSW; ++q) wds[q] = min(row0 + sr + SSTEP * q, rows - 1) * nb + sk;
    const int xds = min(tok0 + sr, T - 1) * nb + sk;
    // W::DIRECT (a type's planes, W16Planes): the weight items are the scale loads' (rows sr + SSTEP q, block sk of
    // each stage), each row's planes found once (rows past `rows` read the last one, as wds).
    typename W16Items<W>::Row wpl[NSW];
    if constexpr (W::DIRECT) {
#pragma unroll
        for (int q = 0; q < NSW; ++q) wpl[q] = w.row(out, min(row0 + sr + SSTEP * q, rows - 1), n);
    }

    // This thread's scales of the next stage (m, e: with mins; w1, m1, e1: PER16's second halves; raw: W::DIRECT's
    // blocks as loaded, whose scales decode puts in w, m, w1, m1).
    struct Pending { float w[NSW], m[NSW], w1[NSW], m1[NSW], x, e, e1; typename W16Items<W>::Raw raw[NSW]; };
    auto fetch = [&](int s, Stage& b, Pending& p) {   // s: the piece's stage (the tile's s_first + s)
        if constexpr (SPLIT) s += s_first;
        const bool ok = s * BK + (lc >> 1) < nb;             // the block this thread's chunks lie in exists
        const int off = (ok ? s * BK * QK : 0) + lc * 16;    // (else an in-bounds address, zeros written)
        if constexpr (!W::DIRECT) {
#pragma unroll
            for (int q = 0; q < NPW; ++q) copy16(&b.w[lr + RSTEP * q][lc * 4], wq + (size_t)wrow[q] * n + off, ok);
        }
#pragma unroll
        for (int q = 0; q < NPX; ++q) copy16(&b.x[lr + RSTEP * q][lc * 4], xq + (size_t)xrow[q] * n + off, ok);
        const bool oks = s * BK + sk < nb;
#pragma unroll
        for (int q = 0; q < NSW; ++q) {
            if constexpr (W::DIRECT) {
                p.raw[q] = wpl[q].load(s * BK + sk);   // (no K tail: a type's blocks fill whole stages, W16Planes)
            } else if constexpr (W::PER16) {
                const float2 z = make_float2(0.f, 0.f), sw = oks ? w.scales(wds[q] + s * BK) : z;
                p.w[q] = sw.x, p.w1[q] = sw.y;
                if constexpr (W::MIN) {
                    const float2 mw = oks ? w.mins(wds[q] + s * BK) : z;
                    p.m[q] = mw.x, p.m1[q] = mw.y;
                }
            } else {
                p.w[q] = oks ? w.scale(wds[q] + s * BK) : 0.f;
                if constexpr (W::MIN) p.m[q] = oks ? w.min(wds[q] + s * BK) : 0.f;
            }
        }
        p.x = oks ? xd[xds + s * BK] : 0.f;
        if constexpr (W::MIN) {
            const float2 e = oks ? reinterpret_cast<const float2*>(xs)[xds + s * BK] : make_float2(0.f, 0.f);
            if constexpr (W::PER16) p.e = e.x, p.e1 = e.y;
            else p.e = e.x + e.y;   // exact (block_term)
        }
    };
    // W::DIRECT: this thread's blocks of stage s (the piece's) decoded by expand_kernel's own decode (W16Planes) into
    // the stage's codes where fetch's cp.async puts an expanded row's, their scales and mins into p where fetch loads
    // an expanded row's: the same stage as the expanded form's, so the same bits. After the stage's math, before the
    // barrier that ends it (publish): b is the stage no warp reads until that barrier has passed.
    auto decode = [&](int s, Stage& b, Pending& p) {
        if constexpr (W::DIRECT) {
            if constexpr (SPLIT) s += s_first;
#pragma unroll
            for (int q = 0; q < NSW; ++q) {
                const auto sb = W::decode(p.raw[q], s * BK + sk);
                int4* dst = reinterpret_cast<int4*>(&b.w[sr + SSTEP * q][sk * 8]);
                dst[0] = make_int4(sb.q[0], sb.q[1], sb.q[2], sb.q[3]);
                dst[1] = make_int4(sb.q[4], sb.q[5], sb.q[6], sb.q[7]);
                p.w[q] = sb.s[0], p.m[q] = sb.m[0], p.w1[q] = sb.s[1], p.m1[q] = sb.m[1];
            }
        }
    };
    // The scales lie block-major here ([BK][TILE] in the stage's [TILE][BK] arrays, [BK][TOK] in its [TOK][BK]): a
    // thread's reads of its rows' (tokens') scales for one block are then scalar loads, so no 16-byte load keeps 4
    // blocks' scales in registers through the stage (with them, 48 registers: the kernel spilled 68 bytes).
    auto publish = [&](int s, Stage& b, Pending& p) {
        cp_async_wait();
        if constexpr (W::DIRECT) decode(s, b, p);
#pragma unroll
        for (int q = 0; q < NSW; ++q) {
            const int at = sk * TILE + sr + SSTEP * q;
            (&b.wd[0][0])[at] = p.w[q];
            if constexpr (W::MIN) (&b.wm[0][0])[at] = p.m[q];
            if constexpr (W::PER16) (&b.wd1[0][0])[at] = p.w1[q];
            if constexpr (W::PER16 && W::MIN) (&b.wm1[0][0])[at] = p.m1[q];
        }
        (&b.xd[0][0])[sk * TOK + sr] = p.x;
        if constexpr (W::MIN) (&b.xs[0][0])[sk * TOK + sr] = p.e;
        if constexpr (W::PER16 && W::MIN) (&b.xs1[0][0])[sk * TOK + sr] = p.e1;
    };

    float acc[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    Pending p{};
    fetch(0, st[0], p);
    if (SPLIT && piece > 0) {   // the piece before parked the tile's sums in its outputs
        split_wait(tile, piece);
        unpark_rows<TS, 32>(acc, tok0 + ty, T, row0 + tx, rows, out);
    }
    publish(0, st[0], p);
    __syncthreads();
    for (int s = 0; s < nstage; ++s) {
        Stage& cur = st[s & 1];
        Stage& nxt = st[(s & 1) ^ 1];
        const bool more = s + 1 < nstage;
        if (more) fetch(s + 1, nxt, p);  // nxt was last read before the previous barrier (W::DIRECT: its blocks'
                                         // Raw, decoded into nxt by publish)
#pragma unroll
        for (int kb = 0; kb < BK; ++kb) {
            int4 a[4][2];
            float sw[4], mw[4], sw1[4], mw1[4];   // (sw1, mw1: PER16's second halves)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int at = kb * TILE + tx + 32 * i;
                a[i][0] = *reinterpret_cast<const int4*>(&cur.w[tx + 32 * i][kb * 8]);
                a[i][1] = *reinterpret_cast<const int4*>(&cur.w[tx + 32 * i][kb * 8 + 4]);
                sw[i] = (&cur.wd[0][0])[at];
                mw[i] = sw1[i] = mw1[i] = 0.f;
                if constexpr (W::MIN) mw[i] = (&cur.wm[0][0])[at];
                if constexpr (W::PER16) sw1[i] = (&cur.wd1[0][0])[at];
                if constexpr (W::PER16 && W::MIN) mw1[i] = (&cur.wm1[0][0])[at];
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int4 b0 = *reinterpret_cast<const int4*>(&cur.x[ty + TS * j][kb * 8]);
                const int4 b1 = *reinterpret_cast<const int4*>(&cur.x[ty + TS * j][kb * 8 + 4]);
                const int at = kb * TOK + ty + TS * j;
                const float sx = (&cur.xd[0][0])[at];
                float e = 0.f, e1 = 0.f;
                if constexpr (W::MIN) e = (&cur.xs[0][0])[at];
                if constexpr (W::PER16 && W::MIN) e1 = (&cur.xs1[0][0])[at];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    if constexpr (W::PER16) {   // a chain per half (block_term16)
                        const int d0 = dot16<D>(a[i][0], b0, dot_chain_init());
                        const int d1 = dot16<D>(a[i][1], b1, dot_chain_init());
                        acc[i][j] = block_term16<W::MIN>(acc[i][j], d0, d1, sw[i], sw1[i], sx, mw[i], mw1[i], e, e1);
                    } else {
                        const int d = dot16<D>(a[i][1], b1, dot16<D>(a[i][0], b0, dot_chain_init()));
                        acc[i][j] = block_term<W::MIN>(acc[i][j], d, sw[i], sx, mw[i], e);
                    }
                }
            }
        }
        if (more) publish(s + 1, nxt, p);
        __syncthreads();
    }
    if (SPLIT && piece + 1 < pieces) {
        park_rows<TS, 32>(acc, tok0 + ty, T, row0 + tx, rows, out);
        split_parked(tile, piece);
        return;
    }
    store_rows<TS, 32>(acc, tok0 + ty, T, row0 + tx, rows, out);
    if (SPLIT) split_finished(tile, (unsigned)(tiles * pieces));
}

// The launch: 4 TOK threads, two stages of W16_BK blocks (smem_plan.h's plans: their bytes are these).
constexpr int W16_BK = 4;
template <class W, int TOK>
constexpr size_t w16_bytes() { return 2 * sizeof(W16Stage<W::MIN, W::PER16, W16_BK, TOK>); }
template <class W>
constexpr bool w16_bytes_planned() {
    return w16_bytes<W, 64>() == smem::gemm_w16_bytes(64, W::MIN, W::PER16) &&
           w16_bytes<W, 128>() == smem::gemm_w16_bytes(128, W::MIN, W::PER16);
}
static_assert(w16_bytes_planned<W16Q8>() && w16_bytes_planned<W16Expanded<false, false>>() &&
                  w16_bytes_planned<W16Expanded<true, false>>() && w16_bytes_planned<W16Expanded<false, true>>() &&
                  w16_bytes_planned<W16Expanded<true, true>>(),
              "the launch takes what smem_plan.h plans");

// How gemm_w16_kernel<W, D> runs on the current device: its tokens per tile (smem::gemm_w16_plan under smem_limit(),
// so cmp_set_smem_cap runs the other cards' tiles; 0: not at all, where its code is older than compute_80 (the
// stages come by cp.async; sm_70/75's register-staged copy would hold a whole stage in registers) or it does not
// fit), the blocks resident on the device at once (its wave) and on one SM. The code's version is asked once per
// device (code_at_least's cache), the limit at every call (cmp_set_smem_cap), the wave once per size (wave_blocks);
// a matmul asks it once for all its launches.
struct W16Shape {
    int tok, wave, per_sm;
};
template <class W, class D, int TOK>
int w16_wave(int* wave) {
    return wave_blocks("gemm_w16_kernel", gemm_w16_kernel<W, D, W16_BK, false, TOK>, 4 * TOK, w16_bytes<W, TOK>(),
                       wave);
}
template <class W, class D>
int gemm_w16_shape(W16Shape* s) {
    static PerDevice code;
    size_t limit = 0;
    CMP_TRY(smem_limit(&limit));
    bool async = false;
    CMP_TRY(code_at_least(gemm_w16_kernel<W, D, W16_BK, false, 64>, 80, code, &async));
    *s = W16Shape{async ? smem::gemm_w16_plan(limit, W::MIN, W::PER16).config : 0, 0, 0};
    if (s->tok == 64) CMP_TRY((w16_wave<W, D, 64>(&s->wave)));
    if (s->tok == 128) CMP_TRY((w16_wave<W, D, 128>(&s->wave)));
    DeviceFacts f{};
    CMP_TRY(device_facts(&f));
    s->per_sm = s->wave / std::max(f.sms, 1);
    return CMP_OK;
}

// Whether gemm_w16_kernel<W, D> runs on the current device (gemm_w16_shape).
template <class W, class D>
int gemm_w16_runs(bool* yes) {
    W16Shape s{};
    CMP_TRY((gemm_w16_shape<W, D>(&s)));
    *yes = s.tok != 0;
    return CMP_OK;
}

constexpr int W16_MIN_STAGES = 4;   // stages a piece keeps at least (16 blocks: 512 values of K)
// The wave model of its serial pieces (gemm_chunks.h SplitModel), fitted on the H200 at 64 tokens, two blocks an SM
// (bench_kernels.py --gemm-pieces, 2026-12-04, T = 512; whole / split ms): a block alone on an SM runs at 92% of
// the two blocks' rate (27B down, 320 tiles on 264 slots: whole 1.190 ms = 1 + 0.54 waves), and a split costs
// ~4.4% (9B attention q+k+v, 640 tiles: 2 pieces, 2.5 waves, 0.486 ms against 2.54 whole, 0.474 ms). With them the
// model predicts the other shapes' split / whole within 0.5% (27B q+k+v 1.03 for 1.027, gate+up 1.011 for 1.008),
// where the one-block-an-SM model split them for a loss.
constexpr int W16_SOLO_PCT = 92, W16_SPLIT_COST_PCT = 5;

template <class W, class D, int TOK>
int launch_w16_tiles(const int8_t* xq, const float* xd, const float* xs, const int8_t* wq, const W& w,
                     const GemmOut& out, int T, int n, const W16Shape& s) {
    constexpr size_t bytes = w16_bytes<W, TOK>();
    const int rows = out.end[out.count - 1];
    const dim3 grid(ceil_div(rows, smem::G2TILE), ceil_div(T, TOK));
    const int tiles = grid.x * grid.y;
    const int stages = ceil_div(n / QK, W16_BK);
    const int pieces = out_in_place(out) ? 1
                       : launch_pieces(tiles, SPLIT_MAX_TILES, s.wave, stages, W16_MIN_STAGES,
                                       chunks::SplitModel{s.per_sm, W16_SOLO_PCT, W16_SPLIT_COST_PCT});
    auto kernel = pieces > 1 ? gemm_w16_kernel<W, D, W16_BK, true, TOK> : gemm_w16_kernel<W, D, W16_BK, false, TOK>;
    CMP_TRY(smem_opt_in("gemm_w16_kernel", kernel, bytes));
    kernel<<<dim3(grid.x, grid.y, pieces), 4 * TOK, bytes, stream()>>>(xq, xd, xs, wq, w, out, T, rows, n, pieces);
    return check_launch("gemm_w16_kernel");
}

// rows: of all the matrices (out.end[out.count - 1]); s: gemm_w16_shape's, asked once by the caller for all its
// launches (s.tok != 0: it runs here).
template <class W, class D>
int launch_gemm_w16(const int8_t* xq, const float* xd, const float* xs, const int8_t* wq, const W& w,
                    const GemmOut& out, int T, int n, const W16Shape& s) {
    if (s.tok == 64) return launch_w16_tiles<W, D, 64>(xq, xd, xs, wq, w, out, T, n, s);
    if (s.tok == 128) return launch_w16_tiles<W, D, 128>(xq, xd, xs, wq, w, out, T, n, s);
    return fail(CMP_ERR_UNSUPPORTED, "gemm_w16_kernel does not run on this device (compute_80+ code, 60 KB)");
}

}  // namespace
}  // namespace cmp
