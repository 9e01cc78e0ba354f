// Entry points of the projections and embedding rows over the block-quantized weight types other than Q8_0
// (quant_blocks.cuh): layout, repack, workspace size, embedding, the weight expansion of the GEMM path, and
// cmp_matmul_quant, which hands the call to its dot route's translation unit (matmul_quant.cuh has the GEMV / GEMM
// kernels and what they compute; matmul_quant_dp4a.cu, _dp2a.cu, _imad.cu instantiate them, compiled in parallel).
//  - Embedding rows: value = s * code - m per value, in fp32 with the rounding of gguf.quants' dequantize.
#include "matmul_quant.cuh"

namespace cmp {
namespace {

// ---- repack, embedding and expansion --------------------------------------------------------------------------------

// Thread per file block: its fields into the row's planes (quant_blocks.cuh layout).
template <class Q>
__global__ void repack_kernel(const uint8_t* __restrict__ blocks,  // [rows, nb, BYTES]
                              uint8_t* __restrict__ body,          // [rows, nb * BODY]
                              uint8_t* __restrict__ head,          // [rows, nb * HEAD]
                              int nb, size_t nblocks) {
    const size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (b >= nblocks) return;
    const size_t r = b / nb;
    Q::repack(blocks + b * Q::BYTES, body + r * nb * Q::BODY, head + r * nb * Q::HEAD, nb, (int)(b % nb));
}

// Block per token; thread per sub-block: value = s * code - m (two explicit roundings, as gguf.quants' f32 math).
template <class Q>
__global__ void embed_quant_kernel(const int32_t* __restrict__ ids,   // [T]
                                   const uint8_t* __restrict__ body,  // [N, nb * BODY]
                                   const uint8_t* __restrict__ head,  // [N, nb * HEAD]
                                   float* __restrict__ out,           // [T, D]
                                   int D) {
    pdl_wait_producers();  // launch(): may start while the kernel before it drains
    constexpr int NSUB = Q::BV / 32;
    const int t = blockIdx.x, nb = D / Q::BV;
    const size_t id = (size_t)ids[t];
    body += id * nb * Q::BODY;
    head += id * nb * Q::HEAD;
    for (int c = threadIdx.x; c < D / 32; c += blockDim.x) {
        SubBlock sb;
        Q::decode(Q::load(body, head, nb, c), c % NSUB, sb);
        float* o = out + (size_t)t * D + 32 * c;
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int h = i >> 2;
                o[4 * i + k] = __fsub_rn(__fmul_rn(sb.s[h], (float)(int8_t)(sb.q[i] >> (8 * k))), sb.m[h]);
            }
    }
}

// Thread per (row, sub-block) of rows [0, R) of the chunk: codes wq [R, n] int8, scales ws [R, n/16], mins wm [R, n/16]
// (MIN types only).
template <class Q>
__global__ void expand_kernel(const uint8_t* __restrict__ body, const uint8_t* __restrict__ head,
                              int8_t* __restrict__ wq, float* __restrict__ ws, float* __restrict__ wm, int R, int n) {
    constexpr int NSUB = Q::BV / 32;
    const int nsub = n / 32, nb = n / Q::BV;
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)R * nsub) return;
    const size_t r = i / nsub;
    const int c = (int)(i % nsub);
    SubBlock sb;
    Q::decode(Q::load(body + r * nb * Q::BODY, head + r * nb * Q::HEAD, nb, c), c % NSUB, sb);
    int4* dst = reinterpret_cast<int4*>(wq + r * n + 32 * c);
    dst[0] = make_int4(sb.q[0], sb.q[1], sb.q[2], sb.q[3]);
    dst[1] = make_int4(sb.q[4], sb.q[5], sb.q[6], sb.q[7]);
    reinterpret_cast<float2*>(ws)[i] = make_float2(sb.s[0], sb.s[1]);
    if (Q::MIN) reinterpret_cast<float2*>(wm)[i] = make_float2(sb.m[0], sb.m[1]);
}

}  // namespace

int expand_quant(int type, const uint8_t* body, const uint8_t* head, int8_t* wq, float* ws, float* wm, int R, int n) {
    return dispatch_quant(type, "cmp_matmul_quant", [&](auto q) -> int {
        using Q = decltype(q);
        const size_t subs = (size_t)R * (n / 32);
        expand_kernel<Q><<<ceil_div(subs, 256), 256, 0, stream()>>>(body, head, wq, ws, wm, R, n);
        return check_launch("expand_kernel");
    });
}

}  // namespace cmp

using namespace cmp;

extern "C" int cmp_quant_layout(int type, int* block_values, int* block_bytes, int* body_bytes, int* head_bytes) {
    return dispatch_quant(type, "cmp_quant_layout", [&](auto q) -> int {
        using Q = decltype(q);
        *block_values = Q::BV;
        *block_bytes = Q::BYTES;
        *body_bytes = Q::BODY;
        *head_bytes = Q::HEAD;
        return CMP_OK;
    });
}

extern "C" int cmp_quant_repack(int type, const uint8_t* blocks, void* body, void* head, int rows, int n) {
    return dispatch_quant(type, "cmp_quant_repack", [&](auto q) -> int {
        using Q = decltype(q);
        CMP_REQUIRE(rows >= 0 && n > 0 && n % Q::BV == 0, "cmp_quant_repack: bad shape rows=%d n=%d (n a multiple of %d)",
                    rows, n, Q::BV);
        const size_t nblocks = (size_t)rows * (n / Q::BV);
        if (nblocks == 0) return CMP_OK;
        repack_kernel<Q><<<ceil_div(nblocks, 256), 256, 0, stream()>>>(blocks, static_cast<uint8_t*>(body),
                                                                       static_cast<uint8_t*>(head), n / Q::BV,
                                                                       nblocks);
        return check_launch("repack_kernel");
    });
}

// The kernel bits cmp_matmul_quant and cmp_quant_work_bytes take, and the int8 dot of a call of T tokens.
static int quant_route_dot(int kernels, int T, const char* what, int* dot) {
    constexpr int known = 3 << CMP_MM_GEMV_DOT_SHIFT | 3 << CMP_MM_GEMM_DOT_SHIFT | CMP_MM_MMA | CMP_MM_MMA_F16;
    CMP_REQUIRE((kernels & ~known) == 0,
                "%s: kernel bits 0x%x (only the dot routes of CmpMatmulDotField, CMP_MM_MMA and CMP_MM_MMA_F16)", what,
                kernels);
    *dot = kernels >> (T <= QGEMV_MAX_T ? CMP_MM_GEMV_DOT_SHIFT : CMP_MM_GEMM_DOT_SHIFT) & 3;
    return CMP_OK;
}

extern "C" int cmp_quant_work_bytes(int type, int T, int n, int rows, int kernels, size_t* bytes) {
    CMP_REQUIRE(T >= 0 && n > 0 && rows > 0, "cmp_quant_work_bytes: bad shape T=%d n=%d rows=%d", T, n, rows);
    int dot = 0;
    CMP_TRY(quant_route_dot(kernels, T, "cmp_quant_work_bytes", &dot));
    const QuantMatmul m{type, nullptr, nullptr, 1, nullptr, nullptr, nullptr, nullptr, &rows, T, n, nullptr, 0,
                        (kernels & CMP_MM_MMA) != 0, (kernels & CMP_MM_MMA_F16) != 0};
    return dispatch_dot(dot, "cmp_quant_work_bytes", [&](auto d) { return matmul_quant_work_dot(d, m, bytes); });
}

extern "C" int cmp_matmul_quant(int type, const int8_t* xq, const float* xd, int count, const void* const* body,
                                const void* const* head, float* const* y, const float* const* res, const int* rows,
                                int T, int n, void* work, size_t work_bytes, int kernels) {
    CMP_REQUIRE(count >= 1 && count <= QMAX_MATS, "cmp_matmul_quant: %d matrices (1..%d)", count, QMAX_MATS);
    CMP_REQUIRE(T >= 0 && n > 0 && n % 32 == 0, "cmp_matmul_quant: bad shape T=%d n=%d", T, n);
    for (int i = 0; i < count; ++i) CMP_REQUIRE(rows[i] > 0, "cmp_matmul_quant: matrix %d has %d rows", i, rows[i]);
    int dot = 0;
    CMP_TRY(quant_route_dot(kernels, T, "cmp_matmul_quant", &dot));
    // The type is checked here first (an unknown one fails even at T = 0); the route's translation unit dispatches
    // on it again to its instantiation.
    return dispatch_quant(type, "cmp_matmul_quant", [&](auto) -> int {
        if (T == 0) return (int)CMP_OK;
        const QuantMatmul m{type, xq, xd, count, body, head, y, res, rows, T, n, work, work_bytes,
                            (kernels & CMP_MM_MMA) != 0, (kernels & CMP_MM_MMA_F16) != 0};
        return dispatch_dot(dot, "cmp_matmul_quant", [&](auto d) { return matmul_quant_dot(d, m); });
    });
}

extern "C" int cmp_embed_quant(int type, const int32_t* ids, const void* body, const void* head, float* out, int T,
                               int D) {
    return dispatch_quant(type, "cmp_embed_quant", [&](auto q) -> int {
        using Q = decltype(q);
        CMP_REQUIRE(T >= 0 && D > 0 && D % Q::BV == 0, "cmp_embed_quant: bad shape T=%d D=%d", T, D);
        if (T == 0) return (int)CMP_OK;
        return launch("embed_quant_kernel", embed_quant_kernel<Q>, dim3(T), dim3(128), 0, ids,
                      static_cast<const uint8_t*>(body), static_cast<const uint8_t*>(head), out, D);
    });
}

