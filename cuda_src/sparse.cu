// Probe statistics for block-sparse prefill (the contract of llamacmp/sparse_attn.group_stats): for G query groups
// (each a range of the chunk's query rows averaged into one query, seeing keys 0 .. limit), the softmax mass and the
// mean score per 64-key block, for every q head. The host picks each head's pattern from these (sparse_attn.
// select_chunk) and hands the block lists to cmp_attn_prefill. FP32 throughout, no tensor cores; keys in any cache
// format through attention_kv.cuh's loader (tq3 keys come rotated, so the group queries are rotated the same way).
#include "attention_kv.cuh"

namespace cmp {
namespace {

constexpr int SP_BLOCK = 64;     // keys per block (sparse_attn.SparseConfig.block, cmp_attn_prefill's blocks)
constexpr int SP_SUB = 32;       // keys per shared-memory sub-tile: lane j scores key j
constexpr int SP_WARPS = 4;

// Block (group g, q head h): qg[g, h] = scale * mean of q rows gstart[g] .. gend[g]-1 of head h; rotated like tq3
// keys when k_type is tq3 (y = H (signs . x) per tq3 block), so that qg . k_stored = scale * q . k.
__global__ void group_queries_kernel(const float* __restrict__ q,        // [L, Hq, Dh]
                                     const int32_t* __restrict__ gstart, // [G]
                                     const int32_t* __restrict__ gend,   // [G]
                                     float* __restrict__ qg,             // [G, Hq, Dh]
                                     int Hq, int Dh, float scale, int k_type) {
    extern __shared__ float xs[];   // [Dh]
    const int g = blockIdx.x, h = blockIdx.y;
    const int r0 = gstart[g], r1 = gend[g];
    const float inv = scale / (float)max(r1 - r0, 1);
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
        float acc = 0.f;
        for (int r = r0; r < r1; ++r) acc += q[((size_t)r * Hq + h) * Dh + d];
        xs[d] = acc * inv;
    }
    __syncthreads();
    if (k_type == CMP_KV_TQ3) fwht_smem(xs, 1, Dh, tq3_block(Dh), Dh, 1, true, false);
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) qg[((size_t)g * Hq + h) * Dh + d] = xs[d];
}

// Block (key block j, kv head kh): the 64 keys in two sub-tiles of 32 in shared memory; each warp takes (group,
// q head of the group) rows in turn and lane l scores key l of the sub-tile. Per row and key block, over the visible
// keys (key <= glimit[g]): part [Hq, G, nkb, 4] = (max score m, sum exp(s - m), sum s, count); the second sub-tile
// merges into what the same thread wrote for the first. Keys at or past n_keys are never read.
__global__ void __launch_bounds__(SP_WARPS * 32)
probe_scores_kernel(const float* __restrict__ qg,       // [G, Hq, Dh]
                    const uint8_t* __restrict__ kc,     // [n_ctx, Hk] rows of row_bytes
                    const int32_t* __restrict__ glimit, // [G]
                    float* __restrict__ part,           // [Hq, G, nkb, 4]
                    int G, int Hq, int Hk, int Dh, int k_type, int row_bytes, int nkb, int n_keys) {
    extern __shared__ float Ks[];   // [SP_SUB][Dh + 1]
    const int j = blockIdx.x, kh = blockIdx.y, group = Hq / Hk;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = G * group;
    for (int sub = 0; sub < SP_BLOCK / SP_SUB; ++sub) {
        const int key0 = j * SP_BLOCK + sub * SP_SUB;
        __syncthreads();   // the previous sub-tile is consumed
        for (int e = threadIdx.x; e < SP_SUB * (Dh / 8); e += blockDim.x) {
            const int kk = e / (Dh / 8), d0 = (e % (Dh / 8)) * 8;
            float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            if (key0 + kk < n_keys) kv_load8(k_type, kc + ((size_t)(key0 + kk) * Hk + kh) * row_bytes, d0, Dh, x);
#pragma unroll
            for (int i = 0; i < 8; ++i) Ks[kk * (Dh + 1) + d0 + i] = x[i];
        }
        __syncthreads();
        for (int r = warp; r < rows; r += SP_WARPS) {
            const int g = r / group, h = kh * group + r % group;
            const bool visible = key0 + lane <= glimit[g];
            const float* qr = qg + ((size_t)g * Hq + h) * Dh;
            const float* kr = Ks + lane * (Dh + 1);
            float s = 0.f;
            for (int d = 0; d < Dh; ++d) s = fmaf(__ldg(qr + d), kr[d], s);
            float m = warp_max(visible ? s : NEG_BIG_KV);
            float l = warp_sum(visible ? __expf(s - m) : 0.f);
            float tot = warp_sum(visible ? s : 0.f);
            float n = warp_sum(visible ? 1.f : 0.f);
            if (lane == 0) {
                float* o = part + (((size_t)h * G + g) * nkb + j) * 4;
                if (sub > 0 && o[3] > 0.f) {
                    if (n > 0.f) {
                        const float mx = fmaxf(o[0], m);
                        l = o[1] * __expf(o[0] - mx) + l * __expf(m - mx);
                        m = mx;
                    } else {
                        m = o[0];
                        l = o[1];
                    }
                    tot += o[2];
                    n += o[3];
                }
                o[0] = n > 0.f ? m : NEG_BIG_KV;
                o[1] = n > 0.f ? l : 0.f;
                o[2] = tot;
                o[3] = n;
            }
        }
    }
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarp ? scratch[lane] : NEG_BIG_KV;
    return warp_max(v);
}

// Block (group g, q head h): mass[h, g, j] = l_j e^(m_j - M) / sum_j' l_j' e^(m_j' - M); mean = sum s / count
// (-inf where no key is visible).
__global__ void probe_mass_kernel(const float* __restrict__ part,  // [Hq, G, nkb, 4]
                                  float* __restrict__ mass,        // [Hq, G, nkb]
                                  float* __restrict__ mean,        // [Hq, G, nkb]
                                  int G, int nkb) {
    __shared__ float scratch[32];
    const size_t base = ((size_t)blockIdx.y * G + blockIdx.x) * nkb;
    float m = NEG_BIG_KV;
    for (int j = threadIdx.x; j < nkb; j += blockDim.x) m = fmaxf(m, part[4 * (base + j)]);
    const float M = block_max(m, scratch);
    float z = 0.f;
    for (int j = threadIdx.x; j < nkb; j += blockDim.x) {
        const float* p = part + 4 * (base + j);
        z += p[1] > 0.f ? p[1] * __expf(p[0] - M) : 0.f;
    }
    z = block_sum(z, scratch);
    const float inv = z > 0.f ? 1.f / z : 0.f;
    for (int j = threadIdx.x; j < nkb; j += blockDim.x) {
        const float* p = part + 4 * (base + j);
        mass[base + j] = p[1] > 0.f ? p[1] * __expf(p[0] - M) * inv : 0.f;
        mean[base + j] = p[3] > 0.f ? p[2] / p[3] : -INFINITY;
    }
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_sparse_probe(const float* q, const void* kc, int k_type, const int32_t* gstart,
                                const int32_t* gend, const int32_t* glimit, float* mass, float* mean, float* work,
                                int L, int G, int Hq, int Hk, int Dh, float scale, int nkb, int n_keys) {
    CMP_REQUIRE(L > 0 && G > 0 && Hk > 0 && Hq % Hk == 0 && nkb > 0 && Dh % 8 == 0 && n_keys > 0 &&
                    n_keys <= nkb * SP_BLOCK,
                "cmp_sparse_probe: bad shape L=%d G=%d Hq=%d Hk=%d Dh=%d nkb=%d n_keys=%d", L, G, Hq, Hk, Dh, nkb,
                n_keys);
    const int row_bytes = kv_row_bytes(k_type, Dh);
    if (row_bytes < 0) return fail(CMP_ERR_UNSUPPORTED, "cmp_sparse_probe: KV type %d with head dim %d", k_type, Dh);
    float* qg = work;                                   // [G, Hq, Dh]
    float* part = work + (size_t)G * Hq * Dh;           // [Hq, G, nkb, 4]
    group_queries_kernel<<<dim3(G, Hq), 128, Dh * sizeof(float), stream()>>>(q, gstart, gend, qg, Hq, Dh, scale,
                                                                             k_type);
    CMP_TRY(check_launch("group_queries_kernel"));
    const size_t smem = (size_t)SP_SUB * (Dh + 1) * sizeof(float);
    CMP_TRY(check_cuda(cudaFuncSetAttribute(probe_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem), "probe_scores_kernel shared memory"));
    probe_scores_kernel<<<dim3(nkb, Hk), SP_WARPS * 32, smem, stream()>>>(
        qg, static_cast<const uint8_t*>(kc), glimit, part, G, Hq, Hk, Dh, k_type, row_bytes, nkb, n_keys);
    CMP_TRY(check_launch("probe_scores_kernel"));
    probe_mass_kernel<<<dim3(G, Hq), 256, 0, stream()>>>(part, mass, mean, G, nkb);
    return check_launch("probe_mass_kernel");
}
