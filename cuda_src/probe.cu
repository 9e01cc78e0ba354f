// The probe (issue 20): tiny kernels that time each unit a route could use, so that llamacmp picks per card
// (llamacmp/backends/probe.py runs them once per device, driver and library build; routes.py chooses). Each thread
// runs CHAINS independent dependency chains of one instruction (or of a route's int8 dot primitive, common.cuh),
// `iters` steps each, over a grid of 4 blocks of 256 threads per SM: enough warps in flight that the unit's
// throughput, not its latency, is timed. Results are stored so nothing is dead code.
// The int8 dots use the previous result as their second operand (no hoisting of its byte extracts: the IMAD figure
// is the emulation's cost with one operand changing every step, as in a GEMV).
// Only the int8 mma.sync and f16 HMMA kernels hold tensor-core instructions; no matmul route runs them.
#include "common.cuh"

namespace cmp {
namespace {

constexpr int CHAINS = 8;
constexpr int PROBE_THREADS = 256;
constexpr int PROBE_BLOCKS_PER_SM = 4;

template <class D>
__global__ void __launch_bounds__(PROBE_THREADS) probe_dot_kernel(int* __restrict__ out, int iters, int seed) {
    int a[CHAINS], c[CHAINS];
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) {
        a[k] = seed * (k + 3) ^ (int)threadIdx.x;
        c[k] = (k + 1) * 0x01030507 ^ (int)blockIdx.x;
    }
    for (int i = 0; i < iters; ++i)
#pragma unroll
        for (int k = 0; k < CHAINS; ++k) c[k] = D::dot4(a[k], c[k], c[k]);
    int s = 0;
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) s ^= c[k];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void __launch_bounds__(PROBE_THREADS) probe_ffma_kernel(float* __restrict__ out, int iters, float seed) {
    float c[CHAINS];
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) c[k] = seed + k + threadIdx.x;
    const float a = 0.9999f, b = seed * 1e-3f;
    for (int i = 0; i < iters; ++i)
#pragma unroll
        for (int k = 0; k < CHAINS; ++k) c[k] = __fmaf_rn(c[k], a, b);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) s += c[k];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void __launch_bounds__(PROBE_THREADS) probe_hfma2_kernel(float* __restrict__ out, int iters, float seed) {
    __half2 c[CHAINS];
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) c[k] = __floats2half2_rn(seed + k, seed - k);
    const __half2 a = __floats2half2_rn(0.999f, 0.998f), b = __floats2half2_rn(seed * 1e-3f, seed * 2e-3f);
    for (int i = 0; i < iters; ++i)
#pragma unroll
        for (int k = 0; k < CHAINS; ++k) c[k] = __hfma2(c[k], a, b);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) s += __low2float(c[k]) + __high2float(c[k]);
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// Multiply-adds per warp of one mma.sync of the shape each arch runs best (the same shapes a tensor-core GEMM
// would use): int8 m16n8k32 (sm_80+) / m8n8k16 (sm_75); f16 -> f32 m16n8k16 (sm_80+), m16n8k8 (sm_75), m8n8k4
// (sm_70: four quad-pairs, each an 8x8x4 product).
constexpr int MMA_CHAINS = 4;

__device__ __forceinline__ constexpr int imma_macs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return 16 * 8 * 32;
#else
    return 8 * 8 * 16;
#endif
}

__device__ __forceinline__ constexpr int hmma_macs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return 16 * 8 * 16;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    return 16 * 8 * 8;
#else
    return 4 * 8 * 8 * 4;
#endif
}

// out[0] = multiply-adds per warp instruction of the compiled shape (0: this code has no such instruction).
__global__ void __launch_bounds__(PROBE_THREADS) probe_imma_kernel(int* __restrict__ out, int iters, int seed) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    const int a = seed ^ (int)threadIdx.x, b = seed * 7 + (int)threadIdx.x;
    int d[MMA_CHAINS][4] = {};
    for (int i = 0; i < iters; ++i)
#pragma unroll
        for (int k = 0; k < MMA_CHAINS; ++k) {
#if __CUDA_ARCH__ >= 800
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                         "{%0,%1,%2,%3};\n"
                         : "+r"(d[k][0]), "+r"(d[k][1]), "+r"(d[k][2]), "+r"(d[k][3])
                         : "r"(a), "r"(a + k), "r"(a ^ k), "r"(a - k), "r"(b), "r"(b + k));
#else
            asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                         : "+r"(d[k][0]), "+r"(d[k][1])
                         : "r"(a + k), "r"(b ^ k));
#endif
        }
    int s = 0;
#pragma unroll
    for (int k = 0; k < MMA_CHAINS; ++k) s ^= d[k][0] ^ d[k][1] ^ d[k][2] ^ d[k][3];
    out[1 + blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = imma_macs();
#else
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = 0;
    (void)iters; (void)seed;
#endif
}

__global__ void __launch_bounds__(PROBE_THREADS) probe_hmma_kernel(int* __restrict__ out, int iters, int seed) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    const unsigned a = 0x3c003c00u ^ (unsigned)(seed & 0xff), b = 0x3a003a00u + threadIdx.x;  // small f16 pairs
    float d[MMA_CHAINS][8] = {};
    for (int i = 0; i < iters; ++i)
#pragma unroll
        for (int k = 0; k < MMA_CHAINS; ++k) {
#if __CUDA_ARCH__ >= 800
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                         "{%0,%1,%2,%3};\n"
                         : "+f"(d[k][0]), "+f"(d[k][1]), "+f"(d[k][2]), "+f"(d[k][3])
                         : "r"(a), "r"(a + k), "r"(a), "r"(a + k), "r"(b), "r"(b + k));
#elif __CUDA_ARCH__ >= 750
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                         "{%0,%1,%2,%3};\n"
                         : "+f"(d[k][0]), "+f"(d[k][1]), "+f"(d[k][2]), "+f"(d[k][3])
                         : "r"(a), "r"(a + k), "r"(b));
#else
            asm volatile("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, "
                         "{%10,%11}, {%0,%1,%2,%3,%4,%5,%6,%7};\n"
                         : "+f"(d[k][0]), "+f"(d[k][1]), "+f"(d[k][2]), "+f"(d[k][3]), "+f"(d[k][4]),
                           "+f"(d[k][5]), "+f"(d[k][6]), "+f"(d[k][7])
                         : "r"(a), "r"(a + k), "r"(b), "r"(b + k));
#endif
        }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < MMA_CHAINS; ++k)
#pragma unroll
        for (int e = 0; e < 8; ++e) s += d[k][e];
    out[1 + blockIdx.x * blockDim.x + threadIdx.x] = __float_as_int(s);
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = hmma_macs();
#else
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = 0;
    (void)iters; (void)seed;
#endif
}

// The lowest compute_XX the library's code for this kernel on the current device was compiled for (ptxVersion:
// 61, 70, ...): an instruction the code lacks cannot be timed, whatever the GPU has.
template <typename K>
int code_arch(K kernel, int* arch) {
    cudaFuncAttributes fa;
    CMP_TRY(check_cuda(cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes"));
    *arch = fa.ptxVersion;
    return CMP_OK;
}

// Launch one probe kernel `iters` steps per chain, timed by events on the library stream.
template <typename K, typename... A>
int timed(K kernel, unsigned blocks, float* ms, A... args) {
    cudaEvent_t e0, e1;
    CMP_TRY(check_cuda(cudaEventCreate(&e0), "cudaEventCreate"));
    CMP_TRY(check_cuda(cudaEventCreate(&e1), "cudaEventCreate"));
    int rc = check_cuda(cudaEventRecord(e0, stream()), "cudaEventRecord");
    if (rc == CMP_OK) {
        kernel<<<blocks, PROBE_THREADS, 0, stream()>>>(args...);
        rc = check_launch("probe kernel");
    }
    if (rc == CMP_OK) rc = check_cuda(cudaEventRecord(e1, stream()), "cudaEventRecord");
    if (rc == CMP_OK) rc = check_cuda(cudaEventSynchronize(e1), "probe kernel");
    if (rc == CMP_OK) rc = check_cuda(cudaEventElapsedTime(ms, e0, e1), "cudaEventElapsedTime");
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc;
}

int probe_unit(int unit, int iters, float* ms, double* ops) {
    DeviceFacts f;
    CMP_TRY(device_facts(&f));
    const unsigned blocks = (unsigned)f.sms * PROBE_BLOCKS_PER_SM;
    const double threads = (double)blocks * PROBE_THREADS;
    int* out = nullptr;
    CMP_TRY(check_cuda(cudaMalloc(&out, (threads + 1) * sizeof(int)), "cudaMalloc (probe)"));
    int arch = 0, rc = CMP_OK;
    auto need = [&](auto kernel, int min_arch, const char* what) {
        int r = code_arch(kernel, &arch);
        if (r == CMP_OK && arch < min_arch)
            r = fail(CMP_ERR_UNSUPPORTED, "probe: %s needs compute_%d code, this library runs compute_%d here", what,
                     min_arch, arch);
        return r;
    };
    switch (unit) {
        case CMP_PROBE_DP4A:
        case CMP_PROBE_DP2A:
        case CMP_PROBE_IMAD:
            rc = dispatch_dot(unit, "cmp_probe", [&](auto d) {
                constexpr auto k = probe_dot_kernel<decltype(d)>;
                CMP_TRY(need(k, 61, "an int8 dot"));
                *ops = threads * iters * CHAINS * 8.0;   // 4 multiply-adds per dot4
                return timed(k, blocks, ms, out, iters, 12345);
            });
            break;
        case CMP_PROBE_FFMA:
            *ops = threads * iters * CHAINS * 2.0;
            rc = timed(probe_ffma_kernel, blocks, ms, reinterpret_cast<float*>(out), iters, 1.5f);
            break;
        case CMP_PROBE_HFMA2:
            *ops = threads * iters * CHAINS * 4.0;       // two halves
            rc = need(probe_hfma2_kernel, 60, "HFMA2");
            if (rc == CMP_OK) rc = timed(probe_hfma2_kernel, blocks, ms, reinterpret_cast<float*>(out), iters, 1.5f);
            break;
        case CMP_PROBE_IMMA:
        case CMP_PROBE_HMMA: {
            const bool imma = unit == CMP_PROBE_IMMA;
            auto kernel = imma ? probe_imma_kernel : probe_hmma_kernel;
            rc = need(kernel, imma ? 75 : 70, imma ? "int8 mma.sync" : "f16 mma.sync (HMMA)");
            if (rc == CMP_OK) rc = timed(kernel, blocks, ms, out, iters, 777);
            int macs = 0;
            if (rc == CMP_OK) rc = check_cuda(cudaMemcpy(&macs, out, sizeof(int), cudaMemcpyDeviceToHost), "probe");
            if (rc == CMP_OK && macs == 0) rc = fail(CMP_ERR_UNSUPPORTED, "probe: no mma.sync in this code");
            *ops = threads / 32 * iters * MMA_CHAINS * macs * 2.0;
            break;
        }
        default:
            rc = fail(CMP_ERR_ARG, "cmp_probe: unknown unit %d", unit);
    }
    cudaFree(out);
    return rc;
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_probe(int unit, int iters, float* ms, double* ops) {
    CMP_REQUIRE(iters > 0, "cmp_probe: iters %d (> 0)", iters);
    return probe_unit(unit, iters, ms, ops);
}

extern "C" int cmp_device_info(int* cc, int* sms, int* driver) {
    int dev = 0, major = 0, minor = 0;
    CMP_TRY(check_cuda(cudaGetDevice(&dev), "cudaGetDevice"));
    CMP_TRY(check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cc major"));
    CMP_TRY(check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cc minor"));
    CMP_TRY(check_cuda(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev), "SM count"));
    *cc = 10 * major + minor;
    return check_cuda(cudaDriverGetVersion(driver), "cudaDriverGetVersion");
}
