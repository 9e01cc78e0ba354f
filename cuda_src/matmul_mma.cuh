// The tensor-core (int8 mma.sync) GEMM of the prefill projections (issue 20's "mma" route), called by matmul_q8.cu
// for Q8_0 weights and by matmul_quant.cuh for the block-quantized types: the K-quants it reads as repacked
// (gemm_mma_planes), the others expanded to int8 codes first; the kernels are in matmul_mma.cu.
#pragma once
#include <type_traits>

#include "common.cuh"
#include "gemm_out.cuh"

namespace cmp {

// How the weight codes are scaled: Q8_0 as repacked (one f16 per 32 values), or matmul_quant.cu's expanded form (an
// f32 per 16 values; PER32 types write the same scale in both halves and use the first).
enum MmaScales { MMA_Q8 = 0, MMA_PER32 = 1, MMA_PER16 = 2 };

struct MmaOperands {
    const int8_t* xq;   // [T, n] activation codes (cmp_quantize_q8)
    const float* xd;    // [T, n/32] activation scales
    const float* xs;    // [T, n/16] activation half sums times their scale (with mins only)
    const int8_t* wq;   // [R, n] weight codes
    const void* ws;     // [R, n/32] __half (MMA_Q8) or [R, n/16] float
    const float* wm;    // [R, n/16] weight mins (with mins only)
    GemmOut out;        // where the R rows go: one matrix's outputs, or several matrices' (gemm_out.cuh)
    int T, R, n;
};

// The scale form and mins as compile-time values for a launcher templated on them: f(sc, min) with sc a
// std::integral_constant<int, form> and min a std::bool_constant (MMA_Q8 has no mins: always false). The one switch
// of both GEMMs (gemm_mma, gemm_hmma); `what` names the caller in the error for an unknown form.
template <typename F>
int dispatch_scales(MmaScales scales, bool mins, const char* what, F&& f) {
    auto with_mins = [&](auto sc) { return mins ? f(sc, std::true_type{}) : f(sc, std::false_type{}); };
    switch (scales) {
        case MMA_Q8: return f(std::integral_constant<int, MMA_Q8>{}, std::false_type{});
        case MMA_PER32: return with_mins(std::integral_constant<int, MMA_PER32>{});
        case MMA_PER16: return with_mins(std::integral_constant<int, MMA_PER16>{});
    }
    return fail(CMP_ERR_ARG, "%s: unknown scale form %d", what, (int)scales);
}

// y = res + dequant(x) . dequant(W)^T with per-32-value integer dots on the tensor cores, scaled and summed in fp32
// in the DP4A GEMMs' order and rounding (so the results equal theirs; with mins the int8 kernel adds each min's
// term by one FFMA, so those differ in the last bits: matmul_mma.cu): int8 mma.sync where the device runs
// compute_75+ code, else (Volta) or with f16 set the f16 HMMA GEMM of matmul_hmma.cu. Fails naming the reason where
// the device runs code without mma.sync (older than compute_70).
int gemm_mma(MmaScales scales, bool mins, const MmaOperands& op, bool f16);

// Whether a call of T tokens over weights of ggml type `type` on this device, with f16 as gemm_mma's, goes to
// gemm_mma_planes: the int8 kernel runs (compute_75+ code, f16 not asked for), decodes that type itself (Q2_K, Q4_K,
// Q5_K) and is faster so at T (matmul_mma.cu: up to 4096 tokens, Q5_K 1024); else the caller expands them and calls
// gemm_mma.
int mma_planes_available(int type, bool f16, int T, bool* yes);

// gemm_mma over weights of a type mma_planes_available accepts, read from their repacked planes: op.wq, ws, wm are
// unused (null), op.R is the run's rows (all matrices), op.xs the activation half sums where the type has mins.
// Each (row, 32-value block) is decoded in the kernel's stage loads by the type's own decode (expand_kernel's), so
// the results are gemm_mma's over the expanded weights, bit for bit.
int gemm_mma_planes(int type, const MmaOperands& op, const GemmPlanes& planes);

// gemm_mma's wave for these operands' form (wave_blocks): the blocks its kernel keeps resident at once.
int gemm_mma_wave(MmaScales scales, bool mins, bool f16, int* blocks);

// Whether this library's code for the current device has the int8 mma kernels (compute_75+ code).
int mma_int8_available(bool* yes);

// Volta's GEMM (matmul_hmma.cu): the same operands and results on f16 m8n8k4 mma.sync (compute_70+ code; on newer
// cards too, where it is slow: for the tests). hmma_available: whether the device's code has it.
int gemm_hmma(MmaScales scales, bool mins, const MmaOperands& op);
int hmma_available(bool* yes);
int gemm_hmma_wave(MmaScales scales, bool mins, int* blocks);

}  // namespace cmp
