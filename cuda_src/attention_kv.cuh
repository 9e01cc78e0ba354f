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
#include "common.cuh"

namespace cmp {

constexpr float NEG_BIG_KV = -1e30f;

__host__ __device__ inline int tq3_block(int Dh) { return Dh < 128 ? Dh : 128; }

// Bytes of one cache row, or -1 if the type does not support this head dim.
__host__ __device__ inline int kv_row_bytes(int type, int Dh) {
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

// Sign of position i (0..127) of the fixed random-sign vector (kv_quant.tq3_rotation: numpy default_rng(0x7133)
// .choice([-1, 1], n); the 32- and 64-value vectors are prefixes of the 128-value one). Bit set = -1.
__device__ __forceinline__ float tq3_sign(int i) {
    const unsigned w = i < 64 ? (i < 32 ? 0x644d0c9du : 0xdcef6f3du) : (i < 96 ? 0xfde5ea35u : 0x6a3ca0aeu);
    return (w >> (i & 31)) & 1u ? -1.f : 1.f;
}

// kv_quant.LLOYD_MAX_8[c] without an indexed local array (which would live in local memory).
__device__ __forceinline__ float tq3_level(int c) {
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

// x[0..7] = the values d0 .. d0+7 of a cache row (d0 a multiple of 8). tq3 gives them in the rotated domain
// (level * s): the kernels rotate the query instead of un-rotating keys, and the output instead of values.
// `type` is uniform across the block, so the switch costs no divergence.
__device__ __forceinline__ void kv_load8(int type, const uint8_t* __restrict__ row, int d0, int Dh, float (&x)[8]) {
    switch (type) {
        case CMP_KV_F32: {
            const float4 a = __ldg(reinterpret_cast<const float4*>(row) + d0 / 4);
            const float4 b = __ldg(reinterpret_cast<const float4*>(row) + d0 / 4 + 1);
            x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
            break;
        }
        case CMP_KV_F16: {
            const uint4 u = __ldg(reinterpret_cast<const uint4*>(row + 2 * d0));
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {   // bit operations, not a pointer cast (which would force w to memory)
                x[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
                x[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
            }
            break;
        }
        case CMP_KV_Q8_0: {
            const float d = ld_half(row + Dh + (d0 / 32) * 2);
            const uint32_t a = ld_u32_any(row + d0), b = ld_u32_any(row + d0 + 4);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                x[i] = (float)(int8_t)(a >> (8 * i)) * d;
                x[4 + i] = (float)(int8_t)(b >> (8 * i)) * d;
            }
            break;
        }
        case CMP_KV_Q4_0: {
            const float d = ld_half(row + Dh / 2 + (d0 / 32) * 2);
            const uint32_t a = ld_u32_any(row + d0 / 2);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                x[2 * i] = (float)((int)((a >> (8 * i)) & 15u) - 8) * d;
                x[2 * i + 1] = (float)((int)((a >> (8 * i + 4)) & 15u) - 8) * d;
            }
            break;
        }
        default: {  // CMP_KV_TQ3
            const int B = tq3_block(Dh);
            const float s = ld_half(row + Dh * 3 / 8 + (d0 / B) * 2);
            const uint8_t* g = row + (d0 / 32) * 12 + (d0 & 31) / 8;
            const uint32_t p0 = __ldg(g), p1 = __ldg(g + 4), p2 = __ldg(g + 8);
#pragma unroll
            for (int i = 0; i < 8; ++i)
                x[i] = s * tq3_level((int)(((p0 >> i) & 1u) | ((p1 >> i) & 1u) << 1 | ((p2 >> i) & 1u) << 2));
            break;
        }
    }
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
