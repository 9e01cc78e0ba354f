// Volta's tensor-core route of the prefill projections (issue 20's "mma" route on compute capability 7.0): the same
// operands as matmul_mma.cu's int8 GEMM (Q8 activation codes, Q8_0 weights or matmul_quant.cu's expanded codes), on
// f16 HMMA, the one mma.sync sm_70 has: m8n8k4, f16 inputs, f32 accumulation.
// Every int8 code is exact in f16 and every product of two is exact, so each 32-value block's (PER16: 16-value
// half's) dot, summed from zero in f32 by the tensor cores, is the same integer the DP4A GEMMs compute (|dot| <
// 2^19, every partial sum an integer below 2^24). It is then scaled and summed in fp32 per block as the DP4A GEMMs
// do: Q8_0 and the PER32 types without mins by their expression (the same bits), the others within fp32 rounding
// (PER16 types scale each half on its own: matching the DP4A form's fma(s0, d0, s1 d1) would hold both halves' dots
// of a warp's 64 x 32 outputs at once, 64 more registers), so the numpy reference of the int8 routes is this
// route's too. Rounding the dequantized operands to f16 instead would move
// every output by ~1e-4 (relative) and, through the next layer's Q8 activations, the small fixtures' logits far more.
// Tiles of 128 weight rows x 128 tokens, 8 warps of 64 rows x 32 tokens; one 32-value block per shared-memory stage,
// two stages, codes converted to f16 as they are stored (a PRMT pair and an HADD2 per 4 codes). In a warp's mma,
// quad-pair q multiplies rows 8 (q & 1) .. +7 by tokens 8 (q >> 1) .. +7 of a 16 x 16 tile. The instruction is
// valid PTX from sm_70 (on sm_80+ emulated and slow, but correct: how the tests run it on an H200); code older than
// compute_70 has no kernel body here and gemm_hmma refuses it.
#include "matmul_mma.cuh"

namespace cmp {
namespace {

constexpr int MT = 128, NT = 128;                      // weight rows, tokens per block
constexpr int WARPS_M = 2, WARPS_N = 4;                // warps along the rows and the tokens of a tile
constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int WTM = MT / WARPS_M, WTN = NT / WARPS_N;  // a warp's rows and tokens: 64 x 32
constexpr int MI = WTM / 16, NI = WTN / 16;            // its 16 x 16 mma tiles
constexpr int KP = 36;  // halves per staged row: 32 codes + 4, so the 8 rows of a fragment load hit distinct banks
static_assert(THREADS == MT + NT, "one thread stages each weight row and each token of a block");

template <int SC, bool MIN>
struct HmmaStage {
    __half w[MT][KP];                      // weight codes of one block, as f16
    __half x[NT][KP];                      // activation codes
    float ws[2][MT];                       // weight scale (PER16: per half)
    float wm[MIN ? 2 : 1][MT];             // weight min per half
    float xd[NT];                          // activation scale
    float xs[MIN ? 2 : 1][NT];             // activation half sums times their scale
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
// Four int8 codes -> two f16x2 of the same integers: bytes biased to 0..255 become the low byte of 1024 + u (f16
// 0x64uu), then 1152 comes off (exact: every value is an integer below 2048).
__device__ __forceinline__ void codes_to_f16(int w, uint32_t& lo, uint32_t& hi) {
    const unsigned u = (unsigned)w ^ 0x80808080u;
    lo = __byte_perm(u, 0x64646464u, 0x4140);
    hi = __byte_perm(u, 0x64646464u, 0x4342);
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
    __half2 l = __hsub2(*reinterpret_cast<__half2*>(&lo), bias), h = __hsub2(*reinterpret_cast<__half2*>(&hi), bias);
    lo = *reinterpret_cast<uint32_t*>(&l);
    hi = *reinterpret_cast<uint32_t*>(&h);
}

// The four quad-pairs' 8 x 8 x 4 products: d (8 f32) = c + a (row, k 0..3) . b (token, k 0..3). Lane l of a
// quad-pair holds a's row and b's token (l % 4) + 4 (l >= 16), and d's elements i at row (l & 1) + (i & 2) +
// 4 (l >= 16), token (i & 4) + (l & 2) + (i & 1). zero: c = 0 (the first step of a block's dot), else c = d.
template <bool ZERO>
__device__ __forceinline__ void mma884(float (&d)[8], uint2 a, uint2 b) {
    if (ZERO) {
        asm("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, {%10,%11}, "
            "{%12,%12,%12,%12,%12,%12,%12,%12};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
            : "r"(a.x), "r"(a.y), "r"(b.x), "r"(b.y), "f"(0.f));
    } else {
        asm("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, {%10,%11}, "
            "{%0,%1,%2,%3,%4,%5,%6,%7};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
            : "r"(a.x), "r"(a.y), "r"(b.x), "r"(b.y));
    }
}
#endif

// The codes and scales of one block that a thread stages: thread i < MT a weight row's, else a token's.
struct Staged {
    int4 c0, c1;      // the 32 codes
    float a, b, c, d; // weight: scale(s), min halves; token: scale, half sums
};

template <int SC, bool MIN>
__global__ void __launch_bounds__(THREADS, 1) gemm_hmma_kernel(const MmaOperands op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    using Stage = HmmaStage<SC, MIN>;
    constexpr int HALVES = SC == MMA_PER16 ? 2 : 1;   // scaled dots per block
    constexpr int STEPS = 8 / HALVES;                 // k-steps of 4 per scaled dot
    extern __shared__ __align__(16) unsigned char hmma_smem[];
    Stage* st = reinterpret_cast<Stage*>(hmma_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wr = (warp % WARPS_M) * WTM, wt = (warp / WARPS_M) * WTN;  // the warp's first row and token
    const int qp = (lane >> 2) & 3, hi4 = (lane >> 4) * 4;
    const int frag_r = (qp & 1) * 8 + hi4 + (lane & 3);   // a fragment's row (token) within a 16 x 16 tile
    const int frag_t = (qp >> 1) * 8 + hi4 + (lane & 3);
    const int out_r = (qp & 1) * 8 + hi4 + (lane & 1);    // + (i & 2): d's rows
    const int out_t = (qp >> 1) * 8 + (lane & 2);         // + (i & 4) + (i & 1): d's tokens
    const int row0 = blockIdx.x * MT, tok0 = blockIdx.y * NT;
    const int nsub = op.n / 32, nh = op.n / 16;

    // This thread's row of the operands: rows past R or T read the last row (their outputs are never stored).
    const bool is_w = tid < MT;
    const int r = is_w ? tid : tid - MT;
    const size_t src_row = is_w ? (size_t)min(row0 + r, op.R - 1) : (size_t)min(tok0 + r, max(op.T - 1, 0));
    const int8_t* codes = (is_w ? op.wq : op.xq) + src_row * op.n;

    auto load = [&](int s) {
        Staged v;
        const int4* c = reinterpret_cast<const int4*>(codes + s * 32);
        v.c0 = __ldg(c);
        v.c1 = __ldg(c + 1);
        v.b = v.c = v.d = 0.f;
        if (is_w) {
            if (SC == MMA_Q8) {
                v.a = __half2float(static_cast<const __half*>(op.ws)[src_row * nsub + s]);
            } else {
                const float2 s2 = reinterpret_cast<const float2*>(static_cast<const float*>(op.ws) + src_row * nh)[s];
                v.a = s2.x;
                v.b = s2.y;
            }
            if (MIN) {
                const float2 m2 = reinterpret_cast<const float2*>(op.wm + src_row * nh)[s];
                v.c = m2.x;
                v.d = m2.y;
            }
        } else {
            v.a = op.xd[src_row * nsub + s];
            if (MIN) {
                const float2 e2 = reinterpret_cast<const float2*>(op.xs + src_row * nh)[s];
                v.b = e2.x;
                v.c = e2.y;
            }
        }
        return v;
    };
    auto store = [&](Stage& b, const Staged& v) {
        uint2* dst = reinterpret_cast<uint2*>(is_w ? &b.w[r][0] : &b.x[r][0]);  // KP halves: 8-byte aligned rows
        const int words[8] = {v.c0.x, v.c0.y, v.c0.z, v.c0.w, v.c1.x, v.c1.y, v.c1.z, v.c1.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            uint2 h;
            codes_to_f16(words[j], h.x, h.y);
            dst[j] = h;
        }
        if (is_w) {
            b.ws[0][r] = v.a;
            b.ws[1][r] = v.b;
            if (MIN) {
                b.wm[0][r] = v.c;
                b.wm[1][r] = v.d;
            }
        } else {
            b.xd[r] = v.a;
            if (MIN) {
                b.xs[0][r] = v.b;
                b.xs[1][r] = v.c;
            }
        }
    };

    float acc[MI][NI][8];  // [row tile][token tile][d element]
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[mi][ni][i] = 0.f;

    // One block's math: per scaled dot (the block, or each PER16 half) the integer dots of every tile on the tensor
    // cores from zero, then per output the DP4A GEMMs' fp32 expression.
    auto compute = [&](const Stage& b) {
#pragma unroll
        for (int h = 0; h < HALVES; ++h) {
            float d[MI][NI][8];
#pragma unroll
            for (int k = 0; k < STEPS; ++k) {
                const int col = (h * STEPS + k) * 4;
                uint2 af[MI], bf[NI];
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
                    af[mi] = *reinterpret_cast<const uint2*>(&b.w[wr + mi * 16 + frag_r][col]);
#pragma unroll
                for (int ni = 0; ni < NI; ++ni)
                    bf[ni] = *reinterpret_cast<const uint2*>(&b.x[wt + ni * 16 + frag_t][col]);
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni) {
                        if (k == 0) mma884<true>(d[mi][ni], af[mi], bf[ni]);
                        else mma884<false>(d[mi][ni], af[mi], bf[ni]);
                    }
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {   // d's rows out_r and out_r + 2
                    const int rr = wr + mi * 16 + out_r + 2 * hr;
                    const float s = b.ws[h][rr];
                    const float m0 = MIN ? b.wm[HALVES == 2 ? h : 0][rr] : 0.f, m1 = MIN ? b.wm[1][rr] : 0.f;
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                        for (int i = 0; i < 8; ++i) {
                            if ((i & 2) != 2 * hr) continue;
                            const int tt = wt + ni * 16 + out_t + (i & 4) + (i & 1);
                            const float sx = b.xd[tt];
                            float& o = acc[mi][ni][i];
                            if (SC == MMA_Q8 || (SC == MMA_PER32 && !MIN)) {
                                // the DP4A GEMMs' block_term (gemm_w16.cuh): their bits
                                o = __fmaf_rn(d[mi][ni][i], __fmul_rn(s, sx), o);
                            } else {
                                o = fmaf(s * d[mi][ni][i], sx, o);
                                if (MIN) {
                                    const float e0 = b.xs[HALVES == 2 ? h : 0][tt];
                                    o -= HALVES == 2 ? m0 * e0 : fmaf(m0, e0, m1 * b.xs[1][tt]);
                                }
                            }
                        }
                }
        }
    };

    // Two stages: the next block's codes and scales are in registers while this one is multiplied, stored after;
    // the barrier at the end of an iteration orders both (no warp still reads the slot being stored).
    store(st[0], load(0));
    __syncthreads();
    for (int kt = 0; kt < nsub; ++kt) {
        const bool more = kt + 1 < nsub;
        Staged v;
        if (more) v = load(kt + 1);
        compute(st[kt & 1]);
        if (more) store(st[(kt + 1) & 1], v);
        __syncthreads();
    }

    // d element i: row out_r + (i & 2), token out_t + (i & 4) + (i & 1)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int i2 = 0; i2 < 4; i2 += 2) {
            const int rr = row0 + wr + mi * 16 + out_r + i2;
            if (rr >= op.R) continue;
            const RowOut o = row_out(op.out, rr);
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int i = i2 | (j & 1) | (j & 2) << 1;
                    const int tt = tok0 + wt + ni * 16 + out_t + (i & 4) + (i & 1);
                    if (tt < op.T) o.store(tt, acc[mi][ni][i]);
                }
        }
#endif  // __CUDA_ARCH__ >= 700
}

template <int SC, bool MIN>
constexpr int hmma_bytes = 2 * (int)sizeof(HmmaStage<SC, MIN>);

template <int SC, bool MIN>
int launch(const MmaOperands& op) {
    constexpr int smem = hmma_bytes<SC, MIN>;
    constexpr auto kernel = gemm_hmma_kernel<SC, MIN>;
    CMP_TRY(smem_opt_in("gemm_hmma_kernel", kernel, smem));
    kernel<<<dim3(ceil_div(op.R, MT), ceil_div(op.T, NT)), THREADS, smem, stream()>>>(op);
    return check_launch("gemm_hmma_kernel");
}

PerDevice g_hmma_code;   // hmma_available

}  // namespace

// An sm_61 build has the kernel empty.
int hmma_available(bool* yes) { return code_at_least(gemm_hmma_kernel<MMA_Q8, false>, 70, g_hmma_code, yes); }

int gemm_hmma(MmaScales scales, bool mins, const MmaOperands& op) {
    bool ok = false;
    CMP_TRY(hmma_available(&ok));
    CMP_REQUIRE(ok, "the f16 tensor-core GEMM (--hw-route mma on Volta) needs mma.sync, compute capability 7.0+ "
                    "code; this device runs this library's older code");
    if (op.T == 0) return CMP_OK;
    return dispatch_scales(scales, mins, "gemm_hmma", [&](auto sc, auto min) {
        return launch<decltype(sc)::value, decltype(min)::value>(op);
    });
}

int gemm_hmma_wave(MmaScales scales, bool mins, int* blocks) {
    return dispatch_scales(scales, mins, "gemm_hmma_wave", [&](auto sc, auto min) {
        constexpr int SC = decltype(sc)::value;
        constexpr bool MIN = decltype(min)::value;
        return wave_blocks("gemm_hmma_kernel", gemm_hmma_kernel<SC, MIN>, THREADS, hmma_bytes<SC, MIN>, blocks);
    });
}

}  // namespace cmp

using namespace cmp;

extern "C" int cmp_hmma_available(int* yes) {
    bool ok = false;
    CMP_TRY(hmma_available(&ok));
    *yes = ok ? 1 : 0;
    return CMP_OK;
}
