// Activation quantization to Q8 blocks (shared by every projection that reads the same input), the ops fused with
// it (RMSNorm, SwiGLU, sigmoid gate, gated RMSNorm: their f32 output is only ever read by projections, so the
// fused kernels write just q and d), and the load-time repack of GGUF Q8_0 weights into separate quant and scale
// arrays (16-byte aligned quant rows for wide loads).
// The Q8 producers call pdl_allow_consumers first: a v3 GEMV launched with PDL after one of them starts streaming
// its weights while the producer runs (it waits for the producer's q and d; no effect on ordinary launches).
#include <algorithm>

#include "common.cuh"

namespace cmp {
namespace {

// ==== kernels =====================================================================================================

// Quantize one 32-value block held one value per lane of a full warp. Rounding matches
// numpy_ref.quantize_q8_blocks bit for bit: inv = 127/amax in IEEE round-to-nearest (fast-math would make it
// approximate and move ties), q = round-half-even(x*inv), and the scale d = amax/127 is rounded to f16 as llama.cpp
// stores it (kept in an f32 array here: same value, aligned loads).
__device__ __forceinline__ float q8_inv(float amax) { return amax > 0.f ? __fdiv_rn(127.f, amax) : 0.f; }
__device__ __forceinline__ int8_t q8_code(float v, float inv) { return (int8_t)__float2int_rn(__fmul_rn(v, inv)); }
__device__ __forceinline__ float q8_scale(float amax) { return __half2float(__float2half_rn(__fdiv_rn(amax, 127.f))); }

__device__ __forceinline__ void quantize_block(float v, int8_t* __restrict__ q, float* __restrict__ d, size_t blk,
                                               int lane) {
    const float amax = warp_max(fabsf(v));
    q[blk * QK + lane] = q8_code(v, q8_inv(amax));
    if (lane == 0) d[blk] = q8_scale(amax);
}

// The same quantization with a block held 8 values per lane by 4 adjacent lanes (part = lane % 4: values 8 part ..
// 8 part + 7), for the producers that stream whole rows: a warp covers 8 blocks (1 KB of f32 per input) instead of one
// (128 B), so each load moves 16 bytes a lane and 8x the bytes are in flight. The amax is the same value whichever
// lanes fold it (a max is exact; NaN folds as in warp_max, the lane's first value seeding it), and inv, q and d come
// from quantize_block's helpers, so q and d are its bits. Every lane of the warp calls block8_amax (its shuffles);
// store_block8 writes the 8 codes as one 8-byte store.
constexpr int Q8_PER_LANE = 8, Q8_LANES = QK / Q8_PER_LANE;
__device__ __forceinline__ float block8_amax(const float (&v)[Q8_PER_LANE]) {
    float amax = fabsf(v[0]);
#pragma unroll
    for (int j = 1; j < Q8_PER_LANE; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
    for (int o = 1; o < Q8_LANES; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    return amax;
}
__device__ __forceinline__ void store_block8(const float (&v)[Q8_PER_LANE], float amax, int8_t* __restrict__ q,
                                             float* __restrict__ d, size_t blk, int part) {
    const float inv = q8_inv(amax);
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < Q8_PER_LANE; ++j) w[j / 4] |= (uint32_t)(uint8_t)q8_code(v[j], inv) << (8 * (j % 4));
    *reinterpret_cast<uint2*>(q + blk * QK + part * Q8_PER_LANE) = make_uint2(w[0], w[1]);
    if (part == 0) d[blk] = q8_scale(amax);
}

// 8 consecutive floats from a 16-byte aligned address (the caller's rows are whole 32-value blocks).
__device__ __forceinline__ void load8(const float* __restrict__ p, float (&v)[Q8_PER_LANE]) {
    const float4 lo = reinterpret_cast<const float4*>(p)[0], hi = reinterpret_cast<const float4*>(p)[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

// 4 lanes per 32-value block (store_block8); lanes past the last block hold zeros for the shuffles and store nothing.
__global__ void quantize_q8_kernel(const float* __restrict__ x,  // [nblk * 32]
                                   int8_t* __restrict__ q,        // [nblk * 32]
                                   float* __restrict__ d,         // [nblk]
                                   size_t nblk) {
    pdl_allow_consumers();  // first: the GEMV after it streams its weights meanwhile (it waits for q, d)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x, blk = g / Q8_LANES;
    float v[Q8_PER_LANE] = {};
    if (blk < nblk) load8(x + g * Q8_PER_LANE, v);
    const float amax = block8_amax(v);
    if (blk < nblk) store_block8(v, amax, q, d, blk, (int)(g % Q8_LANES));
}

// RMSNorm then quantize, block per row. The scale comes from row_rms_scale's expression as in elementwise.cu's
// rmsnorm_kernel (launched alike, the same block size) and the normalized value is its expression, so q and d equal
// rmsnorm + quantize bit for bit; warp w quantizes the 32-blocks w, w + nwarp, ...
// Rows of up to RMSQ_MAXV values per thread (D <= 8192 at 1024 threads: every Qwen3.5 width) keep their x in
// registers from the one load on: thread t's values are t, t + blockDim, ... in row_rms_scale's order, and value j
// of lane l of warp w is element (j * nwarp + w) * 32 + l, i.e. block j * nwarp + w in the loop's order, so the
// sums, blocks and roundings are the same. Its 4 (D = 4096) block quantizations are independent, so their warp
// reductions and divisions overlap instead of each waiting for a reload. (Decode, H200, 9B Q4_K_M: 65 of these per
// token took 4.78 us each without PDL, 12% of the kernel time, 2026-12-02; one block per row at T = 1 is latency.)
// HOLD_W (a few rows: decode, verify) loads w with x, before the sum, so no load waits after it; at 40 registers
// that is one 1024-thread block an SM, which prefill's thousands of rows ran at ~27% of the copy rate (each row's
// load, sum and quantization in turn; H100, 2026-12-05). Without it w is read at the quantization and the launch
// bound keeps two blocks an SM (32 registers, no spill): 44%.
constexpr int RMSQ_MAXV = 8;

template <bool HOLD_W>
__global__ void __launch_bounds__(1024, HOLD_W ? 1 : 2) rmsnorm_q8_kernel(const float* __restrict__ x,  // [T, D]
                                                                         const float* __restrict__ w,  // [D]
                                                                         int8_t* __restrict__ q,       // [T, D]
                                                                         float* __restrict__ d,  // [T, D/32]
                                                                         int D, float eps) {
    pdl_allow_consumers();  // first: the GEMV after it streams its weights meanwhile (it waits for q, d)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * D;
    const int lane = threadIdx.x & 31, nb = D / QK;
    if (D > RMSQ_MAXV * (int)blockDim.x) {     // wider rows than any model here: reload from memory
        const float r = row_rms_scale(xr, D, eps, scratch);
        for (int b = threadIdx.x >> 5; b < nb; b += blockDim.x >> 5) {
            const int i = b * QK + lane;
            quantize_block(xr[i] * r * w[i], q, d, (size_t)blockIdx.x * nb + b, lane);
        }
        return;
    }
    float xv[RMSQ_MAXV], wv[RMSQ_MAXV], ss = 0.f;   // (wv unused without HOLD_W)
#pragma unroll
    for (int j = 0; j < RMSQ_MAXV; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        xv[j] = i < D ? xr[i] : 0.f;
        if constexpr (HOLD_W) wv[j] = i < D ? w[i] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < RMSQ_MAXV; ++j)
        if (threadIdx.x + j * blockDim.x < D) ss += xv[j] * xv[j];
    const float r = rsqrtf(block_sum(ss, scratch) / D + eps);
    // D and blockDim are multiples of 32, so a warp's lanes agree on which of their values exist
#pragma unroll
    for (int j = 0; j < RMSQ_MAXV; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < D) {
            const float wi = HOLD_W ? wv[j] : w[i];
            quantize_block(xv[j] * r * wi, q, d, (size_t)blockIdx.x * nb + (i >> 5), lane);
        }
    }
}

// silu(a) * b (op 0, as SwigluOp) or a * sigmoid(b) (op 1, as SigmoidMulOp), then quantize; 4 lanes per block as
// quantize_q8_kernel (a warp per block, a float per lane, kept 8x fewer bytes in flight: RESULTS.md, 2026-12-05).
template <int OP>
__global__ void binary_q8_kernel(const float* __restrict__ a,  // [nblk * 32]
                                 const float* __restrict__ b,  // [nblk * 32]
                                 int8_t* __restrict__ q,       // [nblk * 32]
                                 float* __restrict__ d,        // [nblk]
                                 size_t nblk) {
    pdl_allow_consumers();  // first: the GEMV after it streams its weights meanwhile (it waits for q, d)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x, blk = g / Q8_LANES;
    float v[Q8_PER_LANE] = {};
    if (blk < nblk) {
        float va[Q8_PER_LANE], vb[Q8_PER_LANE];
        load8(a + g * Q8_PER_LANE, va);
        load8(b + g * Q8_PER_LANE, vb);
#pragma unroll
        for (int j = 0; j < Q8_PER_LANE; ++j) v[j] = OP == 0 ? siluf_(va[j]) * vb[j] : va[j] * sigmoidf_(vb[j]);
    }
    const float amax = block8_amax(v);
    if (blk < nblk) store_block8(v, amax, q, d, blk, (int)(g % Q8_LANES));
}

// Gated RMSNorm then quantize, the expressions of elementwise.cu's gated_rmsnorm_kernel, in two layouts with its bits.
// A few rows (decode, verify): its layout, a block per (t, head) of Dv threads, thread d holding value d, warp w
// quantizing the head's 32-block w; the head's latency is one block_sum and one block quantization.
__global__ void gated_rmsnorm_q8_block_kernel(const float* __restrict__ o,  // [heads, Dv]
                                              const float* __restrict__ z,  // [heads, Dv]
                                              const float* __restrict__ w,  // [Dv]
                                              int8_t* __restrict__ q,       // [heads, Dv]
                                              float* __restrict__ d,        // [heads, Dv/32]
                                              int Dv, float eps) {
    pdl_allow_consumers();  // first: the GEMV after it streams its weights meanwhile (it waits for q, d)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float scratch[32];
    const size_t base = (size_t)blockIdx.x * Dv;
    const int dd = threadIdx.x;
    const float v = o[base + dd];
    const float r = rsqrtf(block_sum(v * v, scratch) / Dv + eps);
    quantize_block(v * r * w[dd] * siluf_(z[base + dd]), q, d, (base >> 5) + (dd >> 5), dd & 31);
}

// Prefill: a warp per (t, head), lane l holding the head's values l + 32k (k < Dv / 32). The block kernel's
// block_sum is reproduced in the one warp: its warp k's butterfly is this warp's over the values k, and its second
// butterfly runs over lanes holding those partials (lane k the k-th, the others 0), as here; so r has its bits, and
// each 32-value block k is quantized by the warp as there. Heads are independent warps (no barrier, no shared memory)
// and a lane loads 2 Dv / 32 values before any sum: the block kernel, one value a thread and two barriers, ran at
// ~31% of the copy rate at prefill sizes, this one 71% (H100, 2026-12-05).
constexpr int GRMSQ_MAXK = 8;   // values per lane and input: head dims up to 256 (wider ones run unfused)
__global__ void gated_rmsnorm_q8_warp_kernel(const float* __restrict__ o,  // [heads, Dv]
                                             const float* __restrict__ z,  // [heads, Dv]
                                             const float* __restrict__ w,  // [Dv]
                                             int8_t* __restrict__ q,       // [heads, Dv]
                                             float* __restrict__ d,        // [heads, Dv/32]
                                             size_t heads, int Dv, float eps) {
    pdl_allow_consumers();  // first: the GEMV after it streams its weights meanwhile (it waits for q, d)
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t head = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (head >= heads) return;   // (a whole warp)
    const int lane = threadIdx.x & 31, nk = Dv >> 5;
    const size_t base = head * Dv;
    float ov[GRMSQ_MAXK], zv[GRMSQ_MAXK], part = 0.f;
#pragma unroll
    for (int k = 0; k < GRMSQ_MAXK; ++k)
        if (k < nk) ov[k] = o[base + 32 * k + lane], zv[k] = z[base + 32 * k + lane];
#pragma unroll
    for (int k = 0; k < GRMSQ_MAXK; ++k) {
        if (k >= nk) break;
        const float p = warp_sum(ov[k] * ov[k]);
        if (lane == k) part = p;
    }
    const float r = rsqrtf(warp_sum(part) / Dv + eps);
#pragma unroll
    for (int k = 0; k < GRMSQ_MAXK; ++k)
        if (k < nk) quantize_block(ov[k] * r * w[32 * k + lane] * siluf_(zv[k]), q, d, (base >> 5) + k, lane);
}

// One thread per block of 34 bytes: f16 scale, then 32 int8.
__global__ void q8_repack_kernel(const uint8_t* __restrict__ blocks,  // [nblk, 34]
                                 int8_t* __restrict__ qs,             // [nblk, 32]
                                 __half* __restrict__ d,              // [nblk]
                                 size_t nblk) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblk) return;
    const uint8_t* src = blocks + b * 34;
    d[b] = __ushort_as_half((unsigned short)(src[0] | (src[1] << 8)));
    int* dst = reinterpret_cast<int*>(qs + b * QK);
#pragma unroll
    for (int i = 0; i < 8; ++i)
        dst[i] = src[2 + 4 * i] | (src[3 + 4 * i] << 8) | (src[4 + 4 * i] << 16) | (src[5 + 4 * i] << 24);
}

}  // namespace
}  // namespace cmp

using namespace cmp;

// The 4-lane producers read f32 in 16 bytes and write codes in 8 (any row of whole blocks in an arena qualifies).
static bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ==== launchers ===================================================================================================
// Rows up to DECODE_ROWS (decode, verify: common.cuh) take the producers' latency layouts (rmsnorm_q8's HOLD_W, the
// gated RMSNorm's block per head), more take the ones that keep the copy rate: the same bits either way.

extern "C" int cmp_quantize_q8(const float* x, int8_t* q, float* d, int T, int n) {
    CMP_REQUIRE(T >= 0 && n > 0 && n % QK == 0, "cmp_quantize_q8: n=%d must be a positive multiple of 32", n);
    const size_t nblk = (size_t)T * (n / QK);
    if (nblk == 0) return CMP_OK;
    CMP_REQUIRE(aligned(x, 16) && aligned(q, 8), "cmp_quantize_q8: x (q) must be 16 (8)-byte aligned");
    return launch("quantize_q8_kernel", quantize_q8_kernel, dim3(ceil_div(nblk * Q8_LANES, 256)), dim3(256), 0, x, q,
                  d, nblk);
}

extern "C" int cmp_rmsnorm_q8(const float* x, const float* w, int8_t* q, float* d, int T, int D, float eps) {
    CMP_REQUIRE(T >= 0 && D > 0 && D % QK == 0, "cmp_rmsnorm_q8: bad shape T=%d D=%d (D a multiple of 32)", T, D);
    if (T == 0) return CMP_OK;
    // = rmsnorm_kernel's block
    return launch("rmsnorm_q8_kernel", T <= DECODE_ROWS ? rmsnorm_q8_kernel<true> : rmsnorm_q8_kernel<false>,
                  dim3(T), dim3(std::min(1024, D)), 0, x, w, q, d, D, eps);
}

extern "C" int cmp_binary_q8(const float* a, const float* b, int op, int8_t* q, float* d, int T, int n) {
    CMP_REQUIRE(T >= 0 && n > 0 && n % QK == 0, "cmp_binary_q8: n=%d must be a positive multiple of 32", n);
    CMP_REQUIRE(op == 0 || op == 1, "cmp_binary_q8: op %d (0 = swiglu, 1 = sigmoid_mul)", op);
    const size_t nblk = (size_t)T * (n / QK);
    if (nblk == 0) return CMP_OK;
    CMP_REQUIRE(aligned(a, 16) && aligned(b, 16) && aligned(q, 8),
                "cmp_binary_q8: a, b (q) must be 16 (8)-byte aligned");
    return launch("binary_q8_kernel", op == 0 ? binary_q8_kernel<0> : binary_q8_kernel<1>,
                  dim3(ceil_div(nblk * Q8_LANES, 256)), dim3(256), 0, a, b, q, d, nblk);
}

extern "C" int cmp_gated_rmsnorm_q8(const float* o, const float* z, const float* w, int8_t* q, float* d, int T, int V,
                                    int Dv, float eps) {
    CMP_REQUIRE(T >= 0 && V > 0 && Dv > 0 && Dv <= GRMSQ_MAXK * QK && Dv % QK == 0,
                "cmp_gated_rmsnorm_q8: bad shape T=%d V=%d Dv=%d (Dv a multiple of 32, <= 256)", T, V, Dv);
    if (T == 0) return CMP_OK;
    const size_t heads = (size_t)T * V;
    if (T <= DECODE_ROWS)
        return launch("gated_rmsnorm_q8_block_kernel", gated_rmsnorm_q8_block_kernel, dim3(heads), dim3(Dv), 0, o, z,
                      w, q, d, Dv, eps);
    return launch("gated_rmsnorm_q8_warp_kernel", gated_rmsnorm_q8_warp_kernel, dim3(ceil_div(heads, 4)), dim3(128), 0,
                  o, z, w, q, d, heads, Dv, eps);
}

extern "C" int cmp_q8_repack(const uint8_t* blocks, int8_t* qs, void* d, int rows, int n) {
    CMP_REQUIRE(rows >= 0 && n > 0 && n % QK == 0, "cmp_q8_repack: n=%d must be a positive multiple of 32", n);
    const size_t nblk = (size_t)rows * (n / QK);
    if (nblk == 0) return CMP_OK;
    return launch("q8_repack_kernel", q8_repack_kernel, dim3(ceil_div(nblk, 256)), dim3(256), 0, blocks, qs,
                  static_cast<__half*>(d), nblk);
}
