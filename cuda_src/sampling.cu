// Sampling on the device: greedy argmax over the vocabulary, so that a decode loop (CapturedStep, llamacmp-bench)
// moves one int32 per sequence to the host instead of a logits row (1 MB on the real vocabulary; ~4 ms/token on a
// PCIe Gen1 x1 card). The argmax can write straight into a captured graph's token-id input, so the next replay
// consumes it without any host round trip.
#include "common.cuh"

namespace cmp {
namespace {

constexpr int ARGMAX_NT = 1024;

// ==== kernels =====================================================================================================

// (value, index) order of numpy.argmax: larger value first, the lower index among equal values. Unlike numpy, NaN
// is never chosen over a number (a broken logit must not become the next token); a row of only NaN gives index 0.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Block per row: strided scan per thread, then a warp and a block reduction of (value, index) pairs.
__global__ void __launch_bounds__(ARGMAX_NT)
argmax_kernel(const float* __restrict__ x,   // [R, N]
              int32_t* __restrict__ out,     // [R]
              int N) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* row = x + (size_t)blockIdx.x * N;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        const float v = row[i];
        if (better(v, i, bv, bi)) {  // NaN compares false: skipped
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nwarp ? sv[lane] : -INFINITY;
        bi = lane < nwarp ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        // every value -inf or NaN: no candidate won; index 0 as numpy gives for an all-NaN row
        if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

}  // namespace
}  // namespace cmp

using namespace cmp;

// ==== launchers ===================================================================================================

extern "C" int cmp_argmax(const float* x, int32_t* out, int R, int N) {
    CMP_REQUIRE(R >= 0 && N > 0, "cmp_argmax: bad shape R=%d N=%d", R, N);
    if (R == 0) return CMP_OK;
    argmax_kernel<<<R, ARGMAX_NT, 0, stream()>>>(x, out, N);
    return check_launch("argmax_kernel");
}
