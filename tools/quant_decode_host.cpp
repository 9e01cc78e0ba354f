// cuda_src/quant_blocks.cuh's decoders run on the CPU, from the same source: each type's repack (per file block, as
// matmul_quant.cu's repack_kernel) and then load + decode of every sub-block, written out as the embedding kernel
// writes a value (s * code - m). Checks a decoder's byte layout, bit order and scale arithmetic without a GPU; not
// the kernels around it (tests/test_quant_cuda.py on a GPU does). The CUDA intrinsics the decoders use are emulated
// below, except prmt (inline PTX: the types that use it, IQ4_NL, IQ4_XS, Q4_K, Q5_K, give garbage here and are not
// run). tests/test_quant_decode_host.py builds it in a folder where quant_blocks.cuh's "common.cuh" is this file's
// stand-in (an empty file: everything it would give is defined here first), and runs it:
//   quant_decode_host TYPE_ID ROWS N IN.bin OUT.bin     IN: [ROWS, N / BV, BYTES] blocks; OUT: [ROWS, N] float32
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "api.h"

#define __device__
#define __forceinline__ inline
#define asm(...) ((void)0)  // prmt's inline PTX: no host equivalent (see above)

struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) int2 { int x, y; };
struct alignas(8) float2 { float x, y; };
struct __half { uint16_t bits; };
struct __half2 { __half x, y; };
inline int2 make_int2(int x, int y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

template <class T>
inline T __ldg(const T* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline float __half2float(__half h) {  // IEEE binary16 -> binary32, subnormals, inf and NaN included
    const unsigned s = (h.bits >> 15) & 1u, e = (h.bits >> 10) & 31u, m = h.bits & 1023u;
    const float v = e == 0 ? std::ldexp((float)m, -24)
                  : e == 31 ? (m ? NAN : INFINITY) : std::ldexp((float)(m | 1024u), (int)e - 25);
    return s ? -v : v;
}
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half __ushort_as_half(unsigned short b) { return {b}; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    const uint64_t w = (uint64_t)hi << 32 | lo;
    return (unsigned)(w >> (s & 31));
}
inline unsigned bytewise(unsigned a, unsigned b, int sign) {  // per byte a + sign * b, mod 256
    unsigned r = 0;
    for (int k = 0; k < 4; ++k) r |= ((((a >> 8 * k) & 255u) + sign * ((b >> 8 * k) & 255u)) & 255u) << 8 * k;
    return r;
}
inline unsigned __vsub4(unsigned a, unsigned b) { return bytewise(a, b, -1); }
inline unsigned __vadd4(unsigned a, unsigned b) { return bytewise(a, b, 1); }

namespace cmp {
inline int fail(int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    return code;
}
}  // namespace cmp

#include "quant_blocks.cuh"

using namespace cmp;

int main(int argc, char** argv) {
    if (argc != 6) return fail(CMP_ERR_ARG, "usage: quant_decode_host TYPE_ID ROWS N IN.bin OUT.bin");
    const int type = std::atoi(argv[1]), rows = std::atoi(argv[2]), n = std::atoi(argv[3]);
    std::ifstream in(argv[4], std::ios::binary);
    const std::vector<char> blocks((std::istreambuf_iterator<char>(in)), {});
    std::vector<float> out((size_t)rows * n);
    const int rc = dispatch_quant(type, "quant_decode_host", [&](auto q) -> int {
        using Q = decltype(q);
        const int nb = n / Q::BV;
        if (n % Q::BV || blocks.size() != (size_t)rows * nb * Q::BYTES) return fail(CMP_ERR_ARG, "input size");
        std::vector<uint8_t> body((size_t)rows * nb * Q::BODY), head((size_t)rows * nb * Q::HEAD + 1);
        for (size_t b = 0; b < (size_t)rows * nb; ++b) {  // repack_kernel's threads, one after another
            const size_t r = b / nb;
            Q::repack(reinterpret_cast<const uint8_t*>(blocks.data()) + b * Q::BYTES, body.data() + r * nb * Q::BODY,
                      head.data() + r * nb * Q::HEAD, nb, (int)(b % nb));
        }
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < n / 32; ++c) {  // embed_quant_kernel's value of each code
                SubBlock sb;
                Q::decode(Q::load(body.data() + (size_t)r * nb * Q::BODY, head.data() + (size_t)r * nb * Q::HEAD, nb, c),
                          c % (Q::BV / 32), sb);
                for (int v = 0; v < 32; ++v) {
                    const float code = (float)(int8_t)(sb.q[v / 4] >> (8 * (v % 4)));
                    out[(size_t)r * n + 32 * c + v] = sb.s[v / 16] * code - sb.m[v / 16];
                }
            }
        return (int)CMP_OK;
    });
    if (rc != CMP_OK) return 1;
    std::ofstream(argv[5], std::ios::binary).write(reinterpret_cast<const char*>(out.data()),
                                                    (std::streamsize)(out.size() * sizeof(float)));
    return 0;
}
