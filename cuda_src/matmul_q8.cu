// Projections: y [T, rows] = x [T, n] . W [rows, n]^T.
//  - Q8_0 weights (repacked: qs [rows, n] int8, d [rows, n/32] f16) against Q8 activations (cmp_quantize_q8):
//    a warp-per-row DP4A GEMV for T <= 8 (decode: bound by reading the weights once), and a 64x64-tiled DP4A GEMM
//    for larger T (prefill). Integer dots per 32-block, scaled by d_w * d_x, accumulated in fp32.
//  - F32/F16 weights (fixture files): one tiled fp32 GEMM.
// No tensor-core instruction anywhere (DP4A = IDP.4A in SASS).
#include <array>
#include <utility>

#include "common.cuh"

namespace cmp {
namespace {

constexpr int GEMV_WARPS = 4;     // rows per block of the GEMV
#ifndef CMP_GEMV_UNROLL
#define CMP_GEMV_UNROLL 4
#endif
constexpr int GEMV_UNROLL = CMP_GEMV_UNROLL;  // 16-byte weight loads in flight per lane before any arithmetic
constexpr int GEMV_MAX_T = 8;
constexpr int GEMV_MAX_MATS = 4;
constexpr int TILE = 64;          // GEMM tile: 64 weight rows x 64 tokens, 256 threads, 4x4 outputs each
constexpr int GEMM_BK = 4;        // Q8 blocks (of 32) per shared-memory stage
constexpr int FGEMM_BK = 16;

__device__ __forceinline__ int dot16(const int4 a, const int4 b) {
    int s = __dp4a(a.x, b.x, 0);
    s = __dp4a(a.y, b.y, s);
    s = __dp4a(a.z, b.z, s);
    return __dp4a(a.w, b.w, s);
}

// ==== kernels =====================================================================================================

// Up to GEMV_MAX_MATS weight matrices that read the same activations, launched as one grid: the warps are
// numbered over the concatenated rows, so small matrices (e.g. GDN alpha/beta, 32 rows) ride along with big ones
// instead of paying a launch and a mostly idle grid each.
struct GemvSet {
    const int8_t* wq[GEMV_MAX_MATS];  // [rows_i, n]
    const __half* wd[GEMV_MAX_MATS];  // [rows_i, n/32]
    float* y[GEMV_MAX_MATS];          // [T, rows_i]
    int row_end[GEMV_MAX_MATS];       // cumulative rows
    int count;
    int total;                        // row_end[count-1], so that no index into the struct is dynamic
};

// Warp per weight row. Lane l reads 16-byte chunks l, l+32, ... of the row (chunk c is half of Q8 block c/2), so a
// warp load is 512 contiguous bytes; GEMV_UNROLL such loads are issued before the DP4A work to keep enough bytes in
// flight for the memory system. Activations (T rows, a few KB) stay in L1/L2.
template <int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_q8_kernel(const int8_t* __restrict__ xq,  // [NT, n]
               const float* __restrict__ xd,   // [NT, n/32]
               const GemvSet set, int n) {
    // Find this warp's matrix with compile-time indices only (a dynamic index into the kernel parameter struct
    // would copy it to local memory).
    int row = blockIdx.x * GEMV_WARPS + threadIdx.y;
    if (row >= set.total) return;
    const int8_t* wq = set.wq[0];
    const __half* wd = set.wd[0];
    float* y = set.y[0];
    int row0 = 0, rows = set.row_end[0];
#pragma unroll
    for (int i = 1; i < GEMV_MAX_MATS; ++i) {
        if (i < set.count && row >= set.row_end[i - 1]) {
            wq = set.wq[i];
            wd = set.wd[i];
            y = set.y[i];
            row0 = set.row_end[i - 1];
            rows = set.row_end[i] - row0;
        }
    }
    row -= row0;
    const int lane = threadIdx.x, nchunk = n / 16, nb = n / QK;
    const int4* w = reinterpret_cast<const int4*>(wq + (size_t)row * n);
    const __half* dw = wd + (size_t)row * nb;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;

    for (int c0 = lane; c0 < nchunk; c0 += 32 * GEMV_UNROLL) {
        int4 wv[GEMV_UNROLL];
        float ws[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int c = c0 + 32 * u;
            wv[u] = c < nchunk ? __ldg(w + c) : make_int4(0, 0, 0, 0);
            ws[u] = c < nchunk ? __half2float(dw[c >> 1]) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int c = c0 + 32 * u;
            if (c >= nchunk) break;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int4 xv = *reinterpret_cast<const int4*>(xq + (size_t)t * n + (size_t)c * 16);
                acc[t] += (float)dot16(wv[u], xv) * (ws[u] * xd[(size_t)t * nb + (c >> 1)]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * rows + row] = v;
    }
}

// 64 weight rows x 64 tokens per block; thread (tx, ty) owns rows tx + 16i and tokens ty + 16j (i, j < 4), so the
// stores along rows are coalesced and the shared-memory reads of W (row stride 33 ints) are conflict-free while
// those of X are broadcasts. Each stage holds GEMM_BK Q8 blocks of both operands.
__global__ void __launch_bounds__(256)
gemm_q8_kernel(const int8_t* __restrict__ xq,  // [T, n]
               const float* __restrict__ xd,   // [T, n/32]
               const int8_t* __restrict__ wq,  // [rows, n]
               const __half* __restrict__ wd,  // [rows, n/32]
               float* __restrict__ y,          // [T, rows]
               int T, int rows, int n) {
    constexpr int KI = GEMM_BK * 8;  // ints per row per stage
    __shared__ int Ws[TILE][KI + 1], Xs[TILE][KI + 1];
    __shared__ float Wd[TILE][GEMM_BK], Xd[TILE][GEMM_BK];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int row0 = blockIdx.x * TILE, tok0 = blockIdx.y * TILE, nb = n / QK;
    float acc[4][4] = {};

    for (int b0 = 0; b0 < nb; b0 += GEMM_BK) {
        for (int i = tid; i < TILE * KI; i += 256) {
            const int r = i / KI, k = i % KI, blk = b0 + k / 8;
            const int gr = row0 + r, gt = tok0 + r;
            Ws[r][k] = (gr < rows && blk < nb) ? reinterpret_cast<const int*>(wq + (size_t)gr * n + (size_t)b0 * QK)[k] : 0;
            Xs[r][k] = (gt < T && blk < nb) ? reinterpret_cast<const int*>(xq + (size_t)gt * n + (size_t)b0 * QK)[k] : 0;
        }
        for (int i = tid; i < TILE * GEMM_BK; i += 256) {
            const int r = i / GEMM_BK, kb = i % GEMM_BK, blk = b0 + kb;
            Wd[r][kb] = (row0 + r < rows && blk < nb) ? __half2float(wd[(size_t)(row0 + r) * nb + blk]) : 0.f;
            Xd[r][kb] = (tok0 + r < T && blk < nb) ? xd[(size_t)(tok0 + r) * nb + blk] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kb = 0; kb < GEMM_BK; ++kb) {
            int s[4][4] = {};
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                int a[4], bb[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) a[i] = Ws[tx + 16 * i][kb * 8 + k];
#pragma unroll
                for (int j = 0; j < 4; ++j) bb[j] = Xs[ty + 16 * j][kb * 8 + k];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) s[i][j] = __dp4a(a[i], bb[j], s[i][j]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += (float)s[i][j] * (Wd[tx + 16 * i][kb] * Xd[ty + 16 * j][kb]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int t = tok0 + ty + 16 * j;
        if (t >= T) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = row0 + tx + 16 * i;
            if (r < rows) y[(size_t)t * rows + r] = acc[i][j];
        }
    }
}

// fp32 GEMM over f32 or f16 weights, same thread layout as gemm_q8_kernel; any n.
template <typename W>
__global__ void __launch_bounds__(256)
gemm_f_kernel(const float* __restrict__ x,  // [T, n]
              const W* __restrict__ w,      // [rows, n]
              float* __restrict__ y,        // [T, rows]
              int T, int rows, int n) {
    __shared__ float Ws[TILE][FGEMM_BK + 1], Xs[TILE][FGEMM_BK + 1];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int row0 = blockIdx.x * TILE, tok0 = blockIdx.y * TILE;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < n; k0 += FGEMM_BK) {
        for (int i = tid; i < TILE * FGEMM_BK; i += 256) {
            const int r = i / FGEMM_BK, k = i % FGEMM_BK, gk = k0 + k;
            Ws[r][k] = (row0 + r < rows && gk < n) ? to_f32(w[(size_t)(row0 + r) * n + gk]) : 0.f;
            Xs[r][k] = (tok0 + r < T && gk < n) ? x[(size_t)(tok0 + r) * n + gk] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < FGEMM_BK; ++k) {
            float a[4], bb[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = Ws[tx + 16 * i][k];
#pragma unroll
            for (int j = 0; j < 4; ++j) bb[j] = Xs[ty + 16 * j][k];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], bb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int t = tok0 + ty + 16 * j;
        if (t >= T) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = row0 + tx + 16 * i;
            if (r < rows) y[(size_t)t * rows + r] = acc[i][j];
        }
    }
}

// ==== launchers ===================================================================================================

using GemvLaunch = int (*)(const int8_t*, const float*, const GemvSet&, int, int);

template <int NT>
int launch_gemv(const int8_t* xq, const float* xd, const GemvSet& set, int total_rows, int n) {
    gemv_q8_kernel<NT><<<ceil_div(total_rows, GEMV_WARPS), dim3(32, GEMV_WARPS), 0, stream()>>>(xq, xd, set, n);
    return check_launch("gemv_q8_kernel");
}

template <int... NT>
constexpr auto gemv_table(std::integer_sequence<int, NT...>) {
    return std::array<GemvLaunch, sizeof...(NT)>{launch_gemv<NT + 1>...};
}

int matmul_q8_set(const int8_t* xq, const float* xd, int count, const int8_t* const* wq, const void* const* wd,
                  float* const* y, const int* rows, int T, int n) {
    CMP_REQUIRE(count >= 1 && count <= GEMV_MAX_MATS, "cmp_matmul_q8_multi: %d matrices (1..%d)", count,
                GEMV_MAX_MATS);
    CMP_REQUIRE(T >= 0 && n > 0 && n % QK == 0, "cmp_matmul_q8: bad shape T=%d n=%d (n a multiple of 32)", T, n);
    for (int i = 0; i < count; ++i) CMP_REQUIRE(rows[i] > 0, "cmp_matmul_q8: matrix %d has %d rows", i, rows[i]);
    if (T == 0) return CMP_OK;
    if (T <= GEMV_MAX_T) {
        GemvSet set{};
        int total = 0;
        for (int i = 0; i < count; ++i) {
            set.wq[i] = wq[i];
            set.wd[i] = static_cast<const __half*>(wd[i]);
            set.y[i] = y[i];
            set.row_end[i] = total += rows[i];
        }
        set.count = count;
        set.total = total;
        static constexpr auto table = gemv_table(std::make_integer_sequence<int, GEMV_MAX_T>{});
        return table[T - 1](xq, xd, set, total, n);
    }
    for (int i = 0; i < count; ++i) {
        gemm_q8_kernel<<<dim3(ceil_div(rows[i], TILE), ceil_div(T, TILE)), 256, 0, stream()>>>(
            xq, xd, wq[i], static_cast<const __half*>(wd[i]), y[i], T, rows[i], n);
        CMP_TRY(check_launch("gemm_q8_kernel"));
    }
    return CMP_OK;
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_matmul_q8(const int8_t* xq, const float* xd, const int8_t* wq, const void* wd, float* y, int T,
                             int rows, int n) {
    return matmul_q8_set(xq, xd, 1, &wq, &wd, &y, &rows, T, n);
}

extern "C" int cmp_matmul_q8_multi(const int8_t* xq, const float* xd, int count, const int8_t* const* wq,
                                   const void* const* wd, float* const* y, const int* rows, int T, int n) {
    return matmul_q8_set(xq, xd, count, wq, wd, y, rows, T, n);
}

extern "C" int cmp_matmul_f(const float* x, const void* w, int w_dtype, float* y, int T, int rows, int n) {
    CMP_REQUIRE(T >= 0 && rows > 0 && n > 0, "cmp_matmul_f: bad shape T=%d rows=%d n=%d", T, rows, n);
    if (T == 0) return CMP_OK;
    return dispatch_dtype(w_dtype, [&](auto tag) {
        using W = decltype(tag);
        gemm_f_kernel<W><<<dim3(ceil_div(rows, TILE), ceil_div(T, TILE)), 256, 0, stream()>>>(
            x, static_cast<const W*>(w), y, T, rows, n);
        return check_launch("gemm_f_kernel");
    });
}
