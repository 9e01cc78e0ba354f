// Row-wise and element-wise ops: embedding gather, RMSNorm, add, SwiGLU, sigmoid gate, row gather, the attention
// input preparation (per-head q/k RMSNorm + NeoX partial rotary + gate split), GDN gates and the gated RMSNorm.
#include <algorithm>

#include "common.cuh"

namespace cmp {
namespace {

constexpr int EW_THREADS = 256;

// ==== kernels =====================================================================================================

__global__ void embed_q8_kernel(const int32_t* __restrict__ ids,  // [T]
                                const int8_t* __restrict__ qs,    // [N, D]
                                const __half* __restrict__ d,     // [N, D/32]
                                float* __restrict__ out,          // [T, D]
                                int D) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const int t = blockIdx.x;
    const size_t id = (size_t)ids[t];
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        out[(size_t)t * D + i] = (float)qs[id * D + i] * __half2float(d[id * (D / QK) + i / QK]);
}

template <typename Tab>
__global__ void embed_f_kernel(const int32_t* __restrict__ ids,  // [T]
                               const Tab* __restrict__ table,    // [N, D]
                               float* __restrict__ out,          // [T, D]
                               int D) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const int t = blockIdx.x;
    const size_t id = (size_t)ids[t];
    for (int i = threadIdx.x; i < D; i += blockDim.x) out[(size_t)t * D + i] = to_f32(table[id * D + i]);
}

// Block per row; fp32 sum of squares (the reference uses float64: fine at D <= 16K for a 1e-4 tolerance).
__global__ void rmsnorm_kernel(const float* __restrict__ x,  // [T, D]
                               const float* __restrict__ w,  // [D]
                               float* __restrict__ y,        // [T, D]
                               int D, float eps) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * D;
    const float r = row_rms_scale(xr, D, eps, scratch);
    for (int i = threadIdx.x; i < D; i += blockDim.x) y[(size_t)blockIdx.x * D + i] = xr[i] * r * w[i];
}

struct AddOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct SwigluOp {
    __device__ float operator()(float gate, float up) const { return siluf_(gate) * up; }
};
struct SigmoidMulOp {
    __device__ float operator()(float x, float gate) const { return x * sigmoidf_(gate); }
};

template <typename Op>
__global__ void binary_kernel(const float* __restrict__ a, const float* __restrict__ b,  // [n], [n]
                              float* __restrict__ out, size_t n) {                        // [n]
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = Op{}(a[i], b[i]);
}

__global__ void gather_rows_kernel(const float* __restrict__ x,      // [T, D]
                                   const int32_t* __restrict__ rows,  // [R]
                                   float* __restrict__ out,           // [R, D]
                                   int D) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t src = (size_t)rows[blockIdx.x] * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) out[(size_t)blockIdx.x * D + i] = x[src + i];
}

// Block (t, head) over the Hq q heads then the Hk k heads; blockDim.x = Dh rounded up to 32 (Dh <= 1024).
// The rotation angle is formed in double: pos * base^(-2i/n_rot) reaches ~1e5 rad at long contexts, where a float
// angle (or fast-math __sinf) is off by whole percents; it is 32 sincos per head, negligible.
__global__ void attention_prep_kernel(const float* __restrict__ qg,      // [T, Hq, 2, Dh]
                                      const float* __restrict__ k,       // [T, Hk, Dh]
                                      const float* __restrict__ q_norm,  // [Dh]
                                      const float* __restrict__ k_norm,  // [Dh]
                                      const int32_t* __restrict__ pos,   // [T]
                                      float* __restrict__ q_out,         // [T, Hq, Dh]
                                      float* __restrict__ k_out,         // [T, Hk, Dh]
                                      float* __restrict__ gate_out,      // [T, Hq*Dh]
                                      int Hq, int Hk, int Dh, int n_rot, float rope_base, float eps) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float scratch[32];
    __shared__ float normed[1024];
    float* dst = attn_prep_norm_head(qg, k, q_norm, k_norm, q_out, k_out, gate_out, Hq, Hk, Dh, eps, scratch, normed);
    const int t = blockIdx.x, d = threadIdx.x;
    if (d >= Dh) return;
    const int half = n_rot / 2;
    float out = normed[d];
    if (d < n_rot) {
        const int i = d < half ? d : d - half;
        const double theta = (double)pos[t] * pow((double)rope_base, -2.0 * i / n_rot);
        double s, c;
        sincos(theta, &s, &c);
        const float x0 = normed[i], x1 = normed[i + half];
        out = d < half ? (float)(x0 * c - x1 * s) : (float)(x0 * s + x1 * c);
    }
    dst[d] = out;
}

__global__ void gdn_gates_kernel(const float* __restrict__ alpha,    // [T, V]
                                 const float* __restrict__ beta,     // [T, V]
                                 const float* __restrict__ dt_bias,  // [V]
                                 const float* __restrict__ ssm_a,    // [V]
                                 float* __restrict__ g,              // [T, V]
                                 float* __restrict__ b,              // [T, V]
                                 int n, int V) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int h = i % V;
    const float a = alpha[i] + dt_bias[h];
    const float sp = a > 20.f ? a : log1pf(expf(a));  // the reference's softplus threshold
    g[i] = sp * ssm_a[h];
    b[i] = sigmoidf_(beta[i]);
}

// Block per (t, head), blockDim.x = Dv rounded up to 32.
__global__ void gated_rmsnorm_kernel(const float* __restrict__ o,  // [T, V*Dv]
                                     const float* __restrict__ z,  // [T, V*Dv]
                                     const float* __restrict__ w,  // [Dv]
                                     float* __restrict__ out,      // [T, V*Dv]
                                     int Dv, float eps) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float scratch[32];
    const size_t base = (size_t)blockIdx.x * Dv;
    const int d = threadIdx.x;
    const float v = d < Dv ? o[base + d] : 0.f;
    const float r = rsqrtf(block_sum(v * v, scratch) / Dv + eps);
    if (d < Dv) out[base + d] = v * r * w[d] * siluf_(z[base + d]);
}

inline int round32(int n) { return (n + 31) / 32 * 32; }

template <typename Op>
int launch_binary(const float* a, const float* b, float* out, size_t n, const char* name) {
    if (n == 0) return CMP_OK;
    return launch(name, binary_kernel<Op>, dim3(std::min<unsigned>(ceil_div(n, EW_THREADS), 65535u)), dim3(EW_THREADS),
                  0, a, b, out, n);
}

}  // namespace
}  // namespace cmp

using namespace cmp;

// ==== launchers ===================================================================================================

extern "C" int cmp_embed_q8(const int32_t* ids, const int8_t* qs, const void* d, float* out, int T, int D) {
    CMP_REQUIRE(T >= 0 && D > 0 && D % QK == 0, "cmp_embed_q8: bad shape T=%d D=%d", T, D);
    if (T == 0) return CMP_OK;
    return launch("embed_q8_kernel", embed_q8_kernel, dim3(T), dim3(EW_THREADS), 0, ids, qs,
                  static_cast<const __half*>(d), out, D);
}

extern "C" int cmp_embed_f(const int32_t* ids, const void* table, int dtype, float* out, int T, int D) {
    CMP_REQUIRE(T >= 0 && D > 0, "cmp_embed_f: bad shape T=%d D=%d", T, D);
    if (T == 0) return CMP_OK;
    return dispatch_dtype(dtype, [&](auto tag) {
        using Tab = decltype(tag);
        return launch("embed_f_kernel", embed_f_kernel<Tab>, dim3(T), dim3(EW_THREADS), 0, ids,
                      static_cast<const Tab*>(table), out, D);
    });
}

extern "C" int cmp_rmsnorm(const float* x, const float* w, float* y, int T, int D, float eps) {
    CMP_REQUIRE(T >= 0 && D > 0, "cmp_rmsnorm: bad shape T=%d D=%d", T, D);
    if (T == 0) return CMP_OK;
    return launch("rmsnorm_kernel", rmsnorm_kernel, dim3(T), dim3(std::min(1024, round32(D))), 0, x, w, y, D, eps);
}

extern "C" int cmp_add(const float* x, const float* y, float* out, size_t n) {
    return launch_binary<AddOp>(x, y, out, n, "add_kernel");
}

extern "C" int cmp_swiglu(const float* gate, const float* up, float* out, size_t n) {
    return launch_binary<SwigluOp>(gate, up, out, n, "swiglu_kernel");
}

extern "C" int cmp_sigmoid_mul(const float* x, const float* gate, float* out, size_t n) {
    return launch_binary<SigmoidMulOp>(x, gate, out, n, "sigmoid_mul_kernel");
}

extern "C" int cmp_gather_rows(const float* x, const int32_t* rows, float* out, int R, int D) {
    CMP_REQUIRE(R >= 0 && D > 0, "cmp_gather_rows: bad shape R=%d D=%d", R, D);
    if (R == 0) return CMP_OK;
    return launch("gather_rows_kernel", gather_rows_kernel, dim3(R), dim3(EW_THREADS), 0, x, rows, out, D);
}

// Hq = 0: the k heads alone (qg, q_norm, q_out and gate_out are not read: the MTP head's catch-up writes its KV
// cache only, Qwen35Model.mtp_fill), the same bits as with the q heads.
extern "C" int cmp_attention_prep(const float* qg, const float* k, const float* q_norm, const float* k_norm,
                                  const int32_t* pos, float* q_out, float* k_out, float* gate_out, int T, int Hq,
                                  int Hk, int Dh, int n_rot, float rope_base, float eps) {
    CMP_REQUIRE(T >= 0 && Hq >= 0 && Hk > 0 && Dh > 0 && Dh <= 1024 && n_rot >= 0 && n_rot <= Dh && n_rot % 2 == 0,
                "cmp_attention_prep: bad shape T=%d Hq=%d Hk=%d Dh=%d n_rot=%d", T, Hq, Hk, Dh, n_rot);
    if (T == 0) return CMP_OK;
    return launch("attention_prep_kernel", attention_prep_kernel, dim3(T, Hq + Hk), dim3(round32(Dh)), 0, qg, k,
                  q_norm, k_norm, pos, q_out, k_out, gate_out, Hq, Hk, Dh, n_rot, rope_base, eps);
}

extern "C" int cmp_gdn_gates(const float* alpha, const float* beta, const float* dt_bias, const float* ssm_a, float* g,
                             float* b, int T, int V) {
    CMP_REQUIRE(T >= 0 && V > 0, "cmp_gdn_gates: bad shape T=%d V=%d", T, V);
    const int n = T * V;
    if (n == 0) return CMP_OK;
    return launch("gdn_gates_kernel", gdn_gates_kernel, dim3(ceil_div(n, EW_THREADS)), dim3(EW_THREADS), 0, alpha,
                  beta, dt_bias, ssm_a, g, b, n, V);
}

extern "C" int cmp_gated_rmsnorm(const float* o, const float* z, const float* w, float* out, int T, int V, int Dv,
                                 float eps) {
    CMP_REQUIRE(T >= 0 && V > 0 && Dv > 0 && Dv <= 1024, "cmp_gated_rmsnorm: bad shape T=%d V=%d Dv=%d", T, V, Dv);
    if (T == 0) return CMP_OK;
    return launch("gated_rmsnorm_kernel", gated_rmsnorm_kernel, dim3(T * V), dim3(round32(Dv)), 0, o, z, w, out, Dv,
                  eps);
}
