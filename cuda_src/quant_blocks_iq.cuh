// Decoders of the IQ1-3 grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) in quant_blocks.cuh's
// scheme: per 32-value sub-block 32 int8 codes, a scale per 16-value half, no min, no bias. Included by
// quant_blocks.cuh (its helpers, SubBlock and the layout rules apply; read its header comment first).
//
// A grid type stores, per group of 8 values, an index into a codebook of 8 (IQ2, IQ1) or two of 4 (IQ3) small
// integers (iq_grids.cuh, ggml-common.h's tables) and 8 sign bits (IQ2/IQ3; IQ2_XXS, IQ2_XS and IQ3_XXS give 7 of
// them, the 8th makes the count of minus signs even: ggml's ksigns_iq2xs). decode looks the grid entries up and
// negates the signed bytes, so each code is the grid value itself (|code| <= 62) and the scale the block's d times
// the sub-block's odd multiplier, both exact in fp32:
//   IQ2_XXS/IQ2_XS/IQ2_S  d (0.5 + s) / 4 = d (2s + 1) / 8       IQ3_XXS  d (0.5 + s) / 2 = d (2s + 1) / 4
//   IQ3_S                 d (1 + 2s)
// IQ1_S / IQ1_M add a delta of +-1/8 to every grid value (in {-1, 0, 1}) of a group (ggml's IQ1S_DELTA): codes are
// 8 g +- 1 (|code| <= 9) and the scale d (2s + 1) / 8, so scale * code = d (2s + 1) (g +- 1/8) exactly, as ggml's
// dequantize_row_iq1_s / _m and the numpy reference compute it.
// Unlike the other types, decode reads memory besides the raw registers: the grid entries. Its last argument says
// where from (GridLdg: the global table through __ldg, the default; GridSmem: a shared-memory copy that
// gemv_quant_kernel stages per block: matmul_quant.cuh GemvGrid). Each type names its table (grid_table(), GRID_BYTES).
//
// Tested on the GPU by tests/test_quant_cuda.py, test_matmul_mma_cuda.py and test_quant_fixtures_cuda.py (first run
// on an H200 2026-12-05); on the CPU, tools/quant_decode_host.cpp runs their repack, load and decode from this source
// (intrinsics emulated) and tests/test_quant_decode_host.py holds them to gguf.quants bit for bit.
#pragma once
#include "iq_grids.cuh"

namespace cmp {

// ---- grid helpers --------------------------------------------------------------------------------------------------

// Entry idx of a grid table, read from the global table (GridLdg) or from a copy of it in shared memory (GridSmem:
// a warp's 32 lookups at random indices cost a wavefront per distinct cache line from L1, ~2-3 per instruction from
// shared memory's banks; the lookups held the grid types' decode GEMV at 17-36% of the copy rate through L1).
struct GridLdg {
    template <class T>
    __device__ __forceinline__ T operator()(const T* table, unsigned idx) const { return __ldg(table + idx); }
};
struct GridSmem {
    const void* copy;   // the staged table (the same entries as the global one decode names)
    template <class T>
    __device__ __forceinline__ T operator()(const T*, unsigned idx) const { return static_cast<const T*>(copy)[idx]; }
};

template <class G>
__device__ __forceinline__ uint2 grid8(G grid, const uint64_t* table, unsigned idx) {
    const uint64_t g = grid(table, idx);
    return make_uint2((unsigned)g, (unsigned)(g >> 32));
}
template <class G>
__device__ __forceinline__ unsigned grid4(G grid, const uint32_t* table, unsigned idx) { return grid(table, idx); }

// Bit k of h (k < 4) -> 1 in byte k (the minus signs of 4 values).
__device__ __forceinline__ unsigned sign_bits(unsigned h) { return ((h & 15u) * 0x00204081u) & 0x01010101u; }

// The 4 unsigned bytes of w with those whose sign bit (sign_bits) is set negated: ~w + 1 = (w ^ 0xFF) + 1 per byte,
// in one 32-bit add because no byte carries: the sign-coded grids' values are 1 .. 62, so a negated byte is 256 - w
// in 194 .. 255. (__vsub4((w ^ m), m) is 4 instructions on sm_90, this 3 with the mask's multiply.)
__device__ __forceinline__ int signed4(unsigned w, unsigned b) { return (int)((w ^ (b * 0xFFu)) + b); }

// ggml's ksigns_iq2xs: 7 sign bits and an 8th that makes the number of set bits even.
__device__ __forceinline__ unsigned ksigns(unsigned s7) { return s7 | (__popc(s7) & 1u) << 7; }

// Group l (values 8l .. 8l + 7) of an 8-value grid entry g with sign byte s into q[2l], q[2l + 1].
__device__ __forceinline__ void put_group8(int (&q)[8], int l, uint2 g, unsigned s) {
    q[2 * l] = signed4(g.x, sign_bits(s));
    q[2 * l + 1] = signed4(g.y, sign_bits(s >> 4));
}

// An IQ1 group: int8 grid values g in {-1, 0, 1} -> 8 g + delta (delta = +-1) per byte. (w << 3) keeps each byte's
// low 5 bits in place times 8 and moves its top 3 bits into the next byte, where the mask drops them: per byte
// (8 g) mod 256; __vadd4 adds the delta without carries between bytes.
__device__ __forceinline__ int iq1_codes4(unsigned w, int delta) {
    return (int)__vadd4((w << 3) & 0xF8F8F8F8u, (unsigned)(delta & 0xFF) * 0x01010101u);   // -1: 0xFF per byte
}
__device__ __forceinline__ void put_group8_iq1(int (&q)[8], int l, uint2 g, int delta) {
    q[2 * l] = iq1_codes4(g.x, delta);
    q[2 * l + 1] = iq1_codes4(g.y, delta);
}

__device__ __forceinline__ void no_mins(SubBlock& o) { o.m[0] = o.m[1] = 0.f; }

// ---- the types (ids: api.h CmpQuantType) ---------------------------------------------------------------------------

// IQ2_XXS: d f16 | qs u16[32]. Sub-block j: 8 bytes qs[4j .. 4j + 3] = words a (the 4 groups' grid indices, a byte
// each) and b (7 sign bits per group l at bit 7l, the 4-bit scale s at bits 28-31). body: those 8 bytes per
// sub-block (the file's order); head: d.
struct IQ2_XXS {
    static constexpr int ID = QID_IQ2_XXS, BV = 256, BYTES = 66, HEAD = 2, BODY = 64, BIAS = 0;
    static constexpr bool PER16 = false, MIN = false;
    static constexpr int GRID_BYTES = sizeof(kIq2xxsGrid);
    static __device__ __forceinline__ const void* grid_table() { return kIq2xxsGrid; }
    struct Raw { uint2 w; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        copy_bytes(head + 2 * b, src, 2);
        copy_bytes(body + 64 * b, src + 2, 64);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        return {ld8(body + 8 * c), ldh(head + 2 * (c >> 3))};
    }
    template <class G = GridLdg>
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o, G grid = {}) {
#pragma unroll
        for (int l = 0; l < 4; ++l)
            put_group8(o.q, l, grid8(grid, kIq2xxsGrid, (r.w.x >> (8 * l)) & 0xFFu), ksigns((r.w.y >> (7 * l)) & 127u));
        o.s[0] = o.s[1] = r.d * (float)(2 * (int)(r.w.y >> 28) + 1) * 0.125f;
        no_mins(o);
    }
};

// IQ2_XS: d f16 | qs u16[32] | scales[8]. Sub-block j: qs[4j + l] = grid index (9 bits) | 7 sign bits << 9 for
// group l; scales[j]: low nibble the first half's s, high nibble the second's. body: qs, 8 bytes per sub-block;
// head: scales [nb, 8] then d [nb, 2].
struct IQ2_XS {
    static constexpr int ID = QID_IQ2_XS, BV = 256, BYTES = 74, HEAD = 10, BODY = 64, BIAS = 0;
    static constexpr bool PER16 = true, MIN = false;
    static constexpr int GRID_BYTES = sizeof(kIq2xsGrid);
    static __device__ __forceinline__ const void* grid_table() { return kIq2xsGrid; }
    struct Raw { uint2 w; unsigned sc; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        copy_bytes(body + 64 * b, src + 2, 64);
        copy_bytes(head + 8 * b, src + 66, 8);
        copy_bytes(head + 8 * nb + 2 * b, src, 2);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {ld8(body + 8 * c), ld1(head + c), ldh(head + 8 * nb + 2 * (c >> 3))};
    }
    template <class G = GridLdg>
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o, G grid = {}) {
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const unsigned q = ((l < 2 ? r.w.x : r.w.y) >> (16 * (l & 1))) & 0xFFFFu;
            put_group8(o.q, l, grid8(grid, kIq2xsGrid, q & 511u), ksigns(q >> 9));
        }
        o.s[0] = r.d * (float)(2 * (int)(r.sc & 15u) + 1) * 0.125f;
        o.s[1] = r.d * (float)(2 * (int)(r.sc >> 4) + 1) * 0.125f;
        no_mins(o);
    }
};

// IQ2_S: d f16 | qs[32] | signs[32] | qh[8] | scales[8]. Sub-block j, group l: grid index qs[4j + l] | bits 2l,
// 2l + 1 of qh[j] << 8 (10 bits), sign byte signs[4j + l]; scales[j] as IQ2_XS's. body: qs[4j..] then
// signs[4j..], 8 bytes per sub-block; head: qh [nb, 8], scales [nb, 8], d [nb, 2].
struct IQ2_S {
    static constexpr int ID = QID_IQ2_S, BV = 256, BYTES = 82, HEAD = 18, BODY = 64, BIAS = 0;
    static constexpr bool PER16 = true, MIN = false;
    static constexpr int GRID_BYTES = sizeof(kIq2sGrid);
    static __device__ __forceinline__ const void* grid_table() { return kIq2sGrid; }
    struct Raw { uint2 w; unsigned qh, sc; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        for (int j = 0; j < 8; ++j) {
            copy_bytes(body + 8 * (8 * b + j), src + 2 + 4 * j, 4);
            copy_bytes(body + 8 * (8 * b + j) + 4, src + 34 + 4 * j, 4);
        }
        copy_bytes(head + 8 * b, src + 66, 8);
        copy_bytes(head + 8 * nb + 8 * b, src + 74, 8);
        copy_bytes(head + 16 * nb + 2 * b, src, 2);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {ld8(body + 8 * c), ld1(head + c), ld1(head + 8 * nb + c), ldh(head + 16 * nb + 2 * (c >> 3))};
    }
    template <class G = GridLdg>
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o, G grid = {}) {
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const unsigned idx = ((r.w.x >> (8 * l)) & 0xFFu) | ((r.qh >> (2 * l)) & 3u) << 8;
            put_group8(o.q, l, grid8(grid, kIq2sGrid, idx), (r.w.y >> (8 * l)) & 0xFFu);
        }
        o.s[0] = r.d * (float)(2 * (int)(r.sc & 15u) + 1) * 0.125f;
        o.s[1] = r.d * (float)(2 * (int)(r.sc >> 4) + 1) * 0.125f;
        no_mins(o);
    }
};

// IQ3_XXS: d f16 | qs[64] | scales_and_signs u32[8]. Sub-block j: qs[8j + i] indexes a 4-value grid entry (values
// 4i .. 4i + 3); word j of scales_and_signs: 7 sign bits per group l of 8 at bit 7l, the scale s at bits 28-31.
// body: qs[8j..] then the word, 12 bytes per sub-block; head: d.
struct IQ3_XXS {
    static constexpr int ID = QID_IQ3_XXS, BV = 256, BYTES = 98, HEAD = 2, BODY = 96, BIAS = 0;
    static constexpr bool PER16 = false, MIN = false;
    static constexpr int GRID_BYTES = sizeof(kIq3xxsGrid);
    static __device__ __forceinline__ const void* grid_table() { return kIq3xxsGrid; }
    struct Raw { unsigned w[3]; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int, int b) {
        for (int j = 0; j < 8; ++j) {
            copy_bytes(body + 12 * (8 * b + j), src + 2 + 8 * j, 8);
            copy_bytes(body + 12 * (8 * b + j) + 8, src + 66 + 4 * j, 4);
        }
        copy_bytes(head + 2 * b, src, 2);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int, int c) {
        Raw r;
#pragma unroll
        for (int i = 0; i < 3; ++i) r.w[i] = (unsigned)ld4(body + 12 * c + 4 * i);
        r.d = ldh(head + 2 * (c >> 3));
        return r;
    }
    template <class G = GridLdg>
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o, G grid = {}) {
        const unsigned aux = r.w[2];
#pragma unroll
        for (int i = 0; i < 8; ++i) {     // int i = values 4i .. 4i + 3 = half (i & 1) of group i / 2
            const unsigned s = ksigns((aux >> (7 * (i >> 1))) & 127u) >> (4 * (i & 1));
            o.q[i] = signed4(grid4(grid, kIq3xxsGrid, (r.w[i >> 2] >> (8 * (i & 3))) & 0xFFu), sign_bits(s));
        }
        o.s[0] = o.s[1] = r.d * (float)(2 * (int)(aux >> 28) + 1) * 0.25f;
        no_mins(o);
    }
};

// IQ3_S: d f16 | qs[64] | qh[8] | signs[32] | scales[4]. Sub-block j: qs[8j + i] | bit i of qh[j] << 8 indexes a
// 4-value grid entry (values 4i .. 4i + 3); signs[4j + l] the sign byte of group l; s = nibble (j & 1) of
// scales[j / 2]. body: qs[8j..] then signs[4j..], 12 bytes per sub-block; head: qh [nb, 8], scales [nb, 4], d [nb, 2].
struct IQ3_S {
    static constexpr int ID = QID_IQ3_S, BV = 256, BYTES = 110, HEAD = 14, BODY = 96, BIAS = 0;
    static constexpr bool PER16 = false, MIN = false;
    static constexpr int GRID_BYTES = sizeof(kIq3sGrid);
    static __device__ __forceinline__ const void* grid_table() { return kIq3sGrid; }
    struct Raw { unsigned w[3]; unsigned qh, sc; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        for (int j = 0; j < 8; ++j) {
            copy_bytes(body + 12 * (8 * b + j), src + 2 + 8 * j, 8);
            copy_bytes(body + 12 * (8 * b + j) + 8, src + 74 + 4 * j, 4);
        }
        copy_bytes(head + 8 * b, src + 66, 8);
        copy_bytes(head + 8 * nb + 4 * b, src + 106, 4);
        copy_bytes(head + 12 * nb + 2 * b, src, 2);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        Raw r;
#pragma unroll
        for (int i = 0; i < 3; ++i) r.w[i] = (unsigned)ld4(body + 12 * c + 4 * i);
        r.qh = ld1(head + c);
        r.sc = ld1(head + 8 * nb + (c >> 1));
        r.d = ldh(head + 12 * nb + 2 * (c >> 3));
        return r;
    }
    template <class G = GridLdg>
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o, G grid = {}) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const unsigned idx = ((r.w[i >> 2] >> (8 * (i & 3))) & 0xFFu) | ((r.qh >> i) & 1u) << 8;
            const unsigned s = (r.w[2] >> (8 * (i >> 1) + 4 * (i & 1))) & 15u;
            o.q[i] = signed4(grid4(grid, kIq3sGrid, idx), sign_bits(s));
        }
        o.s[0] = o.s[1] = r.d * (float)(1 + 2 * (int)((r.sc >> (4 * (j & 1))) & 15u));
        no_mins(o);
    }
};

// IQ1_S: d f16 | qs[32] | qh u16[8]. Sub-block j, group l: grid index qs[4j + l] | bits 3l .. 3l + 2 of qh[j] << 8
// (11 bits); qh[j] bits 12-14 the scale s, bit 15 the delta's sign (set: -1/8). body: qs [nb, 8 x 4] then qh
// [nb, 8 x 2]; head: d.
struct IQ1_S {
    static constexpr int ID = QID_IQ1_S, BV = 256, BYTES = 50, HEAD = 2, BODY = 48, BIAS = 0;
    static constexpr bool PER16 = false, MIN = false;
    static constexpr int GRID_BYTES = sizeof(kIq1sGrid);
    static __device__ __forceinline__ const void* grid_table() { return kIq1sGrid; }
    struct Raw { unsigned qs, qh; float d; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        copy_bytes(body + 32 * b, src + 2, 32);
        copy_bytes(body + 32 * nb + 16 * b, src + 34, 16);
        copy_bytes(head + 2 * b, src, 2);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {(unsigned)ld4(body + 4 * c), ld2(body + 32 * nb + 2 * c), ldh(head + 2 * (c >> 3))};
    }
    template <class G = GridLdg>
    static __device__ __forceinline__ void decode(const Raw& r, int, SubBlock& o, G grid = {}) {
        const int delta = r.qh & 0x8000u ? -1 : 1;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const unsigned idx = ((r.qs >> (8 * l)) & 0xFFu) | ((r.qh >> (3 * l)) & 7u) << 8;
            put_group8_iq1(o.q, l, grid8(grid, kIq1sGrid, idx), delta);
        }
        o.s[0] = o.s[1] = r.d * (float)(2 * (int)((r.qh >> 12) & 7u) + 1) * 0.125f;
        no_mins(o);
    }
};

// IQ1_M: qs[32] | qh[16] | scales u16[4]. Sub-block j, group l: grid index qs[4j + l] | bits 4 (l & 1) .. +2 of
// qh[2j + l / 2] << 8; bit 4 (l & 1) + 3 of that byte the delta's sign. The 3-bit scale of half k is bits
// 6 (j & 1) + 3k of scales[j / 2]; d (f16) is the top nibbles of scales[0..3], low nibble first (iq1m_scale_t).
// body: qs [nb, 8 x 4] then qh [nb, 8 x 2]; head: the 8 scale bytes per block.
struct IQ1_M {
    static constexpr int ID = QID_IQ1_M, BV = 256, BYTES = 56, HEAD = 8, BODY = 48, BIAS = 0;
    static constexpr bool PER16 = true, MIN = false;
    static constexpr int GRID_BYTES = sizeof(kIq1sGrid);
    static __device__ __forceinline__ const void* grid_table() { return kIq1sGrid; }
    struct Raw { unsigned qs, qh; uint2 sc; };
    static __device__ void repack(const uint8_t* src, uint8_t* body, uint8_t* head, int nb, int b) {
        copy_bytes(body + 32 * b, src, 32);
        copy_bytes(body + 32 * nb + 16 * b, src + 32, 16);
        copy_bytes(head + 8 * b, src + 48, 8);
    }
    static __device__ __forceinline__ Raw load(const uint8_t* body, const uint8_t* head, int nb, int c) {
        return {(unsigned)ld4(body + 4 * c), ld2(body + 32 * nb + 2 * c), ld8(head + 8 * (c >> 3))};
    }
    template <class G = GridLdg>
    static __device__ __forceinline__ void decode(const Raw& r, int j, SubBlock& o, G grid = {}) {
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const unsigned h = (r.qh >> (4 * l)) & 15u;        // byte l / 2 of qh, nibble l & 1
            const unsigned idx = ((r.qs >> (8 * l)) & 0xFFu) | (h & 7u) << 8;
            put_group8_iq1(o.q, l, grid8(grid, kIq1sGrid, idx), h & 8u ? -1 : 1);
        }
        const unsigned s0 = r.sc.x & 0xFFFFu, s1 = r.sc.x >> 16, s2 = r.sc.y & 0xFFFFu, s3 = r.sc.y >> 16;
        const unsigned bits = (s0 >> 12) | ((s1 >> 8) & 0x00F0u) | ((s2 >> 4) & 0x0F00u) | (s3 & 0xF000u);
        const float d = __half2float(__ushort_as_half((unsigned short)bits));
        // u16 j / 2 of the scales (words x: u16 0, 1; y: 2, 3), then sub-block j's 6 bits
        const unsigned sc = ((j & 4) ? r.sc.y : r.sc.x) >> (16 * ((j >> 1) & 1)) >> (6 * (j & 1));
#pragma unroll
        for (int k = 0; k < 2; ++k) o.s[k] = d * (float)(2 * (int)((sc >> (3 * k)) & 7u) + 1) * 0.125f;
        no_mins(o);
    }
};

}  // namespace cmp
