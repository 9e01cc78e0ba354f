// Activation quantization to Q8 blocks (shared by every projection that reads the same input) and the load-time
// repack of GGUF Q8_0 weights into separate quant and scale arrays (16-byte aligned quant rows for wide loads).
#include "common.cuh"

namespace cmp {
namespace {

// ==== kernels =====================================================================================================

// One warp per 32-value block. Rounding matches numpy_ref.quantize_q8_blocks bit for bit: inv = 127/amax in IEEE
// round-to-nearest (fast-math would make it approximate and move ties), q = round-half-even(x*inv), and the scale
// d = amax/127 is rounded to f16 as llama.cpp stores it (kept in an f32 array here: same value, aligned loads).
__global__ void quantize_q8_kernel(const float* __restrict__ x,  // [nblk * 32]
                                   int8_t* __restrict__ q,        // [nblk * 32]
                                   float* __restrict__ d,         // [nblk]
                                   size_t nblk) {
    const size_t blk = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (blk >= nblk) return;
    const int lane = threadIdx.x & 31;
    const float v = x[blk * QK + lane];
    const float amax = warp_max(fabsf(v));
    const float inv = amax > 0.f ? __fdiv_rn(127.f, amax) : 0.f;
    q[blk * QK + lane] = (int8_t)__float2int_rn(__fmul_rn(v, inv));
    if (lane == 0) d[blk] = __half2float(__float2half_rn(__fdiv_rn(amax, 127.f)));
}

// One thread per block of 34 bytes: f16 scale, then 32 int8.
__global__ void q8_repack_kernel(const uint8_t* __restrict__ blocks,  // [nblk, 34]
                                 int8_t* __restrict__ qs,             // [nblk, 32]
                                 __half* __restrict__ d,              // [nblk]
                                 size_t nblk) {
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

// ==== launchers ===================================================================================================

extern "C" int cmp_quantize_q8(const float* x, int8_t* q, float* d, int T, int n) {
    CMP_REQUIRE(T >= 0 && n > 0 && n % QK == 0, "cmp_quantize_q8: n=%d must be a positive multiple of 32", n);
    const size_t nblk = (size_t)T * (n / QK);
    if (nblk == 0) return CMP_OK;
    quantize_q8_kernel<<<ceil_div(nblk, 8), 256, 0, stream()>>>(x, q, d, nblk);
    return check_launch("quantize_q8_kernel");
}

extern "C" int cmp_q8_repack(const uint8_t* blocks, int8_t* qs, void* d, int rows, int n) {
    CMP_REQUIRE(rows >= 0 && n > 0 && n % QK == 0, "cmp_q8_repack: n=%d must be a positive multiple of 32", n);
    const size_t nblk = (size_t)rows * (n / QK);
    if (nblk == 0) return CMP_OK;
    q8_repack_kernel<<<ceil_div(nblk, 256), 256, 0, stream()>>>(blocks, qs, static_cast<__half*>(d), nblk);
    return check_launch("q8_repack_kernel");
}
