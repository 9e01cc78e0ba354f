// Device layout and decoders of the block-quantized weight types other than Q8_0 (matmul_quant.cu).
//
// Layout: a GGUF block of `BYTES` bytes is split at load (cmp_quant_repack) into its f16 fields ("head", HEAD
// bytes at HEAD_AT in the file's block) and the rest ("body", BODY bytes, in file order): body [rows, nb, BODY],
// head [rows, nb, HEAD]. Every body is a multiple of 4 bytes (Q4_0/IQ4_NL/Q2_K/Q6_K/IQ4_XS/Q4_K/Q5_K: of 16), so a
// lane reads it with 16- or 4-byte loads, where the file's 18/110/210-byte blocks are only 2-byte aligned.
// Q4_K and Q5_K keep the whole block as body (144 and 176 bytes: already 16-byte aligned).
// Block layouts (ggml-common.h, as read by gguf.quants): see each decoder.
//
// A decoder gives, for block b and its 32-value sub-block j (j < BV/32), the 32 codes as int8 in value order
// (8 ints, 4 values each), a float scale per 16-value half s[2] and a float min per half m[2], so that
// value = s * code - m exactly (s and m are an f16 times a small integer: exact in fp32). PER16: the two halves
// have their own scales (Q2_K, Q3_K, Q6_K); MIN: the type has a min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K). Decoding is
// split into load (the raw registers, so that a lane's loads of several sub-blocks are in flight together) and
// decode (integer unpacking).
#pragma once
#include "common.cuh"

namespace cmp {

// ggml type ids (api.h CmpQuantType).
enum QuantId { QID_Q4_0 = 2, QID_Q4_1 = 3, QID_Q5_0 = 6, QID_Q5_1 = 7, QID_Q2_K = 10, QID_Q3_K = 11, QID_Q4_K = 12,
               QID_Q5_K = 13, QID_Q6_K = 14, QID_IQ4_NL = 20, QID_IQ4_XS = 23 };

struct SubBlock {
    int q[8];     // 32 codes, int8, value order
    float s[2];   // scale of values 0..15 and 16..31
    float m[2];   // min of each half (0 where the type has none)
};

__device__ __forceinline__ int4 ld16(const uint8_t* p) { return __ldg(reinterpret_cast<const int4*>(p)); }
__device__ __forceinline__ int ld4(const uint8_t* p) { return __ldg(reinterpret_cast<const int*>(p)); }
__device__ __forceinline__ float ldh(const uint8_t* p) { return __half2float(__ldg(reinterpret_cast<const __half*>(p))); }
__device__ __forceinline__ float2 ldh2(const uint8_t* p) {
    return __half22float2(__ldg(reinterpret_cast<const __half2*>(p)));
}

// The low 4 bits of h (bit k) -> bit 0 of byte k (the four shifted copies of a 4-bit value never overlap, so no
// carries; the higher bits of h are masked off first, they would).
__device__ __forceinline__ int spread4(unsigned h) { return (int)(((h & 15u) * 0x00204081u) & 0x01010101u); }

// The 16-entry IQ4 table (int8) looked up for 4 indices (the low nibbles of v's bytes, 0..15): two 8-byte byte
// permutes (entries 0..7 and 8..15) selected per byte by bit 3 of the index.
__device__ __forceinline__ int iq4_lookup(int v) {
    constexpr unsigned T0 = 0xBFAD9881u, T1 = 0xF6EADDCFu, T2 = 0x26190D01u, T3 = 0x71594535u;  // kvalues, bytes LE
    const unsigned s = (unsigned)v & 0x07070707u;
    const unsigned t = (s | (s >> 4)) & 0x00FF00FFu;
    const unsigned sel = (t | (t >> 8)) & 0xFFFFu;               // the four 3-bit indices as selector nibbles
    const unsigned lo = __byte_perm(T0, T1, sel), hi = __byte_perm(T2, T3, sel);
    const unsigned big = (((unsigned)v >> 3) & 0x01010101u) * 0xFFu;  // 0xFF where bit 3 is set
    // (not a sign-replicating byte permute: __byte_perm uses only the low 3 bits of each selector nibble)
    return (int)((hi & big) | (lo & ~big));
}

// ---- 32-value blocks -------------------------------------------------------------------------------------------

// Q4_0: d f16 | qs[16]; value i = d * ((qs[i % 16] >> 4 (i / 16)) & 15) - 8d.
struct Q4_0 {
    static constexpr int ID = QID_Q4_0, BV = 32, BYTES = 18, HEAD_AT = 0, HEAD = 2, BODY = 16;
    static constexpr bool PER16 = false, MIN = false;
    struct Raw { int4 qs; float d; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int) {
        return {ld16(body), ldh(head)};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
        const int v[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            o.q[i] = (int)__vsub4(v[i] & 0x0F0F0F0F, 0x08080808);
            o.q[4 + i] = (int)__vsub4((v[i] >> 4) & 0x0F0F0F0F, 0x08080808);
        }
        o.s[0] = o.s[1] = r.d;
        o.m[0] = o.m[1] = 0.f;
    }
};

// Q4_1: d, m f16 | qs[16]; value = d * nibble + m.
struct Q4_1 {
    static constexpr int ID = QID_Q4_1, BV = 32, BYTES = 20, HEAD_AT = 0, HEAD = 4, BODY = 16;
    static constexpr bool PER16 = false, MIN = true;
    struct Raw { int4 qs; float2 dm; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int) {
        return {ld16(body), ldh2(head)};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
        const int v[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            o.q[i] = v[i] & 0x0F0F0F0F;
            o.q[4 + i] = (v[i] >> 4) & 0x0F0F0F0F;
        }
        o.s[0] = o.s[1] = r.dm.x;
        o.m[0] = o.m[1] = -r.dm.y;
    }
};

// Q5_0: d f16 | qh u32 | qs[16]; value i = d * (nibble | bit i of qh << 4) - 16d.
struct Q5_0 {
    static constexpr int ID = QID_Q5_0, BV = 32, BYTES = 22, HEAD_AT = 0, HEAD = 2, BODY = 20;
    static constexpr bool PER16 = false, MIN = false;
    struct Raw { int w[5]; float d; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int) {
        Raw r;
#pragma unroll
        for (int i = 0; i < 5; ++i) r.w[i] = ld4(body + 4 * i);
        r.d = ldh(head);
        return r;
    }
    static __device__ __forceinline__ void unpack(const int (&w)[5], int (&q)[8]) {
        const unsigned qh = (unsigned)w[0];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[i] = (w[1 + i] & 0x0F0F0F0F) | (spread4(qh >> (4 * i)) << 4);
            q[4 + i] = ((w[1 + i] >> 4) & 0x0F0F0F0F) | (spread4(qh >> (16 + 4 * i)) << 4);
        }
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
        unpack(r.w, o.q);
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (int)__vsub4(o.q[i], 0x10101010);
        o.s[0] = o.s[1] = r.d;
        o.m[0] = o.m[1] = 0.f;
    }
};

// Q5_1: d, m f16 | qh u32 | qs[16]; value = d * (5-bit code) + m.
struct Q5_1 {
    static constexpr int ID = QID_Q5_1, BV = 32, BYTES = 24, HEAD_AT = 0, HEAD = 4, BODY = 20;
    static constexpr bool PER16 = false, MIN = true;
    struct Raw { int w[5]; float2 dm; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int) {
        Raw r;
#pragma unroll
        for (int i = 0; i < 5; ++i) r.w[i] = ld4(body + 4 * i);
        r.dm = ldh2(head);
        return r;
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
        Q5_0::unpack(r.w, o.q);
        o.s[0] = o.s[1] = r.dm.x;
        o.m[0] = o.m[1] = -r.dm.y;
    }
};

// IQ4_NL: d f16 | qs[16] as Q4_0; value = d * kvalues[nibble].
struct IQ4_NL {
    static constexpr int ID = QID_IQ4_NL, BV = 32, BYTES = 18, HEAD_AT = 0, HEAD = 2, BODY = 16;
    static constexpr bool PER16 = false, MIN = false;
    using Raw = Q4_0::Raw;
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int) {
        return {ld16(body), ldh(head)};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o) {
        const int v[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            o.q[i] = iq4_lookup(v[i]);
            o.q[4 + i] = iq4_lookup(v[i] >> 4);
        }
        o.s[0] = o.s[1] = r.d;
        o.m[0] = o.m[1] = 0.f;
    }
};

// ---- 256-value super-blocks (K-quants, IQ4_XS) -------------------------------------------------------------------

// Q2_K: scales[16] | qs[64] | d, dmin f16. Value v = 128h + 32s + l (h < 2, s < 4, l < 32) is
// (qs[32h + l] >> 2s) & 3; 16-value group g = v / 16 has scale d * (scales[g] & 15), min dmin * (scales[g] >> 4).
struct Q2_K {
    static constexpr int ID = QID_Q2_K, BV = 256, BYTES = 84, HEAD_AT = 80, HEAD = 4, BODY = 80;
    static constexpr bool PER16 = true, MIN = true;
    struct Raw { int4 q0, q1; int sc; float2 dm; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int j) {
        const uint8_t* qs = body + 16 + 32 * (j >> 2);
        return {ld16(qs), ld16(qs + 16), ld4(body + 4 * (j >> 1)), ldh2(head)};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        const int v[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
        const int sh = 2 * (j & 3);
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (v[i] >> sh) & 0x03030303;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int b = (r.sc >> (8 * (2 * (j & 1) + k))) & 0xFF;
            o.s[k] = r.dm.x * (float)(b & 15);
            o.m[k] = r.dm.y * (float)(b >> 4);
        }
    }
};

// Q3_K: hmask[32] | qs[64] | scales[12] | d f16. Value v = 128h + 32s + l: low bits (qs[32h + l] >> 2s) & 3, high
// bit = bit (v / 32) of hmask[l]; code = low + 4 * high - 4. Group g = v / 16 has a 6-bit scale: low 4 bits from
// scales[g % 8] (nibble g / 8), high 2 from scales[8 + g % 4] (bits 2 (g / 4)); scale = d * (that - 32).
struct Q3_K {
    static constexpr int ID = QID_Q3_K, BV = 256, BYTES = 110, HEAD_AT = 108, HEAD = 2, BODY = 108;
    static constexpr bool PER16 = true, MIN = false;
    struct Raw { int hm[8], ql[8], sc[3]; float d; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int j) {
        Raw r;
        const uint8_t* qs = body + 32 + 32 * (j >> 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            r.hm[i] = ld4(body + 4 * i);
            r.ql[i] = ld4(qs + 4 * i);
        }
#pragma unroll
        for (int i = 0; i < 3; ++i) r.sc[i] = ld4(body + 96 + 4 * i);
        r.d = ldh(head);
        return r;
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        const int sh = 2 * (j & 3);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int code = ((r.ql[i] >> sh) & 0x03030303) | (((r.hm[i] >> j) & 0x01010101) << 2);
            o.q[i] = (int)__vsub4(code, 0x04040404);
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int g = 2 * j + k;
            const int lo = ((g & 4 ? r.sc[1] : r.sc[0]) >> (8 * (g & 3) + 4 * (g >> 3))) & 15;  // no dynamic index
            const int hi = (r.sc[2] >> (8 * (g & 3) + 2 * (g >> 2))) & 3;
            o.s[k] = r.d * (float)((lo | (hi << 4)) - 32);
            o.m[k] = 0.f;
        }
    }
};

// The 6-bit scale and min of sub-block j of Q4_K/Q5_K from their 12 packed bytes (as 3 ints): j < 4: low 6 bits of
// bytes j and j + 4; j >= 4: low / high nibble of byte j + 4, with bits 4-5 from the top 2 bits of bytes j - 4 / j.
__device__ __forceinline__ void k_scale_min(int s0, int s1, int s2, int j, int& sc, int& mn) {
    const int sh = 8 * (j & 3);
    if (j < 4) {
        sc = (s0 >> sh) & 63;
        mn = (s1 >> sh) & 63;
    } else {
        sc = ((s2 >> sh) & 15) | (((s0 >> (sh + 6)) & 3) << 4);
        mn = ((s2 >> (sh + 4)) & 15) | (((s1 >> (sh + 6)) & 3) << 4);
    }
}

// Q4_K: d, dmin f16 | scales[12] | qs[128]. Sub-block j's values are the nibbles (j & 1) of qs[32 (j / 2) + l];
// value = d * sc_j * nibble - dmin * m_j.
struct Q4_K {
    static constexpr int ID = QID_Q4_K, BV = 256, BYTES = 144, HEAD_AT = 0, HEAD = 0, BODY = 144;
    static constexpr bool PER16 = false, MIN = true;
    struct Raw { int4 hdr, q0, q1; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t*, int j) {
        const uint8_t* qs = body + 16 + 32 * (j >> 1);
        return {ld16(body), ld16(qs), ld16(qs + 16)};
    }
    static __device__ __forceinline__ void scales(const int4& hdr, int j, SubBlock& o) {
        const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&hdr.x));
        int sc, mn;
        k_scale_min(hdr.y, hdr.z, hdr.w, j, sc, mn);
        o.s[0] = o.s[1] = dm.x * (float)sc;
        o.m[0] = o.m[1] = dm.y * (float)mn;
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        const int v[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (v[i] >> sh) & 0x0F0F0F0F;
        scales(r.hdr, j, o);
    }
};

// Q5_K: d, dmin f16 | scales[12] | qh[32] | qs[128]. As Q4_K, plus bit j of qh[l] as bit 4 of the code.
struct Q5_K {
    static constexpr int ID = QID_Q5_K, BV = 256, BYTES = 176, HEAD_AT = 0, HEAD = 0, BODY = 176;
    static constexpr bool PER16 = false, MIN = true;
    struct Raw { int4 hdr, h0, h1, q0, q1; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t*, int j) {
        const uint8_t* qs = body + 48 + 32 * (j >> 1);
        return {ld16(body), ld16(body + 16), ld16(body + 32), ld16(qs), ld16(qs + 16)};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        const int v[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
        const int h[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = ((v[i] >> sh) & 0x0F0F0F0F) | (((h[i] >> j) & 0x01010101) << 4);
        Q4_K::scales(r.hdr, j, o);
    }
};

// Q6_K: ql[128] | qh[64] | scales[16] int8 | d f16. Value v = 128h + 32s + l: low nibble (s / 2) of
// ql[64h + 32 (s & 1) + l], high 2 bits (qh[32h + l] >> 2s) & 3; code = that - 32; group v / 16 scale d * scales[g].
struct Q6_K {
    static constexpr int ID = QID_Q6_K, BV = 256, BYTES = 210, HEAD_AT = 208, HEAD = 2, BODY = 208;
    static constexpr bool PER16 = true, MIN = false;
    struct Raw { int4 l0, l1, h0, h1; int sc; float d; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int j) {
        const uint8_t* ql = body + 64 * (j >> 2) + 32 * (j & 1);
        const uint8_t* qh = body + 128 + 32 * (j >> 2);
        return {ld16(ql), ld16(ql + 16), ld16(qh), ld16(qh + 16), ld4(body + 192 + 4 * (j >> 1)), ldh(head)};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        const int l[8] = {r.l0.x, r.l0.y, r.l0.z, r.l0.w, r.l1.x, r.l1.y, r.l1.z, r.l1.w};
        const int h[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
        const int s = j & 3, shl = 4 * (s >> 1), shh = 2 * s;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            o.q[i] = (int)__vsub4(((l[i] >> shl) & 0x0F0F0F0F) | (((h[i] >> shh) & 0x03030303) << 4), 0x20202020);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            o.s[k] = r.d * (float)(int8_t)((r.sc >> (8 * (2 * (j & 1) + k))) & 0xFF);
            o.m[k] = 0.f;
        }
    }
};

// IQ4_XS: d f16 | scales_h u16 | scales_l[4] | qs[128]. Sub-block j: 6-bit scale ls = nibble (j & 1) of
// scales_l[j / 2] | bits 2j..2j+1 of scales_h << 4; values kvalues[nibble] of qs[16j .. 16j + 15] as IQ4_NL;
// value = d * (ls - 32) * kvalue.
struct IQ4_XS {
    static constexpr int ID = QID_IQ4_XS, BV = 256, BYTES = 136, HEAD_AT = 0, HEAD = 8, BODY = 128;
    static constexpr bool PER16 = false, MIN = false;
    struct Raw { int4 qs; uint2 h; };
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int j) {
        return {ld16(body + 16 * j), __ldg(reinterpret_cast<const uint2*>(head))};
    }
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o) {
        const int v[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            o.q[i] = iq4_lookup(v[i]);
            o.q[4 + i] = iq4_lookup(v[i] >> 4);
        }
        const float d = __half2float(__ushort_as_half((unsigned short)(r.h.x & 0xFFFF)));
        const int lo = (r.h.y >> (4 * j)) & 15, hi = (r.h.x >> (16 + 2 * j)) & 3;
        o.s[0] = o.s[1] = d * (float)((lo | (hi << 4)) - 32);
        o.m[0] = o.m[1] = 0.f;
    }
};

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
        default: return fail(CMP_ERR_ARG, "%s: unknown quant type id %d", what, id);
    }
}

}  // namespace cmp
