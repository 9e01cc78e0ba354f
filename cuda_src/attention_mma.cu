// The tensor-core route of the attention prefill (issue 20, routes.attn_prefill "mma"): causal GQA attention over
// an f16 KV cache, FlashAttention-2 on f16 mma.sync (m16n8k16, fp32 accumulation; compute capability 8.0+).
// Block (64 rows, kv head): rows r = t*G + g of the kv head's group as in attn_prefill_kernel (each K/V tile serves
// all G heads); warp w owns rows 16w .. 16w+15. Per 64-key tile: S = Q K^T on the tensor cores (Q scaled and
// rounded to f16 once, K as stored), the online softmax on the S fragments (row max and sum over the 4 lanes of a
// row), P rounded to f16 straight from the S fragments into the A operand of O += P V (V through ldmatrix.trans).
// The f16 rounding of Q and P is the difference from the fp32 kernel (as in llama.cpp's FlashAttention); the
// tests allow 2e-3 for it. Dense causal only: other KV types and block-sparse lists run attn_prefill_kernel.
#include "common.cuh"

namespace cmp {
namespace {

constexpr int FM_BR = 64;                 // rows per block (16 per warp)
constexpr int FM_NT = FM_BR / 16 * 32;    // threads per block

// Shared row stride in halves: Dh + 8, an odd number of 16-byte groups, so the 8 rows of an ldmatrix phase fall in
// 8 distinct bank groups.
__host__ __device__ constexpr int fm_stride(int Dh) { return Dh + 8; }
__host__ __device__ constexpr size_t fm_smem(int Dh) { return 3 * (size_t)FM_BR * fm_stride(Dh) * 2; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], unsigned s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], unsigned s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
// d [16 x 8] += a [16 x 16] . b [16 x 8], f16 in, f32 accumulate; fragments as in the PTX ISA (g = lane / 4,
// t = lane % 4): d[0..1] row g, cols 2t, 2t+1; d[2..3] row g + 8.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}
// 16 bytes global -> shared, zeros when !ok (src then unread).
__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
#endif

template <int Dh>
__global__ void __launch_bounds__(FM_NT) attn_prefill_mma_kernel(const float* __restrict__ q,     // [L, Hq, Dh]
                                                                 const __half* __restrict__ kc,  // [n_ctx, Hk, Dh]
                                                                 const __half* __restrict__ vc,  // [n_ctx, Hk, Dh]
                                                                 const int32_t* __restrict__ pos,  // [L]
                                                                 float* __restrict__ out,          // [L, Hq*Dh]
                                                                 int L, int Hq, int Hk, int G, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    constexpr int FM_BK = 64;          // keys per tile
    constexpr float FM_NEG = -1e30f;   // a masked score
    constexpr int S = fm_stride(Dh), DT = Dh / 8, KS = Dh / 16, NT = FM_BK / 8;
    extern __shared__ __align__(16) __half fm_smem_buf[];
    __half* Qs = fm_smem_buf;          // [FM_BR][S]
    __half* Ks = Qs + FM_BR * S;       // [FM_BK][S]
    __half* Vs = Ks + FM_BK * S;       // [FM_BK][S]
    const int kvh = blockIdx.y, total = L * G, r0 = blockIdx.x * FM_BR;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;

    // Q rows, scaled, as f16 (padding rows zero).
    for (int i = tid; i < FM_BR * Dh / 4; i += FM_NT) {
        const int r = i / (Dh / 4), d4 = i % (Dh / 4), rr = r0 + r;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (rr < total) x = *reinterpret_cast<const float4*>(q + ((size_t)(rr / G) * Hq + kvh * G + rr % G) * Dh + d4 * 4);
        *reinterpret_cast<__half2*>(Qs + r * S + d4 * 4) = __floats2half2_rn(x.x * scale, x.y * scale);
        *reinterpret_cast<__half2*>(Qs + r * S + d4 * 4 + 2) = __floats2half2_rn(x.z * scale, x.w * scale);
    }

    const int last_row = min(r0 + FM_BR, total) - 1;
    const int kmax = pos[last_row / G] + 1;   // keys 0 .. kmax-1 exist and may be seen
    int qpos[2];                              // this lane's rows g, g + 8 of the warp (-1: padding, all masked)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rr = r0 + warp * 16 + g + 8 * h;
        qpos[h] = rr < total ? pos[rr / G] : -1;
    }
    const size_t kstride = (size_t)Hk * Dh;
    const __half* kbase = kc + (size_t)kvh * Dh;
    const __half* vbase = vc + (size_t)kvh * Dh;
    const unsigned qs0 = (unsigned)__cvta_generic_to_shared(Qs), ks0 = (unsigned)__cvta_generic_to_shared(Ks),
                   vs0 = (unsigned)__cvta_generic_to_shared(Vs);
    // ldmatrix lane addresses (bytes): A = Q rows (lane & 15), halves (lane >> 4) * 8; B = K keys (lane & 7) +
    // ((lane >> 4) << 3), halves ((lane >> 3) & 1) * 8; V (transposed) keys (lane & 7) + ((lane >> 3) & 1) * 8,
    // halves (lane >> 4) * 8.
    const unsigned qa = qs0 + 2 * ((warp * 16 + (lane & 15)) * S + (lane >> 4) * 8);
    const unsigned kb_ = ks0 + 2 * (((lane & 7) + ((lane >> 4) << 3)) * S + ((lane >> 3) & 1) * 8);
    const unsigned vb_ = vs0 + 2 * (((lane & 7) + ((lane >> 3) & 1) * 8) * S + (lane >> 4) * 8);

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;
    float m[2] = {FM_NEG, FM_NEG}, l[2] = {0.f, 0.f};   // per row g / g + 8: running max, this lane's partial sum

    for (int k0 = 0; k0 < kmax; k0 += FM_BK) {
        __syncthreads();   // K / V free (previous tile consumed); Q written (first tile)
        for (int i = tid; i < FM_BK * Dh / 8; i += FM_NT) {
            const int key = i / (Dh / 8), c8 = i % (Dh / 8);
            const bool ok = k0 + key < kmax;   // beyond: zeros (stale cache rows may hold anything)
            const size_t off = ok ? (size_t)(k0 + key) * kstride + c8 * 8 : 0;
            cp16(ks0 + 2 * (key * S + c8 * 8), kbase + off, ok);
            cp16(vs0 + 2 * (key * S + c8 * 8), vbase + off, ok);
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
        __syncthreads();

        // S = Q K^T: [16 rows x 64 keys] per warp
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            uint32_t a[4];
            ldsm_x4(a, qa + 2 * ks * 16);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                uint32_t b[4];
                ldsm_x4(b, kb_ + 2 * (np * 16 * S + ks * 16));
                mma_f16(s[2 * np], a, b[0], b[1]);
                mma_f16(s[2 * np + 1], a, b[2], b[3]);
            }
        }
        // causal mask and online softmax (rows g and g + 8: elements e >> 1)
        float mx[2] = {FM_NEG, FM_NEG};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + nt * 8 + 2 * tq + (e & 1);
                if (key > qpos[e >> 1]) s[nt][e] = FM_NEG;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            }
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            const float m_new = fmaxf(m[h], mx[h]);
            corr[h] = __expf(m[h] - m_new);
            m[h] = m_new;
            l[h] *= corr[h];
        }
        uint32_t p[NT / 2][4];   // P as the A operand of the 4 key steps of 16
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                pv[e] = s[nt][e] <= FM_NEG ? 0.f : __expf(s[nt][e] - m[e >> 1]);
                l[e >> 1] += pv[e];
            }
            // keys 16kk + 2t (+1) of rows g / g + 8 are n-tile 2kk, keys 16kk + 8 + 2t n-tile 2kk + 1
            p[nt >> 1][(nt & 1) * 2 + 0] = pack_half2(pv[0], pv[1]);
            p[nt >> 1][(nt & 1) * 2 + 1] = pack_half2(pv[2], pv[3]);
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[dt][e] *= corr[e >> 1];
        // O += P V
#pragma unroll
        for (int kk = 0; kk < FM_BK / 16; ++kk)
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                uint32_t b[4];
                ldsm_x4_trans(b, vb_ + 2 * (kk * 16 * S + dp * 16));
                mma_f16(o[2 * dp], p[kk], b[0], b[1]);
                mma_f16(o[2 * dp + 1], p[kk], b[2], b[3]);
            }
    }
    // normalise by the row sums (the 4 lanes of a row hold parts) and write
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        const int rr = r0 + warp * 16 + g + 8 * h;
        if (rr >= total) continue;
        const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
        float* dst = out + ((size_t)(rr / G) * Hq + kvh * G + rr % G) * Dh + 2 * tq;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
    }
#endif
}

template <int Dh>
int launch_mma(const float* q, const void* kc, const void* vc, const int32_t* pos, float* out, int L, int Hq, int Hk,
               float scale) {
    constexpr auto kernel = attn_prefill_mma_kernel<Dh>;
    constexpr size_t smem = fm_smem(Dh);
    CMP_TRY(smem_opt_in("attn_prefill_mma_kernel", kernel, smem));
    const int G = Hq / Hk;
    return launch("attn_prefill_mma_kernel", kernel, dim3(ceil_div((size_t)L * G, FM_BR), Hk), dim3(FM_NT), smem, q,
                  static_cast<const __half*>(kc), static_cast<const __half*>(vc), pos, out, L, Hq, Hk, G, scale);
}

PerDevice g_fm_code;   // attn_mma_available's code half

// compute_75-or-older code (or its PTX JIT-compiled on a newer GPU) has the kernels empty; and the device must lend
// the largest head dim's tile (its opt-in limit, as device_facts knows it; not the tests' smem cap).
int attn_mma_available(bool* yes) {
    bool code = false;
    CMP_TRY(code_at_least(attn_prefill_mma_kernel<64>, 80, g_fm_code, &code));
    DeviceFacts f{};
    if (code) CMP_TRY(device_facts(&f));
    *yes = code && (size_t)f.smem_optin >= fm_smem(256);
    return CMP_OK;
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_attn_mma_available(int* yes) {
    bool ok = false;
    CMP_TRY(attn_mma_available(&ok));
    *yes = ok ? 1 : 0;
    return CMP_OK;
}

extern "C" int cmp_attn_prefill_mma(const float* q, const void* kc, const void* vc, const int32_t* pos, float* out,
                                    int L, int Hq, int Hk, int Dh, float scale) {
    CMP_REQUIRE(L >= 0 && Hk > 0 && Hq > 0 && Hq % Hk == 0, "cmp_attn_prefill_mma: bad heads Hq=%d Hk=%d", Hq, Hk);
    bool ok = false;
    CMP_TRY(attn_mma_available(&ok));
    CMP_REQUIRE(ok, "the tensor-core attention prefill (attn_prefill mma) needs f16 mma.sync, compute capability "
                    "8.0+ code, and %zu bytes of shared memory per block; this device runs neither", fm_smem(256));
    if (L == 0) return CMP_OK;
    switch (Dh) {
        case 64: return launch_mma<64>(q, kc, vc, pos, out, L, Hq, Hk, scale);
        case 128: return launch_mma<128>(q, kc, vc, pos, out, L, Hq, Hk, scale);
        case 256: return launch_mma<256>(q, kc, vc, pos, out, L, Hq, Hk, scale);
    }
    return fail(CMP_ERR_ARG, "cmp_attn_prefill_mma: head dim %d (64, 128 or 256)", Dh);
}
