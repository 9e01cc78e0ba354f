// Causal GQA attention over the KV cache, FlashAttention-style in fp32 (no tensor cores): KV tiles of 32 keys in
// shared memory, online softmax per query row, optional split of the key range across blocks (decode over long
// contexts) merged by log-sum-exp. Head dim 32..256 (a multiple of 32), KV cache f16 or f32.
#include <algorithm>

#include "common.cuh"

namespace cmp {
namespace {

constexpr int ATT_BN = 32;     // keys per tile: lane j scores key j
constexpr int ATT_WARPS = 4;
constexpr int ATT_RPW = 4;     // query rows (query, head) per warp
constexpr int ATT_ROWS = ATT_WARPS * ATT_RPW;
constexpr float NEG_BIG = -1e30f;  // "minus infinity" that keeps exp and subtraction finite under fast-math

// ==== kernels =====================================================================================================

template <typename KV>
__global__ void kv_write_kernel(const float* __restrict__ k,      // [L, Hk*Dh]
                                const float* __restrict__ v,      // [L, Hk*Dh]
                                const int32_t* __restrict__ pos,  // [L]
                                KV* __restrict__ kc,              // [n_ctx, Hk*Dh]
                                KV* __restrict__ vc,              // [n_ctx, Hk*Dh]
                                int row) {                        // Hk*Dh
    const int t = blockIdx.x;
    const size_t dst = (size_t)pos[t] * row, src = (size_t)t * row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        from_f32(kc[dst + i], k[src + i]);
        from_f32(vc[dst + i], v[src + i]);
    }
}

// Block (row tile, kv head, split). The block's rows are r0 .. r0+ATT_ROWS-1 of the flattened (token, head in
// group) space of this kv head, so the K/V tiles it loads serve every q head of the group (GQA reuse).
// Lane j of a warp scores key j of the tile against a row (the padded K tile makes that conflict-free); then each
// lane accumulates DPL = Dh/32 output dims, broadcasting p_j with shuffles.
// n_split > 1: the key range [0, kmax) is cut into n_split pieces; each writes unnormalised acc and (m, l) to work.
template <int DPL, typename KV>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_kernel(const float* __restrict__ q,      // [L, Hq, Dh]
                 const KV* __restrict__ kc,        // [n_ctx, Hk, Dh]
                 const KV* __restrict__ vc,        // [n_ctx, Hk, Dh]
                 const int32_t* __restrict__ pos,  // [L]
                 float* __restrict__ out,          // [L, Hq*Dh]          (n_split == 1)
                 float* __restrict__ work,         // [n_split, L*Hq, Dh+2] (n_split > 1)
                 int L, int Hq, int Hk, float scale, int n_split) {
    constexpr int Dh = DPL * 32;
    extern __shared__ float smem[];
    float* Ks = smem;                         // [ATT_BN][Dh+1]
    float* Vs = Ks + ATT_BN * (Dh + 1);       // [ATT_BN][Dh]
    float* Qs = Vs + ATT_BN * Dh;             // [ATT_ROWS][Dh]
    const int group = Hq / Hk, kvh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int total = L * group, r0 = blockIdx.x * ATT_ROWS;
    const int pos0 = pos[0];

    for (int i = threadIdx.x; i < ATT_ROWS * Dh; i += blockDim.x) {
        const int r = r0 + i / Dh, d = i % Dh;
        float val = 0.f;
        if (r < total) val = q[((size_t)(r / group) * Hq + kvh * group + r % group) * Dh + d] * scale;
        Qs[i] = val;
    }
    // Keys this block may need: up to the last row's position (rows are in token order).
    const int last = min(r0 + ATT_ROWS, total) - 1;
    const int kmax = pos0 + last / group + 1;
    const int chunk = (kmax + n_split - 1) / n_split;
    const int kbeg = split * chunk, kend = min(kmax, kbeg + chunk);

    float m[ATT_RPW], l[ATT_RPW], acc[ATT_RPW][DPL];
#pragma unroll
    for (int i = 0; i < ATT_RPW; ++i) {
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
                vv = to_f32(vc[key * kv_row + (size_t)kvh * Dh + d]);
            }
            Ks[j * (Dh + 1) + d] = kv;
            Vs[j * Dh + d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_RPW; ++i) {
            const int r = r0 + warp * ATT_RPW + i;
            if (r >= total) break;
            const int qpos = pos0 + r / group;
            const float* qr = Qs + (warp * ATT_RPW + i) * Dh;
            const float* kr = Ks + lane * (Dh + 1);
            float s = 0.f;
#pragma unroll 8
            for (int d = 0; d < Dh; ++d) s = fmaf(qr[d], kr[d], s);
            const int key = kt + lane;
            if (key >= kend || key > qpos) s = NEG_BIG;
            const float mt = warp_max(s);
            const float m_new = fmaxf(m[i], mt);
            if (m_new <= NEG_BIG) continue;  // every key so far masked for this row
            const float p = s <= NEG_BIG ? 0.f : __expf(s - m_new);
            const float corr = __expf(m[i] - m_new);
            l[i] = l[i] * corr + warp_sum(p);
            m[i] = m_new;
#pragma unroll
            for (int d = 0; d < DPL; ++d) acc[i][d] *= corr;
            for (int j = 0; j < ATT_BN; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int d = 0; d < DPL; ++d) acc[i][d] = fmaf(pj, Vs[j * Dh + lane + 32 * d], acc[i][d]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < ATT_RPW; ++i) {
        const int r = r0 + warp * ATT_RPW + i;
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

template <int DPL, typename KV>
int launch_attention(const float* q, const void* kc, const void* vc, const int32_t* pos, float* out, float* work,
                     int L, int Hq, int Hk, float scale, int n_split) {
    constexpr int Dh = DPL * 32;
    const size_t smem = sizeof(float) * (ATT_BN * (Dh + 1) + ATT_BN * Dh + ATT_ROWS * Dh);
    auto kernel = attention_kernel<DPL, KV>;
    CMP_TRY(check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                       "attention_kernel shared memory"));
    const dim3 grid(ceil_div((size_t)L * (Hq / Hk), ATT_ROWS), Hk, n_split);
    kernel<<<grid, ATT_WARPS * 32, smem, stream()>>>(q, static_cast<const KV*>(kc), static_cast<const KV*>(vc), pos,
                                                     out, work, L, Hq, Hk, scale, n_split);
    CMP_TRY(check_launch("attention_kernel"));
    if (n_split == 1) return CMP_OK;
    attention_merge_kernel<<<L * Hq, std::min(Dh, 256), 0, stream()>>>(work, out, L * Hq, Dh, n_split);
    return check_launch("attention_merge_kernel");
}

template <typename KV>
int dispatch_head_dim(int Dh, const float* q, const void* kc, const void* vc, const int32_t* pos, float* out,
                      float* work, int L, int Hq, int Hk, float scale, int n_split) {
    switch (Dh) {
        case 32: return launch_attention<1, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        case 64: return launch_attention<2, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        case 96: return launch_attention<3, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        case 128: return launch_attention<4, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        case 192: return launch_attention<6, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        case 256: return launch_attention<8, KV>(q, kc, vc, pos, out, work, L, Hq, Hk, scale, n_split);
        default: return fail(CMP_ERR_UNSUPPORTED, "cmp_attention: head dim %d not supported (32/64/96/128/192/256)", Dh);
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
        kv_write_kernel<KV><<<L, 256, 0, stream()>>>(k, v, pos, static_cast<KV*>(kc), static_cast<KV*>(vc), Hk * Dh);
        return check_launch("kv_write_kernel");
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
