// The vision tower's ops (llama.cpp's qwen3vl_merger graph, tools/mtmd/models/qwen3vl.cpp): bias add, LayerNorm,
// GELU (tanh form through ggml-cpu's f16 table), the vision 2D rotary (ggml_rope_multi in GGML_ROPE_TYPE_VISION
// mode), full non-causal attention over all patches, and the text model's attention input preparation with per-token multi-axis
// positions (ggml_rope_multi in GGML_ROPE_TYPE_IMROPE mode) for image tokens. FP32 only, no tensor cores.
#include <algorithm>

#include "common.cuh"
#include "smem_plan.h"

namespace cmp {
namespace {

constexpr int VIS_THREADS = 256;

// ==== element-wise and row-wise ===================================================================================

__global__ void bias_add_kernel(const float* __restrict__ x,  // [T, N]
                                const float* __restrict__ b,  // [N]
                                float* __restrict__ out,      // [T, N]
                                size_t total, int N) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = x[i] + b[i % N];
}

// GELU as llama.cpp's CPU backend evaluates it (Backend.gelu): x <= -10 -> 0, x >= 10 -> x, else the table entry
// of f16(x) (cvt.rn: round to nearest even), table[h] = f16(gelu_tanh(h)) -- ggml-cpu's GGML_GELU_FP16 table. The
// caller builds the table [65536] f16 from numpy_ref's formula, so every result is bit-identical to the
// reference's; no transcendental runs here (none of --use_fast_math's approximations, no FP64 on the target).
__global__ void gelu_kernel(const float* __restrict__ x,       // [n]
                            const __half* __restrict__ table,  // [65536], indexed by the f16 bits of x
                            float* __restrict__ out,           // [n]
                            size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        out[i] = v <= -10.f ? 0.f : v >= 10.f ? v : __half2float(table[__half_as_ushort(__float2half_rn(v))]);
    }
}

// Block per row. ggml_norm: mean, then the mean of squared deviations (two passes, not E[x^2] - mean^2, which
// cancels badly when |mean| >> std), y = (x - mean) / sqrt(var + eps) * w + b.
__global__ void layernorm_kernel(const float* __restrict__ x,  // [T, D]
                                 const float* __restrict__ w,  // [D]
                                 const float* __restrict__ b,  // [D]
                                 float* __restrict__ y,        // [T, D]
                                 int D, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * D;
    float* yr = y + (size_t)blockIdx.x * D;
    float s = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, scratch) / D;
    float ss = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float d = xr[i] - mean;
        ss += d * d;
    }
    const float r = rsqrtf(block_sum(ss, scratch) / D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = (xr[i] - mean) * r * w[i] + b[i];
}

// ==== rotary ======================================================================================================

// Block per token. The Dh/2 angles are formed once per token (in double: cheap here, and it matches the float64
// reference) and shared by every head. Vision mode (ggml_mrope_cache_init with indep_sects): pair i (0..Dh/2-1)
// rotates dims (i, i + Dh/2); its sector s = i % (s0+s1+s2+s3) picks the axis by plain sections (t for s < s0,
// h below s0+s1, w below s0+s1+s2, else e), and the frequency restarts at each section:
// theta = pos[axis] * base^(-2 (s - section start) / (Dh/2)).
__global__ void rope_vision_kernel(const float* __restrict__ x,      // [T, H*Dh]
                                   const int32_t* __restrict__ pos,  // [T, 4]
                                   float* __restrict__ out,          // [T, H*Dh]
                                   int H, int Dh, int4 sec, float base) {
    extern __shared__ float cs[];  // [Dh/2] cos then [Dh/2] sin
    const int t = blockIdx.x, half = Dh / 2;
    const int sect = sec.x + sec.y + sec.z + sec.w;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int s = i % sect;
        int axis, start;
        if (s < sec.x) axis = 0, start = 0;
        else if (s < sec.x + sec.y) axis = 1, start = sec.x;
        else if (s < sec.x + sec.y + sec.z) axis = 2, start = sec.x + sec.y;
        else axis = 3, start = sec.x + sec.y + sec.z;
        const double theta = (double)pos[(size_t)t * 4 + axis] * pow((double)base, -2.0 * (s - start) / half);
        double sn, c;
        sincos(theta, &sn, &c);
        cs[i] = (float)c;
        cs[half + i] = (float)sn;
    }
    __syncthreads();
    const size_t row = (size_t)t * H * Dh;
    for (int j = threadIdx.x; j < H * half; j += blockDim.x) {
        const int h = j / half, i = j % half;
        const size_t o = row + (size_t)h * Dh + i;
        const float x0 = x[o], x1 = x[o + half], c = cs[i], s = cs[half + i];
        out[o] = x0 * c - x1 * s;
        out[o + half] = x0 * s + x1 * c;
    }
}

// attention_prep (elementwise.cu) with four position ids per token, IMROPE (ggml_mrope_cache_init, is_imrope):
// pair i < n_rot/2 rotates dims (i, i + n_rot/2) by theta = p * base^(-2i/n_rot) where, with s = i % (s0+s1+s2+s3),
// p is pos[h] when s % 3 == 1 and s < 3*s1, pos[w] when s % 3 == 2 and s < 3*s2, pos[t] when s % 3 == 0 and
// s < 3*s0, else pos[e]. Same block layout as attention_prep_kernel: block (t, head) over the Hq q heads then the
// Hk k heads, blockDim.x = Dh rounded up to 32. Angles in double for the same reason (long-context positions).
__global__ void attention_prep_mrope_kernel(const float* __restrict__ qg,      // [T, Hq, 2, Dh]
                                            const float* __restrict__ k,       // [T, Hk, Dh]
                                            const float* __restrict__ q_norm,  // [Dh]
                                            const float* __restrict__ k_norm,  // [Dh]
                                            const int32_t* __restrict__ pos,   // [T, 4]
                                            float* __restrict__ q_out,         // [T, Hq, Dh]
                                            float* __restrict__ k_out,         // [T, Hk, Dh]
                                            float* __restrict__ gate_out,      // [T, Hq*Dh]
                                            int Hq, int Hk, int Dh, int n_rot, int4 sec, float rope_base,
                                            float eps) {
    __shared__ float scratch[32];
    __shared__ float normed[1024];
    float* dst = attn_prep_norm_head(qg, k, q_norm, k_norm, q_out, k_out, gate_out, Hq, Hk, Dh, eps, scratch, normed);
    const int t = blockIdx.x, d = threadIdx.x;
    if (d >= Dh) return;
    const int half = n_rot / 2;
    float out = normed[d];
    if (d < n_rot) {
        const int i = d < half ? d : d - half;
        const int s = i % (sec.x + sec.y + sec.z + sec.w);
        int axis = 3;
        if (s % 3 == 1 && s < 3 * sec.y) axis = 1;
        else if (s % 3 == 2 && s < 3 * sec.z) axis = 2;
        else if (s % 3 == 0 && s < 3 * sec.x) axis = 0;
        const double theta = (double)pos[(size_t)t * 4 + axis] * pow((double)rope_base, -2.0 * i / n_rot);
        double sn, c;
        sincos(theta, &sn, &c);
        const float x0 = normed[i], x1 = normed[i + half];
        out = d < half ? (float)(x0 * c - x1 * sn) : (float)(x0 * sn + x1 * c);
    }
    dst[d] = out;
}

// ==== full attention ==============================================================================================

// Non-causal softmax(q k^T * scale) v over all T rows, flash style in FP32. Block = 16 * RA queries of one head
// (RA 4, or 2 where shared memory is short: smem::attention_full_plan), 256 threads as a 16x16 grid: thread
// (ty, tx) owns query rows ty + 16a (a < RA) and, for the scores of a 64-key tile,
// keys tx + 16b (b < 4); for the output, head dims tx + 16c (c < NC = ceil(Dh/16)). The 16 threads sharing a row
// are 16 lanes of one warp, so the row max and sum are shuffles. Online softmax: running max m and sum l per row,
// the output rescaled by exp(m_old - m_new).
// Shared memory (smem::attention_full_bytes): Q tile [16 RA][S] (pre-scaled), one K-or-V tile [64][S] (K is read
// for the scores, then V overwrites it), P [16 RA][FA_PS]. S = Dh rounded up to 4, plus 4 when that is a multiple
// of 8, so rows are 16-byte aligned and S % 32 is an odd multiple of 4: the scores read q and k as float4 (4 head dims per load)
// and the 8 threads of a quarter-warp hit 8 distinct 16-byte bank groups. Columns Dh..S-1 are zero. The P . V
// product reads P as float4 (4 keys per load); keys past T have P = 0 and V rows of zeros.
using smem::FA_BK;
using smem::FA_PS;
using smem::fa_stride;

template <int NC, int RA>
__global__ void __launch_bounds__(VIS_THREADS)
attention_full_kernel(const float* __restrict__ q,  // [T, ldq] (head h at columns h*Dh)
                      const float* __restrict__ k,  // [T, ldk]
                      const float* __restrict__ v,  // [T, ldv]
                      float* __restrict__ out,      // [T, H*Dh]
                      int T, int H, int Dh, int ldq, int ldk, int ldv, float scale) {
    extern __shared__ __align__(16) float sm[];
    constexpr int BQ = 16 * RA;        // queries per block
    const int S = fa_stride(Dh);
    float* Qs = sm;                    // [BQ][S]
    float* KVs = Qs + BQ * S;          // [64][S]
    float* Ps = KVs + FA_BK * S;       // [BQ][FA_PS]
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y;

    for (int i = tid; i < BQ * S; i += VIS_THREADS) {
        const int r = i / S, d = i % S;
        Qs[i] = q0 + r < T && d < Dh ? q[(size_t)(q0 + r) * ldq + (size_t)h * Dh + d] * scale : 0.f;
    }
    float m[RA], l[RA], acc[RA][NC];
#pragma unroll
    for (int a = 0; a < RA; ++a) {
        m[a] = -INFINITY;
        l[a] = 0.f;
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[a][c] = 0.f;
    }

    for (int k0 = 0; k0 < T; k0 += FA_BK) {
        __syncthreads();  // the previous tile's V and P reads are done (and, at k0 = 0, Qs is written)
        for (int i = tid; i < FA_BK * S; i += VIS_THREADS) {
            const int r = i / S, d = i % S;
            KVs[i] = k0 + r < T && d < Dh ? k[(size_t)(k0 + r) * ldk + (size_t)h * Dh + d] : 0.f;
        }
        __syncthreads();
        float s[RA][4] = {};
#pragma unroll 2
        for (int d = 0; d < Dh; d += 4) {
            float4 qa[RA], kb[4];
#pragma unroll
            for (int a = 0; a < RA; ++a) qa[a] = *reinterpret_cast<const float4*>(&Qs[(ty + 16 * a) * S + d]);
#pragma unroll
            for (int b = 0; b < 4; ++b) kb[b] = *reinterpret_cast<const float4*>(&KVs[(tx + 16 * b) * S + d]);
#pragma unroll
            for (int a = 0; a < RA; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    float t = fmaf(qa[a].x, kb[b].x, s[a][b]);
                    t = fmaf(qa[a].y, kb[b].y, t);
                    t = fmaf(qa[a].z, kb[b].z, t);
                    s[a][b] = fmaf(qa[a].w, kb[b].w, t);
                }
        }
#pragma unroll
        for (int a = 0; a < RA; ++a) {
            float mx = -INFINITY;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                if (k0 + tx + 16 * b >= T) s[a][b] = -INFINITY;
                mx = fmaxf(mx, s[a][b]);
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = fmaxf(m[a], mx);   // finite: every tile holds at least one valid key
            const float corr = __expf(m[a] - m_new);
            float sum = 0.f;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const float p = __expf(s[a][b] - m_new);
                Ps[(ty + 16 * a) * FA_PS + tx + 16 * b] = p;
                sum += p;
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            l[a] = l[a] * corr + sum;
            m[a] = m_new;
#pragma unroll
            for (int c = 0; c < NC; ++c) acc[a][c] *= corr;
        }
        __syncthreads();  // all scores read K: V may overwrite it; P is complete
        for (int i = tid; i < FA_BK * S; i += VIS_THREADS) {
            const int r = i / S, d = i % S;
            KVs[i] = k0 + r < T && d < Dh ? v[(size_t)(k0 + r) * ldv + (size_t)h * Dh + d] : 0.f;
        }
        __syncthreads();
        const int kn = min(FA_BK, T - k0);
        for (int j = 0; j < kn; j += 4) {          // keys kn..j+3 (past T) have P = 0 and V = 0
            float4 p[RA];
#pragma unroll
            for (int a = 0; a < RA; ++a) p[a] = *reinterpret_cast<const float4*>(&Ps[(ty + 16 * a) * FA_PS + j]);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                float vv[NC];
#pragma unroll
                for (int c = 0; c < NC; ++c) vv[c] = tx + 16 * c < Dh ? KVs[(j + jj) * S + tx + 16 * c] : 0.f;
#pragma unroll
                for (int a = 0; a < RA; ++a) {
                    const float pa = jj == 0 ? p[a].x : jj == 1 ? p[a].y : jj == 2 ? p[a].z : p[a].w;
#pragma unroll
                    for (int c = 0; c < NC; ++c) acc[a][c] = fmaf(pa, vv[c], acc[a][c]);
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < RA; ++a) {
        const int r = q0 + ty + 16 * a;
        if (r >= T) continue;
        const float inv = 1.f / l[a];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int d = tx + 16 * c;
            if (d < Dh) out[(size_t)r * H * Dh + (size_t)h * Dh + d] = acc[a][c] * inv;
        }
    }
}

template <int NC, int RA>
int launch_attention_full_rows(const float* q, const float* k, const float* v, float* out, int T, int H, int Dh,
                               int ldq, int ldk, int ldv, float scale) {
    const size_t bytes = smem::attention_full_bytes(Dh, 16 * RA);
    CMP_TRY(smem_opt_in("attention_full_kernel", attention_full_kernel<NC, RA>, bytes));
    attention_full_kernel<NC, RA><<<dim3(ceil_div(T, 16 * RA), H), VIS_THREADS, bytes, stream()>>>(
        q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
    return check_launch("attention_full_kernel");
}

// 64 queries per block where shared memory allows, else 32 (smem::attention_full_plan: sm_61 at head dim 64-80).
template <int NC>
int launch_attention_full(const float* q, const float* k, const float* v, float* out, int T, int H, int Dh, int ldq,
                          int ldk, int ldv, float scale) {
    size_t limit = 0;
    CMP_TRY(smem_limit(&limit));
    const auto run = smem::attention_full_plan(Dh, limit).config == 64 ? launch_attention_full_rows<NC, 4>
                                                                       : launch_attention_full_rows<NC, 2>;
    return run(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
}

unsigned grid_for(size_t n) { return (unsigned)std::min<size_t>(ceil_div(n, VIS_THREADS), 65535u * 4); }

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_bias_add(const float* x, const float* b, float* out, int T, int N) {
    CMP_REQUIRE(T >= 0 && N > 0, "cmp_bias_add: bad shape T=%d N=%d", T, N);
    const size_t total = (size_t)T * N;
    if (total == 0) return CMP_OK;
    bias_add_kernel<<<grid_for(total), VIS_THREADS, 0, stream()>>>(x, b, out, total, N);
    return check_launch("bias_add_kernel");
}

extern "C" int cmp_gelu(const float* x, const void* table, float* out, size_t n) {
    if (n == 0) return CMP_OK;
    gelu_kernel<<<grid_for(n), VIS_THREADS, 0, stream()>>>(x, static_cast<const __half*>(table), out, n);
    return check_launch("gelu_kernel");
}

extern "C" int cmp_layernorm(const float* x, const float* w, const float* b, float* y, int T, int D, float eps) {
    CMP_REQUIRE(T >= 0 && D > 0, "cmp_layernorm: bad shape T=%d D=%d", T, D);
    if (T == 0) return CMP_OK;
    const int threads = D >= 1024 ? 1024 : D >= 256 ? 256 : 32 * (int)ceil_div(D, 32);
    layernorm_kernel<<<T, threads, 0, stream()>>>(x, w, b, y, D, eps);
    return check_launch("layernorm_kernel");
}

extern "C" int cmp_rope_vision(const float* x, const int32_t* pos, float* out, int T, int H, int Dh, int s0, int s1,
                               int s2, int s3, float base) {
    CMP_REQUIRE(T >= 0 && H > 0 && Dh > 0 && Dh % 4 == 0, "cmp_rope_vision: bad shape T=%d H=%d Dh=%d (Dh %% 4 == 0)",
                T, H, Dh);
    CMP_REQUIRE(s0 >= 0 && s1 >= 0 && s2 >= 0 && s3 >= 0 && s0 + s1 + s2 + s3 > 0 && s0 + s1 + s2 + s3 <= Dh,
                "cmp_rope_vision: sections (%d, %d, %d, %d) must be >= 0 with a sum in 1..Dh=%d", s0, s1, s2, s3, Dh);
    if (T == 0) return CMP_OK;
    rope_vision_kernel<<<T, VIS_THREADS, sizeof(float) * Dh, stream()>>>(x, pos, out, H, Dh, make_int4(s0, s1, s2, s3),
                                                                          base);
    return check_launch("rope_vision_kernel");
}

extern "C" int cmp_attention_prep_mrope(const float* qg, const float* k, const float* q_norm, const float* k_norm,
                                        const int32_t* pos, float* q_out, float* k_out, float* gate_out, int T, int Hq,
                                        int Hk, int Dh, int n_rot, int s0, int s1, int s2, int s3, float rope_base,
                                        float eps) {
    // Hq = 0: the k heads alone, as cmp_attention_prep
    CMP_REQUIRE(T >= 0 && Hq >= 0 && Hk > 0 && Dh > 0 && Dh <= 1024 && n_rot >= 0 && n_rot <= Dh && n_rot % 2 == 0,
                "cmp_attention_prep_mrope: bad shape T=%d Hq=%d Hk=%d Dh=%d n_rot=%d", T, Hq, Hk, Dh, n_rot);
    CMP_REQUIRE(s0 >= 0 && s1 >= 0 && s2 >= 0 && s3 >= 0 && s0 + s1 + s2 + s3 > 0,
                "cmp_attention_prep_mrope: sections (%d, %d, %d, %d) must be >= 0 with a positive sum", s0, s1, s2,
                s3);
    if (T == 0) return CMP_OK;
    attention_prep_mrope_kernel<<<dim3(T, Hq + Hk), 32 * ceil_div(Dh, 32), 0, stream()>>>(
        qg, k, q_norm, k_norm, pos, q_out, k_out, gate_out, Hq, Hk, Dh, n_rot, make_int4(s0, s1, s2, s3), rope_base,
        eps);
    return check_launch("attention_prep_mrope_kernel");
}

extern "C" int cmp_attention_full(const float* q, const float* k, const float* v, float* out, int T, int H, int Dh,
                                  int ldq, int ldk, int ldv, float scale) {
    CMP_REQUIRE(T >= 0 && H > 0 && Dh > 0 && Dh <= 128 && ldq >= H * Dh && ldk >= H * Dh && ldv >= H * Dh,
                "cmp_attention_full: bad shape T=%d H=%d Dh=%d (Dh <= 128) ld=%d/%d/%d", T, H, Dh, ldq, ldk, ldv);
    if (T == 0) return CMP_OK;
    switch ((Dh + 15) / 16) {
        case 1: return launch_attention_full<1>(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
        case 2: return launch_attention_full<2>(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
        case 3: return launch_attention_full<3>(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
        case 4: return launch_attention_full<4>(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
        case 5: return launch_attention_full<5>(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
        case 6: return launch_attention_full<6>(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
        case 7: return launch_attention_full<7>(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
        default: return launch_attention_full<8>(q, k, v, out, T, H, Dh, ldq, ldk, ldv, scale);
    }
}
