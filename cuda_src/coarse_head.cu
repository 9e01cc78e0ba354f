// The MTP draft's coarse head (--spec-draft-coarse; backends/cuda.py coarse_copy / coarse_argmax, the reference is
// numpy_ref.py's and cq2_ref.py's). A draft only needs the argmax of the head's logits, and reading the whole LM head
// (248320 x 4096 on the 9B: 1.08 GB of Q8_0) is most of a draft step. So the draft reads a CQ2 copy of the head
// (cq2_ref.py: 2-bit codes of the levels {-3, -1, 1, 3} d and an f16 d per 32 values, 0.3125 bytes a weight), keeps
// the k best ids of those coarse logits and rescores only those k rows with the exact head: the result is the exact
// argmax whenever that is among the k. The verify keeps the exact head, so output never changes, only acceptance
// could.
//  - the copy, once at MTP setup: rows dequantized by the embed kernels (every loaded type), quantized here to CQ2
//    exactly as cq2_ref.quantize_cq2 does it, into two planes (codes, scales);
//  - the coarse GEMV: against the Q8 activations the rescoring shares, each block's dot an int8 dot chain (the
//    route's: DP4A, DP2A or IMAD) of the codes times two with the activation codes, less 3 times their sum;
//  - top-k per row: each warp keeps the k best of TOPK_SLICE values as a sorted list (topk_slices_kernel), then
//    each block of topk_merge_kernel merges up to TOPK_MERGE_LISTS lists into one until one list is left (one merge
//    pass up to 262144 values); both through warp_topk, which rejects almost every value with one compare;
//  - rescoring: the candidates' rows (dequantized by the embed kernels) dotted with the activations as the exact
//    head's GEMV sees them, and the best candidate in argmax order.
#include <algorithm>
#include <climits>

#include "common.cuh"

namespace cmp {
namespace {

constexpr int CQ2_VALUES = 32;
constexpr float CQ2_SCALE = 0.2f;                 // d = amax * 0.2 (cq2_ref.py says why)
constexpr int CQ2_WARPS = 4;                      // warps of a GEMV block
constexpr int CQ2_ROWS = 4;                       // weight rows of a GEMV warp (the activation loads shared by them)
constexpr int CQ2_UNROLL = 4;                     // blocks of each row a lane loads before it multiplies (IMAD T>2: 2)
constexpr int CQ2_MAX_T = 4;                      // activation rows of one GEMV launch
constexpr int TOPK_MAX = 32;                      // most candidates (a warp each in the rescoring, a lane each in
                                                  // a top-k list)
constexpr int TOPK_PER = 32;                      // values each lane of topk_slices_kernel holds in registers
constexpr int TOPK_SLICE = 32 * TOPK_PER;         // values one warp reduces to a list (1024: 243 lists on 248320)
constexpr int TOPK_SLICE_WARPS = 4;               // warps of a topk_slices_kernel block (61 blocks a row on 248320)
constexpr int TOPK_MERGE_WARPS = 8;               // warps of a topk_merge_kernel block, each merges 32 lists
constexpr int TOPK_MERGE_LISTS = 32 * TOPK_MERGE_WARPS;   // lists one merge block reduces to one (256)
constexpr int TOPK_GROUPS = 4;                    // groups of a lane's entries in warp_topk (its threshold's source)
constexpr unsigned FULL_MASK = 0xffffffffu;

// ==== kernels =====================================================================================================

// One CQ2 code: the nearest of the levels {-3, -1, 1, 3} d as cq2_ref.quantize_cq2 computes it, the product and the
// sum rounded apart (never an FMA: fast-math may contract a plain `x * id + 2.f`); fmaxf takes NaN to code 0 as
// numpy's fmax does.
__device__ __forceinline__ unsigned cq2_code(float x, float id) {
    return (unsigned)fminf(fmaxf(floorf(__fadd_rn(__fmul_rn(x, id), 2.f)), 0.f), 3.f);
}

// Thread per 32-value block, cq2_ref.quantize_cq2 step by step in f32 (bit for bit): amax = the largest |value|
// (fmaxf from 0: NaN ignored), d = f16(amax * 0.2), id = 1 / (2d) in IEEE round-to-nearest (fast-math's 1/x is
// approximate) or 0 for d = 0, then the codes; byte i of word w packs values 16w + i, + 4, + 8, + 12 (cq2_ref.py's
// layout: a shift and a mask give four consecutive values' codes in byte order).
__global__ void quantize_cq2_kernel(const float* __restrict__ x,  // [nblk * 32]
                                    uint2* __restrict__ codes,    // [nblk]: 8 bytes a block
                                    __half* __restrict__ scales,  // [nblk]
                                    size_t nblk) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblk) return;
    float v[CQ2_VALUES];
    const float4* xb = reinterpret_cast<const float4*>(x + b * CQ2_VALUES);   // rows of n % 32 == 0: 16-aligned
#pragma unroll
    for (int i = 0; i < CQ2_VALUES / 4; ++i) {
        const float4 f = xb[i];
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
    }
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < CQ2_VALUES; ++i) amax = fmaxf(amax, fabsf(v[i]));
    const __half d = __float2half_rn(__fmul_rn(amax, CQ2_SCALE));
    const float step = __half2float(d) * 2.f;     // exact
    const float id = step != 0.f ? __frcp_rn(step) : 0.f;
    unsigned w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        w[h] = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int k = 0; k < 4; ++k) w[h] |= cq2_code(v[16 * h + 4 * k + i], id) << (8 * i + 2 * k);
    }
    codes[b] = make_uint2(w[0], w[1]);
    scales[b] = d;
}

// Twice the codes of values 4k .. 4k + 3 of a code word, one a byte (0, 2, 4, 6: the levels 2c - 3 less their -3).
__device__ __forceinline__ int cq2_twice(unsigned w, int k) {
    return (int)((k == 0 ? w << 1 : w >> (2 * k - 1)) & 0x06060606u);
}

// y [NT, N] = the Q8 activations (xq, xd) times the CQ2 matrix: per block, I = sum (2c - 3) q as one int8 dot chain
// of the route D (the codes times two against the activation codes, started from -3 times the activation block's
// sum), exact (|I| <= 32 * 3 * 127), then acc += (d * xd) * I in fp32; a row's blocks summed lane by lane, then
// across the warp.
// Warp per CQ2_ROWS weight rows, lane l takes blocks l, l + 32, ... (8 code bytes and a scale each: a warp's load of
// a plane is one contiguous span per row); CQ2_UNROLL blocks of every row are loaded before the first multiply (a
// 4096-wide row is one round: 16 loads of codes and 16 of scales per lane in flight). The activations' codes, scale
// and block sum are read and computed once per block and token for the warp's rows (from L1: [NT, n] int8 is 16 KB
// at NT = 4, n = 4096). The weights never change after the copy, so the first round's loads go out before
// pdl_wait_producers (the activations belong to the kernel before this one).
// Issue budget (sm_90 SASS, nvcc 13, DP4A, not yet measured): T = 1 is 800 instructions a warp for a round of 4 rows
// x 4 blocks x 32 lanes (160 IDP, ~240 extracting the codes), ~1.6 warp-instructions per 10-byte row-block; the
// H200's ~16.4 bytes per SM-cycle at 4.3 TB/s bring 1.64 row-blocks a cycle, so ~2.6 of the 4 issue slots. T = 2:
// 1072 (~3.4 slots), T = 4: 1680 (~5.4: bound by instruction issue, ~1.35x the stream's time at best).
template <int NT, class D>
__global__ void __launch_bounds__(CQ2_WARPS * 32)
cq2_gemv_kernel(const int8_t* __restrict__ xq,     // [NT, n]
                const float* __restrict__ xd,      // [NT, n/32]
                const uint2* __restrict__ codes,   // [N, n/32]
                const __half* __restrict__ scales, // [N, n/32]
                float* __restrict__ y,             // [NT, N] (row stride N)
                int N, int n) {
    // IMAD's dots (8 instructions each, bytes widened in registers) at T >= 3 spilled with 4 blocks in flight
    constexpr int R = CQ2_ROWS, U = NT * D::OPS > 16 ? 2 : CQ2_UNROLL;
    const int lane = threadIdx.x, first = (blockIdx.x * CQ2_WARPS + threadIdx.y) * R;
    if (first >= N) return;
    const int nb = n / CQ2_VALUES;
    // Cursors at the lane's block of the current round (advanced a round at a time), so that every load of a round
    // is at a constant offset from one of them: no 64-bit address arithmetic per load.
    const uint2* pc[R];
    const __half* ps[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {   // rows past the last re-read it and store nothing
        const size_t row = min(first + r, N - 1);
        pc[r] = codes + row * nb + lane, ps[r] = scales + row * nb + lane;
    }
    const int4* px[NT];             // token t's activation codes, 2 int4 a block
    const float* pd[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t)
        px[t] = reinterpret_cast<const int4*>(xq + (size_t)t * n) + 2 * lane, pd[t] = xd + (size_t)t * nb + lane;
    uint2 w[U][R];
    float d[U][R];
    auto fetch = [&](int c0) {      // the round of blocks c0 + 32 u (c0: this lane's first)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (c0 + 32 * u < nb) w[u][r] = pc[r][32 * u], d[u][r] = __half2float(ps[r][32 * u]);
    };
    fetch(lane);
    pdl_allow_consumers();
    pdl_wait_producers();
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
    const int4 ones = make_int4(0x01010101, 0x01010101, 0x01010101, 0x01010101);   // dot16 with it: the sum
    for (int c0 = lane;;) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + 32 * u >= nb) break;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int4 x0 = __ldg(px[t] + 64 * u), x1 = __ldg(px[t] + 64 * u + 1);
                const float dx = __ldg(pd[t] + 32 * u);
                const int e = -3 * dot16<D>(ones, x1, dot16<D>(ones, x0));
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const unsigned lo = w[u][r].x, hi = w[u][r].y;
                    int s = D::dot4(cq2_twice(lo, 0), x0.x, e);
                    s = D::dot4(cq2_twice(lo, 1), x0.y, s);
                    s = D::dot4(cq2_twice(lo, 2), x0.z, s);
                    s = D::dot4(cq2_twice(lo, 3), x0.w, s);
                    s = D::dot4(cq2_twice(hi, 0), x1.x, s);
                    s = D::dot4(cq2_twice(hi, 1), x1.y, s);
                    s = D::dot4(cq2_twice(hi, 2), x1.z, s);
                    s = D::dot4(cq2_twice(hi, 3), x1.w, s);
                    acc[r][t] = __fmaf_rn(__fmul_rn(d[u][r], dx), __int2float_rn(s), acc[r][t]);
                }
            }
        }
        c0 += 32 * U;
        if (c0 >= nb) break;
#pragma unroll
        for (int r = 0; r < R; ++r) pc[r] += 32 * U, ps[r] += 32 * U;
#pragma unroll
        for (int t = 0; t < NT; ++t) px[t] += 64 * U, pd[t] += 32 * U;
        fetch(c0);
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0 && first + r < N) y[(size_t)t * N + first + r] = v;
        }
}

// ---- top-k: a warp's k best entries ------------------------------------------------------------------------------
// Entries are (value, id) pairs in argmax_better's order: the larger value first, the lower id among equal values;
// NaN is read as -inf (the entry stays a candidate; only a row of fewer than k numbers would take one). Padding is
// (-inf, INT_MAX): after every real entry (real ids are below INT_MAX), never better than another padding entry, so
// it fills a list only where fewer than k real entries exist, and a later merge passes it over. Real ids are
// distinct, so the order is total on real entries and every step below is exact.

__device__ __forceinline__ void set_padding(float& v, int& i) { v = -INFINITY, i = INT_MAX; }

// Bitonic sort of G entries a lane, each register on its own, into argmax order across the warp: lane 0 ends with
// each register's best (the G sorts interleave, so they take the time of one).
template <int G>
__device__ __forceinline__ void warp_sort(float (&v)[G], int (&i)[G]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            // runs of `size` lanes alternate best-first / best-last (the last run, all 32, best-first); the lower
            // lane of a pair in a best-first run keeps the better entry
            const bool keep_better = ((lane & stride) == 0) == ((lane & size) == 0);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float ov = __shfl_xor_sync(FULL_MASK, v[g], stride);
                const int oi = __shfl_xor_sync(FULL_MASK, i[g], stride);
                if (argmax_better(ov, oi, v[g], i[g]) == keep_better) v[g] = ov, i[g] = oi;
            }
        }
    }
}

// The best 32 of two sorted lists (a lane's entry each, best first) into a, sorted: a's r-th against b's
// (31 - r)-th keeps the 32 best as a bitonic sequence, which the bitonic merge then sorts.
__device__ __forceinline__ void warp_merge_best32(float& av, int& ai, float bv, int bi) {
    const int lane = threadIdx.x & 31;
    const float rv = __shfl_sync(FULL_MASK, bv, 31 - lane);
    const int ri = __shfl_sync(FULL_MASK, bi, 31 - lane);
    if (argmax_better(rv, ri, av, ai)) av = rv, ai = ri;
#pragma unroll
    for (int stride = 16; stride > 0; stride >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, av, stride);
        const int oi = __shfl_xor_sync(FULL_MASK, ai, stride);
        if (argmax_better(ov, oi, av, ai) == ((lane & stride) == 0)) av = ov, ai = oi;
    }
}

// Insert c into the sorted list (lane r: the r-th entry) where it belongs, the last entry dropping out; c must be
// better than the list's entry k - 1, which (tv, ti) is set to afterwards.
__device__ __forceinline__ void list_insert(float cv, int ci, int k, float& lv, int& li, float& tv, int& ti) {
    const int lane = threadIdx.x & 31;
    const int pos = __popc(__ballot_sync(FULL_MASK, argmax_better(lv, li, cv, ci)));   // the entries before c
    const float uv = __shfl_up_sync(FULL_MASK, lv, 1);
    const int ui = __shfl_up_sync(FULL_MASK, li, 1);
    if (lane > pos) lv = uv, li = ui;
    else if (lane == pos) lv = cv, li = ci;
    tv = __shfl_sync(FULL_MASK, lv, k - 1);
    ti = __shfl_sync(FULL_MASK, li, k - 1);
}

// The k best of the warp's 32 * V entries (at(u, lane, v, i) gives lane `lane`'s u-th entry, padding included, the
// same for every lane that asks): lane r < k ends with the r-th best in (lv, li). A lane's entries form
// TOPK_GROUPS groups (u % TOPK_GROUPS), so the warp has 32 * TOPK_GROUPS groups.
//  1. each group's best entry; the best 32 of them, sorted across the warp, are the list, and its entry k - 1, t,
//     bounds the answer: k entries are at least as good as t, so an entry worse than t is out;
//  2. each lane marks its entries better than t, its groups' bests aside (listed, or out already): only the groups
//     whose best is better than t, at most k - 1 of them, can have any, and on logits they are about one entry a
//     warp (the more groups, the fewer: the k best entries must crowd into few groups);
//  3. the marked entries one at a time (read again through at(): registers cannot be indexed by a lane's variable),
//     each inserted if still better than the list's entry k - 1, which only rises. SORTED: a lane's entries come
//     best first (merged lists), so one that fails ends its lane's; ties that crowd the k best into a few lists
//     (equal values go to the lowest ids, one slice's) would otherwise mark most of those lists.
// Every entry is a group's best, out by 2, out by 3 or in the list, and the list stays sorted, so its first k are
// the k best. The cost is step 3's count: lists whose bests spread over the groups keep it small.
template <int V, bool SORTED, typename At>
__device__ __forceinline__ void warp_topk(At at, int k, float& lv, int& li) {
    constexpr int G = TOPK_GROUPS;
    static_assert(V % G == 0, "a lane's entries split evenly into its groups");
    const int lane = threadIdx.x & 31;
    float v[V];
    int id[V];
#pragma unroll
    for (int u = 0; u < V; ++u) at(u, lane, v[u], id[u]);
    // 1. each group's best by a tree (independent compares rather than a chain of V / G), then the sorts and merges
    float bv[V];
    int bi[V];
#pragma unroll
    for (int u = 0; u < V; ++u) bv[u] = v[u], bi[u] = id[u];
#pragma unroll
    for (int s = G; s < V; s <<= 1) {
#pragma unroll
        for (int u = 0; u + s < V; u += 2 * s) {
#pragma unroll
            for (int g = 0; g < G; ++g)
                if (argmax_better(bv[u + g + s], bi[u + g + s], bv[u + g], bi[u + g]))
                    bv[u + g] = bv[u + g + s], bi[u + g] = bi[u + g + s];
        }
    }
    float gv[G];
    int gi[G], own[G];
#pragma unroll
    for (int g = 0; g < G; ++g) gv[g] = bv[g], gi[g] = own[g] = bi[g];
    warp_sort<G>(gv, gi);
#pragma unroll
    for (int s = 1; s < G; s <<= 1) {
#pragma unroll
        for (int g = 0; g + s < G; g += 2 * s) warp_merge_best32(gv[g], gi[g], gv[g + s], gi[g + s]);
    }
    lv = gv[0], li = gi[0];
    float tv = __shfl_sync(FULL_MASK, lv, k - 1);
    int ti = __shfl_sync(FULL_MASK, li, k - 1);
    // 2. (padding is never better than t)
    unsigned marked = 0;
#pragma unroll
    for (int u = 0; u < V; ++u)
        if (id[u] != own[u % G] && argmax_better(v[u], id[u], tv, ti)) marked |= 1u << u;
    // 3.
    for (;;) {
        const unsigned lanes = __ballot_sync(FULL_MASK, marked != 0);
        if (lanes == 0) break;
        const int src = __ffs(lanes) - 1;
        const int u = __shfl_sync(FULL_MASK, __ffs(marked) - 1, src);
        if (lane == src) marked &= marked - 1;
        float cv;
        int ci;
        at(u, src, cv, ci);
        if (argmax_better(cv, ci, tv, ti)) list_insert(cv, ci, k, lv, li, tv, ti);
        else if (SORTED && lane == src) marked = 0;
    }
}

// Warp per TOPK_SLICE consecutive values of a row: their k best as a list (lane u's entries: values u*32 + lane of
// the slice, coalesced); grid (ceil(lists / TOPK_SLICE_WARPS), R).
__global__ void __launch_bounds__(32 * TOPK_SLICE_WARPS)
topk_slices_kernel(const float* __restrict__ x,     // [R, n]
                   int n, int k,
                   float* __restrict__ vout,        // [R, lists, k] values, or null (one list: the answer)
                   int32_t* __restrict__ iout) {    // [R, lists, k] ids, lists = ceil(n / TOPK_SLICE)
    pdl_allow_consumers();  // first: the merge after it launches and waits for the lists
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const int lists = (n - 1) / TOPK_SLICE + 1;
    const int list = blockIdx.x * TOPK_SLICE_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (list >= lists) return;
    const float* xs = x + (size_t)blockIdx.y * n + (size_t)list * TOPK_SLICE;
    const int len = min(n - list * TOPK_SLICE, TOPK_SLICE);
    const auto at = [&](int u, int src, float& v, int& i) {
        const int j = u * 32 + src;
        if (j < len) {
            const float f = __ldg(xs + j);
            v = isnan(f) ? -INFINITY : f, i = list * TOPK_SLICE + j;
        } else {
            set_padding(v, i);
        }
    };
    float lv;
    int li;
    warp_topk<TOPK_PER, false>(at, k, lv, li);
    const size_t o = ((size_t)blockIdx.y * lists + list) * k + lane;
    if (lane < k) {
        if (vout != nullptr) vout[o] = lv;
        iout[o] = li;
    }
}

// Block per TOPK_MERGE_LISTS lists of one row (each sorted, k long): their k best as one list; grid
// (ceil(lists / TOPK_MERGE_LISTS), R). Each warp merges 32 lists, a whole list a lane (its groups' bests: the list's
// first TOPK_GROUPS entries), warp w lists w, w + 8, ... of the block's, so that a block of few lists gives each
// warp as many (a warp of fewer than k / TOPK_GROUPS lists has no threshold but padding: it inserts all their
// entries); then warp 0 merges the warps' lists, laid rank-major over the lanes (lane l: list l % 8's entries l / 8,
// l / 8 + 4, ...), so that the groups' bests are the lists' first 16 entries. Both ways a lane's entries come best
// first (warp_topk's SORTED).
__global__ void __launch_bounds__(32 * TOPK_MERGE_WARPS)
topk_merge_kernel(const float* __restrict__ vin,     // [R, lists, k]
                  const int32_t* __restrict__ iin,   // [R, lists, k]
                  int lists, int k,
                  float* __restrict__ vout,          // [R, gridDim.x, k], or null (one list: the answer)
                  int32_t* __restrict__ iout) {      // [R, gridDim.x, k]
    pdl_allow_consumers();  // first: the kernel after it launches and waits
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float sv[TOPK_MERGE_WARPS][TOPK_MAX];
    __shared__ int si[TOPK_MERGE_WARPS][TOPK_MAX];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g0 = blockIdx.x * TOPK_MERGE_LISTS + warp;
    const size_t row = (size_t)blockIdx.y * lists;
    const auto whole = [&](int u, int src, float& v, int& i) {
        const int g = g0 + src * TOPK_MERGE_WARPS;
        if (g < lists && u < k) {
            const size_t e = (row + g) * k + u;
            v = __ldg(vin + e), i = __ldg(iin + e);
        } else {
            set_padding(v, i);
        }
    };
    float lv;
    int li;
    warp_topk<TOPK_MAX, true>(whole, k, lv, li);
    if (lane < k) sv[warp][lane] = lv, si[warp][lane] = li;
    __syncthreads();
    if (warp != 0) return;
    const auto rank_major = [&](int u, int src, float& v, int& i) {
        const int f = u * 32 + src, g = f % TOPK_MERGE_WARPS, r = f / TOPK_MERGE_WARPS;
        if (r < k) v = sv[g][r], i = si[g][r];
        else set_padding(v, i);
    };
    warp_topk<TOPK_MERGE_WARPS * TOPK_MAX / 32, true>(rank_major, k, lv, li);
    const size_t o = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * k + lane;
    if (lane < k) {
        if (vout != nullptr) vout[o] = lv;
        iout[o] = li;
    }
}

// Block per row, warp per candidate: the candidate's exact logit, computed as the exact head's GEMV computes it up to
// the order of the sums -- activations as that GEMV sees them (its Q8 blocks q * d for a block-quantized head,
// the f32 row for a dense one, rounded to f16 first for an f16 one as cmp_matmul_dense does) against the
// candidate's dequantized row -- then the best candidate in argmax order (NaN never chosen; a row of NaN only gives
// the first candidate, the coarse best).
__global__ void coarse_rescore_kernel(const int8_t* __restrict__ xq,     // [R, D] or null: a dense head reads x
                                      const float* __restrict__ xd,      // [R, D/32]
                                      const float* __restrict__ x,       // [R, D]
                                      int x_f16,                         // dense: x rounded to f16 first
                                      const float* __restrict__ rows,    // [R * k, D] the candidates' rows
                                      const int32_t* __restrict__ cand,  // [R, k]
                                      int32_t* __restrict__ out,         // [R]
                                      int k, int D) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    __shared__ float sv[TOPK_MAX];
    __shared__ int si[TOPK_MAX];
    const int r = blockIdx.x, lane = threadIdx.x & 31, j = threadIdx.x >> 5;
    const float* w = rows + ((size_t)r * k + j) * D;
    float acc = 0.f;
    if (xq != nullptr) {
        const int8_t* q = xq + (size_t)r * D;
        const float* d = xd + (size_t)r * (D / 32);
        for (int i = lane; i < D; i += 32) acc += (float)q[i] * d[i >> 5] * w[i];
    } else {
        const float* xr = x + (size_t)r * D;
        for (int i = lane; i < D; i += 32) acc += (x_f16 ? __half2float(__float2half_rn(xr[i])) : xr[i]) * w[i];
    }
    acc = warp_sum(acc);
    if (lane == 0) sv[j] = acc, si[j] = cand[(size_t)r * k + j];
    __syncthreads();
    if (j == 0) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        if (lane < k && argmax_better(sv[lane], si[lane], bv, bi)) bv = sv[lane], bi = si[lane];
        warp_argmax(bv, bi);
        if (lane == 0) out[r] = bi == INT_MAX ? cand[(size_t)r * k] : bi;
    }
}

// Entries of one ping-pong half of cmp_topk's work: the first pass's lists, the longest.
size_t topk_half(int R, int N, int k) { return (size_t)R * ceil_div(N, TOPK_SLICE) * k; }

}  // namespace
}  // namespace cmp

using namespace cmp;

// ==== launchers ===================================================================================================

extern "C" int cmp_quantize_cq2(const float* x, void* codes, void* scales, int rows, int n) {
    CMP_REQUIRE(rows >= 0 && n > 0 && n % CQ2_VALUES == 0, "cmp_quantize_cq2: bad shape rows=%d n=%d (n a multiple "
                "of 32)", rows, n);
    const size_t nblk = (size_t)rows * (n / CQ2_VALUES);
    if (nblk == 0) return CMP_OK;
    return launch("quantize_cq2_kernel", quantize_cq2_kernel, dim3(ceil_div(nblk, 128)), dim3(128), 0, x,
                  static_cast<uint2*>(codes), static_cast<__half*>(scales), nblk);
}

namespace cmp {
namespace {
template <int NT, class D>
int cq2_gemv(const int8_t* xq, const float* xd, const void* codes, const void* scales, float* y, int N, int n) {
    return launch("cq2_gemv_kernel", cq2_gemv_kernel<NT, D>, dim3(ceil_div(N, CQ2_WARPS * CQ2_ROWS)),
                  dim3(32, CQ2_WARPS), 0, xq, xd, static_cast<const uint2*>(codes),
                  static_cast<const __half*>(scales), y, N, n);
}
}  // namespace
}  // namespace cmp

extern "C" int cmp_cq2_gemv(const int8_t* xq, const float* xd, const void* codes, const void* scales, float* y,
                            int T, int N, int n, int dot) {
    CMP_REQUIRE(T >= 0 && N >= 0 && n > 0 && n % CQ2_VALUES == 0, "cmp_cq2_gemv: bad shape T=%d N=%d n=%d (n a "
                "multiple of 32)", T, N, n);
    if (T == 0 || N == 0) return CMP_OK;
    return dispatch_dot(dot, "cmp_cq2_gemv", [&](auto route) -> int {
        using D = decltype(route);
        // CQ2_MAX_T activation rows a launch: their rows of y start at t0 * N
        for (int t0 = 0; t0 < T; t0 += CQ2_MAX_T) {
            const int8_t* q = xq + (size_t)t0 * n;
            const float* s = xd + (size_t)t0 * (n / CQ2_VALUES);
            float* out = y + (size_t)t0 * N;
            switch (std::min(T - t0, CQ2_MAX_T)) {
                case 1: CMP_TRY((cq2_gemv<1, D>(q, s, codes, scales, out, N, n))); break;
                case 2: CMP_TRY((cq2_gemv<2, D>(q, s, codes, scales, out, N, n))); break;
                case 3: CMP_TRY((cq2_gemv<3, D>(q, s, codes, scales, out, N, n))); break;
                default: CMP_TRY((cq2_gemv<4, D>(q, s, codes, scales, out, N, n))); break;
            }
        }
        return CMP_OK;
    });
}

extern "C" int cmp_topk_work_bytes(int R, int N, int k, size_t* bytes) {
    CMP_REQUIRE(R >= 0 && N > 0 && k >= 1 && bytes != nullptr, "cmp_topk_work_bytes: bad arguments R=%d N=%d k=%d",
                R, N, k);
    *bytes = 2 * topk_half(R, N, k) * (sizeof(float) + sizeof(int32_t));
    return CMP_OK;
}

extern "C" int cmp_topk(const float* x, int32_t* ids, void* work, int R, int N, int k) {
    CMP_REQUIRE(R >= 0 && R <= 65535 && N > 0 && k >= 1 && k <= TOPK_MAX && k <= N,
                "cmp_topk: bad shape R=%d N=%d k=%d (1 <= k <= min(%d, N), R <= 65535)", R, N, k, TOPK_MAX);
    if (R == 0) return CMP_OK;
    // two halves of (values, ids): the slices' lists go to the first, each merge pass reads one and writes the
    // other; the last pass writes ids straight out
    const size_t half = topk_half(R, N, k);
    float* wv[2] = {static_cast<float*>(work), static_cast<float*>(work) + half};
    int32_t* wi0 = reinterpret_cast<int32_t*>(wv[0] + 2 * half);
    int32_t* wi[2] = {wi0, wi0 + half};
    int lists = (int)ceil_div(N, TOPK_SLICE);
    float* vout = lists == 1 ? nullptr : wv[0];
    int32_t* iout = lists == 1 ? ids : wi[0];
    CMP_TRY(launch("topk_slices_kernel", topk_slices_kernel, dim3(ceil_div(lists, TOPK_SLICE_WARPS), R),
                   dim3(32 * TOPK_SLICE_WARPS), 0, x, N, k, vout, iout));
    for (int p = 0; lists > 1; p ^= 1) {
        const int out = (int)ceil_div(lists, TOPK_MERGE_LISTS);
        vout = out == 1 ? nullptr : wv[p ^ 1];
        iout = out == 1 ? ids : wi[p ^ 1];
        CMP_TRY(launch("topk_merge_kernel", topk_merge_kernel, dim3(out, R), dim3(32 * TOPK_MERGE_WARPS), 0,
                       static_cast<const float*>(wv[p]), static_cast<const int32_t*>(wi[p]), lists, k, vout, iout));
        lists = out;
    }
    return CMP_OK;
}

extern "C" int cmp_coarse_rescore(const int8_t* xq, const float* xd, const float* x, int x_f16, const float* rows,
                                  const int32_t* cand, int32_t* out, int R, int k, int D) {
    CMP_REQUIRE(R >= 0 && k >= 1 && k <= TOPK_MAX && D > 0, "cmp_coarse_rescore: bad shape R=%d k=%d D=%d", R, k, D);
    CMP_REQUIRE(xq != nullptr ? xd != nullptr && D % 32 == 0 : x != nullptr,
                "cmp_coarse_rescore: give xq and xd (D a multiple of 32), or x");
    if (R == 0) return CMP_OK;
    return launch("coarse_rescore_kernel", coarse_rescore_kernel, dim3(R), dim3(32 * k), 0, xq, xd, x, x_f16, rows,
                  cand, out, k, D);
}
