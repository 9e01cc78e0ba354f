// Probe statistics for block-sparse prefill (the contract of llamacmp/sparse_attn.group_stats): for G query groups
// (each a range of the chunk's query rows averaged into one query, seeing keys 0 .. limit), the softmax mass and the
// mean score per 64-key block, for every q head. The host picks each head's pattern from these (sparse_attn.
// select_chunk) and hands the block lists to cmp_attn_prefill. FP32 throughout, no tensor cores; keys in any cache
// format through attention_kv.cuh's loader (tq3 keys come rotated, so the group queries are rotated the same way).
#include "attention_kv.cuh"
#include "smem_plan.h"

namespace cmp {
namespace {

constexpr int SP_BLOCK = 64;     // keys per block (sparse_attn.SparseConfig.block, cmp_attn_prefill's blocks)
using smem::SP_SUB;              // keys per shared-memory sub-tile: lane j scores key j
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


// ---- selection on the device (the contract of sparse_attn.select_lists; see api.h cmp_sparse_select) -------------
// Everything here is ranks, counts and fixed-order sums, so that it reproduces the numpy reference exactly: pooled
// statistics summed over the group's heads in head order (fp32), column weights over probes in probe order (fp32),
// diagonal weights in fp64, equal weights ranked in index order. Only the recall (an fp64 sum in another order)
// can differ in its last bits, which matters only where two patterns' recalls tie.

// Block (key-block tile, list h): pooled mass pm [Hl, P, nkb], pooled mean pmean [Hl, nqb, nkb], column weights
// colw [Hl, nkb] (fp32, probes in order) and diagonal weights diagw [Hl, nkb] (fp64: offset d = pkb[p] - j).
__global__ void select_pool_kernel(const float* __restrict__ mass, const float* __restrict__ mean,  // [Hq, G, nkb]
                                   const int32_t* __restrict__ pqb,                                  // [P]
                                   float* __restrict__ pm, float* __restrict__ pmean, float* __restrict__ colw,
                                   double* __restrict__ diagw, int group, int P, int nqb, int nkb, int qb0) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (j >= nkb) return;
    const int G = P + nqb;
    float cw = 0.f;
    for (int p = 0; p < P; ++p) {
        float m = mass[((size_t)(h * group) * G + p) * nkb + j];
        for (int e = 1; e < group; ++e) m += mass[((size_t)(h * group + e) * G + p) * nkb + j];
        pm[((size_t)h * P + p) * nkb + j] = m;
        cw += m;
    }
    colw[(size_t)h * nkb + j] = cw;
    for (int i = 0; i < nqb; ++i) {
        float m = mean[((size_t)(h * group) * G + P + i) * nkb + j];
        for (int e = 1; e < group; ++e) m += mean[((size_t)(h * group + e) * G + P + i) * nkb + j];
        pmean[((size_t)h * nqb + i) * nkb + j] = __fdiv_rn(m, (float)group);
    }
    // offset d = j here: probe p reads its key block pkb - d (none when d > pkb)
    double dw = 0.0;
    for (int p = 0; p < P; ++p) {
        const int kb = qb0 + pqb[p] - j;
        if (kb >= 0) {
            float m = mass[((size_t)(h * group) * G + p) * nkb + kb];
            for (int e = 1; e < group; ++e) m += mass[((size_t)(h * group + e) * G + p) * nkb + kb];
            dw += (double)m;
        }
    }
    diagw[(size_t)h * nkb + j] = dw;
}

// key block (or offset) j costs the query blocks that reach it: nqb up to the chunk's first block, one less each after
__device__ __forceinline__ int col_cost(int j, int nqb, int qb0) { return j <= qb0 ? nqb : nqb - (j - qb0); }

// Greedy prefix of sparse_attn._prefix without sorting: item j (weight w[j] > 0) is chosen when the costs of every
// item ranked at or before it (higher weight, or equal weight and lower index) fit the budget. O(nkb^2) per list.
template <typename T>
__device__ int prefix_choose(const T* w, uint8_t* chosen, int nkb, int nqb, int qb0, double budget, int* scratch) {
    int spent_mine = 0;
    for (int j = threadIdx.x; j < nkb; j += blockDim.x) {
        const T wj = w[j];
        long long spent = 0;
        for (int i = 0; i < nkb; ++i) {
            const T wi = w[i];
            if (wi > wj || (wi == wj && i <= j)) spent += col_cost(i, nqb, qb0);
        }
        const bool take = wj > (T)0 && (double)spent <= budget;
        chosen[j] = take;
        if (take) spent_mine += col_cost(j, nqb, qb0);
    }
    // the chosen items' total cost (int: exact in any order)
    for (int o = 16; o > 0; o >>= 1) spent_mine += __shfl_xor_sync(0xffffffffu, spent_mine, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = spent_mine;
    __syncthreads();
    int total = 0;
    for (int k = 0; k < (int)(blockDim.x >> 5); ++k) total += scratch[k];
    __syncthreads();
    return total;
}

// Block (list h): the vertical_slash columns, then the diagonals with the budget the columns left.
__global__ void select_vs_kernel(const float* __restrict__ colw, const double* __restrict__ diagw,
                                 uint8_t* __restrict__ cols, uint8_t* __restrict__ diags, int nkb, int nqb, int qb0,
                                 double total) {
    __shared__ int scratch[32];
    const int h = blockIdx.x;
    const int spent = prefix_choose<float>(colw + (size_t)h * nkb, cols + (size_t)h * nkb, nkb, nqb, qb0, total,
                                           scratch);
    prefix_choose<double>(diagw + (size_t)h * nkb, diags + (size_t)h * nkb, nkb, nqb, qb0, total - (double)spent,
                          scratch);
}

// Block (query block i, list h): block_sparse's `keep` highest pooled scores among the causal key blocks
// 0 .. qb0 + i (equal scores in index order): key block j is kept when fewer than keep causal blocks rank before it.
__global__ void select_bs_kernel(const float* __restrict__ pmean, uint8_t* __restrict__ bs, int nqb, int nkb,
                                 int qb0, int keep) {
    const int i = blockIdx.x, h = blockIdx.y, last = qb0 + i;
    const float* s = pmean + ((size_t)h * nqb + i) * nkb;
    uint8_t* out = bs + ((size_t)h * nqb + i) * nkb;
    for (int j = threadIdx.x; j < nkb; j += blockDim.x) {
        bool take = false;
        if (j <= last) {
            const float sj = s[j];
            int before = 0;
            for (int k = 0; k <= last && before < keep; ++k) {
                const float sk = s[k];
                before += (sk > sj || (sk == sj && k < j)) ? 1 : 0;
            }
            take = before < keep;
        }
        out[j] = take;
    }
}

__device__ __forceinline__ bool select_in(int pat, int i, int j, int last, int keep, int sink, int nkb,
                                          const uint8_t* cols, const uint8_t* diags, const uint8_t* bsrow) {
    if (j == last) return true;             // the diagonal block, always
    if (j > last) return false;             // causal
    if (pat == 0) return j < sink || j > last - (keep - sink);
    if (pat == 1) return cols[j] || diags[last - j];
    return bsrow[j];
}

// Block (list h): each pattern's recall over the probes (fp64), the best (first of equals), then its block lists:
// warp w compacts query blocks w, w + nwarps, .. with ballots, pads each row to nkb with its last block.
__global__ void select_pick_kernel(const float* __restrict__ pm, const int32_t* __restrict__ pqb,
                                   const uint8_t* __restrict__ cols, const uint8_t* __restrict__ diags,
                                   const uint8_t* __restrict__ bs, int32_t* __restrict__ pattern,
                                   int32_t* __restrict__ blocks, int32_t* __restrict__ counts, int P, int nqb,
                                   int nkb, int qb0, int keep, int sink) {
    __shared__ double red[3][32];
    __shared__ int best;
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
    const uint8_t* ch = cols + (size_t)h * nkb;
    const uint8_t* dh = diags + (size_t)h * nkb;
    double r[3] = {0.0, 0.0, 0.0};
    for (int e = threadIdx.x; e < P * nkb; e += blockDim.x) {
        const int p = e / nkb, j = e % nkb, i = pqb[p], last = qb0 + i;
        const double m = (double)pm[((size_t)h * P + p) * nkb + j];
        const uint8_t* bsrow = bs + ((size_t)h * nqb + i) * nkb;
        for (int pat = 0; pat < 3; ++pat)
            if (select_in(pat, i, j, last, keep, sink, nkb, ch, dh, bsrow)) r[pat] += m;
    }
    for (int pat = 0; pat < 3; ++pat) {
        for (int o = 16; o > 0; o >>= 1) r[pat] += __shfl_xor_sync(0xffffffffu, r[pat], o);
        if (lane == 0) red[pat][warp] = r[pat];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double rec[3];
        for (int pat = 0; pat < 3; ++pat) {
            rec[pat] = 0.0;
            for (int w = 0; w < nwarp; ++w) rec[pat] += red[pat][w];
        }
        best = 0;
        for (int pat = 1; pat < 3; ++pat)
            if (rec[pat] > rec[best]) best = pat;
        pattern[h] = best;
    }
    __syncthreads();
    const int pat = best;
    for (int i = warp; i < nqb; i += nwarp) {
        const int last = qb0 + i;
        const uint8_t* bsrow = bs + ((size_t)h * nqb + i) * nkb;
        int32_t* out = blocks + ((size_t)h * nqb + i) * nkb;
        int n = 0;
        for (int j0 = 0; j0 <= last; j0 += 32) {
            const int j = j0 + lane;
            const bool in = j <= last && select_in(pat, i, j, last, keep, sink, nkb, ch, dh, bsrow);
            const unsigned mask = __ballot_sync(0xffffffffu, in);
            if (in) out[n + __popc(mask & ((1u << lane) - 1u))] = j;
            n += __popc(mask);
        }
        __syncwarp();
        for (int k = n + lane; k < nkb; k += 32) out[k] = last;   // the diagonal is always the last kept
        if (lane == 0) counts[(size_t)h * nqb + i] = n;
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
    const size_t bytes = smem::probe_scores_plan(Dh, 0).bytes;
    CMP_TRY(smem_opt_in("probe_scores_kernel", probe_scores_kernel, bytes));
    probe_scores_kernel<<<dim3(nkb, Hk), SP_WARPS * 32, bytes, stream()>>>(
        qg, static_cast<const uint8_t*>(kc), glimit, part, G, Hq, Hk, Dh, k_type, row_bytes, nkb, n_keys);
    CMP_TRY(check_launch("probe_scores_kernel"));
    probe_mass_kernel<<<dim3(G, Hq), 256, 0, stream()>>>(part, mass, mean, G, nkb);
    return check_launch("probe_mass_kernel");
}

extern "C" int cmp_sparse_select(const float* mass, const float* mean, const int32_t* pqb, int32_t* pattern,
                                 int32_t* blocks, int32_t* counts, void* work, int Hq, int Hl, int P, int nqb,
                                 int nkb, int qb0, int keep, int sink, double total) {
    CMP_REQUIRE(Hl > 0 && Hq % Hl == 0 && P > 0 && nqb > 0 && nkb == qb0 + nqb && qb0 >= 0 && keep > 0 &&
                    sink >= 0,
                "cmp_sparse_select: bad shape Hq=%d Hl=%d P=%d nqb=%d nkb=%d qb0=%d keep=%d sink=%d", Hq, Hl, P,
                nqb, nkb, qb0, keep, sink);
    const size_t n = (size_t)Hl * nkb;
    double* diagw = static_cast<double*>(work);                 // [Hl, nkb]
    float* pm = reinterpret_cast<float*>(diagw + n);            // [Hl, P, nkb]
    float* pmean = pm + n * P;                                   // [Hl, nqb, nkb]
    float* colw = pmean + n * nqb;                               // [Hl, nkb]
    uint8_t* cols = reinterpret_cast<uint8_t*>(colw + n);       // [Hl, nkb]
    uint8_t* diags = cols + n;                                   // [Hl, nkb]
    uint8_t* bs = diags + n;                                     // [Hl, nqb, nkb]
    select_pool_kernel<<<dim3((nkb + 127) / 128, Hl), 128, 0, stream()>>>(mass, mean, pqb, pm, pmean, colw, diagw,
                                                                          Hq / Hl, P, nqb, nkb, qb0);
    CMP_TRY(check_launch("select_pool_kernel"));
    select_vs_kernel<<<Hl, 1024, 0, stream()>>>(colw, diagw, cols, diags, nkb, nqb, qb0, total);
    CMP_TRY(check_launch("select_vs_kernel"));
    select_bs_kernel<<<dim3(nqb, Hl), 256, 0, stream()>>>(pmean, bs, nqb, nkb, qb0, keep);
    CMP_TRY(check_launch("select_bs_kernel"));
    select_pick_kernel<<<Hl, 1024, 0, stream()>>>(pm, pqb, cols, diags, bs, pattern, blocks, counts, P, nqb, nkb,
                                                  qb0, keep, sink);
    return check_launch("select_pick_kernel");
}
