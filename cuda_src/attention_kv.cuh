// KV-cache storage formats as the attention kernels see them: bytes per cache row (one token, one kv head), the
// quantizers used by the KV write, and one loader that dequantizes 8 consecutive values of a row. The formats and
// their numerics are those of llamacmp/kv_quant.py; the byte layout of a row is llamacmp/kv_layout.py's.
//
// Row layouts (Dh values of one token and one kv head; rows of a cache are [n_ctx, Hk] of these, packed):
//   f32   Dh floats                      f16  Dh halves
//   q8_0  int8 q[Dh], then f16 d[Dh/32]                    (34 bytes per 32 values, as llama.cpp)
//   q4_0  uint8 n[Dh/2] (value 2i in the low nibble of byte i, 2i+1 in the high one; stored q + 8), then f16 d[Dh/32]
//   tq3   per 32 values 3 bit-plane words (12 bytes; bit i of word p is bit p of value i's code), then f16 s[Dh/B]
//         with B = min(128, Dh): codes index the 8 Lloyd-Max levels in the rotated domain; s = |x| / |levels| per
//         B-block (50 bytes per 128 values).
// Scales follow the quants so that the quants of a row start aligned for wide loads.
#pragma once
#include <string.h>

#include <type_traits>

#include "common.cuh"
#include "smem_plan.h"

namespace cmp {

constexpr float NEG_BIG_KV = -1e30f;

__host__ __device__ constexpr int tq3_block(int Dh) { return Dh < 128 ? Dh : 128; }

// Bytes of one cache row, or -1 if the type does not support this head dim.
__host__ __device__ constexpr int kv_row_bytes(int type, int Dh) {
    if (Dh <= 0 || Dh % 32) return -1;
    switch (type) {
        case CMP_KV_F32: return 4 * Dh;
        case CMP_KV_F16: return 2 * Dh;
        case CMP_KV_Q8_0: return Dh + Dh / 16;
        case CMP_KV_Q4_0: return Dh / 2 + Dh / 16;
        case CMP_KV_TQ3: {
            const int B = tq3_block(Dh);
            if (B != 32 && B != 64 && B != 128) return -1;
            if (Dh % B) return -1;
            return Dh * 3 / 8 + 2 * (Dh / B);
        }
        default: return -1;
    }
}

// Whether every q8_0 and q4_0 row of head dim Dh is a multiple of 4 bytes long, so that (caches being cudaMalloc'd)
// a lane's quants (at a multiple of 4 within its row) load as aligned words; true for Dh 64, 128 and 256, not 32 or 96.
__host__ __device__ constexpr bool kv_quant_aligned(int Dh) {
    return kv_row_bytes(CMP_KV_Q8_0, Dh) % 4 == 0 && kv_row_bytes(CMP_KV_Q4_0, Dh) % 4 == 0;
}

// Sign of position i (0..127) of the fixed random-sign vector (kv_quant.tq3_rotation: numpy default_rng(0x7133)
// .choice([-1, 1], n); the 32- and 64-value vectors are prefixes of the 128-value one). Bit set = -1.
__device__ __forceinline__ float tq3_sign(int i) {
    const unsigned w = i < 64 ? (i < 32 ? 0x644d0c9du : 0xdcef6f3du) : (i < 96 ? 0xfde5ea35u : 0x6a3ca0aeu);
    return (w >> (i & 31)) & 1u ? -1.f : 1.f;
}

// kv_quant.LLOYD_MAX_8[c] without an indexed local array (which would live in local memory).
__host__ __device__ __forceinline__ float tq3_level(int c) {
    const int m = c >= 4 ? c - 4 : 3 - c;
    const float a = (m & 1) ? ((m & 2) ? 2.1520f : 0.7560f) : ((m & 2) ? 1.3439f : 0.2451f);
    return c >= 4 ? a : -a;
}

// Code = number of decision thresholds (midpoints of adjacent levels) strictly below y (numpy searchsorted, left).
__device__ __forceinline__ int tq3_code(float y) {
    int c = 0;
    c += y > -1.74795f;
    c += y > -1.04995f;
    c += y > -0.50055f;
    c += y > 0.f;
    c += y > 0.50055f;
    c += y > 1.04995f;
    c += y > 1.74795f;
    return c;
}

__device__ __forceinline__ uint32_t ld_u32_any(const uint8_t* p) {
    if (((uintptr_t)p & 3u) == 0) return __ldg(reinterpret_cast<const uint32_t*>(p));
    return (uint32_t)__ldg(p) | (uint32_t)__ldg(p + 1) << 8 | (uint32_t)__ldg(p + 2) << 16 |
           (uint32_t)__ldg(p + 3) << 24;
}

__device__ __forceinline__ float ld_half(const uint8_t* p) {
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(p))));
}

// ---- fast dequantisation of 8 values -------------------------------------------------------------------------------
// The decode kernel is bound by dequantisation instructions, not bytes (tq3 is 0.2x f16's bytes), so the helpers
// below decode with whole-word bit tricks; each is exact (the same floats as the plain formulas, checked for every
// input byte combination by tools/check_kv_decode.cu) and runs on host and device.

// __byte_perm on the device, its definition on the host (result byte i = byte s[4i..4i+2] of the 8 bytes b:a).
__host__ __device__ __forceinline__ uint32_t kv_prmt(uint32_t a, uint32_t b, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, s);
#else
    const uint64_t x = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= (uint32_t)(x >> (8 * ((s >> (4 * i)) & 7u)) & 0xffu) << (8 * i);
    return r;
#endif
}

// Byte i (0..3) of u as an exact float, u < 256: bytes (u, 0, 0, 0x4B) are the float 2^23 + u, minus 2^23 + bias
// (two instructions instead of a quarter-rate I2F).
__host__ __device__ __forceinline__ float kv_byte_f32(uint32_t u, int i, float bias) {
    const uint32_t bits = kv_prmt(u, 0x4B000000u, 0x7540u | (uint32_t)i);
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits) - (8388608.f + bias);
#else
    float f;
    memcpy(&f, &bits, 4);
    return f - (8388608.f + bias);
#endif
}

// The level pair of two adjacent values from the 6-bit index (bits 0, 2, 4 = code of the first value, bits 1, 3, 5 =
// code of the second): entry e of the pair table.
__host__ __device__ __forceinline__ float2 tq3_pair_levels(int e) {
    return make_float2(tq3_level((e & 1) | (e >> 1 & 2) | (e >> 2 & 4)), tq3_level((e >> 1 & 1) | (e >> 2 & 2) | (e >> 3 & 4)));
}

// The pair table: 64 level pairs, each held 16 times side by side (entry e for lane slot s at byte e * 128 + s * 8)
// so that the 16 lanes of a half warp, each reading its own slot, hit 16 different bank pairs whatever their codes
// (8 KB; one 64-bit load gives two values).
using smem::TQ3_PAIR_SLOTS;
using smem::TQ3_PAIR_TABLE_BYTES;

// The 8 levels of the group whose bit-plane bytes are b0, b1, b2, from the pair table: ld(offset) reads the float2 at
// byte `offset` of the lane's slot (offset = pair index * 128). Two byte permutes put plane p in byte p + 1 of one
// word w; for values k, k+1 a mask keeps bits k, k+1 of each plane, and the high word of one multiply by
// 2^(31-k) + 2^(25-k) + 2^(19-k) holds the 6-bit pair index at bits 7..12 (the nine 2-bit copies land at bits
// 27 + 2j of the product, j = 0, 3, 4, 6, 7, 8, 10, 11, 14: no carries), so one more mask gives the offset. 3 integer
// instructions and one 64-bit load per 2 values, where the 8-level table took 4.5 and a load per value.
template <typename Ld>
__host__ __device__ __forceinline__ void tq3_levels_pairs(uint32_t b0, uint32_t b1, uint32_t b2, Ld&& ld, float (&x)[8]) {
    const uint32_t w = kv_prmt(kv_prmt(b0, b1, 0x0400u), b2, 0x4210u);   // (junk, b0, b1, b2): the masks skip byte 0
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
        const uint32_t m = (1u << (31 - k)) + (1u << (25 - k)) + (1u << (19 - k));
        const uint32_t hi = (uint32_t)((uint64_t)(w & (0x03030300u << k)) * m >> 32);
        const float2 v = ld(hi & 0x1f80u);
        x[k] = v.x;
        x[k + 1] = v.y;
    }
}

// The same without a table (for kernels without room for one in shared memory): levels are +-(magnitude by the
// two low code bits, mirrored for negative codes), so x bit = b0 ^ ~b2, y bit = b1 ^ ~b2 pick one of 4 magnitudes
// and bit 2 of the code is the sign: ~6.5 instructions per value instead of ~17.
__host__ __device__ __forceinline__ void tq3_levels_sel(uint32_t b0, uint32_t b1, uint32_t b2, float (&x)[8]) {
    const uint32_t xb = b0 ^ ~b2, yb = b1 ^ ~b2, neg = ~b2;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const float lo = (xb >> k) & 1u ? 0.7560f : 0.2451f;
        const float hi = (xb >> k) & 1u ? 2.1520f : 1.3439f;
        const float mag = (yb >> k) & 1u ? hi : lo;
#ifdef __CUDA_ARCH__
        x[k] = __uint_as_float(__float_as_uint(mag) | (neg << (31 - k) & 0x80000000u));
#else
        uint32_t bits;
        memcpy(&bits, &mag, 4);
        bits |= neg << (31 - k) & 0x80000000u;
        memcpy(&x[k], &bits, 4);
#endif
    }
}

// Raw bytes of the 8 values d0 .. d0+7 (d0 a multiple of 8) of a cache row, loaded in one go and decoded later, so
// that a lane can have the loads of several keys in flight before it waits on the first. values() gives the values
// WITHOUT their block scale and scale() the scale (1 for f32/f16): callers multiply a dot product or a probability
// by it once instead of every value (load_q() loads the quants alone for callers that fetch the scale elsewhere);
// decode() is the two. scale_values(Dh) values share one scale. tq3 values come in the rotated domain (levels), see
// kv_load8.
template <int T>
struct KvChunk;

template <>
struct KvChunk<CMP_KV_F32> {
    float4 a, b;
    __device__ __forceinline__ void load(const uint8_t* __restrict__ row, int d0, int) {
        a = __ldg(reinterpret_cast<const float4*>(row) + d0 / 4);
        b = __ldg(reinterpret_cast<const float4*>(row) + d0 / 4 + 1);
    }
    __device__ __forceinline__ void zero() { a = b = make_float4(0.f, 0.f, 0.f, 0.f); }
    __host__ __device__ static constexpr int scale_values(int Dh) { return Dh; }
    __device__ __forceinline__ void values(float (&x)[8], uint32_t) const {
        x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
    }
    __device__ __forceinline__ float scale() const { return 1.f; }
    __device__ __forceinline__ float decode(float (&x)[8], uint32_t slot) const { values(x, slot); return scale(); }
};

template <>
struct KvChunk<CMP_KV_F16> {
    uint4 u;
    __device__ __forceinline__ void load(const uint8_t* __restrict__ row, int d0, int) {
        u = __ldg(reinterpret_cast<const uint4*>(row + 2 * d0));
    }
    __device__ __forceinline__ void zero() { u = make_uint4(0u, 0u, 0u, 0u); }
    __host__ __device__ static constexpr int scale_values(int Dh) { return Dh; }
    __device__ __forceinline__ void values(float (&x)[8], uint32_t) const {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            x[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
            x[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
        }
    }
    __device__ __forceinline__ float scale() const { return 1.f; }
    __device__ __forceinline__ float decode(float (&x)[8], uint32_t slot) const { values(x, slot); return scale(); }
};

template <>
struct KvChunk<CMP_KV_Q8_0> {
    uint32_t a, b;
    unsigned short d;
    __device__ __forceinline__ void load(const uint8_t* __restrict__ row, int d0, int Dh) {
        const uint8_t* q = row + lane_q(d0, Dh);
        d = __ldg(reinterpret_cast<const unsigned short*>(row + lane_s(d0, Dh)));
        a = ld_u32_any(q);
        b = ld_u32_any(q + 4);
    }
    __host__ __device__ static int lane_q(int d0, int) { return d0; }
    __host__ __device__ static int lane_s(int d0, int Dh) { return Dh + (d0 / 32) * 2; }
    // load_q / load_at: q 4-byte aligned (kv_quant_aligned), so no byte-wise fallback sits between a lane's loads
    __device__ __forceinline__ void load_q(const uint8_t* __restrict__ q) {
        a = __ldg(reinterpret_cast<const uint32_t*>(q));
        b = __ldg(reinterpret_cast<const uint32_t*>(q + 4));
    }
    __device__ __forceinline__ void load_at(const uint8_t* __restrict__ q, const uint8_t* __restrict__ s) {
        d = __ldg(reinterpret_cast<const unsigned short*>(s));
        load_q(q);
    }
    __device__ __forceinline__ void zero() { a = b = 0u; d = 0; }
    __host__ __device__ static constexpr int scale_values(int) { return 32; }
    __device__ __forceinline__ void values(float (&x)[8], uint32_t) const {
        const uint32_t ua = a ^ 0x80808080u, ub = b ^ 0x80808080u;   // int8 q -> q + 128
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            x[i] = kv_byte_f32(ua, i, 128.f);
            x[4 + i] = kv_byte_f32(ub, i, 128.f);
        }
    }
    __device__ __forceinline__ float scale() const { return __half2float(__ushort_as_half(d)); }
    __device__ __forceinline__ float decode(float (&x)[8], uint32_t slot) const { values(x, slot); return scale(); }
};

template <>
struct KvChunk<CMP_KV_Q4_0> {
    uint32_t a;
    unsigned short d;
    __device__ __forceinline__ void load(const uint8_t* __restrict__ row, int d0, int Dh) {
        d = __ldg(reinterpret_cast<const unsigned short*>(row + lane_s(d0, Dh)));
        a = ld_u32_any(row + lane_q(d0, Dh));
    }
    __host__ __device__ static int lane_q(int d0, int) { return d0 / 2; }
    __host__ __device__ static int lane_s(int d0, int Dh) { return Dh / 2 + (d0 / 32) * 2; }
    // load_q / load_at: q 4-byte aligned (kv_quant_aligned)
    __device__ __forceinline__ void load_q(const uint8_t* __restrict__ q) { a = __ldg(reinterpret_cast<const uint32_t*>(q)); }
    __device__ __forceinline__ void load_at(const uint8_t* __restrict__ q, const uint8_t* __restrict__ s) {
        d = __ldg(reinterpret_cast<const unsigned short*>(s));
        load_q(q);
    }
    __device__ __forceinline__ void zero() { a = 0u; d = 0; }
    __host__ __device__ static constexpr int scale_values(int) { return 32; }
    __device__ __forceinline__ void values(float (&x)[8], uint32_t) const {
        const uint32_t lo = a & 0x0f0f0f0fu, hi = a >> 4 & 0x0f0f0f0fu;   // stored q + 8
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            x[2 * i] = kv_byte_f32(lo, i, 8.f);
            x[2 * i + 1] = kv_byte_f32(hi, i, 8.f);
        }
    }
    __device__ __forceinline__ float scale() const { return __half2float(__ushort_as_half(d)); }
    __device__ __forceinline__ float decode(float (&x)[8], uint32_t slot) const { values(x, slot); return scale(); }
};

template <>
struct KvChunk<CMP_KV_TQ3> {
    uint32_t p0, p1, p2;   // bit-plane bytes of the 8 values
    unsigned short s;
    __device__ __forceinline__ void load(const uint8_t* __restrict__ row, int d0, int Dh) {
        load_at(row + lane_q(d0, Dh), row + lane_s(d0, Dh));
    }
    __host__ __device__ static int lane_q(int d0, int) { return (d0 / 32) * 12 + (d0 & 31) / 8; }
    __host__ __device__ static int lane_s(int d0, int Dh) { return Dh * 3 / 8 + (d0 / tq3_block(Dh)) * 2; }
    __device__ __forceinline__ void load_q(const uint8_t* __restrict__ g) {
        p0 = __ldg(g);
        p1 = __ldg(g + 4);
        p2 = __ldg(g + 8);
    }
    __device__ __forceinline__ void load_at(const uint8_t* __restrict__ g, const uint8_t* __restrict__ sc) {
        s = __ldg(reinterpret_cast<const unsigned short*>(sc));
        load_q(g);
    }
    __device__ __forceinline__ void zero() { p0 = p1 = p2 = 0u; s = 0; }
    __host__ __device__ static constexpr int scale_values(int Dh) { return tq3_block(Dh); }
    // slot: the lane's slot of the pair table (tq3_pairs_init), a shared-window address
    __device__ __forceinline__ void values(float (&x)[8], uint32_t slot) const {
        tq3_levels_pairs(p0, p1, p2, [slot](uint32_t off) {
            float2 v;
            // volatile: stays after the __syncthreads that publishes the table (the compiler cannot see the address)
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(slot | off));
            return v;
        }, x);
    }
    __device__ __forceinline__ float scale() const { return __half2float(__ushort_as_half(s)); }
    __device__ __forceinline__ float decode(float (&x)[8], uint32_t slot) const { values(x, slot); return scale(); }
    // the same without a table
    __device__ __forceinline__ float decode_sel(float (&x)[8]) const {
        tq3_levels_sel(p0, p1, p2, x);
        return __half2float(__ushort_as_half(s));
    }
};

// Fill the pair table of KvChunk<CMP_KV_TQ3>::decode in `smem` (TQ3_PAIR_SMEM bytes: the table goes to the first
// 8 KB boundary of the shared window inside it, so that a lane's slot address ORs with the offsets; every thread of
// the block takes part, the caller syncs before use) and return the calling lane's slot as a shared-window address.
using smem::TQ3_PAIR_SMEM;
__device__ __forceinline__ uint32_t tq3_pairs_init(float* smem) {
    uint32_t a;
    asm("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(a) : "l"(smem));
    const uint32_t base = (a + TQ3_PAIR_TABLE_BYTES - 1) & ~(uint32_t)(TQ3_PAIR_TABLE_BYTES - 1);
    float2* table = reinterpret_cast<float2*>(reinterpret_cast<char*>(smem) + (base - a));
    for (int i = threadIdx.x; i < 64 * TQ3_PAIR_SLOTS; i += blockDim.x) table[i] = tq3_pair_levels(i / TQ3_PAIR_SLOTS);
    return base + (threadIdx.x % TQ3_PAIR_SLOTS) * 8u;
}

// Ask L2 for the bytes [p, p + n) of global memory: nothing is waited for and no register is held, so a kernel can
// fetch its next tile's rows while it computes the current one, and then load them at L2 latency.
__device__ __forceinline__ void prefetch_l2(const uint8_t* p, int n) {
    const uintptr_t end = (uintptr_t)p + (uintptr_t)n;
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)127; a < end; a += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// Call f(std::integral_constant<int, T>{}) with T = type, so a loop over keys is compiled once per KV type with the
// type out of its body (the loads of several keys can then be issued before any is decoded).
template <typename F>
__device__ __forceinline__ void kv_type_switch(int type, F&& f) {
    switch (type) {
        case CMP_KV_F32: f(std::integral_constant<int, CMP_KV_F32>{}); break;
        case CMP_KV_F16: f(std::integral_constant<int, CMP_KV_F16>{}); break;
        case CMP_KV_Q8_0: f(std::integral_constant<int, CMP_KV_Q8_0>{}); break;
        case CMP_KV_Q4_0: f(std::integral_constant<int, CMP_KV_Q4_0>{}); break;
        default: f(std::integral_constant<int, CMP_KV_TQ3>{}); break;
    }
}

// A lane's view of the quantized rows of one kv head: its quants in key 0's row, the distance from them to its block
// scale, and the row stride (a few KB: 32 bits), so that key j's two addresses are q + j * stride and that + ds.
struct KvLane {
    const uint8_t* q;
    int ds;
    uint32_t stride;
};

__device__ __forceinline__ KvLane kv_lane(int type, const uint8_t* base, uint32_t stride, int d0, int Dh) {
    int q = 0, s = 0;
    kv_type_switch(type, [&](auto tag) {
        constexpr int T = decltype(tag)::value;
        if constexpr (T >= CMP_KV_Q8_0) {
            q = KvChunk<T>::lane_q(d0, Dh);
            s = KvChunk<T>::lane_s(d0, Dh);
        }
    });
    return KvLane{base + q, s - q, stride};
}

// x[0..7] = the values d0 .. d0+7 of a cache row (d0 a multiple of 8). tq3 gives them in the rotated domain
// (level * s): the kernels rotate the query instead of un-rotating keys, and the output instead of values.
// `type` is uniform across the block, so the switch costs no divergence.
__device__ __forceinline__ void kv_load8(int type, const uint8_t* __restrict__ row, int d0, int Dh, float (&x)[8]) {
    kv_type_switch(type, [&](auto tag) {
        constexpr int T = decltype(tag)::value;
        KvChunk<T> c;
        c.load(row, d0, Dh);
        float s;
        if constexpr (T == CMP_KV_TQ3) s = c.decode_sel(x);   // no level table in the callers' shared memory
        else s = c.decode(x, 0u);
        if (T >= CMP_KV_Q8_0) {
#pragma unroll
            for (int i = 0; i < 8; ++i) x[i] *= s;
        }
    });
}

// kv_load8 in two steps, so that a kernel can hold a whole tile's loads in flight (a few registers a lane) while it
// computes the tile before: kv_fetch8 loads the raw bytes of the 8 values into one uint4 (f16: the 16 bytes; q8_0:
// the quants in x, y and the scale in w; q4_0: the quants in x and the scale in w; tq3: the bit planes in x, y, z
// and the scale in w), kv_unpack8 decodes them as kv_load8 would. f32 does not fit (32 bytes): its callers load it
// with kv_load8 when they need it.
__device__ __forceinline__ uint4 kv_fetch8(int type, const uint8_t* __restrict__ row, int d0, int Dh) {
    uint4 r = make_uint4(0u, 0u, 0u, 0u);
    kv_type_switch(type, [&](auto tag) {
        constexpr int T = decltype(tag)::value;
        if constexpr (T != CMP_KV_F32) {
            KvChunk<T> c;
            c.load(row, d0, Dh);
            if constexpr (T == CMP_KV_F16) r = c.u;
            if constexpr (T == CMP_KV_Q8_0) r = make_uint4(c.a, c.b, 0u, c.d);
            if constexpr (T == CMP_KV_Q4_0) r = make_uint4(c.a, 0u, 0u, c.d);
            if constexpr (T == CMP_KV_TQ3) r = make_uint4(c.p0, c.p1, c.p2, c.s);
        }
    });
    return r;
}

__device__ __forceinline__ void kv_unpack8(int type, uint4 r, float (&x)[8]) {
    kv_type_switch(type, [&](auto tag) {
        constexpr int T = decltype(tag)::value;
        if constexpr (T != CMP_KV_F32) {
            KvChunk<T> c;
            float s = 1.f;
            if constexpr (T == CMP_KV_F16) {
                c.u = r;
                c.values(x, 0u);
            }
            if constexpr (T == CMP_KV_Q8_0) {
                c.a = r.x;
                c.b = r.y;
                c.d = (unsigned short)r.w;
                s = c.decode(x, 0u);
            }
            if constexpr (T == CMP_KV_Q4_0) {
                c.a = r.x;
                c.d = (unsigned short)r.w;
                s = c.decode(x, 0u);
            }
            if constexpr (T == CMP_KV_TQ3) {
                c.p0 = r.x;
                c.p1 = r.y;
                c.p2 = r.z;
                c.s = (unsigned short)r.w;
                s = c.decode_sel(x);   // no level table in the callers' shared memory
            }
            if constexpr (T >= CMP_KV_Q8_0) {
#pragma unroll
                for (int i = 0; i < 8; ++i) x[i] *= s;
            }
        }
    });
}

// In-place orthonormal Walsh-Hadamard transform of n_vec vectors of `len` values in shared memory, per block of B
// (a power of two dividing len); element i of vector v lives at x[v * vstride + i * estride]. signs_before: y =
// H (signs . x) (what the tq3 writer does to keys, and the kernels to queries); signs_after: y = signs . (H x)
// (the inverse, for outputs accumulated in the rotated domain). Every thread of the block must call it.
__device__ inline void fwht_smem(float* x, int n_vec, int len, int B, int vstride, int estride, bool signs_before,
                                 bool signs_after) {
    const int n = n_vec * len;
    if (signs_before) {
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            const int v = e % n_vec, i = e / n_vec;
            x[v * vstride + i * estride] *= tq3_sign(i % B);
        }
    }
    __syncthreads();
    for (int h = 1; h < B; h <<= 1) {
        for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
            const int v = p % n_vec, ip = p / n_vec;
            const int i = (ip / h) * 2 * h + ip % h;
            float* a = x + v * vstride + i * estride;
            float* b = a + h * estride;
            const float va = *a, vb = *b;
            *a = va + vb;
            *b = va - vb;
        }
        __syncthreads();
    }
    const float norm = rsqrtf((float)B);
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int v = e % n_vec, i = e / n_vec;
        x[v * vstride + i * estride] *= signs_after ? norm * tq3_sign(i % B) : norm;
    }
    __syncthreads();
}

}  // namespace cmp
