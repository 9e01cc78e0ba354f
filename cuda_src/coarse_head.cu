// The MTP draft's coarse head (--spec-draft-coarse; backends/cuda.py coarse_copy / coarse_argmax, the reference is
// numpy_ref.py's). A draft only needs the argmax of the head's logits, and reading the whole LM head (248320 x 4096
// on the 9B: 1.08 GB of Q8_0) is most of a draft step. So the draft reads a Q4_0 copy of the head (0.5625 bytes a
// weight), keeps the k best ids of those coarse logits and rescores only those k rows with the exact head: the
// result is the exact argmax whenever that is among the k. The verify keeps the exact head, so output never
// changes, only acceptance could.
//  - the copy, once at MTP setup: rows dequantized by the embed kernels (every loaded type), quantized here to Q4_0
//    exactly as gguf.quants does it, written in quant_blocks.cuh's device layout (the Q4_0 GEMV then reads it);
//  - top-k per row: each block keeps the k best of TOPK_SPAN values (k rounds of a block-wide argmax among the
//    values after the previous winner), the same kernel then merges the blocks' lists until one list is left;
//  - rescoring: the candidates' rows (dequantized by the embed kernels) dotted with the activations as the exact
//    head's GEMV sees them, and the best candidate in argmax order.
#include <climits>

#include "common.cuh"

namespace cmp {
namespace {

constexpr int Q4_0_VALUES = 32;
constexpr int TOPK_NT = 256;                      // threads of a top-k block
constexpr int TOPK_PER = 8;                       // values each thread holds in registers
constexpr int TOPK_SPAN = TOPK_NT * TOPK_PER;     // values one block reduces to k (2048: 122 blocks on 248320)
constexpr int TOPK_MAX = 32;                      // most candidates (a warp each in the rescoring)

// ==== kernels =====================================================================================================

// One candidate value of gguf.quants' Q4_0: the product and the sum rounded apart as numpy does them (never an
// FMA: fast-math may contract a plain `x * id + 8.5f`), then truncated.
__device__ __forceinline__ unsigned q4_code(float x, float id) {
    const float t = truncf(__fadd_rn(__fmul_rn(x, id), 8.5f));
    return (unsigned)min(15, max(0, (int)t));
}

// Thread per 32-value block, gguf.quants' Q4_0.quantize_blocks step by step in f32 (bit for bit with the numpy
// reference's coarse_copy): max = the value of largest magnitude (the first of equal ones: numpy's argmax), d =
// max / -8, id = 1/d in IEEE round-to-nearest (fast-math's 1/d is approximate) or 0 for an all-zero block, code =
// min(15, trunc(x * id + 8.5)); body: the 16 code bytes in file order (value i low nibble, value 16 + i high),
// head: d as f16.
__global__ void quantize_q4_0_kernel(const float* __restrict__ x,  // [nblk * 32]
                                     uint8_t* __restrict__ body,   // [nblk * 16]
                                     uint8_t* __restrict__ head,   // [nblk * 2]
                                     size_t nblk) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblk) return;
    float v[Q4_0_VALUES];
    const float4* xb = reinterpret_cast<const float4*>(x + b * Q4_0_VALUES);   // rows of n % 32 == 0: 16-aligned
#pragma unroll
    for (int i = 0; i < Q4_0_VALUES / 4; ++i) {
        const float4 f = xb[i];
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
    }
    // from value 0 on, as numpy's argmax: an all-zero block keeps its first value's sign in d (-0 / 8 = +0 ...)
    float amax = fabsf(v[0]), mx = v[0];
#pragma unroll
    for (int i = 1; i < Q4_0_VALUES; ++i)
        if (fabsf(v[i]) > amax) amax = fabsf(v[i]), mx = v[i];
    const float d = mx * -0.125f;                  // max / -8, exact
    const float id = d != 0.f ? __frcp_rn(d) : 0.f;
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        w[j] = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int i = 4 * j + k;
            w[j] |= (q4_code(v[i], id) | q4_code(v[i + 16], id) << 4) << (8 * k);
        }
    }
    reinterpret_cast<uint4*>(body)[b] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<__half*>(head)[b] = __float2half_rn(d);
}

// The k best (value, id) entries of TOPK_SPAN consecutive entries of one row's list, in argmax_better's order
// (larger value first, the lower id among equal values); grid (lists out per row, R). Each of the k rounds is a
// block-wide argmax over the entries after the previous round's winner in that order, so nothing is marked and the
// values stay in registers (k <= 32 rounds of two syncs; a sort of 2048 values would cost more for 16 of them).
// NaN counts as -inf (the entry stays a candidate; only a row of fewer than k numbers would take one). Entries past
// the row's end are (-inf, INT_MAX): after every real entry, and never better than the empty best, so a block
// with fewer than k real entries fills its list with them (the merge then passes them over).
__global__ void __launch_bounds__(TOPK_NT)
topk_kernel(const float* __restrict__ vin,    // [R, n] values
            const int32_t* __restrict__ iin,  // [R, n] their ids; null: an entry's id is its position
            int n, int k,
            float* __restrict__ vout,         // [R, gridDim.x, k]
            int32_t* __restrict__ iout) {     // [R, gridDim.x, k]
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float sv[TOPK_NT / 32];
    __shared__ int si[TOPK_NT / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t row = (size_t)blockIdx.y * n;
    const int j0 = blockIdx.x * TOPK_SPAN;
    float v[TOPK_PER];
    int id[TOPK_PER];
#pragma unroll
    for (int u = 0; u < TOPK_PER; ++u) {            // coalesced: the block's threads read consecutive entries
        const int j = j0 + u * TOPK_NT + tid;
        const bool in = j < n;
        const float x = in ? vin[row + j] : -INFINITY;
        v[u] = isnan(x) ? -INFINITY : x;
        id[u] = !in ? INT_MAX : iin != nullptr ? iin[row + j] : j;
    }
    const size_t o = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * k;
    float lv = INFINITY;                            // the last winner: this round takes the best entry after it
    int li = -1;
    for (int r = 0; r < k; ++r) {
        float bv = -INFINITY;
        int bi = INT_MAX;
#pragma unroll
        for (int u = 0; u < TOPK_PER; ++u)
            if (argmax_better(lv, li, v[u], id[u]) && argmax_better(v[u], id[u], bv, bi)) bv = v[u], bi = id[u];
        warp_argmax(bv, bi);
        if (lane == 0) sv[warp] = bv, si[warp] = bi;
        __syncthreads();
        bv = sv[0], bi = si[0];                     // each thread merges the 8 warps' winners itself
#pragma unroll
        for (int w = 1; w < TOPK_NT / 32; ++w)
            if (argmax_better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
        __syncthreads();                            // every thread has read sv before the next round writes it
        lv = bv, li = bi;
        if (tid == 0) vout[o + r] = bv, iout[o + r] = bi;
    }
}

// Block per row, warp per candidate: the candidate's exact logit, computed as the exact head's GEMV computes it up to
// the order of the sums -- activations as that GEMV sees them (its Q8 blocks q * d for a block-quantized head,
// the f32 row for a dense one, rounded to f16 first for an f16 one as cmp_matmul_dense does) against the
// candidate's dequantized row -- then the best candidate in argmax order (NaN never chosen; a row of NaN only gives
// the first candidate, the coarse best).
__global__ void coarse_rescore_kernel(const int8_t* __restrict__ xq,     // [R, D] or null: a dense head reads x
                                      const float* __restrict__ xd,      // [R, D/32]
                                      const float* __restrict__ x,       // [R, D]
                                      int x_f16,                         // dense: x rounded to f16 first
                                      const float* __restrict__ rows,    // [R * k, D] the candidates' rows
                                      const int32_t* __restrict__ cand,  // [R, k]
                                      int32_t* __restrict__ out,         // [R]
                                      int k, int D) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float sv[TOPK_MAX];
    __shared__ int si[TOPK_MAX];
    const int r = blockIdx.x, lane = threadIdx.x & 31, j = threadIdx.x >> 5;
    const float* w = rows + ((size_t)r * k + j) * D;
    float acc = 0.f;
    if (xq != nullptr) {
        const int8_t* q = xq + (size_t)r * D;
        const float* d = xd + (size_t)r * (D / 32);
        for (int i = lane; i < D; i += 32) acc += (float)q[i] * d[i >> 5] * w[i];
    } else {
        const float* xr = x + (size_t)r * D;
        for (int i = lane; i < D; i += 32) acc += (x_f16 ? __half2float(__float2half_rn(xr[i])) : xr[i]) * w[i];
    }
    acc = warp_sum(acc);
    if (lane == 0) sv[j] = acc, si[j] = cand[(size_t)r * k + j];
    __syncthreads();
    if (j == 0) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        if (lane < k && argmax_better(sv[lane], si[lane], bv, bi)) bv = sv[lane], bi = si[lane];
        warp_argmax(bv, bi);
        if (lane == 0) out[r] = bi == INT_MAX ? cand[(size_t)r * k] : bi;
    }
}

// Entries of one ping-pong half of cmp_topk's work: the first pass's lists, the longest.
size_t topk_half(int R, int N, int k) { return (size_t)R * ceil_div(N, TOPK_SPAN) * k; }

}  // namespace
}  // namespace cmp

using namespace cmp;

// ==== launchers ===================================================================================================

extern "C" int cmp_quantize_q4_0(const float* x, void* body, void* head, int rows, int n) {
    CMP_REQUIRE(rows >= 0 && n > 0 && n % Q4_0_VALUES == 0, "cmp_quantize_q4_0: bad shape rows=%d n=%d (n a "
                "multiple of 32)", rows, n);
    const size_t nblk = (size_t)rows * (n / Q4_0_VALUES);
    if (nblk == 0) return CMP_OK;
    return launch("quantize_q4_0_kernel", quantize_q4_0_kernel, dim3(ceil_div(nblk, 128)), dim3(128), 0, x,
                  static_cast<uint8_t*>(body), static_cast<uint8_t*>(head), nblk);
}

extern "C" int cmp_topk_work_bytes(int R, int N, int k, size_t* bytes) {
    CMP_REQUIRE(R >= 0 && N > 0 && k >= 1 && bytes != nullptr, "cmp_topk_work_bytes: bad arguments R=%d N=%d k=%d",
                R, N, k);
    *bytes = 2 * topk_half(R, N, k) * (sizeof(float) + sizeof(int32_t));
    return CMP_OK;
}

extern "C" int cmp_topk(const float* x, int32_t* ids, void* work, int R, int N, int k) {
    CMP_REQUIRE(R >= 0 && R <= 65535 && N > 0 && k >= 1 && k <= TOPK_MAX && k <= N,
                "cmp_topk: bad shape R=%d N=%d k=%d (1 <= k <= min(%d, N), R <= 65535)", R, N, k, TOPK_MAX);
    if (R == 0) return CMP_OK;
    // two halves of (values, ids): pass p reads one, writes the other; the last pass writes ids straight out
    const size_t half = topk_half(R, N, k);
    float* wv[2] = {static_cast<float*>(work), static_cast<float*>(work) + half};
    int32_t* wi[2] = {reinterpret_cast<int32_t*>(wv[0] + 2 * half), reinterpret_cast<int32_t*>(wv[0] + 2 * half) + half};
    const float* vin = x;
    const int32_t* iin = nullptr;
    for (int n = N, p = 0;; p ^= 1) {
        const int lists = (int)ceil_div(n, TOPK_SPAN);   // each list k long: n shrinks while n > TOPK_SPAN
        const bool last = lists == 1;
        CMP_TRY(launch("topk_kernel", topk_kernel, dim3(lists, R), dim3(TOPK_NT), 0, vin, iin, n, k, wv[p],
                       last ? ids : wi[p]));
        if (last) return CMP_OK;
        vin = wv[p], iin = wi[p], n = lists * k;
    }
}

extern "C" int cmp_coarse_rescore(const int8_t* xq, const float* xd, const float* x, int x_f16, const float* rows,
                                  const int32_t* cand, int32_t* out, int R, int k, int D) {
    CMP_REQUIRE(R >= 0 && k >= 1 && k <= TOPK_MAX && D > 0, "cmp_coarse_rescore: bad shape R=%d k=%d D=%d", R, k, D);
    CMP_REQUIRE(xq != nullptr ? xd != nullptr && D % 32 == 0 : x != nullptr,
                "cmp_coarse_rescore: give xq and xd (D a multiple of 32), or x");
    if (R == 0) return CMP_OK;
    return launch("coarse_rescore_kernel", coarse_rescore_kernel, dim3(R), dim3(32 * k), 0, xq, xd, x, x_f16, rows,
                  cand, out, k, D);
}
