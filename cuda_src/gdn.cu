// Gated DeltaNet: the causal depthwise conv1d (+SiLU) with its rolling state, and the gated delta rule.
// The delta rule runs as a sequential scan over the segment's tokens (exact for decode and prefill alike); the
// chunked WY/UT prefill form of numpy_ref.gdn_chunked is not written yet.
#include "common.cuh"

namespace cmp {
namespace {

constexpr int CONV_MAX_K = 8;

// ==== kernels =====================================================================================================

// Thread per channel, walking the tokens with the last kernel-1 inputs in registers.
__global__ void conv1d_silu_kernel(const float* __restrict__ x,  // [L, C]
                                   const float* __restrict__ w,  // [C, kernel]
                                   float* __restrict__ state,    // [kernel-1, C]
                                   float* __restrict__ out,      // [L, C]
                                   int L, int C, int kernel) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float win[CONV_MAX_K], wc[CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) {
        wc[j] = j < kernel ? w[(size_t)c * kernel + j] : 0.f;
        win[j] = j < kernel - 1 ? state[(size_t)j * C + c] : 0.f;
    }
    for (int t = 0; t < L; ++t) {
        win[kernel - 1 < CONV_MAX_K ? kernel - 1 : 0] = x[(size_t)t * C + c];
        float y = 0.f;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; ++j)
            if (j < kernel) y = fmaf(win[j], wc[j], y);
        out[(size_t)t * C + c] = siluf_(y);
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; ++j)
            if (j < kernel - 1) win[j] = win[j + 1];
    }
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j)
        if (j < kernel - 1) state[(size_t)j * C + c] = win[j];
}

// Block (V head h, 32 value columns); lane owns column j of S_h ([Dk, Dv], S[i][j]) in DK registers, so the whole
// token update (decay, delta, rank-1 update, output) needs no cross-lane reduction. q and k of the head's K group
// (h % K) are L2-normalised by the warp into shared memory each token. The next token's inputs are loaded before
// the current update so the global-load latency overlaps the arithmetic.
template <int DK>
__global__ void __launch_bounds__(32)
gdn_scan_kernel(const float* __restrict__ qkv,  // [L, C], C = 2*K*DK + V*DK
                const float* __restrict__ g,    // [L, V] log-decay
                const float* __restrict__ b,    // [L, V] beta
                float* __restrict__ state,      // [V, DK, DK]
                float* __restrict__ o,          // [L, V*DK]
                int L, int K, int V, float eps) {
    constexpr int PER = DK >= 32 ? DK / 32 : 1;  // q/k elements per lane
    __shared__ float qs[DK], ks[DK];
    const int h = blockIdx.x, kh = h % K, lane = threadIdx.x;
    const int j = blockIdx.y * 32 + lane;
    const bool col = j < DK;
    const size_t C = (size_t)(2 * K + V) * DK;
    float* S = state + (size_t)h * DK * DK;
    float s[DK];
#pragma unroll
    for (int i = 0; i < DK; ++i) s[i] = col ? S[(size_t)i * DK + j] : 0.f;
    const float qscale = rsqrtf((float)DK);

    auto load = [&](int t, float* qv, float* kv, float& vj, float& gt, float& bt) {
        const float* row = qkv + (size_t)t * C;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = lane + 32 * e;
            qv[e] = i < DK ? row[kh * DK + i] : 0.f;
            kv[e] = i < DK ? row[(size_t)K * DK + kh * DK + i] : 0.f;
        }
        vj = col ? row[(size_t)2 * K * DK + (size_t)h * DK + j] : 0.f;
        gt = g[(size_t)t * V + h];
        bt = b[(size_t)t * V + h];
    };
    float qv[PER], kv[PER], vj = 0.f, gt = 0.f, bt = 0.f;
    if (L > 0) load(0, qv, kv, vj, gt, bt);
    for (int t = 0; t < L; ++t) {
        float qsum = 0.f, ksum = 0.f;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            qsum += qv[e] * qv[e];
            ksum += kv[e] * kv[e];
        }
        const float qn = qscale / fmaxf(sqrtf(warp_sum(qsum)), eps);
        const float kn = 1.f / fmaxf(sqrtf(warp_sum(ksum)), eps);
        __syncwarp();  // previous token's readers of qs/ks are done
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = lane + 32 * e;
            if (i < DK) {
                qs[i] = qv[e] * qn;
                ks[i] = kv[e] * kn;
            }
        }
        const float decay = __expf(gt), beta = bt, v_now = vj;
        if (t + 1 < L) load(t + 1, qv, kv, vj, gt, bt);
        __syncwarp();
        float kS = 0.f;
#pragma unroll
        for (int i = 0; i < DK; ++i) kS = fmaf(s[i], ks[i], kS);
        const float delta = beta * (v_now - decay * kS);
        float out = 0.f;
#pragma unroll
        for (int i = 0; i < DK; ++i) {
            s[i] = fmaf(decay, s[i], ks[i] * delta);
            out = fmaf(s[i], qs[i], out);
        }
        if (col) o[(size_t)t * V * DK + (size_t)h * DK + j] = out;
    }
#pragma unroll
    for (int i = 0; i < DK; ++i)
        if (col) S[(size_t)i * DK + j] = s[i];
}

// ==== launchers ===================================================================================================

template <int DK>
int launch_gdn_scan(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K, int V,
                    float eps) {
    gdn_scan_kernel<DK><<<dim3(V, ceil_div(DK, 32)), 32, 0, stream()>>>(qkv, g, b, state, o, L, K, V, eps);
    return check_launch("gdn_scan_kernel");
}

}  // namespace
}  // namespace cmp

using namespace cmp;

extern "C" int cmp_conv1d_silu(const float* x, const float* w, float* state, float* out, int L, int C, int kernel) {
    CMP_REQUIRE(L >= 0 && C > 0 && kernel >= 1 && kernel <= CONV_MAX_K,
                "cmp_conv1d_silu: bad shape L=%d C=%d kernel=%d (kernel <= %d)", L, C, kernel, CONV_MAX_K);
    if (L == 0) return CMP_OK;
    conv1d_silu_kernel<<<ceil_div(C, 128), 128, 0, stream()>>>(x, w, state, out, L, C, kernel);
    return check_launch("conv1d_silu_kernel");
}

extern "C" int cmp_gdn(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K, int V,
                       int Dk, float eps) {
    CMP_REQUIRE(L >= 0 && K > 0 && V > 0 && V % K == 0, "cmp_gdn: bad shape L=%d K=%d V=%d", L, K, V);
    if (L == 0) return CMP_OK;
    switch (Dk) {
        case 16: return launch_gdn_scan<16>(qkv, g, b, state, o, L, K, V, eps);
        case 32: return launch_gdn_scan<32>(qkv, g, b, state, o, L, K, V, eps);
        case 64: return launch_gdn_scan<64>(qkv, g, b, state, o, L, K, V, eps);
        case 128: return launch_gdn_scan<128>(qkv, g, b, state, o, L, K, V, eps);
        default: return fail(CMP_ERR_UNSUPPORTED, "cmp_gdn: state size %d not supported (16/32/64/128)", Dk);
    }
}
