// Dense f32 / f16 weight projections for the vision tower (and any unquantized matrix): y = x . W^T with fp32
// activations and FP32 (FFMA) accumulation; f16 weights are widened to f32 as they enter shared memory (and x is
// rounded to f16 for them, as the reference does). No tensor cores. Three shapes of work:
//   T <= 8        a GEMV: one warp per weight row, 16-byte weight loads, T accumulators per lane;
//   small grids   64x64 output tiles (4x4 per thread), so that a few hundred tokens still fill the GPU;
//   large grids   128x128 output tiles (8x8 per thread, two 4-wide groups half a tile apart so the shared-memory
//                 reads are conflict-free float4s), register-prefetched double buffering of the next k-slab.
#include "common.cuh"

namespace cmp {
namespace {

constexpr int DENSE_THREADS = 256;
constexpr int DENSE_GEMV_MAX_T = 8;
constexpr int DENSE_GEMV_WARPS = 8;

// Four consecutive weights as floats. `vec`: the four lie inside the row and are 4-element aligned (n % 4 == 0),
// so one 16-byte (f32) or 8-byte (f16) load does.
__device__ __forceinline__ float4 load4(const float* p, bool vec, int left) {
    if (vec) return *reinterpret_cast<const float4*>(p);
    return make_float4(left > 0 ? p[0] : 0.f, left > 1 ? p[1] : 0.f, left > 2 ? p[2] : 0.f, left > 3 ? p[3] : 0.f);
}
__device__ __forceinline__ float4 load4(const __half* p, bool vec, int left) {
    if (vec) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
        return make_float4(a.x, a.y, b.x, b.y);
    }
    return make_float4(left > 0 ? __half2float(p[0]) : 0.f, left > 1 ? __half2float(p[1]) : 0.f,
                       left > 2 ? __half2float(p[2]) : 0.f, left > 3 ? __half2float(p[3]) : 0.f);
}

// f16 weights see the activations rounded to f16 first (ggml's CPU mul_mat converts src1 to the weights' vec_dot
// type; numpy_ref.matmuls does the same), so each product is of two f16 values, exact in fp32.
__device__ __forceinline__ float4 as_operand(float4 v, float) { return v; }
__device__ __forceinline__ float4 as_operand(float4 v, __half) {
    return make_float4(__half2float(__float2half_rn(v.x)), __half2float(__float2half_rn(v.y)),
                       __half2float(__float2half_rn(v.z)), __half2float(__float2half_rn(v.w)));
}

// ==== kernels =====================================================================================================

// Warp per weight row; lane l takes 4-element chunks l, l+32, ... of the row. The T activation rows (a few KB)
// stay in L1. NT = T, a template so the accumulators live in registers.
template <typename W, int NT>
__global__ void __launch_bounds__(DENSE_GEMV_WARPS * 32)
dense_gemv_kernel(const float* __restrict__ x,  // [NT, n]
                  const W* __restrict__ w,      // [rows, n]
                  float* __restrict__ y,        // [NT, rows]
                  int rows, int n) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * DENSE_GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const bool vec = (n & 3) == 0;
    const W* wr = w + (size_t)r * n;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
    for (int k = lane * 4; k < n; k += 128) {
        const float4 a = load4(wr + k, vec, n - k);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float4 b = as_operand(load4(x + (size_t)t * n + k, vec, n - k), W{});
            acc[t] = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc[t]))));
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * rows + r] = s;
    }
}

// Output tile BR weight rows x BT tokens, 256 threads each holding TR x TT outputs, k-slabs of BK (BR*BK and
// BT*BK are both 1024: every thread loads one 4-wide chunk of each per slab). Shared memory holds the slabs
// k-major (Ws[k][r]) so the inner product reads float4s along r and t. The next slab is fetched into registers
// while the current one is multiplied, into the other of two shared buffers: one barrier per slab.
template <typename W, int BR, int BT, int TR, int TT, int BK>
__global__ void __launch_bounds__(DENSE_THREADS)
dense_gemm_kernel(const float* __restrict__ x,  // [T, n]
                  const W* __restrict__ w,      // [rows, n]
                  float* __restrict__ y,        // [T, rows]
                  int T, int rows, int n) {
    static_assert(BR * BK == 4 * DENSE_THREADS && BT * BK == 4 * DENSE_THREADS, "one 4-chunk per thread per slab");
    static_assert((BR / TR) * (BT / TT) == DENSE_THREADS, "thread grid");
    constexpr int PAD = 4;              // keeps rows 16-byte aligned and the transposed stores conflict-free
    constexpr int GR = TR / 4, GT = TT / 4;             // 4-wide groups per thread
    constexpr int SR = BR / GR, ST = BT / GT;           // distance between a thread's groups
    __shared__ __align__(16) float Ws[2][BK][BR + PAD];
    __shared__ __align__(16) float Xs[2][BK][BT + PAD];

    const int tid = threadIdx.x;
    const int tr = tid % (BR / TR), tt = tid / (BR / TR);
    const int row0 = blockIdx.x * BR, tok0 = blockIdx.y * BT;
    // this thread's load chunk: row lr of the slab, k offset lk (4 consecutive k)
    const int lr = tid / (BK / 4), lk = (tid % (BK / 4)) * 4;
    const bool vec_ok = (n & 3) == 0;
    const bool w_in = row0 + lr < rows, x_in = tok0 + lr < T;
    const W* wp = w + (size_t)min(row0 + lr, rows - 1) * n;
    const float* xp = x + (size_t)min(tok0 + lr, T - 1) * n;

    auto fetch = [&](int k0, float4& a, float4& b) {
        const int k = k0 + lk, left = n - k;
        const bool vec = vec_ok && left >= 4;
        a = w_in && left > 0 ? load4(wp + k, vec, left) : make_float4(0.f, 0.f, 0.f, 0.f);
        b = x_in && left > 0 ? as_operand(load4(xp + k, vec, left), W{}) : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    auto stash = [&](int buf, const float4& a, const float4& b) {
        Ws[buf][lk + 0][lr] = a.x; Ws[buf][lk + 1][lr] = a.y; Ws[buf][lk + 2][lr] = a.z; Ws[buf][lk + 3][lr] = a.w;
        Xs[buf][lk + 0][lr] = b.x; Xs[buf][lk + 1][lr] = b.y; Xs[buf][lk + 2][lr] = b.z; Xs[buf][lk + 3][lr] = b.w;
    };

    float acc[TR][TT];
#pragma unroll
    for (int i = 0; i < TR; ++i)
#pragma unroll
        for (int j = 0; j < TT; ++j) acc[i][j] = 0.f;

    float4 pa, pb;
    fetch(0, pa, pb);
    stash(0, pa, pb);
    __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < n; k0 += BK) {
        const bool more = k0 + BK < n;
        if (more) fetch(k0 + BK, pa, pb);
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TR], b[TT];
#pragma unroll
            for (int g = 0; g < GR; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&Ws[buf][k][g * SR + tr * 4]);
                a[g * 4 + 0] = v.x; a[g * 4 + 1] = v.y; a[g * 4 + 2] = v.z; a[g * 4 + 3] = v.w;
            }
#pragma unroll
            for (int g = 0; g < GT; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&Xs[buf][k][g * ST + tt * 4]);
                b[g * 4 + 0] = v.x; b[g * 4 + 1] = v.y; b[g * 4 + 2] = v.z; b[g * 4 + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TR; ++i)
#pragma unroll
                for (int j = 0; j < TT; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) stash(buf ^ 1, pa, pb);   // the other buffer: last read before the previous barrier
        __syncthreads();
        buf ^= 1;
    }

#pragma unroll
    for (int gj = 0; gj < GT; ++gj)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = tok0 + gj * ST + tt * 4 + j;
            if (t >= T) continue;
            float* yr = y + (size_t)t * rows;
#pragma unroll
            for (int gi = 0; gi < GR; ++gi)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = row0 + gi * SR + tr * 4 + i;
                    if (r < rows) yr[r] = acc[gi * 4 + i][gj * 4 + j];
                }
        }
}

// ==== launchers ===================================================================================================

template <typename W, int NT>
int launch_gemv(const float* x, const W* w, float* y, int rows, int n) {
    dense_gemv_kernel<W, NT>
        <<<ceil_div(rows, DENSE_GEMV_WARPS), DENSE_GEMV_WARPS * 32, 0, stream()>>>(x, w, y, rows, n);
    return check_launch("dense_gemv_kernel");
}

template <typename W>
int dense_gemv(const float* x, const W* w, float* y, int T, int rows, int n) {
    switch (T) {
        case 1: return launch_gemv<W, 1>(x, w, y, rows, n);
        case 2: return launch_gemv<W, 2>(x, w, y, rows, n);
        case 3: return launch_gemv<W, 3>(x, w, y, rows, n);
        case 4: return launch_gemv<W, 4>(x, w, y, rows, n);
        case 5: return launch_gemv<W, 5>(x, w, y, rows, n);
        case 6: return launch_gemv<W, 6>(x, w, y, rows, n);
        case 7: return launch_gemv<W, 7>(x, w, y, rows, n);
        default: return launch_gemv<W, 8>(x, w, y, rows, n);
    }
}

template <typename W>
int dense_matmul(const float* x, const W* w, float* y, int T, int rows, int n) {
    if (T <= DENSE_GEMV_MAX_T) return dense_gemv(x, w, y, T, rows, n);
    // The big tile does 4x the work per block; take it only when it still gives every SM of a large GPU a block.
    const size_t big_blocks = (size_t)ceil_div(rows, 128) * ceil_div(T, 128);
    if (big_blocks >= 128) {
        dense_gemm_kernel<W, 128, 128, 8, 8, 8>
            <<<dim3(ceil_div(rows, 128), ceil_div(T, 128)), DENSE_THREADS, 0, stream()>>>(x, w, y, T, rows, n);
    } else {
        dense_gemm_kernel<W, 64, 64, 4, 4, 16>
            <<<dim3(ceil_div(rows, 64), ceil_div(T, 64)), DENSE_THREADS, 0, stream()>>>(x, w, y, T, rows, n);
    }
    return check_launch("dense_gemm_kernel");
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_matmul_dense(const float* x, const void* w, int w_dtype, float* y, int T, int rows, int n) {
    CMP_REQUIRE(T >= 0 && rows > 0 && n > 0, "cmp_matmul_dense: bad shape T=%d rows=%d n=%d", T, rows, n);
    if (T == 0) return CMP_OK;
    return dispatch_dtype(w_dtype, [&](auto tag) {
        using W = decltype(tag);
        return dense_matmul<W>(x, static_cast<const W*>(w), y, T, rows, n);
    });
}
