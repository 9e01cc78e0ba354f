// Shared memory per block of the kernels that take more than a fixed few KB, and the configuration each launcher
// picks under the per-block limit of the device it runs on (smem_limit(): cudaDevAttrMaxSharedMemoryPerBlockOptin,
// or less under cmp_set_smem_cap). Limits: sm_61 48 KB, sm_75 64 KB, sm_70 96 KB, sm_80 163 KB, sm_90 227 KB.
// Plain C++ without CUDA: the launchers size their launches from here, and tests/test_smem_plan.py compiles this
// header on the host (tools/smem_table.cpp) and checks every choice against every card's limit.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CMP_SMEM_HD __host__ __device__   // also called by the kernel it sizes
#else
#define CMP_SMEM_HD
#endif

namespace cmp {
namespace smem {

// A launch configuration: the kernel's knob (rows per block, pipeline stages; 0 = nothing fits) and the dynamic
// shared memory it takes.
struct Plan {
    int config;
    size_t bytes;
};

// ---- attn_decode_kernel (attention.cu) -----------------------------------------------------------------------------
// Static arrays (queries, scores: up to 12.6 KB at Dh 256 and 8 heads a group, cuobjdump -res-usage) and dynamic:
// the warps' partial outputs [DEC_NW][GP*Dh] floats after the key loop, the tq3 pair table during it.
constexpr int DEC_NW = 4;    // warps per block
// The tq3 pair table (attention_kv.cuh): 64 level pairs, each held 16 times side by side (8 KB), placed at the
// first 8 KB boundary of the shared window inside TQ3_PAIR_SMEM bytes.
constexpr int TQ3_PAIR_SLOTS = 16;
constexpr int TQ3_PAIR_TABLE_BYTES = 64 * TQ3_PAIR_SLOTS * 8;
constexpr int TQ3_PAIR_SMEM = 2 * TQ3_PAIR_TABLE_BYTES - 16;   // a 16-byte-aligned start is at most 8 KB - 16 short
constexpr size_t attn_decode_bytes(int Dh, int GP, bool tq3) {
    return sizeof(float) * DEC_NW * GP * Dh > (tq3 ? (size_t)TQ3_PAIR_SMEM : 0) ? sizeof(float) * DEC_NW * GP * Dh
                                                                               : (size_t)TQ3_PAIR_SMEM;
}

// ---- attn_prefill_kernel (attention.cu) ----------------------------------------------------------------------------
// Shared: Qt [Dh][rows] + one K or V chunk [PF_DC][PF_BK] + Pt [PF_BK][rows] floats. Fewer rows per block (4 per
// thread row group, so rows / 4 * 16 threads) only shrink Qt and Pt: each row's arithmetic is the same.
constexpr int PF_BK = 64;    // keys per tile (= the block-sparse block)
constexpr int PF_DC = 64;    // head dims per shared K/V chunk
constexpr int PF_ROWS_MAX = 64, PF_ROWS_MIN = 16;
constexpr size_t attn_prefill_bytes(int Dh, int rows) {
    return sizeof(float) * ((size_t)Dh * rows + (size_t)PF_DC * PF_BK + (size_t)PF_BK * rows);
}
// The most rows per block (64, 32, 16) that fit: 64 at Dh 256 needs 96 KB (sm_70), 32 56 KB (sm_75), 16 36 KB.
constexpr Plan attn_prefill_plan(int Dh, size_t limit) {
    for (int rows = PF_ROWS_MAX; rows >= PF_ROWS_MIN; rows /= 2)
        if (attn_prefill_bytes(Dh, rows) <= limit) return {rows, attn_prefill_bytes(Dh, rows)};
    return {0, attn_prefill_bytes(Dh, PF_ROWS_MIN)};
}

// ---- attention_kernel (attention.cu, the round-1 kernel: f16/f32 caches, head dims 32, 96, 192) --------------------
// Shared: K tile [ATT_BN][Dh+1] + V tile [ATT_BN][Dh] + Q rows [rows][Dh] floats with 16 rows (82 KB at Dh 256);
// where that does not fit, 8 rows and the V tile loaded over the K tile (K tile + Q rows: 40 KB at Dh 256).
constexpr int ATT_BN = 32, ATT_ROWS = 16;
constexpr size_t attention_bytes(int Dh, int rows) {
    return sizeof(float) * ((size_t)ATT_BN * (Dh + 1) + (rows == ATT_ROWS ? (size_t)ATT_BN * Dh : 0) +
                            (size_t)rows * Dh);
}
constexpr Plan attention_plan(int Dh, size_t limit) {
    return attention_bytes(Dh, ATT_ROWS) <= limit       ? Plan{ATT_ROWS, attention_bytes(Dh, ATT_ROWS)}
           : attention_bytes(Dh, ATT_ROWS / 2) <= limit ? Plan{ATT_ROWS / 2, attention_bytes(Dh, ATT_ROWS / 2)}
                                                        : Plan{0, attention_bytes(Dh, ATT_ROWS / 2)};
}

// ---- gemm2_q8_kernel (matmul_q8.cu, the Q8_0 DP4A GEMM) and gemm_w16_kernel (gemm_w16.cuh) ----------------------
// Two stages of BK Q8 blocks each: G2TILE weight rows and TOK tokens of codes (row stride BK * 8 + 4 ints: 16-byte
// aligned, and 8 consecutive rows' 16-byte reads on disjoint banks since the stride in 16-byte units is odd) and
// their scales. gemm2_q8_kernel: 128 rows x 128 tokens, stages of 2 blocks (45 KB, every card). gemm2_q8_plan is
// the table's record of its 4-block stages (80 KB, deleted from the kernel once gemm_w16_kernel took them over).
// gemm_w16_kernel: 128 rows x TOK tokens, stages of 4 blocks, TOK per card (gemm_w16_plan): 64 (30 KB a stage: 60
// KB, 66 KB with mins; PER16 64 KB, 76 KB with mins; 8 warps) where two such blocks share an SM (sm_80's 164 KB,
// sm_90's 228 KB), else 128 (80 KB, 88 KB with mins, PER16 84 KB: 16 warps; sm_86 / sm_89's 100 KB hold one 64-token
// block, 8 warps, where 16 fit); its launcher
// takes it only where the kernel's code has cp.async (sm_80+: the register-staged copy of sm_70/75 holds a whole
// stage in registers, and at 4 blocks sm_70 spills 72 B where 2 spill none; nvcc 12.4).
constexpr int G2TILE = 128;   // weight rows per tile (both kernels), and gemm2_q8_kernel's tokens
template <int BK, int TOK = G2TILE>
struct G2Stage {
    static constexpr int KP = BK * 8 + 4;
    int w[G2TILE][KP];
    int x[TOK][KP];
    float wd[G2TILE][BK];
    float xd[TOK][BK];
};
static_assert(sizeof(G2Stage<2>) == 22528 && sizeof(G2Stage<4>) == 40960, "gemm2_q8_kernel's 128x128 stages");
constexpr Plan gemm2_q8_plan(size_t limit) {
    return 2 * sizeof(G2Stage<4>) <= limit ? Plan{4, 2 * sizeof(G2Stage<4>)} : Plan{2, 2 * sizeof(G2Stage<2>)};
}
// The same stages with each block's weight min and activation sum (gemm_w16_kernel with mins, gemm_w16.cuh: Q4_1,
// Q5_1, Q4_K, Q5_K expanded).
template <int BK, int TOK = G2TILE>
struct G2MinStage : G2Stage<BK, TOK> {
    float wm[G2TILE][BK];
    float xs[TOK][BK];
};
// PER16 (a scale per 16 values: Q6_K, Q3_K expanded): wd holds each block's first half's scale, wd1 its second's.
template <int BK, int TOK = G2TILE>
struct G2Per16Stage : G2Stage<BK, TOK> {
    float wd1[G2TILE][BK];
};
// PER16 with a min per 16 values (Q2_K expanded): the halves' mins and the activation halves' sums times their scale
// (xs the first half's, xs1 the second's).
template <int BK, int TOK = G2TILE>
struct G2Per16MinStage : G2Per16Stage<BK, TOK> {
    float wm[G2TILE][BK];
    float wm1[G2TILE][BK];
    float xs[TOK][BK];
    float xs1[TOK][BK];
};
// gemm_w16_kernel's stages of 4 blocks for TOK tokens, by the weights' scales: per 32 values (Q8_0 and the expanded
// types without PER16) without or with mins, PER16 without or with mins.
template <int TOK>
constexpr size_t w16_stage_bytes(bool min, bool per16) {
    return per16 ? (min ? sizeof(G2Per16MinStage<4, TOK>) : sizeof(G2Per16Stage<4, TOK>))
                 : (min ? sizeof(G2MinStage<4, TOK>) : sizeof(G2Stage<4, TOK>));
}
static_assert(w16_stage_bytes<64>(false, false) == 30720 && w16_stage_bytes<64>(true, false) == 33792 &&
                  w16_stage_bytes<64>(false, true) == 32768 && w16_stage_bytes<64>(true, true) == 38912 &&
                  w16_stage_bytes<64>(true, false) % 16 == 0 && w16_stage_bytes<64>(true, true) % 16 == 0 &&
                  w16_stage_bytes<128>(true, true) % 16 == 0,
              "gemm_w16_kernel's 128x64 stages, 16-byte aligned one after another");
constexpr size_t gemm_w16_bytes(int tok, bool min, bool per16) {
    return 2 * (tok == 64 ? w16_stage_bytes<64>(min, per16) : w16_stage_bytes<128>(min, per16));
}
// Its tokens per tile (config; 0: it does not fit, and the launcher takes gemm2_q8_kernel for Q8_0,
// gemm_quant_kernel for the expanded types: their stages are smaller): 64 where two blocks share an SM, whose shared
// memory is the per-block limit plus the 1 KB the driver keeps per block (sm_80 / sm_86 / sm_89 / sm_90), else 128
// where it fits, else 64 where one block fits. PER16 with mins (Q2_K: 76 KB at 64 tokens, 100 KB at 128) is 64
// everywhere: sm_86 / sm_89's 99 KB a block miss its 128-token tile by 1 KB, so there it runs one 8-warp block an SM.
constexpr Plan gemm_w16_plan(size_t limit, bool min, bool per16) {
    const size_t b64 = gemm_w16_bytes(64, min, per16), b128 = gemm_w16_bytes(128, min, per16);
    if (2 * (b64 + 1024) <= limit + 1024) return {64, b64};
    if (b128 <= limit) return {128, b128};
    return {b64 <= limit ? 64 : 0, b64};
}

// ---- gemm_quant_kernel (matmul_quant.cu, the DP4A GEMM of the expanded block types) --------------------------------
constexpr int QTILE = 128;   // GEMM tile: 128 weight rows x 128 tokens
constexpr int QBK = 2;       // sub-blocks of 32 per shared-memory stage
constexpr int QKP = QBK * 8 + 4;  // row stride in ints (80 B: 16-byte aligned, conflict-free 16-byte reads)
struct QStage {
    int w[QTILE][QKP];
    int x[QTILE][QKP];
    float ws[QTILE][2 * QBK];  // per 16 values
    float wm[QTILE][2 * QBK];
    float xs[QTILE][2 * QBK];
    float xd[QTILE][QBK];
};
// Two stages (the next one loading while the current one is multiplied: 54 KB) where they fit, else one (27 KB:
// the next stage waits in registers until the current one is consumed; sm_61).
constexpr Plan gemm_quant_plan(size_t limit) {
    return 2 * sizeof(QStage) <= limit ? Plan{2, 2 * sizeof(QStage)}
                                       : Plan{sizeof(QStage) <= limit ? 1 : 0, sizeof(QStage)};
}

// ---- gdn_chunk_intra_kernel, gdn_chunk_state_kernel (gdn.cu: the chunked delta rule) --------------------------------
// One configuration each; where either does not fit, cmp_gdn_chunked refuses before anything runs and the caller
// takes the sequential scan (gdn_scan_kernel, a few KB). Row strides are 4 floats past the row (a multiple of 4
// for float4 reads, and an odd number of 16-byte units: 16 distinct rows' float4 reads cover every bank once per
// 8 rows); every array's size is a multiple of 4 floats, so each one starts 16-byte aligned.
constexpr int GDN_CH = 64;    // tokens per chunk (numpy_ref.GDN_CHUNK)
constexpr int GDN_BV = 16;    // value columns per block of the state kernel
constexpr int GDN_TS = GDN_CH + 4;   // row stride of the [CH][CH] arrays (A, T, M)
constexpr int gdn_qk_stride(int DK) { return DK + 4; }   // row stride of the [CH][DK] arrays (q, k, v, W)
constexpr int gdn_x_stride(int DK) { return DK + 4 > GDN_TS ? DK + 4 : GDN_TS; }   // a region holding either
// The intra kernel (block: head, chunk): Ks [CH][QK] (k, then diag(b e^G) k), Xs [CH][XS] (q, then A, then
// diag(b) v), Ts [CH][TS] (T), Ps [3][16][17] (the off-diagonal blocks' products), and 4 rows of CH (G, b, |q|
// and |k| scales). DK 128: 89280 B (sm_70 and up; DK 64: 56512 B, sm_75; DK 32: sm_61).
template <int DK>
struct GdnIntraLayout {
    static constexpr int QK = gdn_qk_stride(DK), XS = gdn_x_stride(DK), TS = GDN_TS, PS = 3 * 16 * 17;
    static constexpr int floats = GDN_CH * QK + GDN_CH * XS + GDN_CH * TS + PS + 4 * GDN_CH;
    static constexpr size_t bytes = sizeof(float) * (size_t)floats;
};
// The state kernel (block: head, GDN_BV value columns): Xa [CH][XS] (W, then M), Xb [CH][QK] (q, then k), Ss [DK][BV]
// (the state slice), Rs [3][CH] (the row scales), Ds [CH][BV] (U, then D: rows ty and ty + 1 of a warp's D
// writes fall on disjoint banks without padding). DK 128: 80640 B.
template <int DK>
struct GdnStateLayout {
    static constexpr int QK = gdn_qk_stride(DK), XS = gdn_x_stride(DK), TS = GDN_TS, DS = GDN_BV;
    static constexpr int floats = GDN_CH * XS + GDN_CH * QK + DK * GDN_BV + GDN_CH * DS + 3 * GDN_CH;
    static constexpr size_t bytes = sizeof(float) * (size_t)floats;
};
template <int DK>
constexpr Plan gdn_chunk_intra_plan(size_t limit) {
    return {GdnIntraLayout<DK>::bytes <= limit ? 1 : 0, GdnIntraLayout<DK>::bytes};
}
template <int DK>
constexpr Plan gdn_chunk_state_plan(size_t limit) {
    return {GdnStateLayout<DK>::bytes <= limit ? 1 : 0, GdnStateLayout<DK>::bytes};
}

// ---- attention_full_kernel (vision.cu, the vision tower's attention) ------------------------------------------------
// Shared: Q tile [rows][S] + one K-or-V tile [FA_BK][S] + P [rows][FA_PS] floats, S = fa_stride(Dh). 32 query rows
// per block instead of 64 (2 per thread instead of 4) only shrink Q and P: each row's arithmetic is the same.
constexpr int FA_BK = 64, FA_PS = FA_BK + 4;
CMP_SMEM_HD constexpr int fa_stride(int Dh) { return (Dh + 3) / 4 * 4 % 8 == 0 ? (Dh + 3) / 4 * 4 + 4 : (Dh + 3) / 4 * 4; }
constexpr size_t attention_full_bytes(int Dh, int rows) {
    return sizeof(float) * ((size_t)(rows + FA_BK) * fa_stride(Dh) + (size_t)rows * FA_PS);
}
// 64 rows: 51 KB at head dim 64, 55 KB at 72 (sm_75 and up); 32 rows: 34 / 37 KB (sm_61).
constexpr Plan attention_full_plan(int Dh, size_t limit) {
    for (int rows = 64; rows >= 32; rows /= 2)
        if (attention_full_bytes(Dh, rows) <= limit) return {rows, attention_full_bytes(Dh, rows)};
    return {0, attention_full_bytes(Dh, 32)};
}

// ---- probe_scores_kernel (sparse.cu): a K sub-tile [SP_SUB][Dh+1] floats ---------------------------------------------
constexpr int SP_SUB = 32;       // keys per shared-memory sub-tile: lane j scores key j
constexpr Plan probe_scores_plan(int Dh, size_t limit) {
    const size_t b = (size_t)SP_SUB * (Dh + 1) * sizeof(float);
    return {b <= limit ? 1 : 0, b};
}

}  // namespace smem
}  // namespace cmp
