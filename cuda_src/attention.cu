// Causal GQA attention over the KV cache, FlashAttention-style in fp32 (no tensor cores): KV tiles of 32 keys in
// shared memory, online softmax per query row, optional split of the key range across blocks (decode over long
// contexts) merged by log-sum-exp. Head dim 32..256 (a multiple of 32), KV cache f16 or f32.
#include <algorithm>

#include "attention_kv.cuh"
#include "common.cuh"
#include "gemm_chunks.h"
#include "serial_pieces.cuh"
#include "smem_plan.h"

namespace cmp {
namespace {

constexpr int ATT_BN = smem::ATT_BN;   // keys per tile: lane j scores key j
constexpr int ATT_WARPS = 4;
constexpr int ATT_RPW = 4;     // query rows (query, head) per warp
constexpr int ATT_ROWS = ATT_WARPS * ATT_RPW;
static_assert(ATT_ROWS == smem::ATT_ROWS, "smem_plan.h sizes attention_kernel's shared memory");
constexpr float NEG_BIG = -1e30f;  // "minus infinity" that keeps exp and subtraction finite under fast-math

// ==== kernels =====================================================================================================

template <typename KV>
__global__ void kv_write_kernel(const float* __restrict__ k,      // [L, Hk*Dh]
                                const float* __restrict__ v,      // [L, Hk*Dh]
                                const int32_t* __restrict__ pos,  // [L]
                                KV* __restrict__ kc,              // [n_ctx, Hk*Dh]
                                KV* __restrict__ vc,              // [n_ctx, Hk*Dh]
                                int row) {                        // Hk*Dh
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const int t = blockIdx.x;
    const size_t dst = (size_t)pos[t] * row, src = (size_t)t * row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        from_f32(kc[dst + i], k[src + i]);
        from_f32(vc[dst + i], v[src + i]);
    }
}

// Block (row tile, kv head, split). The block's rows are r0 .. r0+ROWS-1 of the flattened (token, head in group)
// space of this kv head, so the K/V tiles it loads serve every q head of the group (GQA reuse).
// Per key tile: (A) lane j of a warp scores key j against each of its rows (the padded K tile makes that
// conflict-free), online softmax; (B) each lane accumulates DPL = Dh/32 output dims, broadcasting p_j with shuffles.
// SMALL (smem::attention_plan, where K and V tiles and 16 rows do not fit: head dim 256 below sm_70): 8 rows, and
// the V tile is loaded over the K tile between (A) and (B). A row's arithmetic is the same either way.
// n_split > 1: the key range [0, kmax) is cut into n_split pieces; each writes unnormalised acc and (m, l) to work.
template <int DPL, typename KV, bool SMALL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_kernel(const float* __restrict__ q,      // [L, Hq, Dh]
                 const KV* __restrict__ kc,        // [n_ctx, Hk, Dh]
                 const KV* __restrict__ vc,        // [n_ctx, Hk, Dh]
                 const int32_t* __restrict__ pos,  // [L]
                 float* __restrict__ out,          // [L, Hq*Dh]          (n_split == 1)
                 float* __restrict__ work,         // [n_split, L*Hq, Dh+2] (n_split > 1)
                 int L, int Hq, int Hk, float scale, int n_split) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    constexpr int Dh = DPL * 32;
    constexpr int RPW = SMALL ? ATT_RPW / 2 : ATT_RPW, ROWS = ATT_WARPS * RPW;   // query rows per warp, per block
    extern __shared__ float smem[];
    float* Ks = smem;                                             // [ATT_BN][Dh+1]
    float* Vs = SMALL ? Ks : Ks + ATT_BN * (Dh + 1);              // [ATT_BN][Dh]
    float* Qs = Ks + ATT_BN * (Dh + 1) + (SMALL ? 0 : ATT_BN * Dh);   // [ROWS][Dh]
    const int group = Hq / Hk, kvh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int total = L * group, r0 = blockIdx.x * ROWS;
    const int pos0 = pos[0];

    for (int i = threadIdx.x; i < ROWS * Dh; i += blockDim.x) {
        const int r = r0 + i / Dh, d = i % Dh;
        float val = 0.f;
        if (r < total) val = q[((size_t)(r / group) * Hq + kvh * group + r % group) * Dh + d] * scale;
        Qs[i] = val;
    }
    // Keys this block may need: up to the last row's position (rows are in token order).
    const int last = min(r0 + ROWS, total) - 1;
    const int kmax = pos0 + last / group + 1;
    const int chunk = (kmax + n_split - 1) / n_split;
    const int kbeg = split * chunk, kend = min(kmax, kbeg + chunk);

    float m[RPW], l[RPW], acc[RPW][DPL];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        m[i] = NEG_BIG;
        l[i] = 0.f;
#pragma unroll
        for (int d = 0; d < DPL; ++d) acc[i][d] = 0.f;
    }
    const size_t kv_row = (size_t)Hk * Dh;
    for (int kt = kbeg; kt < kend; kt += ATT_BN) {
        __syncthreads();  // previous tile fully consumed (and Qs written, on the first pass)
        for (int i = threadIdx.x; i < ATT_BN * Dh; i += blockDim.x) {
            const int j = i / Dh, d = i % Dh, key = kt + j;
            float kv = 0.f, vv = 0.f;
            if (key < kend) {
                kv = to_f32(kc[key * kv_row + (size_t)kvh * Dh + d]);
                if (!SMALL) vv = to_f32(vc[key * kv_row + (size_t)kvh * Dh + d]);
            }
            Ks[j * (Dh + 1) + d] = kv;
            if (!SMALL) Vs[j * Dh + d] = vv;
        }
        __syncthreads();
        float p[RPW];      // this lane's key's probability for each row
        bool live[RPW];    // the row has an unmasked key so far (warp-uniform, as are the loop exits below)
        // Every row's flags are set before the scoring loop, which breaks at the first row past the end: (B) reads
        // them for every row, and left unset they differ across a warp's lanes, so (B)'s full-mask __shfl_sync ran
        // on some lanes only while the others waited at the next tile's __syncthreads: the block never finished
        // (tests/test_attention_sass.py checks the SASS for a branch on an unwritten register).
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
            p[i] = 0.f;
            live[i] = false;
        }
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
            const int r = r0 + warp * RPW + i;
            if (r >= total) break;
            const int qpos = pos0 + r / group;
            const float* qr = Qs + (warp * RPW + i) * Dh;
            const float* kr = Ks + lane * (Dh + 1);
            float s = 0.f;
#pragma unroll 8
            for (int d = 0; d < Dh; ++d) s = fmaf(qr[d], kr[d], s);
            const int key = kt + lane;
            if (key >= kend || key > qpos) s = NEG_BIG;
            const float mt = warp_max(s);
            const float m_new = fmaxf(m[i], mt);
            if (m_new <= NEG_BIG) continue;  // every key so far masked for this row
            p[i] = s <= NEG_BIG ? 0.f : __expf(s - m_new);
            const float corr = __expf(m[i] - m_new);
            l[i] = l[i] * corr + warp_sum(p[i]);
            m[i] = m_new;
            live[i] = true;
#pragma unroll
            for (int d = 0; d < DPL; ++d) acc[i][d] *= corr;
        }
        if (SMALL) {   // V over K, now that every row is scored
            __syncthreads();
            for (int i = threadIdx.x; i < ATT_BN * Dh; i += blockDim.x) {
                const int j = i / Dh, d = i % Dh, key = kt + j;
                Vs[j * Dh + d] = key < kend ? to_f32(vc[key * kv_row + (size_t)kvh * Dh + d]) : 0.f;
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
            if (!live[i]) continue;
            for (int j = 0; j < ATT_BN; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p[i], j);
#pragma unroll
                for (int d = 0; d < DPL; ++d) acc[i][d] = fmaf(pj, Vs[j * Dh + lane + 32 * d], acc[i][d]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        const int r = r0 + warp * RPW + i;
        if (r >= total) break;
        const int t = r / group, h = kvh * group + r % group;
        if (n_split == 1) {
            const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
            for (int d = 0; d < DPL; ++d) out[((size_t)t * Hq + h) * Dh + lane + 32 * d] = acc[i][d] * inv;
        } else {
            float* w = work + ((size_t)split * L * Hq + (size_t)t * Hq + h) * (Dh + 2);
#pragma unroll
            for (int d = 0; d < DPL; ++d) w[lane + 32 * d] = acc[i][d];
            if (lane == 0) {
                w[Dh] = m[i];
                w[Dh + 1] = l[i];
            }
        }
    }
}

// Block per (token, q head): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
__global__ void attention_merge_kernel(const float* __restrict__ work,  // [n_split, L*Hq, Dh+2]
                                       float* __restrict__ out,         // [L*Hq, Dh]
                                       int rows, int Dh, int n_split) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const int r = blockIdx.x;
    float M = NEG_BIG;
    for (int s = 0; s < n_split; ++s) M = fmaxf(M, work[((size_t)s * rows + r) * (Dh + 2) + Dh]);
    float lsum = 0.f;
    for (int s = 0; s < n_split; ++s) {
        const float* w = work + ((size_t)s * rows + r) * (Dh + 2);
        lsum += w[Dh + 1] * __expf(w[Dh] - M);
    }
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < n_split; ++s) {
            const float* w = work + ((size_t)s * rows + r) * (Dh + 2);
            a += w[d] * __expf(w[Dh] - M);
        }
        out[(size_t)r * Dh + d] = a * inv;
    }
}

// ==== launchers ===================================================================================================

template <int DPL, typename KV, bool SMALL>
int launch_attention_rows(const float* q, const void* kc, const void* vc, const int32_t* pos, float* out, float* work,
                          int L, int Hq, int Hk, float scale, int n_split) {
    constexpr int Dh = DPL * 32, ROWS = SMALL ? smem::ATT_ROWS / 2 : smem::ATT_ROWS;
    constexpr size_t bytes = smem::attention_bytes(Dh, ROWS);
    auto kernel = attention_kernel<DPL, KV, SMALL>;
    CMP_TRY(smem_opt_in("attention_kernel", kernel, bytes));
    const dim3 grid(ceil_div((size_t)L * (Hq / Hk), ROWS), Hk, n_split);
    CMP_TRY(launch("attention_kernel", kernel, grid, dim3(ATT_WARPS * 32), bytes, q, static_cast<const KV*>(kc),
                   static_cast<const KV*>(vc), pos, out, work, L, Hq, Hk, scale, n_split));
    if (n_split == 1) return CMP_OK;
    return launch("attention_merge_kernel", attention_merge_kernel, dim3(L * Hq), dim3(std::min(Dh, 256)), 0, work,
                  out, L * Hq, Dh, n_split);
}

// 16 rows per block with separate K and V tiles where they fit, else SMALL (smem::attention_plan).
template <int DPL, typename KV>
int launch_attention(const float* q, const void* kc, const void* vc, const int32_t* pos, float* out, float* work,
                     int L, int Hq, int Hk, float scale, int n_split) {
    size_t limit = 0;
    CMP_TRY(smem_limit(&limit));
    const auto run = smem::attention_plan(DPL * 32, limit).config == smem::ATT_ROWS
                         ? launch_attention_rows<DPL, KV, false> : launch_attention_rows<DPL, KV, true>;
    return run(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
}

template <typename KV>
int dispatch_head_dim(int Dh, const float* q, const void* kc, const void* vc, const int32_t* pos, float* out,
                      float* work, int L, int Hq, int Hk, float scale, int n_split) {
    switch (Dh) {
        // 64, 128, 256: cmp_attn_prefill / cmp_attn_decode (v2), which won there on every KV type
        case 32: return launch_attention<1, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        case 96: return launch_attention<3, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        case 192: return launch_attention<6, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        default: return fail(CMP_ERR_UNSUPPORTED, "cmp_attention: head dim %d not supported (32/96/192; 64/128/256: "
                             "cmp_attn_prefill, cmp_attn_decode)", Dh);
    }
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_kv_write(const float* k, const float* v, const int32_t* pos, void* kc, void* vc, int kv_dtype,
                            int L, int Hk, int Dh) {
    CMP_REQUIRE(L >= 0 && Hk > 0 && Dh > 0, "cmp_kv_write: bad shape L=%d Hk=%d Dh=%d", L, Hk, Dh);
    if (L == 0) return CMP_OK;
    return dispatch_dtype(kv_dtype, [&](auto tag) {
        using KV = decltype(tag);
        return launch("kv_write_kernel", kv_write_kernel<KV>, dim3(L), dim3(256), 0, k, v, pos, static_cast<KV*>(kc),
                      static_cast<KV*>(vc), Hk * Dh);
    });
}

extern "C" int cmp_attention(const float* q, const void* kc, const void* vc, int kv_dtype, const int32_t* pos,
                             float* out, float* work, int L, int Hq, int Hk, int Dh, float scale, int n_split) {
    CMP_REQUIRE(L >= 0 && Hk > 0 && Hq % Hk == 0 && n_split >= 1 && (n_split == 1 || work),
                "cmp_attention: bad arguments L=%d Hq=%d Hk=%d n_split=%d", L, Hq, Hk, n_split);
    if (L == 0) return CMP_OK;
    return dispatch_dtype(kv_dtype, [&](auto tag) {
        return dispatch_head_dim<decltype(tag)>(Dh, q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
    });
}

// =================================================================================================================
// v2: quantized KV write, FlashAttention-2-style prefill and split-K decode over every KV type (attention_kv.cuh).
// The round-1 kernels above take the head dims these do not (32, 96, 192; f16/f32 caches of one type).
// =================================================================================================================
namespace cmp {
namespace {

constexpr int DEC_SPLITS = 128;   // target key ranges per row: 128 x Hk (4) = 512 blocks fill 132 SMs (and 80)
// One 64-key tile per split at least: at a few hundred keys 128-key splits left 4 x Hk = 16 blocks on 132 SMs
// (9B Q4_K_M decode at depth 512, H200: 17.5 us per layer, 2026-12-02).
constexpr int DEC_MIN_CHUNK = 64;

// Keys per split for a row of n_kv keys: a function of n_kv alone, so a row's result never depends on the batch
// (or on whether the step was captured in a graph): at least 64 keys, a multiple of 64, <= ~128 splits.
__host__ __device__ inline int dec_chunk(int n_kv) {
    int c = (n_kv + DEC_SPLITS - 1) / DEC_SPLITS;
    c = (c + 63) / 64 * 64;
    return c < DEC_MIN_CHUNK ? DEC_MIN_CHUNK : c;
}
__host__ __device__ inline int dec_splits(int n_kv) {
    const int c = dec_chunk(n_kv);
    return (n_kv + c - 1) / c;
}

// ---- KV write ------------------------------------------------------------------------------------------------------
// Block (token t, kv head h, 0 = K / 1 = V), 128 threads. Warps take 32-value groups (f16/f32/q8_0/q4_0) or tq3
// B-blocks. Quantizers use correctly rounded division/reciprocal (the library builds with fast math) so that the
// codes equal kv_quant.py's.
__device__ void kv_quant_row(const float* __restrict__ x, uint8_t* __restrict__ row, int type, int Dh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (type == CMP_KV_F32 || type == CMP_KV_F16) {
        for (int i = threadIdx.x; i < Dh; i += blockDim.x) {
            if (type == CMP_KV_F32) reinterpret_cast<float*>(row)[i] = x[i];
            else reinterpret_cast<__half*>(row)[i] = __float2half_rn(x[i]);
        }
        return;
    }
    if (type == CMP_KV_Q8_0 || type == CMP_KV_Q4_0) {
        for (int g = warp; g < Dh / 32; g += nw) {
            const float v = x[g * 32 + lane];
            __half* dst_d = reinterpret_cast<__half*>(row + (type == CMP_KV_Q8_0 ? Dh : Dh / 2)) + g;
            if (type == CMP_KV_Q8_0) {
                const float amax = warp_max(fabsf(v));
                const float d = __fdiv_rn(amax, 127.f);
                const float inv = d > 0.f ? __frcp_rn(d) : 0.f;
                const float y = __fmul_rn(v, inv);
                const float qa = floorf(__fadd_rn(fabsf(y), 0.5f));
                row[g * 32 + lane] = (uint8_t)(int8_t)(y < 0.f ? -qa : qa);
                if (lane == 0) *dst_d = __float2half_rn(d);
            } else {
                // value of largest magnitude, the first one among ties (numpy argmax)
                float best = fabsf(v);
                int idx = lane;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
                    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
                    if (ob > best || (ob == best && oi < idx)) {
                        best = ob;
                        idx = oi;
                    }
                }
                const float mx = __shfl_sync(0xffffffffu, v, idx);
                const float d = __fdiv_rn(mx, -8.f);
                const float inv = d != 0.f ? __frcp_rn(d) : 0.f;
                const int q = min(15, (int)truncf(__fadd_rn(__fmul_rn(v, inv), 8.5f)));
                const int hi = __shfl_down_sync(0xffffffffu, q, 1);
                if ((lane & 1) == 0) row[(g * 32 + lane) / 2] = (uint8_t)(q | (hi << 4));
                if (lane == 0) *dst_d = __float2half_rn(d);
            }
        }
        return;
    }
    // tq3: a warp per B-block; value i = j*32 + lane of the block (j < B/32).
    const int B = tq3_block(Dh), per = B / 32;
    for (int blk = warp; blk < Dh / B; blk += nw) {
        float y[4];
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            y[j] = 0.f;
            if (j < per) {
                const float v = x[blk * B + j * 32 + lane];
                ss = fmaf(v, v, ss);
                y[j] = v * tq3_sign(j * 32 + lane);
            }
        }
        const float norm = sqrtf(warp_sum(ss));
        for (int h = 1; h < B; h <<= 1) {   // unnormalised Walsh-Hadamard over i = j*32 + lane
            float t[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) t[j] = h < 32 ? __shfl_xor_sync(0xffffffffu, y[j], h) : y[j];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (j >= per) continue;
                const int i = j * 32 + lane;
                // h >= 32: the partner is this lane's value j ^ (h/32) (in t, read before any update)
                const int jj = j ^ (h >> 5);
                const float other = h < 32 ? t[j] : jj == 0 ? t[0] : jj == 1 ? t[1] : jj == 2 ? t[2] : t[3];
                const float self = h < 32 ? y[j] : t[j];
                y[j] = (i & h) ? other - self : self + other;
            }
        }
        int code[4];
        float lss = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            code[j] = 0;
            if (j < per) {
                code[j] = tq3_code(norm > 0.f ? __fdiv_rn(y[j], norm) : 0.f);
                const float l = tq3_level(code[j]);
                lss = fmaf(l, l, lss);
            }
        }
        const float lnorm = sqrtf(warp_sum(lss));
        uint8_t* codes = row + blk * (B / 32) * 12;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j >= per) continue;
            const unsigned b0 = __ballot_sync(0xffffffffu, code[j] & 1), b1 = __ballot_sync(0xffffffffu, code[j] & 2),
                           b2 = __ballot_sync(0xffffffffu, code[j] & 4);
            if (lane < 12) {
                const unsigned w = lane < 4 ? b0 : lane < 8 ? b1 : b2;
                codes[j * 12 + lane] = (uint8_t)(w >> (8 * (lane & 3)));
            }
        }
        if (lane == 0)
            reinterpret_cast<__half*>(row + Dh * 3 / 8)[blk] = __float2half_rn(norm > 0.f ? __fdiv_rn(norm, lnorm) : 0.f);
    }
}

__global__ void __launch_bounds__(128) kv_write_q_kernel(const float* __restrict__ k,      // [L, Hk*Dh]
                                                         const float* __restrict__ v,      // [L, Hk*Dh]
                                                         const int32_t* __restrict__ pos,  // [L]
                                                         uint8_t* __restrict__ kc,         // [n_ctx, Hk, kbytes]
                                                         uint8_t* __restrict__ vc,         // [n_ctx, Hk, vbytes]
                                                         int k_type, int v_type, int Hk, int Dh, int kbytes,
                                                         int vbytes) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const int t = blockIdx.x, h = blockIdx.y;
    const bool is_v = blockIdx.z == 1;
    const float* src = (is_v ? v : k) + ((size_t)t * Hk + h) * Dh;
    const int bytes = is_v ? vbytes : kbytes;
    uint8_t* dst = (is_v ? vc : kc) + ((size_t)pos[t] * Hk + h) * bytes;
    kv_quant_row(src, dst, is_v ? v_type : k_type, Dh);
}

// ---- decode: split-K over the keys of each row -----------------------------------------------------------------------
// Sum N values v[0..N) across the lanes of aligned groups, over the lane offsets FROM, 2*FROM, ... < TO (powers of
// two), with N/2 + N/4 + ... shuffles instead of N per offset: while a lane keeps several values, each step halves
// them (the lane with the offset's bit set keeps the upper half). lane_reduced() says what a lane holds afterwards.
template <int N, int NV, int FROM, int TO>
__device__ __forceinline__ void lane_reduce(float (&v)[NV], int lane) {
    int n = N;
#pragma unroll
    for (int off = FROM; off < TO; off <<= 1) {
        if (n > 1) {
            const bool upper = lane & off;
#pragma unroll
            for (int i = 0; i < NV / 2; ++i) {
                if (i < n / 2) {
                    const float send = upper ? v[i] : v[i + n / 2];
                    const float keep = upper ? v[i + n / 2] : v[i];
                    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
                }
            }
            n >>= 1;
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
        }
    }
}

// After lane_reduce<N, .., FROM, TO>: how many values a lane keeps, ...
__host__ __device__ constexpr int lane_reduced_count(int n, int from, int to) {
    for (int off = from; off < to && n > 1; off <<= 1) n >>= 1;
    return n;
}

// ... which of the N its v[0] is (index), and whether it is the lowest of the lanes holding that sum (writer).
struct LaneReduced {
    int index;
    bool writer;
};
__device__ __forceinline__ LaneReduced lane_reduced(int n, int from, int to, int lane) {
    LaneReduced r{0, true};
    for (int off = from; off < to; off <<= 1) {
        if (n > 1) {
            n >>= 1;
            if (lane & off) r.index += n;
        } else if (lane & off) {
            r.writer = false;
        }
    }
    return r;
}

using smem::DEC_NW;          // warps per block
constexpr int DEC_TK = 64;   // keys per tile

// Block (split, kv head, row t), 128 threads, all G q heads of the kv head (GQA: K/V read once for the group).
// Lane = (key slot kk, 8 dims at d0): LPK = Dh/8 lanes per key, so a key row is one coalesced 16-byte-per-lane
// read (f16). Per 64-key tile: (A) scores of U keys per lane in flight, reduced with lane_reduce, to shared memory;
// (B) online softmax per head; (C) acc += p v. Partials (unnormalised acc, m, l) go to work when the row has several
// splits; a single split writes the output (tq3 values rotated back) itself.
// Block scales of quantized rows are applied once per sum, not per value: a key's scale multiplies the partial dot
// product of the lanes of its block (the reduction runs over those lanes first), and a tq3 value row's scale goes
// into the probabilities in phase B (its 1-2 blocks per row fit a small shared array; q8_0/q4_0 rows have up to 8,
// so their lanes multiply p themselves).
template <int Dh, int GP>
__global__ void __launch_bounds__(DEC_NW * 32, GP <= 4 ? 4 : 1)   // GP <= 4: 4 blocks (<= 128 registers) per SM
attn_decode_kernel(const float* __restrict__ q,      // [L, Hq, Dh]
                   const uint8_t* __restrict__ kc,   // [n_ctx, Hk, kbytes]
                   const uint8_t* __restrict__ vc,   // [n_ctx, Hk, vbytes]
                   int k_type, int v_type,
                   const int32_t* __restrict__ pos,  // [L]
                   float* __restrict__ out,          // [L, Hq*Dh]
                   float* __restrict__ work,         // [max_split, L*Hq, Dh+2]
                   int L, int Hq, int Hk, int G, float scale,
                   int prefetch) {                   // 1: L2-prefetch the next tile's quantized rows
    pdl_allow_consumers();  // first: the Q8 producer and the GEMV after it launch and wait (weights stream)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    constexpr int LPK = Dh / 8, KPW = 32 / LPK;
    constexpr int U = LPK / GP >= 4 ? 4 : (LPK / GP >= 1 ? LPK / GP : 1);
    constexpr int NV = U * GP;
    constexpr int NBV = Dh / tq3_block(Dh);   // tq3 blocks of a value row
    constexpr int SB = DEC_TK * GP;           // sc floats per tq3 value block: sc is [NBV][DEC_TK][GP]
    static_assert(NV <= LPK, "lane_reduce leaves one value per lane only if NV <= LPK");
    static_assert(DEC_TK % (DEC_NW * KPW * U) == 0, "tile must be a multiple of a pass");
    static_assert(DEC_TK * NBV <= DEC_NW * 32, "a thread stages at most one tq3 value scale per tile");
    static_assert(kv_quant_aligned(Dh), "KvChunk::load_q needs 4-byte aligned q8_0/q4_0 quants");
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    const int n_kv = pos[t] + 1;
    const int chunk = dec_chunk(n_kv), nsp = (n_kv + chunk - 1) / chunk;
    if (split >= nsp) return;
    const int kbeg = split * chunk, kend = min(n_kv, kbeg + chunk);

    __shared__ float qs[GP * Dh];               // scaled (and for tq3 keys rotated) queries; later the output
    // scores, then probabilities (0 for padding heads); tq3 values: p times the block scale, block b at sc + b*SB
    __shared__ __align__(16) float sc[NBV * SB];
    __shared__ float vs_s[DEC_TK * NBV];        // tq3 value rows: the tile's block scales
    __shared__ float m_s[GP], l_s[GP], c_s[GP];
    // [DEC_NW][GP*Dh] partial outputs after the key loop; during it, the tq3 pair table (KvChunk<CMP_KV_TQ3>::values)
    extern __shared__ __align__(16) float red[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int sub = lane % LPK, kk = lane / LPK, d0 = sub * 8;
    for (int i = tid; i < GP * Dh; i += blockDim.x) {
        const int h = i / Dh, d = i % Dh;
        qs[i] = h < G ? q[((size_t)t * Hq + kvh * G + h) * Dh + d] * scale : 0.f;
    }
    for (int i = tid; i < NBV * SB; i += blockDim.x) sc[i] = 0.f;   // padding heads' entries stay 0
    if (tid < GP) {
        m_s[tid] = NEG_BIG_KV;
        l_s[tid] = 0.f;
    }
    const bool tq3 = k_type == CMP_KV_TQ3 || v_type == CMP_KV_TQ3;
    const uint32_t pairs = tq3 ? tq3_pairs_init(red) : 0u;
    __syncthreads();
    if (k_type == CMP_KV_TQ3) fwht_smem(qs, GP, Dh, tq3_block(Dh), Dh, 1, true, false);
    float qr[GP][8], acc[GP][8];
#pragma unroll
    for (int h = 0; h < GP; ++h)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            qr[h][i] = qs[h * Dh + d0 + i];
            acc[h][i] = 0.f;
        }
    const int kbytes = kv_row_bytes(k_type, Dh), vbytes = kv_row_bytes(v_type, Dh);
    const size_t kstride = (size_t)Hk * kbytes, vstride = (size_t)Hk * vbytes;
    const uint8_t* kbase = kc + (size_t)kvh * kbytes;
    const uint8_t* vbase = vc + (size_t)kvh * vbytes;
    const KvLane klane = kv_lane(k_type, kbase, (uint32_t)kstride, d0, Dh);
    const KvLane vlane = kv_lane(v_type, vbase, (uint32_t)vstride, d0, Dh);
    const bool fold_vs = v_type == CMP_KV_TQ3;   // phase B multiplies p by the value rows' block scales

    static_assert(DEC_NW * 32 == 2 * DEC_TK, "the L2 prefetch gives each thread one K or V row of a tile");
    for (int k0 = kbeg; k0 < kend; k0 += DEC_TK) {
        const int nk = min(DEC_TK, kend - k0);
        // Quantized rows: the next tile's K and V rows (a thread per row) are asked of L2 now, so that its loads
        // wait for L2, not DRAM (the tile's few bytes per lane leave the lanes short of loads in flight).
        if (prefetch && k0 + DEC_TK < kend) {
            const bool is_v = tid >= DEC_TK;
            const int key = k0 + DEC_TK + tid % DEC_TK;
            if (key < kend && (is_v ? v_type : k_type) >= CMP_KV_Q8_0)
                prefetch_l2((is_v ? vbase : kbase) + (size_t)key * (is_v ? vstride : kstride), is_v ? vbytes : kbytes);
        }
        // tq3 value scales of the tile (thread = key tid / NBV, block tid % NBV): loaded now, stored to shared
        // memory after phase A, so that their latency hides behind it
        unsigned short vs_raw = 0;
        if (fold_vs && tid < DEC_TK * NBV && tid / NBV < nk)
            vs_raw = __ldg(reinterpret_cast<const unsigned short*>(
                vbase + (size_t)(k0 + tid / NBV) * vstride + KvChunk<CMP_KV_TQ3>::lane_s(tid % NBV * tq3_block(Dh), Dh)));
        // (A) scores: the loads of a lane's U keys are all issued before the first is decoded.
        kv_type_switch(k_type, [&](auto tag) {
            constexpr int KT = decltype(tag)::value;
            constexpr bool QUANT = KT >= CMP_KV_Q8_0;
            // Quantized rows are a few bytes per lane: two passes' loads (2U keys) go out before either is decoded,
            // halving the round trips to memory per tile.
            constexpr int PASS = DEC_NW * KPW * U, NPASS = DEC_TK / PASS;
            constexpr int PP = QUANT && NPASS % 2 == 0 ? 2 : 1;
            // The U*GP partial dot products are summed over the SG lanes of one block scale first; the N1 sums a
            // lane then holds are all of key slot us, so one scale (loaded by this lane alone) multiplies them.
            constexpr int SG = KvChunk<KT>::scale_values(Dh) / 8 < LPK ? KvChunk<KT>::scale_values(Dh) / 8 : LPK;
            constexpr int N1 = lane_reduced_count(NV, 1, SG);
            static_assert(GP % N1 == 0, "the sums a lane holds at the scale must be of one key");
            const int us = lane_reduced(NV, 1, SG, lane).index / GP;
            const LaneReduced fin = lane_reduced(NV, 1, LPK, lane);
            const int u_out = fin.index / GP, h_out = fin.index % GP;
            for (int j00 = warp * KPW * U; j00 < DEC_TK; j00 += PP * PASS) {
                KvChunk<KT> ch[PP][U];
                unsigned short ks_raw[PP];
#pragma unroll
                for (int pp = 0; pp < PP; ++pp) {
                    const int j0 = j00 + pp * PASS;
                    if constexpr (QUANT) {
                        // the lane's quants of key j0 + u*KPW + kk by one wide multiply-add, its scale a fixed
                        // distance away (kv_lane: no per-key rederivation of either); a full tile needs no bounds
                        const uint8_t* qp = klane.q + (size_t)(uint32_t)(k0 + j0 + kk) * klane.stride;
                        const uint8_t* sp = qp + us * KPW * klane.stride + klane.ds;
                        if (nk == DEC_TK) {
#pragma unroll
                            for (int u = 0; u < U; ++u) ch[pp][u].load_q(qp + u * KPW * klane.stride);
                            ks_raw[pp] = __ldg(reinterpret_cast<const unsigned short*>(sp));
                        } else {
#pragma unroll
                            for (int u = 0; u < U; ++u) {
                                if (j0 + u * KPW + kk < nk) ch[pp][u].load_q(qp + u * KPW * klane.stride);
                                else ch[pp][u].zero();
                            }
                            ks_raw[pp] = j0 + us * KPW + kk < nk ? __ldg(reinterpret_cast<const unsigned short*>(sp)) : 0;
                        }
                    } else {
                        const uint8_t* row = kbase + (size_t)(k0 + j0 + kk) * kstride;   // key j0 + u*KPW + kk
#pragma unroll
                        for (int u = 0; u < U; ++u, row += KPW * kstride) {
                            if (j0 + u * KPW + kk < nk) ch[pp][u].load(row, d0, Dh);
                            else ch[pp][u].zero();
                        }
                    }
                }
#pragma unroll
                for (int pp = 0; pp < PP; ++pp) {
                    const int j0 = j00 + pp * PASS;
                    float part[NV];
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        float kx[8];
                        ch[pp][u].values(kx, pairs);
#pragma unroll
                        for (int h = 0; h < GP; ++h) {
                            float s = 0.f;
#pragma unroll
                            for (int i = 0; i < 8; ++i) s = fmaf(qr[h][i], kx[i], s);
                            part[u * GP + h] = s;
                        }
                    }
                    lane_reduce<NV, NV, 1, SG>(part, lane);
                    if constexpr (QUANT) {
                        const float ks = __half2float(__ushort_as_half(ks_raw[pp]));
#pragma unroll
                        for (int i = 0; i < N1; ++i) part[i] *= ks;
                    }
                    lane_reduce<N1, NV, SG, LPK>(part, lane);
                    const int j = j0 + u_out * KPW + kk;
                    // padding heads (h >= G) get probability 0 (phase B leaves them), so phase C needs no test
                    if (fin.writer) sc[j * GP + h_out] = h_out >= G ? 0.f : j < nk ? part[0] : NEG_BIG_KV;
                }
            }
        });
        if (fold_vs && tid < DEC_TK * NBV) vs_s[tid] = __half2float(__ushort_as_half(vs_raw));
        __syncthreads();
        // (B) online softmax, a warp per head
        for (int h = warp; h < G; h += DEC_NW) {
            const float s0 = sc[lane * GP + h], s1 = sc[(lane + 32) * GP + h];
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
            const float p0 = s0 <= NEG_BIG_KV ? 0.f : __expf(s0 - m_new);
            const float p1 = s1 <= NEG_BIG_KV ? 0.f : __expf(s1 - m_new);
            if (fold_vs) {   // keys past the tile's end have p = 0 and scale 0
#pragma unroll
                for (int b = 0; b < NBV; ++b) {
                    sc[b * SB + lane * GP + h] = p0 * vs_s[lane * NBV + b];
                    sc[b * SB + (lane + 32) * GP + h] = p1 * vs_s[(lane + 32) * NBV + b];
                }
            } else {
                sc[lane * GP + h] = p0;
                sc[(lane + 32) * GP + h] = p1;
            }
            const float psum = warp_sum(p0 + p1);
            if (lane == 0) {
                const float corr = __expf(m_old - m_new);
                l_s[h] = l_s[h] * corr + psum;
                m_s[h] = m_new;
                c_s[h] = corr;
            }
        }
        __syncthreads();
        // (C) acc = acc * corr + sum_j p_j v_j
#pragma unroll
        for (int h = 0; h < GP; ++h) {
            const float c = h < G ? c_s[h] : 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[h][i] *= c;
        }
        // UC keys per lane loaded before any is decoded: several loads in flight per lane (memory-level
        // parallelism); quantized rows are a few bytes per lane, so they take twice as many. The block scale goes
        // into p (one multiply per head instead of one per value), for tq3 already in phase B.
        kv_type_switch(v_type, [&](auto tag) {
            constexpr int VT = decltype(tag)::value;
            constexpr bool FOLDED = VT == CMP_KV_TQ3;   // == fold_vs
            constexpr int UC_MAX = DEC_TK / (DEC_NW * KPW);   // a warp's keys of a tile
            constexpr int UC = (VT >= CMP_KV_Q8_0 ? 8 : 4) < UC_MAX ? (VT >= CMP_KV_Q8_0 ? 8 : 4) : UC_MAX;
            constexpr int STEP = DEC_NW * KPW;   // between a lane's keys
            const float* pv = sc + (FOLDED ? d0 / tq3_block(Dh) * SB : 0);   // p of key j, head h: pv[j * GP + h]
            // full: a whole tile, no bounds to check
            auto accumulate = [&](auto full_tile) {
                constexpr bool full = decltype(full_tile)::value;
                for (int jb = warp * KPW + kk; jb < nk; jb += STEP * UC) {
                    KvChunk<VT> ch[UC];
                    if constexpr (VT >= CMP_KV_Q8_0) {
                        const uint8_t* qp = vlane.q + (size_t)(uint32_t)(k0 + jb) * vlane.stride;
#pragma unroll
                        for (int u = 0; u < UC; ++u, qp += STEP * vlane.stride) {
                            if (full || jb + u * STEP < nk) {
                                if constexpr (FOLDED) ch[u].load_q(qp);
                                else ch[u].load_at(qp, qp + vlane.ds);
                            } else {
                                ch[u].zero();
                            }
                        }
                    } else {
                        const uint8_t* row = vbase + (size_t)(k0 + jb) * vstride;   // key jb + u*STEP
#pragma unroll
                        for (int u = 0; u < UC; ++u, row += STEP * vstride) {
                            if (full || jb + u * STEP < nk) ch[u].load(row, d0, Dh);
                            else ch[u].zero();
                        }
                    }
#pragma unroll
                    for (int u = 0; u < UC; ++u) {
                        const int j = jb + u * STEP;
                        if (!full && j >= nk) break;
                        float vx[8], p[GP];
                        ch[u].values(vx, pairs);
                        if constexpr (GP % 4 == 0) {   // one 16-byte shared load per 4 heads
#pragma unroll
                            for (int h = 0; h < GP; h += 4) {
                                const float4 p4 = *reinterpret_cast<const float4*>(pv + j * GP + h);
                                p[h] = p4.x; p[h + 1] = p4.y; p[h + 2] = p4.z; p[h + 3] = p4.w;
                            }
                        } else {
#pragma unroll
                            for (int h = 0; h < GP; ++h) p[h] = pv[j * GP + h];
                        }
                        if constexpr (!FOLDED && VT >= CMP_KV_Q8_0) {
                            const float vsc = ch[u].scale();
#pragma unroll
                            for (int h = 0; h < GP; ++h) p[h] *= vsc;
                        }
#pragma unroll
                        for (int h = 0; h < GP; ++h)
#pragma unroll
                            for (int i = 0; i < 8; ++i) acc[h][i] = fmaf(p[h], vx[i], acc[h][i]);
                    }
                }
            };
            if (nk == DEC_TK) accumulate(std::true_type{});
            else accumulate(std::false_type{});
        });
        __syncthreads();   // sc and vs_s are rewritten by the next tile
    }
    // Sum over the key slots of a warp, then over warps.
#pragma unroll
    for (int off = LPK; off < 32; off <<= 1)
#pragma unroll
        for (int h = 0; h < GP; ++h)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], off);
    if (kk == 0) {
#pragma unroll
        for (int h = 0; h < GP; ++h)
#pragma unroll
            for (int i = 0; i < 8; ++i) red[(warp * GP + h) * Dh + d0 + i] = acc[h][i];
    }
    __syncthreads();
    if (nsp > 1) {
        for (int i = tid; i < G * Dh; i += blockDim.x) {
            const int h = i / Dh, d = i % Dh;
            float o = 0.f;
#pragma unroll
            for (int w = 0; w < DEC_NW; ++w) o += red[(w * GP + h) * Dh + d];
            work[((size_t)split * L * Hq + (size_t)t * Hq + kvh * G + h) * (Dh + 2) + d] = o;
        }
        if (tid < G) {
            float* w = work + ((size_t)split * L * Hq + (size_t)t * Hq + kvh * G + tid) * (Dh + 2);
            w[Dh] = m_s[tid];
            w[Dh + 1] = l_s[tid];
        }
        return;
    }
    for (int i = tid; i < G * Dh; i += blockDim.x) {
        const int h = i / Dh, d = i % Dh;
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < DEC_NW; ++w) o += red[(w * GP + h) * Dh + d];
        qs[i] = l_s[h] > 0.f ? o / l_s[h] : 0.f;
    }
    __syncthreads();
    if (v_type == CMP_KV_TQ3) fwht_smem(qs, G, Dh, tq3_block(Dh), Dh, 1, false, true);
    for (int i = tid; i < G * Dh; i += blockDim.x)
        out[((size_t)t * Hq + kvh * G + i / Dh) * Dh + i % Dh] = qs[i];
}

// Block per (token, q head), Dh threads: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the row's own
// splits (rows with one split were written by the decode kernel); tq3 values are rotated back here.
__global__ void attn_decode_merge_kernel(const float* __restrict__ work,  // [max_split, L*Hq, Dh+2]
                                         const int32_t* __restrict__ pos, float* __restrict__ out,  // [L*Hq, Dh]
                                         int rows, int Hq, int Dh, int v_type) {
    pdl_allow_consumers();  // first: the Q8 producer and the GEMV after it launch and wait (weights stream)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    extern __shared__ float o_s[];  // [Dh]
    const int r = blockIdx.x, t = r / Hq;
    const int nsp = dec_splits(pos[t] + 1);
    if (nsp == 1) return;
    float M = NEG_BIG_KV;
    for (int s = 0; s < nsp; ++s) M = fmaxf(M, work[((size_t)s * rows + r) * (Dh + 2) + Dh]);
    float lsum = 0.f, a = 0.f;
    const int d = threadIdx.x;
    for (int s = 0; s < nsp; ++s) {
        const float* w = work + ((size_t)s * rows + r) * (Dh + 2);
        const float e = __expf(w[Dh] - M);
        lsum += w[Dh + 1] * e;
        a += w[d] * e;
    }
    o_s[d] = lsum > 0.f ? a / lsum : 0.f;
    __syncthreads();
    if (v_type == CMP_KV_TQ3) fwht_smem(o_s, 1, Dh, tq3_block(Dh), Dh, 1, false, true);
    out[(size_t)r * Dh + d] = o_s[d];
}

// ---- prefill: FlashAttention-2 on FP32 FMA -------------------------------------------------------------------------
using smem::PF_BK;   // keys per tile (= the block-sparse block)
using smem::PF_DC;   // head dims per shared K/V chunk

// Block (row tile of BR rows, kv head): rows r = t*G + g of the kv head's group (GQA: each K/V tile serves all G
// heads); BR * 4 threads. Thread (rg, kg) owns S rows rg*4..+3 x keys kg*4..+3 and O rows rg*4..+3 x dims
// {c*64 + kg*4 .. +3}, so a row's arithmetic is the same for every BR. A warp holds row groups 2w, 2w+1 (lane bit
// 0) x key groups 0..15 (lane bits 1..4): its 16-byte shared loads are served a half-warp at a time, identical
// addresses merged within a half only, so a half of 2 row groups x 8 key groups reads 32 + 128 bytes (2 wavefronts)
// a step where one row group x 16 key groups read 16 + 256 (3: ncu, H200, 2026-12-04: 6 wavefronts a warp and
// step, 64% of the shared pipe, 37% of FP32 peak). A row's 16 key groups stay in one warp (shuffles over lane
// bits 4..1, the pairs of the butterfly over kg bits 3..0: the same sums). Shared
// (smem::attn_prefill_bytes): Qt [Dh][BR] (transposed, scaled, tq3-rotated), one 64x64 chunk buffer (K chunk
// transposed [d][key], or V chunk [key][d]), Pt [64 keys][BR rows]: at Dh 256 96 KB with BR 64 (sm_70 and up),
// 56 KB with 32 (sm_75), 36 KB with 16 (sm_61); smem::attn_prefill_plan picks the largest BR that fits.
// Key tiles: dense causal 0 .. last row's block, or the merged block lists of the (at most two) query blocks the
// tile's tokens fall in; a row ignores a visited block its own query block did not list.
// One block per SM (no register cap): at the 9B shape a ubatch of 512 is 128 blocks of 64 rows (16 tokens x 4 q
// heads x 4 kv heads), fewer than an H200's 132 SMs, and sm_70 / sm_80 hold one 96 KB block per SM anyway (96 / 164
// KB). Capped at 128 registers for two blocks (sm_90) the 64-row kernel spilled and loaded each shared operand right
// before its FMAs (nvcc 13), so that two warps a scheduler waited out the shared-memory latency at every step.
// (A 6-head group, 27B, gives 192 blocks: 1.45 waves here, where the cap held them all; not yet timed.)
// Serial pieces (serial_pieces.cuh; launch_prefill_rows plans them): where the row tiles x kv heads fill the waves
// badly (27B: 6 q heads a kv head, 192 blocks at a 512-token ubatch on an H200's 132 SMs: 2 waves at 73%), each
// tile's dense key range is cut into pieces run in turn: a unit takes up the unnormalised sums its tile's piece
// before parked in the tile's output rows and each thread's running max and sum (attn_pf_carry), runs its key tiles,
// and parks its state for the next piece or normalises and writes the output.
constexpr int PF_SPLIT_TILES = 512;   // tiles (row tiles x kv heads) a split launch may have (more: one piece)
constexpr int PF_CARRY = 8;           // floats a thread parks besides its sums: m[4], lp[4]
__device__ float attn_pf_carry[PF_SPLIT_TILES * 256 * PF_CARRY];   // [tile][thread][PF_CARRY], 256 threads at most

template <int Dh, int BR>
__global__ void __launch_bounds__(BR * 4, 1)
attn_prefill_kernel(const float* __restrict__ q,      // [L, Hq, Dh]
                    const uint8_t* __restrict__ kc,   // [n_ctx, Hk, kbytes]
                    const uint8_t* __restrict__ vc,   // [n_ctx, Hk, vbytes]
                    int k_type, int v_type,
                    const int32_t* __restrict__ pos,  // [L]
                    float* __restrict__ out,          // [L, Hq*Dh]
                    int L, int Hq, int Hk, int G, float scale,
                    const int32_t* __restrict__ blocks,  // [Hk, nqb, max_blocks] or null
                    const int32_t* __restrict__ counts,  // [Hk, nqb]
                    int max_blocks,
                    int pieces) {                        // serial pieces of the key range (1: none; dense only)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    constexpr int NC = Dh / PF_DC, NT = BR * 4;
    constexpr int NI = PF_BK * (PF_DC / 8) / NT;   // 8-value pieces of a K or V chunk a thread: 2, 4, 8
    extern __shared__ __align__(16) float smem[];
    float* Qt = smem;                    // [Dh][BR]; at the end the output [BR][Dh]
    float* buf = Qt + Dh * BR;           // [64 * 64]
    float* Pt = buf + PF_DC * PF_BK;     // [PF_BK][BR]
    const int tid = threadIdx.x, rg = (tid >> 5) * 2 + (tid & 1), kg = (tid >> 1) & 15;
    int tile = blockIdx.x + gridDim.x * blockIdx.y, part = 0;   // part: this unit's piece
    if (pieces > 1) {
        const int unit = split_unit(smem), tiles = gridDim.x * gridDim.y;   // (before Q^T overwrites the word)
        tile = unit % tiles;
        part = unit / tiles;
    }
    const int kvh = tile / gridDim.x, total = L * G, r0 = tile % gridDim.x * BR;

    // Q^T: float4 along d from global, transposed into shared (row index fastest: conflict-free stores).
    for (int i = tid; i < BR * Dh / 4; i += NT) {
        const int r = i % BR, d4 = i / BR, rr = r0 + r;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (rr < total)
            x = *reinterpret_cast<const float4*>(q + ((size_t)(rr / G) * Hq + kvh * G + rr % G) * Dh + d4 * 4);
        Qt[(d4 * 4 + 0) * BR + r] = x.x * scale;
        Qt[(d4 * 4 + 1) * BR + r] = x.y * scale;
        Qt[(d4 * 4 + 2) * BR + r] = x.z * scale;
        Qt[(d4 * 4 + 3) * BR + r] = x.w * scale;
    }
    __syncthreads();
    if (k_type == CMP_KV_TQ3) fwht_smem(Qt, BR, Dh, tq3_block(Dh), 1, BR, true, false);

    const int pos0 = pos[0];
    const int last_row = min(r0 + BR, total) - 1;
    const int t_first = r0 / G, t_last = last_row / G;
    const int kmax = pos[t_last] + 1;  // keys 0 .. kmax-1 exist
    const int qb_lo = pos[t_first] / PF_BK, qb_hi = pos[t_last] / PF_BK, qb0 = pos0 / PF_BK;
    int qpos[4];
    bool hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int rr = r0 + rg * 4 + i;
        qpos[i] = rr < total ? pos[rr / G] : -1;   // -1: padding row, every key masked
        hi[i] = qpos[i] >= 0 && qpos[i] / PF_BK != qb_lo;
    }
    const int* A = nullptr;
    const int* Bl = nullptr;
    int na = 0, nb = 0;
    if (blocks) {
        const int nqb = pos[L - 1] / PF_BK - qb0 + 1;
        A = blocks + ((size_t)kvh * nqb + (qb_lo - qb0)) * max_blocks;
        na = counts[kvh * nqb + (qb_lo - qb0)];
        if (qb_hi != qb_lo) {
            Bl = blocks + ((size_t)kvh * nqb + (qb_hi - qb0)) * max_blocks;
            nb = counts[kvh * nqb + (qb_hi - qb0)];
        }
    }
    const int kbytes = kv_row_bytes(k_type, Dh), vbytes = kv_row_bytes(v_type, Dh);
    const size_t kstride = (size_t)Hk * kbytes, vstride = (size_t)Hk * vbytes;
    const uint8_t* kbase = kc + (size_t)kvh * kbytes;
    const uint8_t* vbase = vc + (size_t)kvh * vbytes;

    float m[4], lp[4], acc[4][NC][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = NEG_BIG_KV;
        lp[i] = 0.f;
#pragma unroll
        for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][c][e] = 0.f;
    }
    // A row's output: element d of row rr (rr < total) of the tile.
    auto out_at = [&](int rr, int d) { return out + ((size_t)(rr / G) * Hq + kvh * G + rr % G) * Dh + d; };
    float* carry = attn_pf_carry + ((size_t)tile * NT + tid) * PF_CARRY;
    if (part > 0) {   // the piece before parked the tile's state: sums in the output rows, m and lp in carry
        split_wait(tile, part);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            m[i] = load_cg(carry + i);
            lp[i] = load_cg(carry + 4 + i);
            const int rr = r0 + rg * 4 + i;
            if (rr >= total) continue;   // a padding row: never written
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const float4 a = load_cg(reinterpret_cast<const float4*>(out_at(rr, c * PF_DC + kg * 4)));
                acc[i][c][0] = a.x, acc[i][c][1] = a.y, acc[i][c][2] = a.z, acc[i][c][3] = a.w;
            }
        }
    }
    // Key tiles in order: dense causal 0 .. qb_hi, or the merged block lists. next_tile() gives the tile after the
    // current one (and whether each of the two query blocks listed it), or false when there is none; the loop runs
    // one tile ahead so that the last chunk of a tile can fetch the first of the next.
    // this piece's share of the dense key tiles 0 .. qb_hi
    int kb_dense = part * (qb_hi + 1) / pieces;
    const int kb_end = (part + 1) * (qb_hi + 1) / pieces;
    int ia = 0, ib = 0;
    auto next_tile = [&](int& kb, bool& fa, bool& fb) -> bool {
        fa = fb = true;
        if (blocks) {
            const int ka = ia < na ? A[ia] : INT_MAX, kb2 = ib < nb ? Bl[ib] : INT_MAX;
            kb = min(ka, kb2);
            if (kb == INT_MAX) return false;
            fa = ka == kb;
            fb = kb2 == kb;
            ia += fa;
            ib += fb;
            return true;
        }
        kb = kb_dense++;
        return kb < kb_end;
    };
    // The chunks of a tile: K chunks 0 .. NC-1 ([d][key] in buf), then V chunks NC .. 2*NC-1 ([key][d]). Thread
    // piece n (NI a thread) is 8 values of one key: fetch() issues their global loads into raw (4 registers a piece),
    // store() decodes them into buf once buf is free; a chunk's loads are in flight while the one before is computed.
    // f32 caches (8 values in 32 bytes) skip the raw registers and load in store(). Keys >= kmax are zeros.
    // The thread index goes through an empty asm in each call: the compiler cannot hoist the pieces' row addresses
    // (a pointer for each chunk and piece, 2*NC*NI of them) out of the tile loop, where they would take 32-128
    // registers and spill (nvcc 13, sm_90); recomputing them costs a few integer instructions a piece.
    auto piece = [&](int ch, int n, int& key, int& d0) {
        int t = tid;
        asm volatile("" : "+r"(t));
        const int i = t + n * NT;
        if (ch < NC) {
            key = i % PF_BK;
            d0 = ch * PF_DC + i / PF_BK * 8;
        } else {
            key = i / (PF_DC / 8);
            d0 = (ch - NC) * PF_DC + i % (PF_DC / 8) * 8;
        }
    };
    auto fetch = [&](int kb, int ch, uint4 (&raw)[NI]) {
        const int type = ch < NC ? k_type : v_type;
        if (type == CMP_KV_F32) return;
        const uint8_t* base = ch < NC ? kbase : vbase;
        const size_t stride = ch < NC ? kstride : vstride;
#pragma unroll
        for (int n = 0; n < NI; ++n) {
            int key, d0;
            piece(ch, n, key, d0);
            const int k = kb * PF_BK + key;
            raw[n] = k < kmax ? kv_fetch8(type, base + (size_t)k * stride, d0, Dh) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    auto store = [&](int kb, int ch, const uint4 (&raw)[NI]) {
        const int type = ch < NC ? k_type : v_type;
        const uint8_t* base = ch < NC ? kbase : vbase;
        const size_t stride = ch < NC ? kstride : vstride;
#pragma unroll
        for (int n = 0; n < NI; ++n) {
            int key, d0;
            piece(ch, n, key, d0);
            const int k = kb * PF_BK + key;
            float x[8];
            if (k >= kmax) {
#pragma unroll
                for (int e = 0; e < 8; ++e) x[e] = 0.f;
            } else if (type == CMP_KV_F32) {
                kv_load8(type, base + (size_t)k * stride, d0, Dh, x);
            } else {
                kv_unpack8(type, raw[n], x);
            }
            const int dc = d0 % PF_DC;
            if (ch < NC) {   // transposed: row index (key) fastest, conflict-free stores
#pragma unroll
                for (int e = 0; e < 8; ++e) buf[(dc + e) * PF_BK + key] = x[e];
            } else {
                *reinterpret_cast<float4*>(buf + key * PF_DC + dc) = make_float4(x[0], x[1], x[2], x[3]);
                *reinterpret_cast<float4*>(buf + key * PF_DC + dc + 4) = make_float4(x[4], x[5], x[6], x[7]);
            }
        }
    };

    uint4 raw[NI];
    int kb;
    bool fa, fb;
    bool more = next_tile(kb, fa, fb);
    if (more) fetch(kb, 0, raw);
    while (more) {
        int kb_next;
        bool fa_next, fb_next;
        const bool more_next = next_tile(kb_next, fa_next, fb_next);
        const int k0 = kb * PF_BK;
        // S = Q K^T over the tile, K streamed in 64-dim chunks (a loop, not unrolled: the chunks' fetch and store
        // code, every KV type's, would be there NC times)
        float S[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) S[i][j] = 0.f;
#pragma unroll 1
        for (int c = 0; c < NC; ++c) {
            __syncthreads();   // buf free (previous V chunk consumed)
            store(kb, c, raw);
            __syncthreads();
            fetch(kb, c + 1, raw);   // the next K chunk, or V chunk 0
#pragma unroll 8
            for (int d = 0; d < PF_DC; ++d) {
                const float4 a = *reinterpret_cast<const float4*>(Qt + (c * PF_DC + d) * BR + rg * 4);
                const float4 b = *reinterpret_cast<const float4*>(buf + d * PF_BK + kg * 4);
                const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) S[i][j] = fmaf(av[i], bv[j], S[i][j]);
            }
        }
        // online softmax per row (the 16 threads of a row group: lane bits 1..4 of one warp)
        float p[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const bool row_ok = hi[i] ? fb : fa;
            float mx = NEG_BIG_KV;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int key = k0 + kg * 4 + j;
                if (!row_ok || key > qpos[i]) S[i][j] = NEG_BIG_KV;
                mx = fmaxf(mx, S[i][j]);
            }
#pragma unroll
            for (int o = 16; o > 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = fmaxf(m[i], mx);
            const float corr = __expf(m[i] - m_new);
            float ps = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                p[i][j] = S[i][j] <= NEG_BIG_KV ? 0.f : __expf(S[i][j] - m_new);
                ps += p[i][j];
            }
            lp[i] = lp[i] * corr + ps;
            m[i] = m_new;
#pragma unroll
            for (int c = 0; c < NC; ++c)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][c][e] *= corr;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            *reinterpret_cast<float4*>(Pt + (kg * 4 + j) * BR + rg * 4) = make_float4(p[0][j], p[1][j], p[2][j], p[3][j]);
        // O += P V, V streamed in 64-dim chunks
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            __syncthreads();   // buf free (K chunk / previous V chunk consumed); Pt written
            store(kb, NC + c, raw);
            __syncthreads();
            if (c + 1 < NC) fetch(kb, NC + c + 1, raw);
            else if (more_next) fetch(kb_next, 0, raw);   // the next tile's K chunk 0
#pragma unroll 8
            for (int j = 0; j < PF_BK; ++j) {
                const float4 pa = *reinterpret_cast<const float4*>(Pt + j * BR + rg * 4);
                const float4 vb = *reinterpret_cast<const float4*>(buf + j * PF_DC + kg * 4);
                const float pv[4] = {pa.x, pa.y, pa.z, pa.w}, vv[4] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][c][e] = fmaf(pv[i], vv[e], acc[i][c][e]);
            }
        }
        kb = kb_next;
        fa = fa_next;
        fb = fb_next;
        more = more_next;
    }
    if (part + 1 < pieces) {   // park the state for the next piece of the tile
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            carry[i] = m[i];
            carry[4 + i] = lp[i];
            const int rr = r0 + rg * 4 + i;
            if (rr >= total) continue;
#pragma unroll
            for (int c = 0; c < NC; ++c)
                *reinterpret_cast<float4*>(out_at(rr, c * PF_DC + kg * 4)) =
                    make_float4(acc[i][c][0], acc[i][c][1], acc[i][c][2], acc[i][c][3]);
        }
        split_parked(tile, part);
        return;
    }
    if (pieces > 1) split_finished(tile, gridDim.x * gridDim.y * (unsigned)pieces);
    // normalise, stage [row][Dh] in shared (over Qt), rotate tq3 values back, write coalesced
    __syncthreads();
    float* Os = Qt;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float l = lp[i];
#pragma unroll
        for (int o = 16; o > 1; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int c = 0; c < NC; ++c)
            *reinterpret_cast<float4*>(Os + (rg * 4 + i) * Dh + c * PF_DC + kg * 4) =
                make_float4(acc[i][c][0] * inv, acc[i][c][1] * inv, acc[i][c][2] * inv, acc[i][c][3] * inv);
    }
    __syncthreads();
    if (v_type == CMP_KV_TQ3) fwht_smem(Os, BR, Dh, tq3_block(Dh), Dh, 1, false, true);
    for (int i = tid; i < BR * Dh / 4; i += NT) {
        const int r = i / (Dh / 4), d4 = i % (Dh / 4), rr = r0 + r;
        if (rr < total)
            *reinterpret_cast<float4*>(out + ((size_t)(rr / G) * Hq + kvh * G + rr % G) * Dh + d4 * 4) =
                *reinterpret_cast<const float4*>(Os + r * Dh + d4 * 4);
    }
}

// ---- launchers -------------------------------------------------------------------------------------------------------
inline int check_kv_types(const char* fn, int k_type, int v_type, int Dh) {
    if (kv_row_bytes(k_type, Dh) < 0 || kv_row_bytes(v_type, Dh) < 0)
        return fail(CMP_ERR_UNSUPPORTED, "%s: KV types %d/%d cannot hold head dim %d", fn, k_type, v_type, Dh);
    return CMP_OK;
}

template <int Dh, int BR>
int launch_prefill_rows(const float* q, const void* kc, const void* vc, int kt, int vt, const int32_t* pos,
                        float* out, int L, int Hq, int Hk, float scale, const int32_t* blocks, const int32_t* counts,
                        int max_blocks) {
    constexpr size_t bytes = smem::attn_prefill_bytes(Dh, BR);
    auto kernel = attn_prefill_kernel<Dh, BR>;
    CMP_TRY(smem_opt_in("attn_prefill_kernel", kernel, bytes));
    const int G = Hq / Hk;
    const dim3 grid(ceil_div((size_t)L * G, BR), Hk);
    // Serial pieces of the dense key range where the tiles fill the waves badly (the key tiles per row tile are
    // known on the device only: no bound from them here; a piece of none only carries the state through).
    const int tiles = grid.x * grid.y;
    int wave = 0;
    CMP_TRY(wave_blocks("attn_prefill_kernel", kernel, BR * 4, bytes, &wave));
    const int pieces = blocks ? 1 : launch_pieces(tiles, PF_SPLIT_TILES, wave, SPLIT_NO_BOUND, 1);
    return launch("attn_prefill_kernel", kernel, dim3(grid.x, grid.y, pieces), dim3(BR * 4), bytes, q,
                  static_cast<const uint8_t*>(kc), static_cast<const uint8_t*>(vc), kt, vt, pos, out, L, Hq, Hk, G,
                  scale, blocks, counts, max_blocks, pieces);
}

// The rows per block that the device's shared memory takes (smem::attn_prefill_plan).
template <int Dh>
int launch_prefill(const float* q, const void* kc, const void* vc, int kt, int vt, const int32_t* pos, float* out,
                   int L, int Hq, int Hk, float scale, const int32_t* blocks, const int32_t* counts, int max_blocks) {
    size_t limit = 0;
    CMP_TRY(smem_limit(&limit));
    switch (smem::attn_prefill_plan(Dh, limit).config) {
        case 64: return launch_prefill_rows<Dh, 64>(q, kc, vc, kt, vt, pos, out, L, Hq, Hk, scale, blocks, counts, max_blocks);
        case 32: return launch_prefill_rows<Dh, 32>(q, kc, vc, kt, vt, pos, out, L, Hq, Hk, scale, blocks, counts, max_blocks);
        default:   // 16, or nothing fits: the smallest configuration reports its bytes
            return launch_prefill_rows<Dh, 16>(q, kc, vc, kt, vt, pos, out, L, Hq, Hk, scale, blocks, counts, max_blocks);
    }
}

template <int Dh, int GP>
int launch_decode(const float* q, const void* kc, const void* vc, int kt, int vt, const int32_t* pos, float* out,
                  float* work, int L, int Hq, int Hk, float scale, int max_split) {
    const int G = Hq / Hk;
    const bool tq3 = kt == CMP_KV_TQ3 || vt == CMP_KV_TQ3;
    const size_t bytes = smem::attn_decode_bytes(Dh, GP, tq3);
    auto kernel = attn_decode_kernel<Dh, GP>;
    CMP_TRY(smem_opt_in("attn_decode_kernel", kernel, bytes));
    const dim3 grid(max_split, Hk, L);
    // The L2 prefetch of quantized rows only where L2 holds twice what the resident blocks (at most 4 per SM) ask
    // ahead: a small L2 (6 MB on the CMP 100-210) would evict the rows before their tile reads them.
    DeviceFacts dev{};
    CMP_TRY(device_facts(&dev));
    const size_t ahead_row = (size_t)(kt >= CMP_KV_Q8_0 ? kv_row_bytes(kt, Dh) : 0) +
                             (size_t)(vt >= CMP_KV_Q8_0 ? kv_row_bytes(vt, Dh) : 0);
    const size_t resident = std::min((size_t)max_split * Hk * L, (size_t)dev.sms * 4);
    const int prefetch = ahead_row > 0 && 2 * resident * DEC_TK * ahead_row <= (size_t)dev.l2_bytes;
    CMP_TRY(launch("attn_decode_kernel", kernel, grid, dim3(DEC_NW * 32), bytes, q, static_cast<const uint8_t*>(kc),
                   static_cast<const uint8_t*>(vc), kt, vt, pos, out, work, L, Hq, Hk, G, scale, prefetch));
    if (max_split == 1) return CMP_OK;
    return launch("attn_decode_merge_kernel", attn_decode_merge_kernel, dim3(L * Hq), dim3(Dh), Dh * sizeof(float),
                  work, pos, out, L * Hq, Hq, Dh, vt);
}

template <int Dh>
int decode_group(int G, const float* q, const void* kc, const void* vc, int kt, int vt, const int32_t* pos,
                 float* out, float* work, int L, int Hq, int Hk, float scale, int max_split) {
    if (G == 1) return launch_decode<Dh, 1>(q, kc, vc, kt, vt, pos, out, work, L, Hq, Hk, scale, max_split);
    if (G == 2) return launch_decode<Dh, 2>(q, kc, vc, kt, vt, pos, out, work, L, Hq, Hk, scale, max_split);
    if (G <= 4) return launch_decode<Dh, 4>(q, kc, vc, kt, vt, pos, out, work, L, Hq, Hk, scale, max_split);
    if (G <= 8) return launch_decode<Dh, 8>(q, kc, vc, kt, vt, pos, out, work, L, Hq, Hk, scale, max_split);
    return fail(CMP_ERR_UNSUPPORTED, "cmp_attn_decode: %d q heads per kv head (at most 8)", G);
}

}  // namespace
}  // namespace cmp

extern "C" int cmp_kv_row_bytes(int kv_type, int Dh, int* bytes) {
    CMP_REQUIRE(bytes, "cmp_kv_row_bytes: null output");
    *bytes = kv_row_bytes(kv_type, Dh);
    if (*bytes < 0) return fail(CMP_ERR_UNSUPPORTED, "KV cache type %d cannot hold head dim %d", kv_type, Dh);
    return CMP_OK;
}

extern "C" int cmp_attn_decode_splits(int n_kv, int* n_split) {
    CMP_REQUIRE(n_split && n_kv >= 1, "cmp_attn_decode_splits: n_kv=%d", n_kv);
    // The largest split count of any row of 1 .. n_kv keys (dec_splits is not monotone past 128 x 64 keys, but
    // never exceeds DEC_SPLITS): the grid that covers them all.
    *n_split = n_kv <= DEC_SPLITS * DEC_MIN_CHUNK ? dec_splits(n_kv) : DEC_SPLITS;
    return CMP_OK;
}

extern "C" int cmp_kv_write_q(const float* k, const float* v, const int32_t* pos, void* kc, void* vc, int k_type,
                              int v_type, int L, int Hk, int Dh) {
    CMP_REQUIRE(L >= 0 && Hk > 0, "cmp_kv_write_q: bad shape L=%d Hk=%d", L, Hk);
    CMP_TRY(check_kv_types("cmp_kv_write_q", k_type, v_type, Dh));
    if (L == 0) return CMP_OK;
    return launch("kv_write_q_kernel", kv_write_q_kernel, dim3(L, Hk, 2), dim3(128), 0, k, v, pos,
                  static_cast<uint8_t*>(kc), static_cast<uint8_t*>(vc), k_type, v_type, Hk, Dh,
                  kv_row_bytes(k_type, Dh), kv_row_bytes(v_type, Dh));
}

extern "C" int cmp_attn_prefill(const float* q, const void* kc, const void* vc, int k_type, int v_type,
                                const int32_t* pos, float* out, int L, int Hq, int Hk, int Dh, float scale,
                                const int32_t* blocks, const int32_t* counts, int max_blocks) {
    CMP_REQUIRE(L >= 0 && Hk > 0 && Hq % Hk == 0, "cmp_attn_prefill: bad shape L=%d Hq=%d Hk=%d", L, Hq, Hk);
    CMP_REQUIRE(!blocks || (counts && max_blocks > 0), "cmp_attn_prefill: a block list needs counts and max_blocks");
    CMP_TRY(check_kv_types("cmp_attn_prefill", k_type, v_type, Dh));
    if (L == 0) return CMP_OK;
    switch (Dh) {
        case 64: return launch_prefill<64>(q, kc, vc, k_type, v_type, pos, out, L, Hq, Hk, scale, blocks, counts, max_blocks);
        case 128: return launch_prefill<128>(q, kc, vc, k_type, v_type, pos, out, L, Hq, Hk, scale, blocks, counts, max_blocks);
        case 256: return launch_prefill<256>(q, kc, vc, k_type, v_type, pos, out, L, Hq, Hk, scale, blocks, counts, max_blocks);
        default: return fail(CMP_ERR_UNSUPPORTED, "cmp_attn_prefill: head dim %d (64, 128, 256)", Dh);
    }
}

extern "C" int cmp_attn_decode(const float* q, const void* kc, const void* vc, int k_type, int v_type,
                               const int32_t* pos, float* out, float* work, int L, int Hq, int Hk, int Dh,
                               float scale, int max_split) {
    CMP_REQUIRE(L >= 0 && Hk > 0 && Hq % Hk == 0 && max_split >= 1 && (max_split == 1 || work),
                "cmp_attn_decode: bad arguments L=%d Hq=%d Hk=%d max_split=%d", L, Hq, Hk, max_split);
    CMP_TRY(check_kv_types("cmp_attn_decode", k_type, v_type, Dh));
    if (L == 0) return CMP_OK;
    const int G = Hq / Hk;
    switch (Dh) {
        case 64: return decode_group<64>(G, q, kc, vc, k_type, v_type, pos, out, work, L, Hq, Hk, scale, max_split);
        case 128: return decode_group<128>(G, q, kc, vc, k_type, v_type, pos, out, work, L, Hq, Hk, scale, max_split);
        case 256: return decode_group<256>(G, q, kc, vc, k_type, v_type, pos, out, work, L, Hq, Hk, scale, max_split);
        default: return fail(CMP_ERR_UNSUPPORTED, "cmp_attn_decode: head dim %d (64, 128, 256)", Dh);
    }
}
