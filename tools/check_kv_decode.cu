// Host check of the KV dequantisation bit tricks in cuda_src/attention_kv.cuh (the decode kernel's KvChunk and
// kv_load8 use them): every input byte combination against the plain formulas, bit for bit. Run by
// tests/test_kv_decode_host.py:  nvcc -O2 -std=c++17 tools/check_kv_decode.cu -o /tmp/check && /tmp/check
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../cuda_src/attention_kv.cuh"

using namespace cmp;

static int bad = 0;

static void expect(bool ok, const char* what, unsigned a, unsigned b, unsigned c, int k, float got, float want) {
    if (ok || bad >= 10) {
        bad += !ok;
        return;
    }
    ++bad;
    printf("MISMATCH %s: bytes %02x %02x %02x value %d: got %.9g want %.9g\n", what, a, b, c, k, got, want);
}

// The pair table as the kernel's shared-memory one (tq3_pairs_init): the float2 at byte offset `off` of one lane's
// slot; anything but a multiple of 128 inside the 64 entries is a bug.
struct PairTable {
    float2 entries[64];
    __host__ __device__ float2 operator()(uint32_t off) const {
        return (off & 127u) || off >= 64u * 128u ? make_float2(NAN, NAN) : entries[off / 128];
    }
};

static bool same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

int main() {
    // kv_quant.LLOYD_MAX_8 rounded to float, as the kernels hold it
    const float levels[8] = {-2.1520f, -1.3439f, -0.7560f, -0.2451f, 0.2451f, 0.7560f, 1.3439f, 2.1520f};
    for (int c = 0; c < 8; ++c) expect(same_bits(tq3_level(c), levels[c]), "tq3_level", c, 0, 0, c, tq3_level(c), levels[c]);
    PairTable pairs;
    for (int e = 0; e < 64; ++e) pairs.entries[e] = tq3_pair_levels(e);
    long n = 0;
    for (unsigned b0 = 0; b0 < 256; ++b0)
        for (unsigned b1 = 0; b1 < 256; ++b1)
            for (unsigned b2 = 0; b2 < 256; ++b2) {
                float xl[8], xs[8];
                tq3_levels_pairs(b0, b1, b2, pairs, xl);
                tq3_levels_sel(b0, b1, b2, xs);
                for (int k = 0; k < 8; ++k) {
                    const int c = (b0 >> k & 1) | (b1 >> k & 1) << 1 | (b2 >> k & 1) << 2;
                    expect(same_bits(xl[k], levels[c]), "tq3_levels_pairs", b0, b1, b2, k, xl[k], levels[c]);
                    expect(same_bits(xs[k], levels[c]), "tq3_levels_sel", b0, b1, b2, k, xs[k], levels[c]);
                    n += 2;
                }
            }
    for (unsigned v = 0; v < 256; ++v)
        for (int i = 0; i < 4; ++i) {
            const unsigned w = v << (8 * i) | (0xa5u & ~(0xffu << (8 * i)));   // other bytes non-zero
            // q8_0: int8 q at byte i
            const float q8 = kv_byte_f32(w ^ 0x80808080u, i, 128.f);
            expect(same_bits(q8, (float)(signed char)v), "q8_0 byte", v, 0, 0, i, q8, (float)(signed char)v);
            // q4_0: low and high nibbles, stored q + 8
            const float lo = kv_byte_f32(w & 0x0f0f0f0fu, i, 8.f), hi = kv_byte_f32(w >> 4 & 0x0f0f0f0fu, i, 8.f);
            expect(same_bits(lo, (float)((int)(v & 15) - 8)), "q4_0 low nibble", v, 0, 0, i, lo, (float)((int)(v & 15) - 8));
            expect(same_bits(hi, (float)((int)(v >> 4) - 8)), "q4_0 high nibble", v, 0, 0, i, hi, (float)((int)(v >> 4) - 8));
            n += 3;
        }
    if (bad) {
        printf("FAILED: %d of %ld decoded values differ\n", bad, n);
        return 1;
    }
    printf("ok: %ld decoded values bit-exact\n", n);
    return 0;
}
