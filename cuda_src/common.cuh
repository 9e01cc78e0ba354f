// Shared by every .cu: the error slot behind cmp_last_error, argument and launch checks, warp/block reductions,
// the library stream. No kernel lives here.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <atomic>
#include <utility>

#include "api.h"

namespace cmp {

constexpr int QK = 32;  // values per Q8 block (weights Q8_0 and activations alike)
// Rows of activations a decode-sized call holds at most (decode batches, verify): the batch-invariant GEMV takes up
// to this many (matmul_q8.cu), and the Q8 producers keep their latency layouts up to it (quantize.cu).
constexpr int DECODE_ROWS = 16;

// ---- errors -----------------------------------------------------------------------------------------------------
// Set the per-thread message and return the code, so that a launcher can `return fail(...)`.
int fail(int code, const char* fmt, ...);
// The stream every kernel and copy runs on (created by cmp_init; the legacy default stream before that).
cudaStream_t stream();

inline int check_cuda(cudaError_t e, const char* what) {
    return e == cudaSuccess ? CMP_OK : fail(CMP_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

// The one launch check: a bad configuration surfaces in cudaGetLastError right after the launch.
inline int check_launch(const char* kernel) { return check_cuda(cudaGetLastError(), kernel); }

// Whether launch() asks for programmatic dependent launch on the current device (cmp_set_pdl).
bool pdl_on();

// One cached answer per device (devices 0..63; one beyond is asked every time): the answer + 1, 0 = not asked yet.
// A racing first ask stores the same answer.
struct PerDevice {
    static constexpr int kDevices = 64;
    std::atomic<int> v[kDevices] = {};
};

// Whether the code the driver picked for `kernel` on the current device was compiled for PTX version `min_ptx` or
// newer (cudaFuncAttributes::ptxVersion, major * 10 + minor: 75 = compute_75). A build for an older target, or its
// PTX JIT-compiled on a newer GPU, has the newer kernels compiled empty (#if __CUDA_ARCH__ >= ...), so what a
// device can run is a property of the code it got, not of the device. Asked once per device, kept in `cache` (the
// query costs microseconds, which eager launches would pay every time).
int code_at_least(const void* kernel, int min_ptx, PerDevice& cache, bool* yes);
template <typename... P>
int code_at_least(void (*kernel)(P...), int min_ptx, PerDevice& cache, bool* yes) {
    return code_at_least(reinterpret_cast<const void*>(kernel), min_ptx, cache, yes);
}

// Whether this library's kernels run as compute_90+ code on the current device: programmatic dependent launch needs
// it (code_at_least of a probe kernel: one build, one target list, so its PTX version is every kernel's).
int compute90_code(bool* yes);

// Fixed facts of the current device that launchers size grids and prefetches by, queried once per device.
struct DeviceFacts {
    int sms;        // multiprocessors
    int l2_bytes;   // L2 cache size
    int smem_optin; // shared memory one block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)
};
int device_facts(DeviceFacts* f);

// The shared memory one block may take on the current device: its opt-in limit, or cmp_set_smem_cap's cap where
// that is lower (tests run the small cards' configurations on a large one). Launchers pick their configuration
// from it (smem_plan.h).
int smem_limit(size_t* bytes);
// cmp_set_serial_pieces' count (0: none forced): the serial pieces of the DP4A GEMM (gemm_w16.cuh) and the FP32
// attention prefill (attention.cu).
int serial_pieces_forced();
// Before a launch with `dynamic` bytes of shared memory: the kernel's static plus dynamic shared memory within
// smem_limit(), else CMP_ERR_UNSUPPORTED naming the kernel and the bytes (nothing runs); then the kernel's opt-in
// to `dynamic` bytes. The driver is asked once per kernel and device (its static bytes; the opt-in again only when
// a launch asks more than before), not on every launch.
int smem_check(const char* name, const void* kernel, size_t dynamic);
template <typename... P>
int smem_opt_in(const char* name, void (*kernel)(P...), size_t dynamic) {
    return smem_check(name, reinterpret_cast<const void*>(kernel), dynamic);
}
// A launch's wave: the blocks of `kernel` (threads each, `dynamic` bytes of shared memory, opted in here) resident
// on the whole current device at once (the occupancy API times the SM count; asked once per kernel and size).
int wave_blocks(const char* name, const void* kernel, int threads, size_t dynamic, int* blocks);
template <typename... P>
int wave_blocks(const char* name, void (*kernel)(P...), int threads, size_t dynamic, int* blocks) {
    return wave_blocks(name, reinterpret_cast<const void*>(kernel), threads, dynamic, blocks);
}

// The launch of the small kernels: the stream's next kernel, and with cmp_set_pdl on it may start while the kernel
// before it drains -- so each kernel launched here calls pdl_wait_producers() before it touches memory (a no-op for
// a plain launch). In a captured graph the overlap is kept as a programmatic edge.
template <typename... P, typename... A>
int launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream();
    cfg.attrs = attr;
    cfg.numAttrs = pdl_on() ? 1 : 0;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
    if (e != cudaSuccess) cudaGetLastError();   // reported here, not to the next launch's check
    return check_cuda(e, name);
}

#define CMP_REQUIRE(cond, ...)                                  \
    do {                                                        \
        if (!(cond)) return ::cmp::fail(CMP_ERR_ARG, __VA_ARGS__); \
    } while (0)

#define CMP_TRY(expr)                         \
    do {                                      \
        int cmp_rc_ = (expr);                 \
        if (cmp_rc_ != CMP_OK) return cmp_rc_; \
    } while (0)

inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// ---- reductions ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the function syncs before reusing it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarp ? scratch[lane] : 0.f;
    return warp_sum(v);
}

// (value, index) order of numpy.argmax: larger value first, the lower index among equal values. A NaN value
// compares false, so it never wins over a number.
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Warp reduction of (value, index) pairs in argmax_better's order: every lane ends with the warp's winner.
__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

// 1 / sqrt(mean(xr^2) + eps) of one row xr [D], block per row (every thread calls it and gets the result).
// rmsnorm_kernel (elementwise.cu) and rmsnorm_q8_kernel (quantize.cu) both take the scale from here, so the fused
// kernel equals rmsnorm + quantize bit for bit (fp32 sum; the reference uses float64: fine at D <= 16K for 1e-4).
__device__ __forceinline__ float row_rms_scale(const float* __restrict__ xr, int D, float eps, float* scratch) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    return rsqrtf(block_sum(ss, scratch) / D + eps);
}

// The first half of the attention prep kernels (elementwise.cu: NeoX rope; vision.cu: IMROPE), block (t, hh) of
// blockDim.x >= Dh threads, hh < Hq a q head, else k head hh - Hq: RMS-normalize the head with its norm weight into
// normed [Dh] (shared), copy a q head's gate half to gate_out, sync. -> the head's output row (q_out or k_out) [Dh].
// Every thread of the block calls it (block_sum and __syncthreads inside).
__device__ __forceinline__ float* attn_prep_norm_head(const float* __restrict__ qg,      // [T, Hq, 2, Dh]
                                                      const float* __restrict__ k,       // [T, Hk, Dh]
                                                      const float* __restrict__ q_norm,  // [Dh]
                                                      const float* __restrict__ k_norm,  // [Dh]
                                                      float* __restrict__ q_out,         // [T, Hq, Dh]
                                                      float* __restrict__ k_out,         // [T, Hk, Dh]
                                                      float* __restrict__ gate_out,      // [T, Hq*Dh]
                                                      int Hq, int Hk, int Dh, float eps,
                                                      float* scratch,                    // shared [32]
                                                      float* normed) {                   // shared [Dh]
    const int t = blockIdx.x, hh = blockIdx.y, d = threadIdx.x;
    const bool is_q = hh < Hq;
    const int h = is_q ? hh : hh - Hq;
    const float* src = is_q ? qg + ((size_t)t * Hq + h) * 2 * Dh : k + ((size_t)t * Hk + h) * Dh;
    const float* nw = is_q ? q_norm : k_norm;
    float* dst = is_q ? q_out + ((size_t)t * Hq + h) * Dh : k_out + ((size_t)t * Hk + h) * Dh;

    const float v = d < Dh ? src[d] : 0.f;
    const float r = rsqrtf(block_sum(v * v, scratch) / Dh + eps);
    if (d < Dh) normed[d] = v * r * nw[d];
    if (is_q && d < Dh) gate_out[(size_t)t * Hq * Dh + (size_t)h * Dh + d] = src[Dh + d];
    __syncthreads();
    return dst;
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.f + __expf(-x)); }

// ---- programmatic dependent launch (sm_90+; no-ops on older GPUs) -------------------------------------------------
// A kernel launched with programmatic stream serialization (matmul_q8.cu's GEMV under CMP_MM_GEMV_PDL) may start
// once every block of the kernel before it has called pdl_allow_consumers() or exited; it must call
// pdl_wait_producers() before it touches anything that kernel (or any earlier one) writes or reads, which returns
// when those kernels have completed and their writes are visible. Both are no-ops for ordinary launches.
__device__ __forceinline__ void pdl_allow_consumers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---- int8 dot primitives: one per route of the quantized matmuls (llamacmp/backends/routes.py) ----------------
// Each dot4(a, b, c) = c + the dot product of a's and b's four signed bytes, exactly: every route gives the same
// integers, so the matmuls give the same bits on every route. They differ in the unit: some cards throttle DP4A
// (CMP 50HX / 90HX / 170HX: 16x) or their power when they see it (CMP 70HX); docs/ROUTES.md.
// DP4A: one IDP.4A.
// OPS: SASS instructions per dot4 (what a kernel weighs when it trades dots against other work).
struct DotDp4a {
    static constexpr int OPS = 1;
    static __device__ __forceinline__ int dot4(int a, int b, int c) { return __dp4a(a, b, c); }
};

// prmt.b32 of a with a selector whose nibbles may set the sign-replicate bit (__byte_perm masks that bit off): e.g.
// a's bytes 0,1 (sel 0x9180) or 2,3 (sel 0xB3A2) as two sign-extended 16-bit halves. Not volatile, so the compiler
// hoists it out of the loops where a (a weight or activation word) is reused.
__device__ __forceinline__ int sext_halves(int a, unsigned sel) {
    int r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(a), "r"(sel));
    return r;
}

// DP2A (int16 pairs x int8 pairs, IDP.2A): a widened to two 16-bit pairs, one DP2A on b's low bytes, one on its high.
struct DotDp2a {
    static constexpr int OPS = 4;
    static __device__ __forceinline__ int dot4(int a, int b, int c) {
        return __dp2a_hi(sext_halves(a, 0xB3A2u), b, __dp2a_lo(sext_halves(a, 0x9180u), b, c));
    }
};

// IMAD: each byte sign-extended (prmt, sign-replicate selectors), four mad.lo.s32 (IMAD); no DP4A/DP2A instruction
// for a card to react to. Both in PTX: written as C++ shifts and multiplies the compiler recognises the dot and
// emits IDP.4A again (nvcc 13, sm_90).
struct DotImad {
    static constexpr int OPS = 8;
    static __device__ __forceinline__ int byte(int v, unsigned k) {
        return sext_halves(v, 0x8880u + 0x1111u * k);   // bytes (k, sign k, sign k, sign k)
    }
    static __device__ __forceinline__ int dot4(int a, int b, int c) {
#pragma unroll
        for (unsigned k = 0; k < 4; ++k) asm("mad.lo.s32 %0, %1, %2, %0;" : "+r"(c) : "r"(byte(a, k)), "r"(byte(b, k)));
        return c;
    }
};

// The dot type of a CmpDot code (api.h): f(DotDp4a{}) etc.
template <typename F>
int dispatch_dot(int dot, const char* what, F&& f) {
    switch (dot) {
        case CMP_DOT_DP4A: return f(DotDp4a{});
        case CMP_DOT_DP2A: return f(DotDp2a{});
        case CMP_DOT_IMAD: return f(DotImad{});
        default: return fail(CMP_ERR_ARG, "%s: unknown int8 dot route %d (0 dp4a, 1 dp2a, 2 imad)", what, dot);
    }
}

// ---- int8 matmul helpers shared by matmul_q8.cu, matmul_quant.cuh and gemm_w16.cuh ------------------------------
// c + the dot product of 16 int8 pairs (four dot4 of the route; with DotDp4a four IDP.4A, no tensor core).
template <class D = DotDp4a>
__device__ __forceinline__ int dot16(const int4 a, const int4 b, int c = 0) {
    int s = D::dot4(a.x, b.x, c);
    s = D::dot4(a.y, b.y, s);
    s = D::dot4(a.z, b.z, s);
    return D::dot4(a.w, b.w, s);
}

// The exact int -> float of a DP4A GEMM's block dot (matmul_q8.cu, matmul_quant.cuh; |dot| < 2^22): the block's dot
// chain starts from dot_chain_init() and chain_to_f32() turns its end into the float of the dot, by the conversion
// instruction (I2F on sm_70/75, I2FP.F32.S32 on sm_86+). Not the other exact form (a chain started from 0x4B400000,
// the bits of 1.5 * 2^23, and one FADD): IDP.4A issues to the same pipe as FP32 arithmetic (NVIDIA's description:
// GA100's FMA pipe takes IMAD, IDP and FP32; on GH100 FMAheavy takes those and FMAlite FP32 only; Volta's equal FP32
// and DP4A rates, 64 per SM and clock, fit one shared FMA pipe there too: not measured here), the conversion runs on
// another (XU on sm_70: 16 per SM and clock, one per 8 IDP.4A here; I2FP on the ALU on sm_86+). Per Q8 block and
// output the FMA pipe then carries 8 IDP.4A + FMUL + FFMA without the FADD: a ceiling of 80% of the DP4A rate on
// Volta instead of 73%. H200, 2026-12-02, DP4A route, same run against the FADD form's library: prefill 1.07x
// (Q8_0) and 1.04x (Q4_K_M) with the guards and stage changes of the same branch (benchmarks/RESULTS.md).
__device__ __forceinline__ constexpr int dot_chain_init() { return 0; }
__device__ __forceinline__ float chain_to_f32(int end) { return __int2float_rn(end); }

// Loads through L2, past L1: data another block of the same kernel wrote (serial pieces: a tile's parked sums).
// ld.global.cg as __ldcg gives it under nvcc; clang's CUDA headers (the sm_70 / sm_61 build) have no __ldcg for
// float. Ordered after the wait that precedes them (volatile, memory clobber).
__device__ __forceinline__ float load_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ float4 load_cg(const float4* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}

// 16 bytes global -> shared; `ok` false writes zeros (rows/tokens/blocks past the end). On sm_80+ an asynchronous
// copy (completed by cp_async_wait before the barrier that publishes the stage).
__device__ __forceinline__ void copy16(int* dst, const int8_t* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 16 : 0));
#else
    *reinterpret_cast<int4*>(dst) = ok ? __ldg(reinterpret_cast<const int4*>(src)) : make_int4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::);
#endif
}

// The epilogue of the DP4A GEMMs (gemm_q8_kernel, gemm2_q8_kernel, gemm_w16_kernel, gemm_quant_kernel): a thread's
// outputs acc[i][j], token t0 + TS j and row r0 + RS i, into y [T, ldy], plus res [T, ldy] where the residual add is
// fused (res not null); a partial tile's tokens past T and rows past `rows` are computed but not stored. Tokens
// outer, so a warp's stores run along rows. The kernels' SASS is that of the loops each wrote out before (sm_90,
// nvcc 13.0), t0 evaluated before r0 as there: with r0 first the epilogue's registers came out in another order.
// The GEMVs' and the mma GEMMs' stores (one line each; the mma fragments lay out otherwise) stay their own: through a
// helper their SASS changed, the main loops' register allocation included.
template <int TS, int RS, int I, int J>
__device__ __forceinline__ void store_tile(const float (&acc)[I][J], int t0, int T, int r0, int rows, int ldy,
                                           const float* res, float* y) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int t = t0 + TS * j;
        if (t >= T) continue;
#pragma unroll
        for (int i = 0; i < I; ++i) {
            const int r = r0 + RS * i;
            if (r < rows) y[(size_t)t * ldy + r] = res ? res[(size_t)t * ldy + r] + acc[i][j] : acc[i][j];
        }
    }
}

// Loads of either cache/weight element type as float.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ void from_f32(float& dst, float x) { dst = x; }
__device__ __forceinline__ void from_f32(__half& dst, float x) { dst = __float2half_rn(x); }

// One templated dispatch over the two float storage types (CmpDtype), instead of if-ladders in every launcher.
template <typename F>
int dispatch_dtype(int dtype, F&& f) {
    switch (dtype) {
        case CMP_F32: return f(float{});
        case CMP_F16: return f(__half{});
        default: return fail(CMP_ERR_ARG, "unknown dtype code %d (0 = f32, 1 = f16)", dtype);
    }
}

}  // namespace cmp
