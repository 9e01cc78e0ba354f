// Device layout and decoders of the block-quantized weight types other than Q8_0 (matmul_quant.cu).
//
// Layout: cmp_quant_repack rewrites each weight row's blocks into planes, body [rows, nb * BODY] and head
// [rows, nb * HEAD] (nb blocks per row; per row each plane holds its field of every block of the row, block after
// block). Quants are rearranged so that one 32-value sub-block is a contiguous run of each body plane (16 bytes of
// low 4 bits, 8 bytes of 2-bit fields, 4 bytes of single bits) in a fixed bit order; scales stay in the file's
// encoding, except Q4_K/Q5_K's 12 bytes of packed 6-bit scales and mins, rearranged in place (k_scales_repack). So a
// GEMV lane that takes sub-block c of a row reads only that sub-block's bytes, with 16/8/4-byte loads that are
// coalesced across the warp's lanes (consecutive sub-blocks); only the per-256 header (Q4_K/Q5_K d, dmin and 12 scale
// bytes; IQ4_XS d and scales) is read by the 8 lanes of one super-block together. The byte count is the file's less
// any padding: none is added.
// Bit orders (I < 8 an output int, k < 4 its byte: value 4I + k of the sub-block):
//  - nibbles, 16 bytes: byte i holds value i (low nibble) and value 16 + i (high nibble), as Q4_0's file order;
//    IQ4 types instead hold values 2i and 2i + 1 (table lookups of a 32-bit word give values in order);
//  - pairs (2-bit fields), 8 bytes = words h0, h1: value 4I + k in bits 2 (I % 4) of byte k of word I / 4;
//  - bits, 4 bytes = word h: value 4I + k in bit 8k + I.
// File block layouts (ggml-common.h, as read by gguf.quants): see each type.
//
// A decoder gives, for sub-block c of a row (j = c % (BV / 32) its index in the block), the 32 codes as int8 in
// value order (8 ints, 4 values each), a float scale per 16-value half s[2] and a float min per half m[2], so that
// value = s * code - m exactly (s and m are an f16 times a small integer: exact in fp32). PER16: the two halves
// have their own scales (Q2_K, Q3_K, Q6_K); MIN: the type has a min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K); BIAS: the codes
// are stored with that offset (Q4_0 8, Q5_0 16, Q3_K 4, Q6_K 32), which decode takes off and decode_biased leaves
// on. Decoding is split into load (the raw registers, so that a lane's loads of several sub-blocks are in flight
// together) and decode (integer unpacking). repack writes file block b of a row (src: its BYTES bytes) into the
// row's planes.
#pragma once
#include "common.cuh"

namespace cmp {

// ggml type ids (api.h CmpQuantType).
enum QuantId { QID_Q4_0 = 2, QID_Q4_1 = 3, QID_Q5_0 = 6, QID_Q5_1 = 7, QID_Q2_K = 10, QID_Q3_K = 11, QID_Q4_K = 12,
               QID_Q5_K = 13, QID_Q6_K = 14, QID_IQ2_XXS = 16, QID_IQ2_XS = 17, QID_IQ3_XXS = 18, QID_IQ1_S = 19,
               QID_IQ4_NL = 20, QID_IQ3_S = 21, QID_IQ2_S = 22, QID_IQ4_XS = 23, QID_IQ1_M = 29 };

struct SubBlock {
    int q[8];     // 32 codes, int8, value order
    float s[2];   // scale of values 0..15 and 16..31
    float m[2];   // min of each half (0 where the type has none)
};

__device__ __forceinline__ int4 ld16(const uint8_t* p) { return __ldg(reinterpret_cast<const int4*>(p)); }
__device__ __forceinline__ uint2 ld8(const uint8_t* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
__device__ __forceinline__ int ld4(const uint8_t* p) { return __ldg(reinterpret_cast<const int*>(p)); }
__device__ __forceinline__ unsigned ld2(const uint8_t* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
__device__ __forceinline__ unsigned ld1(const uint8_t* p) { return __ldg(p); }
__device__ __forceinline__ float ldh(const uint8_t* p) { return __half2float(__ldg(reinterpret_cast<const __half*>(p))); }
__device__ __forceinline__ float2 ldh2(const uint8_t* p) {
    return __half22float2(__ldg(reinterpret_cast<const __half2*>(p)));
}

// ---- repack helpers (thread per file block) ------------------------------------------------------------------------

// code(v) of the sub-block's values v < 32 into the orders above.
template <class F>
__device__ __forceinline__ void put_nibbles(uint8_t* dst, F code) {  // 16 bytes
    for (int i = 0; i < 16; ++i) dst[i] = (uint8_t)(code(i) | code(16 + i) << 4);
}
template <class F>
__device__ __forceinline__ void put_nibbles_iq4(uint8_t* dst, F code) {  // 16 bytes
    for (int i = 0; i < 16; ++i) dst[i] = (uint8_t)(code(2 * i) | code(2 * i + 1) << 4);
}
template <class F>
__device__ __forceinline__ void put_pairs(uint8_t* dst, F code) {  // 8 bytes
    for (int i = 0; i < 8; ++i) dst[i] = 0;
    for (int v = 0; v < 32; ++v) dst[4 * (v / 16) + v % 4] |= (uint8_t)(code(v) << (2 * (v / 4 % 4)));
}
template <class F>
__device__ __forceinline__ void put_bits(uint8_t* dst, F bit) {  // 4 bytes
    for (int i = 0; i < 4; ++i) dst[i] = 0;
    for (int v = 0; v < 32; ++v) dst[v % 4] |= (uint8_t)(bit(v) << (v / 4));
}
__device__ __forceinline__ void copy_bytes(uint8_t* dst, const uint8_t* src, int n) {
    for (int i = 0; i < n; ++i) dst[i] = src[i];
}

// ---- decode helpers ------------------------------------------------------------------------------------------------

__device__ __forceinline__ void nibbles(const int4 v, int (&q)[8]) {
    const int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q[i] = w[i] & 0x0F0F0F0F;
        q[4 + i] = (w[i] >> 4) & 0x0F0F0F0F;
    }
}
// The pairs of h (shifted left by `up` bits within each byte) into q.
__device__ __forceinline__ void or_pairs(const uint2 h, int up, int (&q)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] |= (int)((((i < 4 ? h.x : h.y) >> (2 * (i & 3))) & 0x03030303u) << up);
}
__device__ __forceinline__ void or_bits(const unsigned h, int up, int (&q)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] |= (int)(((h >> i) & 0x01010101u) << up);
}

// A decoder's codes with the type's bias taken off each byte (decode_biased gives them as stored, 0..2 BIAS - 1).
__device__ __forceinline__ void unbias(SubBlock& o, int bias) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o.q[i] = (int)__vsub4(o.q[i], (unsigned)bias * 0x01010101u);
}

// prmt.b32 in PTX's default mode: byte k of the result is byte (s_k & 7) of b:a, where s_k is selector nibble k of
// s's low 16 bits, or that byte's sign bit replicated where bit 3 of s_k is set. (__byte_perm clears bit 3 of every
// nibble first: one more instruction per call, sm_90 SASS.)
__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned s) {
    unsigned r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}

// The 16-entry IQ4 table (int8) looked up for the 8 nibbles of v (nibble order = value order): per half word, two
// 8-byte byte permutes (entries 0..7 by the nibble itself: where bit 3 is set the byte is sign garbage, never picked;
// entries 8..15 by the nibble less bit 3) and a third that takes byte k from the first or the second by bit 3 of
// index k (pick: selectors 0..7 only).
__device__ __forceinline__ int2 iq4_lookup8(unsigned v) {
    constexpr unsigned T0 = 0xBFAD9881u, T1 = 0xF6EADDCFu, T2 = 0x26190D01u, T3 = 0x71594535u;  // kvalues, bytes LE
    const unsigned low3 = v & 0x77777777u, pick = ((v >> 1) & 0x44444444u) | 0x32103210u;
    const unsigned lo0 = prmt(T0, T1, v), hi0 = prmt(T2, T3, low3);
    const unsigned lo1 = prmt(T0, T1, v >> 16), hi1 = prmt(T2, T3, low3 >> 16);
    return make_int2((int)prmt(lo0, hi0, pick), (int)prmt(lo1, hi1, pick >> 16));
}
__device__ __forceinline__ void iq4_codes(const int4 v, int (&q)[8]) {
    const int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int2 r = iq4_lookup8((unsigned)w[i]);
        q[2 * i] = r.x;
        q[2 * i + 1] = r.y;
    }
}

// IQ4 file order (value i < 16: low nibble of qs[i], 16 + i: its high nibble) as a code function.
__device__ __forceinline__ int file_nibble(const uint8_t* qs, int v) { return v < 16 ? qs[v] & 15 : qs[v - 16] >> 4; }

// ---- 32-value blocks (one sub-block each; body and head are the file's fields, IQ4_NL's nibbles reordered) ------

// Q4_0: d f16 | qs[16]; value i = d * ((qs[i % 16] >> 4 (i / 16)) & 15) - 8d. body: qs; head: d.
struct Q4_0 {
    static constexpr int ID = QID_Q4_0, BV = 32, BYTES = 18, HEAD = 2, BODY = 16, BIAS = 8;
    static constexpr bool PER16 = false, MIN = false;
    struct Raw { int4 qs; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        copy_bytes(head + 2 * b, src, 2);
        copy_bytes(body + 16 * b, src + 2, 16);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        return {ld16(body + 16 * c), ldh(head + 2 * c)};
    }
    static __device__ __forceinline__ void decode_biased(const Raw& r, int, SubBlock& o) {
        nibbles(r.qs, o.q);
        o.s[0] = o.s[1] = r.d;
        o.m[0] = o.m[1] = 0.f;
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        decode_biased(r, j, o);
        unbias(o, BIAS);
    }
};

// Q4_1: d, m f16 | qs[16]; value = d * nibble + m. body: qs; head: d, m.
struct Q4_1 {
    static constexpr int ID = QID_Q4_1, BV = 32, BYTES = 20, HEAD = 4, BODY = 16, BIAS = 0;
    static constexpr bool PER16 = false, MIN = true;
    struct Raw { int4 qs; float2 dm; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        copy_bytes(head + 4 * b, src, 4);
        copy_bytes(body + 16 * b, src + 4, 16);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        return {ld16(body + 16 * c), ldh2(head + 4 * c)};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
        nibbles(r.qs, o.q);
        o.s[0] = o.s[1] = r.dm.x;
        o.m[0] = o.m[1] = -r.dm.y;
    }
};

// Q5_0: d f16 | qh u32 | qs[16]; value i = d * (nibble | bit i of qh << 4) - 16d. body: qh, qs (20 bytes: 4-byte
// loads); head: d.
struct Q5_0 {
    static constexpr int ID = QID_Q5_0, BV = 32, BYTES = 22, HEAD = 2, BODY = 20, BIAS = 16;
    static constexpr bool PER16 = false, MIN = false;
    struct Raw { int w[5]; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        copy_bytes(head + 2 * b, src, 2);
        copy_bytes(body + 20 * b, src + 2, 20);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        Raw r;
#pragma unroll
        for (int i = 0; i < 5; ++i) r.w[i] = ld4(body + 20 * c + 4 * i);
        r.d = ldh(head + 2 * c);
        return r;
    }
    // The low 4 bits of h (bit k) -> bit 0 of byte k (the four shifted copies of a 4-bit value never overlap, so
    // no carries; the higher bits of h are masked off first, they would).
    static __device__ __forceinline__ int spread4(unsigned h) { return (int)(((h & 15u) * 0x00204081u) & 0x01010101u); }
    static __device__ __forceinline__ void unpack(const int (&w)[5], int (&q)[8]) {
        const unsigned qh = (unsigned)w[0];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[i] = (w[1 + i] & 0x0F0F0F0F) | (spread4(qh >> (4 * i)) << 4);
            q[4 + i] = ((w[1 + i] >> 4) & 0x0F0F0F0F) | (spread4(qh >> (16 + 4 * i)) << 4);
        }
    }
    static __device__ __forceinline__ void decode_biased(const Raw& r, int, SubBlock& o) {
        unpack(r.w, o.q);
        o.s[0] = o.s[1] = r.d;
        o.m[0] = o.m[1] = 0.f;
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        decode_biased(r, j, o);
        unbias(o, BIAS);
    }
};

// Q5_1: d, m f16 | qh u32 | qs[16]; value = d * (5-bit code) + m. body: qh, qs; head: d, m.
struct Q5_1 {
    static constexpr int ID = QID_Q5_1, BV = 32, BYTES = 24, HEAD = 4, BODY = 20, BIAS = 0;
    static constexpr bool PER16 = false, MIN = true;
    struct Raw { int w[5]; float2 dm; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        copy_bytes(head + 4 * b, src, 4);
        copy_bytes(body + 20 * b, src + 4, 20);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        Raw r;
#pragma unroll
        for (int i = 0; i < 5; ++i) r.w[i] = ld4(body + 20 * c + 4 * i);
        r.dm = ldh2(head + 4 * c);
        return r;
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
        Q5_0::unpack(r.w, o.q);
        o.s[0] = o.s[1] = r.dm.x;
        o.m[0] = o.m[1] = -r.dm.y;
    }
};

// IQ4_NL: d f16 | qs[16] as Q4_0; value = d * kvalues[nibble]. body: the nibbles in IQ4 order; head: d.
struct IQ4_NL {
    static constexpr int ID = QID_IQ4_NL, BV = 32, BYTES = 18, HEAD = 2, BODY = 16, BIAS = 0;
    static constexpr bool PER16 = false, MIN = false;
    using Raw = Q4_0::Raw;
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        copy_bytes(head + 2 * b, src, 2);
        put_nibbles_iq4(body + 16 * b, [&](int v) { return file_nibble(src + 2, v); });
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        return {ld16(body + 16 * c), ldh(head + 2 * c)};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
        iq4_codes(r.qs, o.q);
        o.s[0] = o.s[1] = r.d;
        o.m[0] = o.m[1] = 0.f;
    }
};

// ---- 256-value super-blocks (K-quants, IQ4_XS): sub-block c = 8 b + j -------------------------------------------

// Q2_K: scales[16] | qs[64] | d, dmin f16. Value v = 128h + 32s + l (h < 2, s < 4, l < 32) is
// (qs[32h + l] >> 2s) & 3; 16-value group g = v / 16 has scale d * (scales[g] & 15), min dmin * (scales[g] >> 4).
// body: pairs, 8 bytes per sub-block; head: scales [nb, 16] then d, dmin [nb, 4].
struct Q2_K {
    static constexpr int ID = QID_Q2_K, BV = 256, BYTES = 84, HEAD = 20, BODY = 64, BIAS = 0;
    static constexpr bool PER16 = true, MIN = true;
    struct Raw { uint2 q; unsigned sc; float2 dm; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        for (int j = 0; j < 8; ++j)
            put_pairs(body + 8 * (8 * b + j), [&](int l) { return (src[16 + 32 * (j >> 2) + l] >> 2 * (j & 3)) & 3; });
        copy_bytes(head + 16 * b, src, 16);
        copy_bytes(head + 16 * nb + 4 * b, src + 80, 4);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {ld8(body + 8 * c), ld2(head + 2 * c), ldh2(head + 16 * nb + 4 * (c >> 3))};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = 0;
        or_pairs(r.q, 0, o.q);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const unsigned b = (r.sc >> (8 * k)) & 0xFF;
            o.s[k] = r.dm.x * (float)(b & 15);
            o.m[k] = r.dm.y * (float)(b >> 4);
        }
    }
};

// Q3_K: hmask[32] | qs[64] | scales[12] | d f16. Value v = 128h + 32s + l: low bits (qs[32h + l] >> 2s) & 3, high
// bit = bit (v / 32) of hmask[l]; code = low + 4 * high - 4. Group g = v / 16 has a 6-bit scale: low 4 bits from
// scales[g % 8] (nibble g / 8), high 2 from scales[8 + g % 4] (bits 2 (g / 4)); scale = d * (that - 32).
// body: low pairs [nb, 8 x 8] then high bits [nb, 8 x 4]; head: per sub-block a byte of the two halves' low scale
// nibbles [nb, 8], per 4 sub-blocks a u16 of their high scale bits (2 per half) [nb, 4], d [nb, 2].
struct Q3_K {
    static constexpr int ID = QID_Q3_K, BV = 256, BYTES = 110, HEAD = 14, BODY = 96, BIAS = 4;
    static constexpr bool PER16 = true, MIN = false;
    struct Raw { uint2 lo; unsigned hi, s4, s2; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        const uint8_t *hm = src, *qs = src + 32, *sc = src + 96;
        auto lo4 = [&](int g) { return (sc[g % 8] >> 4 * (g / 8)) & 15; };
        auto hi2 = [&](int g) { return (sc[8 + g % 4] >> 2 * (g / 4)) & 3; };
        for (int j = 0; j < 8; ++j) {
            const int c = 8 * b + j;
            put_pairs(body + 8 * c, [&](int l) { return (qs[32 * (j >> 2) + l] >> 2 * (j & 3)) & 3; });
            put_bits(body + 64 * nb + 4 * c, [&](int l) { return (hm[l] >> j) & 1; });
            head[c] = (uint8_t)(lo4(2 * j) | lo4(2 * j + 1) << 4);
        }
        for (int p = 0; p < 2; ++p) {
            unsigned h = 0;
            for (int j = 4 * p; j < 4 * p + 4; ++j) h |= (unsigned)(hi2(2 * j) | hi2(2 * j + 1) << 2) << 4 * (j & 3);
            head[8 * nb + 2 * (2 * b + p)] = (uint8_t)h;
            head[8 * nb + 2 * (2 * b + p) + 1] = (uint8_t)(h >> 8);
        }
        copy_bytes(head + 12 * nb + 2 * b, src + 108, 2);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {ld8(body + 8 * c), (unsigned)ld4(body + 64 * nb + 4 * c), ld1(head + c),
                ld2(head + 8 * nb + 2 * (c >> 2)), ldh(head + 12 * nb + 2 * (c >> 3))};
    }
    static __device__ __forceinline__ void decode_biased(const Raw& r, int j, SubBlock& o) {
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = 0;
        or_pairs(r.lo, 0, o.q);
        or_bits(r.hi, 2, o.q);
        const unsigned s2 = r.s2 >> (4 * (j & 3));
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int sc = (int)(((r.s4 >> (4 * k)) & 15) | ((s2 >> (2 * k)) & 3) << 4);
            o.s[k] = r.d * (float)(sc - 32);
            o.m[k] = 0.f;
        }
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        decode_biased(r, j, o);
        unbias(o, BIAS);
    }
};

// The 6-bit scale and min of sub-block j of Q4_K/Q5_K from the file's 12 packed bytes q (ggml's get_scale_min_k4):
// j < 4: low 6 bits of bytes j and j + 4; j >= 4: low / high nibble of byte j + 4, with bits 4-5 from the top 2 bits
// of bytes j - 4 / j.
__device__ __forceinline__ void k_scale_min_file(const uint8_t* q, int j, int& sc, int& mn) {
    sc = j < 4 ? q[j] & 63 : (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
    mn = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | (q[j] >> 6) << 4;
}

// The same 12 bytes as the head holds them (repack), so that a GEMV lane, whose j is the same in every sub-block it
// takes, gets sub-block j's pair by lane-constant selectors and no select on j: byte j (j < 8) = sc_j |
// (mn_j & 3) << 6, then the 32-bit word of nibbles with nibble j = mn_j >> 2. In the file's encoding (the selects and
// shifts by j of get_scale_min_k4) the pair cost 11 instructions per row and sub-block on sm_90 (SASS, nvcc 13.0)
// besides the two int->float conversions, ~20% of the T = 1 GEMV's per-sub-block work; here 5 (PRMT, a funnel
// rotate, two LOP3, LEA).
__device__ inline void k_scales_repack(const uint8_t* q, uint8_t* dst) {
    for (int i = 0; i < 12; ++i) dst[i] = 0;
    for (int j = 0; j < 8; ++j) {
        int sc, mn;
        k_scale_min_file(q, j, sc, mn);
        dst[j] = (uint8_t)(sc | (mn & 3) << 6);
        dst[8 + j / 2] |= (uint8_t)((mn >> 2) << 4 * (j & 1));
    }
}
// Sub-block j's scale and min from the repacked words s0, s1 (bytes 0-7) and s2 (the nibbles): byte j into bytes 0
// and 3 (sc: its low 6 bits; its top 2 bits, mn's low ones, at bits 30-31), nibble j rotated to bits 2-5. Same
// integers as k_scale_min_file.
__device__ __forceinline__ void k_scale_min(unsigned s0, unsigned s1, unsigned s2, int j, int& sc, int& mn) {
    const unsigned t = prmt(s0, s1, (unsigned)j * 0x1001u);
    const unsigned r = __funnelshift_r(s2, s2, (unsigned)(4 * j - 2) & 31u);
    sc = (int)(t & 63u);
    mn = (int)((r & 0x3Cu) | t >> 30);
}

// The nibble of value l of sub-block j in Q4_K/Q5_K's qs[128]: nibble (j & 1) of qs[32 (j / 2) + l].
__device__ __forceinline__ int k_nibble(const uint8_t* qs, int j, int l) { return (qs[32 * (j >> 1) + l] >> 4 * (j & 1)) & 15; }

// Q4_K: d, dmin f16 | scales[12] | qs[128]; value = d * sc_j * nibble - dmin * m_j. body: nibbles, 16 bytes per
// sub-block; head: d, dmin as in the file, then the scales as k_scales_repack writes them (16 bytes per block).
struct Q4_K {
    static constexpr int ID = QID_Q4_K, BV = 256, BYTES = 144, HEAD = 16, BODY = 128, BIAS = 0;
    static constexpr bool PER16 = false, MIN = true;
    struct Raw { int4 qs, hdr; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        for (int j = 0; j < 8; ++j) put_nibbles(body + 16 * (8 * b + j), [&](int l) { return k_nibble(src + 16, j, l); });
        copy_bytes(head + 16 * b, src, 4);
        k_scales_repack(src + 4, head + 16 * b + 4);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        return {ld16(body + 16 * c), ld16(head + 16 * (c >> 3))};
    }
    // A GEMV lane's cursor (GemvLane in matmul_quant.cuh): its planes at sub-block c, loads k sub-blocks on (k a
    // multiple of 8) at constant offsets.
    struct Lane {
        const uint8_t *qs, *hdr;
        static __device__ __forceinline__ Lane at(const uint8_t* body, const uint8_t* head, int, int c) {
            return {body + 16 * c, head + 16 * (c >> 3)};
        }
        __device__ __forceinline__ Raw load(int k) const { return {ld16(qs + 16 * k), ld16(hdr + 2 * k)}; }
        __device__ __forceinline__ void advance(int k) { qs += 16 * k, hdr += 2 * k; }
        static constexpr bool WHOLE_ROUNDS = true;   // the GEMV's rolling loop refills whole rounds unchecked
    };
    static __device__ __forceinline__ void scales(const int4& hdr, int j, SubBlock& o) {
        const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&hdr.x));
        int sc, mn;
        k_scale_min((unsigned)hdr.y, (unsigned)hdr.z, (unsigned)hdr.w, j, sc, mn);
        o.s[0] = o.s[1] = dm.x * (float)sc;
        o.m[0] = o.m[1] = dm.y * (float)mn;
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        nibbles(r.qs, o.q);
        scales(r.hdr, j, o);
    }
};

// Q5_K: d, dmin f16 | scales[12] | qh[32] | qs[128]. As Q4_K, plus bit j of qh[l] as bit 4 of the code. body:
// nibbles [nb, 8 x 16] then high bits [nb, 8 x 4]; head as Q4_K's (scales repacked).
struct Q5_K {
    static constexpr int ID = QID_Q5_K, BV = 256, BYTES = 176, HEAD = 16, BODY = 160, BIAS = 0;
    static constexpr bool PER16 = false, MIN = true;
    struct Raw { int4 qs, hdr; unsigned qh; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        for (int j = 0; j < 8; ++j) {
            const int c = 8 * b + j;
            put_nibbles(body + 16 * c, [&](int l) { return k_nibble(src + 48, j, l); });
            put_bits(body + 128 * nb + 4 * c, [&](int l) { return (src[16 + l] >> j) & 1; });
        }
        copy_bytes(head + 16 * b, src, 4);
        k_scales_repack(src + 4, head + 16 * b + 4);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {ld16(body + 16 * c), ld16(head + 16 * (c >> 3)), (unsigned)ld4(body + 128 * nb + 4 * c)};
    }
    struct Lane {  // as Q4_K's
        const uint8_t *qs, *hdr, *qh;
        static __device__ __forceinline__ Lane at(const uint8_t* body, const uint8_t* head, int nb, int c) {
            return {body + 16 * c, head + 16 * (c >> 3), body + 128 * nb + 4 * c};
        }
        __device__ __forceinline__ Raw load(int k) const {
            return {ld16(qs + 16 * k), ld16(hdr + 2 * k), (unsigned)ld4(qh + 4 * k)};
        }
        __device__ __forceinline__ void advance(int k) { qs += 16 * k, hdr += 2 * k, qh += 4 * k; }
        static constexpr bool WHOLE_ROUNDS = false;  // (with them ptxas spills under the rolling shape's cap)
    };
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        nibbles(r.qs, o.q);
        or_bits(r.qh, 4, o.q);
        Q4_K::scales(r.hdr, j, o);
    }
};

// Q6_K: ql[128] | qh[64] | scales[16] int8 | d f16. Value v = 128h + 32s + l: low nibble (s / 2) of
// ql[64h + 32 (s & 1) + l], high 2 bits (qh[32h + l] >> 2s) & 3; code = that - 32; group v / 16 scale d * scales[g].
// body: low nibbles [nb, 8 x 16] then high pairs [nb, 8 x 8]; head: scales [nb, 16] then d [nb, 2].
struct Q6_K {
    static constexpr int ID = QID_Q6_K, BV = 256, BYTES = 210, HEAD = 18, BODY = 192, BIAS = 32;
    static constexpr bool PER16 = true, MIN = false;
    struct Raw { int4 ql; uint2 qh; unsigned sc; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        for (int j = 0; j < 8; ++j) {
            const int c = 8 * b + j, h = j >> 2, s = j & 3;
            put_nibbles(body + 16 * c, [&](int l) { return (src[64 * h + 32 * (s & 1) + l] >> 4 * (s >> 1)) & 15; });
            put_pairs(body + 128 * nb + 8 * c, [&](int l) { return (src[128 + 32 * h + l] >> 2 * s) & 3; });
        }
        copy_bytes(head + 16 * b, src + 192, 16);
        copy_bytes(head + 16 * nb + 2 * b, src + 208, 2);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {ld16(body + 16 * c), ld8(body + 128 * nb + 8 * c), ld2(head + 2 * c),
                ldh(head + 16 * nb + 2 * (c >> 3))};
    }
    struct Lane {  // as Q4_K's
        const uint8_t *ql, *qh, *sc, *d;
        static __device__ __forceinline__ Lane at(const uint8_t* body, const uint8_t* head, int nb, int c) {
            return {body + 16 * c, body + 128 * nb + 8 * c, head + 2 * c, head + 16 * nb + 2 * (c >> 3)};
        }
        __device__ __forceinline__ Raw load(int k) const {
            return {ld16(ql + 16 * k), ld8(qh + 8 * k), ld2(sc + 2 * k), ldh(d + k / 4)};
        }
        __device__ __forceinline__ void advance(int k) { ql += 16 * k, qh += 8 * k, sc += 2 * k, d += k / 4; }
        static constexpr bool WHOLE_ROUNDS = true;
    };
    static __device__ __forceinline__ void decode_biased(const Raw& r, int, SubBlock& o) {
        nibbles(r.ql, o.q);
        or_pairs(r.qh, 4, o.q);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            o.s[k] = r.d * (float)(int8_t)((r.sc >> (8 * k)) & 0xFF);
            o.m[k] = 0.f;
        }
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        decode_biased(r, j, o);
        unbias(o, BIAS);
    }
};

// IQ4_XS: d f16 | scales_h u16 | scales_l[4] | qs[128]. Sub-block j: 6-bit scale ls = nibble (j & 1) of
// scales_l[j / 2] | bits 2j..2j+1 of scales_h << 4; values kvalues[nibble] of qs[16j .. 16j + 15] as IQ4_NL;
// value = d * (ls - 32) * kvalue. body: the nibbles in IQ4 order, 16 bytes per sub-block; head: d, scales_h,
// scales_l (8 bytes) per block.
struct IQ4_XS {
    static constexpr int ID = QID_IQ4_XS, BV = 256, BYTES = 136, HEAD = 8, BODY = 128, BIAS = 0;
    static constexpr bool PER16 = false, MIN = false;
    struct Raw { int4 qs; uint2 h; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        for (int j = 0; j < 8; ++j)
            put_nibbles_iq4(body + 16 * (8 * b + j), [&](int v) { return file_nibble(src + 8 + 16 * j, v); });
        copy_bytes(head + 8 * b, src, 8);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        return {ld16(body + 16 * c), ld8(head + 8 * (c >> 3))};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        iq4_codes(r.qs, o.q);
        const float d = __half2float(__ushort_as_half((unsigned short)(r.h.x & 0xFFFF)));
        const int lo = (r.h.y >> (4 * j)) & 15, hi = (r.h.x >> (16 + 2 * j)) & 3;
        o.s[0] = o.s[1] = d * (float)((lo | (hi << 4)) - 32);
        o.m[0] = o.m[1] = 0.f;
    }
};

}  // namespace cmp

#include "quant_blocks_iq.cuh"  // defines: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (the grid types)

namespace cmp {

// Calls f(Type{}) for the decoder of ggml type id `id`; unknown ids fail naming `what`.
template <typename F>
int dispatch_quant(int id, const char* what, F&& f) {
    switch (id) {
        case QID_Q4_0: return f(Q4_0{});
        case QID_Q4_1: return f(Q4_1{});
        case QID_Q5_0: return f(Q5_0{});
        case QID_Q5_1: return f(Q5_1{});
        case QID_Q2_K: return f(Q2_K{});
        case QID_Q3_K: return f(Q3_K{});
        case QID_Q4_K: return f(Q4_K{});
        case QID_Q5_K: return f(Q5_K{});
        case QID_Q6_K: return f(Q6_K{});
        case QID_IQ4_NL: return f(IQ4_NL{});
        case QID_IQ4_XS: return f(IQ4_XS{});
        case QID_IQ2_XXS: return f(IQ2_XXS{});
        case QID_IQ2_XS: return f(IQ2_XS{});
        case QID_IQ2_S: return f(IQ2_S{});
        case QID_IQ3_XXS: return f(IQ3_XXS{});
        case QID_IQ3_S: return f(IQ3_S{});
        case QID_IQ1_S: return f(IQ1_S{});
        case QID_IQ1_M: return f(IQ1_M{});
        default: return fail(CMP_ERR_ARG, "%s: unknown quant type id %d", what, id);
    }
}

}  // namespace cmp
