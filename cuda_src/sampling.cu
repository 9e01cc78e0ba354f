// Sampling on the device, so that a decode loop moves one int32 per sequence to the host instead of a logits row
// (1 MB on the real vocabulary; ~4 ms/token on a PCIe Gen1 x1 card):
//  - greedy argmax over the vocabulary (CapturedStep, llamacmp-bench); it can write straight into a captured
//    graph's token-id input, so the next replay consumes it without any host round trip;
//  - llama.cpp's default chain as llamacmp/sampling.py runs it (logit bias, repeat/frequency/presence penalties over
//    a window, top-k, top-p, min-p, temperature, categorical draw) for 1 <= k <= 1024 candidates. The uniform
//    number of the draw comes from the host's seeded generator, so a draw equals the reference's given the same u.
#include "common.cuh"

namespace cmp {
namespace {

constexpr int ARGMAX_NT = 1024;
constexpr int SAMPLE_NT = 1024;       // threads of the chain kernel; also its most top-k candidates
constexpr int PENALTY_MAX_WINDOW = 4096;

// ==== kernels =====================================================================================================

// Block per row (ARGMAX_NT threads), reduced in numpy.argmax's order (argmax_better). Unlike numpy, NaN is never
// chosen over a number (a broken logit must not become the next token); a row of only NaN gives index 0.
// One block per row is ONE SM reading the row (248320 floats, ~1 MB, on the real vocabulary), so the scan is bound by
// how many loads that SM keeps in flight: the row's 16-byte-aligned body is read as float4, ARGMAX_U independent
// float4 loads per thread before any compare (ARGMAX_U * 16 B * 1024 threads = 128 KB in flight at U = 8;
// the old scalar loop kept ~1 float per thread in flight: 93.6 us per 9B row on the H200, ~11 GB/s), and only
// the unaligned head (rows start at x + r*N, so a row's alignment depends on N) and the tail go one float at a time.
// The scan order does not matter: argmax_better is a total order on (value, index) for every non-NaN value (-0 and
// +0 compare equal, so the lower index wins, as numpy's first maximum), and NaN never enters a best pair.
constexpr int ARGMAX_U = 8;

__device__ __forceinline__ void argmax_take(float v, int i, float& bv, int& bi) {
    if (argmax_better(v, i, bv, bi)) {  // NaN compares false: skipped
        bv = v;
        bi = i;
    }
}

__global__ void __launch_bounds__(ARGMAX_NT, 1)   // 1 block per SM: 64 registers, room for the loads in flight
argmax_kernel(const float* __restrict__ x,   // [R, N]
              int32_t* __restrict__ out,     // [R]
              int N) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* row = x + (size_t)blockIdx.x * N;
    const int tid = threadIdx.x;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    // head: floats before the first 16-byte boundary (0..3; all of a short row); x is float-aligned, so 4-aligned
    const int head = min(N, (int)(((16u - ((unsigned)(uintptr_t)row & 15u)) & 15u) >> 2));
    const int nb = (N - head) >> 2;                       // float4 of the aligned body
    const float4* body = reinterpret_cast<const float4*>(row + head);
    if (tid < head) argmax_take(row[tid], tid, bv, bi);
    // full rounds: ARGMAX_U unguarded loads, then the compares. ptxas keeps 6 of the 8 ahead of the first compare
    // (sm_90, 52 registers); at __launch_bounds__'s default register target (32, for 2 blocks per SM) or with
    // guarded loads it sank them to their compares and only 2-3 were in flight.
    int j0 = tid;
    for (; j0 + (ARGMAX_U - 1) * ARGMAX_NT < nb; j0 += ARGMAX_U * ARGMAX_NT) {
        float4 q[ARGMAX_U];
#pragma unroll
        for (int u = 0; u < ARGMAX_U; ++u) q[u] = body[j0 + u * ARGMAX_NT];
#pragma unroll
        for (int u = 0; u < ARGMAX_U; ++u) {
            const int i = head + 4 * (j0 + u * ARGMAX_NT);
            argmax_take(q[u].x, i, bv, bi);
            argmax_take(q[u].y, i + 1, bv, bi);
            argmax_take(q[u].z, i + 2, bv, bi);
            argmax_take(q[u].w, i + 3, bv, bi);
        }
    }
    for (; j0 < nb; j0 += ARGMAX_NT) {                     // the last partial round: < ARGMAX_U float4 per thread
        const float4 q = body[j0];
        const int i = head + 4 * j0;
        argmax_take(q.x, i, bv, bi);
        argmax_take(q.y, i + 1, bv, bi);
        argmax_take(q.z, i + 2, bv, bi);
        argmax_take(q.w, i + 3, bv, bi);
    }
    const int tail0 = head + 4 * nb;                      // 0..3 floats after the body
    if (tail0 + tid < N) argmax_take(row[tail0 + tid], tail0 + tid, bv, bi);
    warp_argmax(bv, bi);
    const int lane = tid & 31, warp = tid >> 5, nwarp = blockDim.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nwarp ? sv[lane] : -INFINITY;
        bi = lane < nwarp ? si[lane] : 0x7fffffff;
        warp_argmax(bv, bi);
        // every value -inf or NaN: no candidate won; index 0 as numpy gives for an all-NaN row
        if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

// ---- the sampling chain ----------------------------------------------------------------------------------------
// Order-preserving map of a float to an unsigned key (larger float -> larger key); NaN was replaced by -inf before.
// -0 maps as +0: the two compare equal in the candidate order, so they must share a key at the top-k threshold.
__device__ __forceinline__ unsigned fkey(float f) {
    const unsigned u = __float_as_uint(f) == 0x80000000u ? 0u : __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Candidate order of the reference's stable sort: larger logit first, the lower id among equal logits.
__device__ __forceinline__ bool before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// Block per row (SAMPLE_NT threads). work [N] gets the biased, penalised logits; then a radix select finds the
// k-th largest value, the k candidates (ties at the threshold by lowest id) are bitonic-sorted in shared memory,
// and thread 0 walks top-p, min-p, temperature and the inverse-CDF draw over at most k sorted values.
__global__ void __launch_bounds__(SAMPLE_NT)
sample_kernel(const float* __restrict__ logits,    // [N]
              float* __restrict__ work,            // [N] scratch
              const int32_t* __restrict__ hist,    // [n_hist] penalty window (oldest first)
              int n_hist,
              const int32_t* __restrict__ bias_ids,  // [n_bias]
              const float* __restrict__ bias_vals,   // [n_bias]
              int n_bias, CmpSamplerParams p, float u,
              int32_t* __restrict__ out,           // [1]
              int32_t* __restrict__ n_out,         // [1] or null: candidates left for the draw
              int N) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float cv[SAMPLE_NT];
    __shared__ int ci[SAMPLE_NT];
    __shared__ unsigned hist_bins[256];
    __shared__ int warp_cnt[SAMPLE_NT / 32];
    __shared__ int s_sel, s_kk, s_n, s_taken;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int k = p.top_k;

    // -- 1. logit bias, then penalties (as Sampler.candidates then apply_penalties) ---------------------------
    for (int i = tid; i < N; i += SAMPLE_NT) {
        const float x = logits[i];
        work[i] = isnan(x) ? -INFINITY : x;
    }
    __syncthreads();
    for (int j = tid; j < n_bias; j += SAMPLE_NT) {
        const int t = bias_ids[j];
        if (t >= 0 && t < N) work[t] += bias_vals[j];   // ids are distinct (a dict on the host)
    }
    __syncthreads();
    for (int j = tid; j < n_hist; j += SAMPLE_NT) {
        const int t = hist[j];
        bool first = t >= 0 && t < N;
        int count = 0;
        for (int m = 0; m < n_hist && first; ++m) {
            if (hist[m] == t) {
                if (m < j) first = false;      // an earlier slot of the same token applies it
                ++count;
            }
        }
        if (first) {
            float x = work[t];
            x = x <= 0.f ? x * p.penalty_repeat : x / p.penalty_repeat;
            work[t] = x - (float)count * p.penalty_freq - p.penalty_present;
        }
    }
    __syncthreads();

    // -- 2. radix select of the k-th largest key, 8 bits per pass from the top ----------------------------------
    unsigned prefix = 0, mask = 0;
    int kk = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = tid; d < 256; d += SAMPLE_NT) hist_bins[d] = 0;
        __syncthreads();
        // Logits of one row mostly share their top bits, so the shared-memory atomics would pile onto a few bins:
        // lanes of a warp that hit the same bin add once through their leader (uniform trip count for the match).
        // __match_any_sync is sm_70+; sm_61 (Pascal) adds once per lane: the same counts, more atomics.
        for (int base = 0; base < N; base += SAMPLE_NT) {
            const int i = base + tid;
            const unsigned key = i < N ? fkey(work[i]) : 0u;
            const bool in = i < N && (key & mask) == prefix;
            const unsigned bin = in ? (key >> shift) & 255u : 256u + lane;   // out-of-set lanes never match
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
            if (in) atomicAdd(&hist_bins[bin], 1u);
#else
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&hist_bins[bin], (unsigned)__popc(peers));
#endif
        }
        __syncthreads();
        if (tid == 0) {
            int cum = 0, sel = 0;
            for (int d = 255; d >= 0; --d) {
                if (cum + (int)hist_bins[d] >= kk) {
                    sel = d;
                    break;
                }
                cum += (int)hist_bins[d];
            }
            s_sel = sel;
            s_kk = kk - cum;                   // rank still wanted inside the selected bin
        }
        __syncthreads();
        prefix |= (unsigned)s_sel << shift;
        mask |= 255u << shift;
        kk = s_kk;
        __syncthreads();                       // s_sel / s_kk read by all before the next pass rewrites them
    }
    const unsigned thr = prefix;               // the k-th largest key; kk of the keys equal to it are wanted
    const int n_gt = k - kk;

    // -- 3. collect: every key above the threshold, then the lowest ids equal to it --------------------------------
    cv[tid] = -INFINITY;
    ci[tid] = 0x7fffffff;
    if (tid == 0) {
        s_n = 0;
        s_taken = 0;
    }
    __syncthreads();
    for (int i = tid; i < N; i += SAMPLE_NT) {
        const float x = work[i];
        if (fkey(x) > thr) {
            const int slot = atomicAdd(&s_n, 1);
            cv[slot] = x;
            ci[slot] = i;
        }
    }
    __syncthreads();
    for (int base = 0; base < N; base += SAMPLE_NT) {
        if (s_taken >= kk) break;              // uniform: s_taken changes only between the barriers below
        const int i = base + tid;
        const bool eq = i < N && fkey(work[i]) == thr;
        const unsigned ball = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) warp_cnt[warp] = __popc(ball);
        __syncthreads();
        int before_me = __popc(ball & ((1u << lane) - 1u)), total = 0;
        for (int w = 0; w < SAMPLE_NT / 32; ++w) {
            if (w < warp) before_me += warp_cnt[w];
            total += warp_cnt[w];
        }
        const int rank = s_taken + before_me;
        if (eq && rank < kk) {
            cv[n_gt + rank] = work[i];
            ci[n_gt + rank] = i;
        }
        __syncthreads();                       // everyone has read s_taken and warp_cnt
        if (tid == 0) s_taken += total;
        __syncthreads();
    }

    // -- 4. bitonic sort of the SAMPLE_NT slots into candidate order (padding: -inf, id INT_MAX, goes last) --------
    for (int size = 2; size <= SAMPLE_NT; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            const int i = tid, j = tid ^ stride;
            if (j > i) {
                const bool up = (i & size) == 0;
                const bool swap = up ? before(cv[j], ci[j], cv[i], ci[i]) : before(cv[i], ci[i], cv[j], ci[j]);
                if (swap) {
                    const float tv = cv[i];
                    const int ti = ci[i];
                    cv[i] = cv[j];
                    ci[i] = ci[j];
                    cv[j] = tv;
                    ci[j] = ti;
                }
            }
        }
    }
    __syncthreads();

    // -- 5. top-p, min-p, temperature, draw over the sorted candidates (apply_top_p .. Sampler.sample) ----------
    if (tid == 0) {
        const int keep_min = max(p.min_keep, 1);
        int n = k;
        if (p.top_p < 1.f) {
            float sum = 0.f;
            for (int i = 0; i < n; ++i) sum += __expf(cv[i] - cv[0]);
            float cum = 0.f;
            int last = n;
            for (int i = 0; i < n; ++i) {
                cum += __expf(cv[i] - cv[0]) / sum;
                if (cum >= p.top_p) {
                    last = i + 1;
                    break;
                }
            }
            n = min(n, max(last, keep_min));
        }
        if (p.min_p > 0.f) {
            const float floor_ = cv[0] + logf(p.min_p);
            int count = 0;
            while (count < n && cv[count] >= floor_) ++count;   // sorted: the kept set is a prefix
            n = count < keep_min ? min(n, keep_min) : count;
        }
        int pick = 0;
        if (p.temp > 0.f && n > 1) {
            const float inv_t = 1.f / p.temp;
            float total = 0.f;
            for (int i = 0; i < n; ++i) total += __expf((cv[i] - cv[0]) * inv_t);
            const float target = u * total;   // searchsorted(cdf / cdf[-1], u, side="right")
            float cum = 0.f;
            pick = n - 1;
            for (int i = 0; i < n; ++i) {
                cum += __expf((cv[i] - cv[0]) * inv_t);
                if (cum > target) {
                    pick = i;
                    break;
                }
            }
        }
        out[0] = ci[pick];
        // The host sampler draws a uniform number only when more than one candidate is left; the caller reads this
        // to give back the number it drew for a draw that did not need one, keeping its generator in step.
        if (n_out != nullptr) n_out[0] = p.temp > 0.f ? n : 1;
    }
}

}  // namespace
}  // namespace cmp

using namespace cmp;

// ==== launchers ===================================================================================================

extern "C" int cmp_argmax(const float* x, int32_t* out, int R, int N) {
    CMP_REQUIRE(R >= 0 && N > 0, "cmp_argmax: bad shape R=%d N=%d", R, N);
    if (R == 0) return CMP_OK;
    return launch("argmax_kernel", argmax_kernel, dim3(R), dim3(ARGMAX_NT), 0, x, out, N);
}

extern "C" int cmp_sample(const float* logits, float* work, const int32_t* hist, int n_hist, const int32_t* bias_ids,
                          const float* bias_vals, int n_bias, const CmpSamplerParams* params, float u, int32_t* out,
                          int32_t* n_out, int N) {
    CMP_REQUIRE(params != nullptr && N > 0, "cmp_sample: bad arguments (N=%d)", N);
    const CmpSamplerParams p = *params;
    CMP_REQUIRE(p.top_k >= 1 && p.top_k <= SAMPLE_NT && p.top_k <= N,
                "cmp_sample: top_k %d outside 1..min(%d, N=%d) (larger candidate sets sample on the host)", p.top_k,
                SAMPLE_NT, N);
    CMP_REQUIRE(n_hist >= 0 && n_hist <= PENALTY_MAX_WINDOW, "cmp_sample: penalty window %d outside 0..%d", n_hist,
                PENALTY_MAX_WINDOW);
    CMP_REQUIRE(n_bias >= 0, "cmp_sample: n_bias %d", n_bias);
    CMP_REQUIRE(u >= 0.f && u < 1.f, "cmp_sample: u=%g outside [0, 1)", (double)u);
    return launch("sample_kernel", sample_kernel, dim3(1), dim3(SAMPLE_NT), 0, logits, work, hist, n_hist, bias_ids,
                  bias_vals, n_bias, p, u, out, n_out, N);
}
