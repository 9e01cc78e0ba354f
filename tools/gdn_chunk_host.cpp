// cuda_src/gdn_chunk.cuh's two kernels run on the CPU, from the same source: each block's threads are host threads
// (a block at a time), __syncthreads() a barrier of the block's threads, the warp shuffles an exchange through memory
// between two barriers of the warp's 32 threads. Shared memory, the workspace and o start as NaN, so a read of
// anything the kernels did not write shows in the result. Checks the index arithmetic, the barriers' placement
// (a read before its barrier sees NaN or a stale value) and the algebra; not the timing, nor the GPU's memory model.
// tests/test_gdn_chunk_host.py builds and runs it:
//   g++ -std=c++20 -O2 -pthread -I cuda_src tools/gdn_chunk_host.cpp -o gdn_chunk_host && ./gdn_chunk_host in out
// in: int32 L, K, V, Dk; float32 eps; qkv [L, (2K + V) Dk], g [L, V], b [L, V], state [V, Dk, Dk] (float32).
// out: o [L, V Dk], state [V, Dk, Dk] (float32).
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) float4 {
    float x, y, z, w;
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)

namespace emu {
constexpr int MAX_THREADS = 256;
thread_local dim3 thread_idx, block_idx;
std::barrier<>* block_bar = nullptr;
std::barrier<>* warp_bar[MAX_THREADS / 32] = {};
float xch[MAX_THREADS];

inline float shfl(float v, int src) {   // every lane of the warp calls it, src in 0..31
    const int w = thread_idx.x / 32;
    xch[thread_idx.x] = v;
    warp_bar[w]->arrive_and_wait();
    const float r = xch[w * 32 + src];
    warp_bar[w]->arrive_and_wait();
    return r;
}
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
inline void __syncthreads() { emu::block_bar->arrive_and_wait(); }
inline float __shfl_sync(unsigned, float v, int src) { return emu::shfl(v, src & 31); }
inline float __shfl_xor_sync(unsigned, float v, int m) { return emu::shfl(v, (threadIdx.x & 31) ^ m); }
inline float __shfl_up_sync(unsigned, float v, int d) {
    const int lane = threadIdx.x & 31;
    const float r = emu::shfl(v, lane >= d ? lane - d : lane);
    return lane >= d ? r : v;
}
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }

namespace cmp {
using std::min;
inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
inline void pdl_wait_producers() {}
inline float warp_sum(float v) {   // common.cuh's
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
}  // namespace cmp

#include "gdn_chunk.cuh"

namespace cmp {
namespace {
constexpr size_t SMEM_BYTES = 128 * 1024;
float4 gdn_smem[SMEM_BYTES / sizeof(float4)];
}  // namespace
}  // namespace cmp

namespace {

const float NaN = std::numeric_limits<float>::quiet_NaN();

// Every block of `grid` in turn, `threads` host threads each running body() as one CUDA thread.
template <typename Body>
void run_grid(dim3 grid, int threads, size_t smem, Body body) {
    if (smem > cmp::SMEM_BYTES || threads > emu::MAX_THREADS || threads % 32) {
        fprintf(stderr, "launch beyond the emulator: %zu B, %d threads\n", smem, threads);
        exit(2);
    }
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::fill_n(reinterpret_cast<float*>(cmp::gdn_smem), cmp::SMEM_BYTES / sizeof(float), NaN);
            std::barrier<> bar(threads);
            std::vector<std::unique_ptr<std::barrier<>>> warps;
            emu::block_bar = &bar;
            for (int w = 0; w < threads / 32; ++w) {
                warps.push_back(std::make_unique<std::barrier<>>(32));
                emu::warp_bar[w] = warps.back().get();
            }
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; ++t)
                pool.emplace_back([&, t] {
                    emu::thread_idx = dim3{(unsigned)t, 0, 0};
                    emu::block_idx = dim3{bx, by, 0};
                    body();
                });
            for (auto& th : pool) th.join();
        }
}

template <int DK>
void run(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K, int V, float eps) {
    using namespace cmp;
    std::vector<float> work(gdn_chunk_work_bytes<DK>(L, V) / sizeof(float), NaN);
    const unsigned nc = ceil_div(L, GDN_CH);
    run_grid(dim3{(unsigned)V, nc, 1}, GDN_NT, smem::GdnIntraLayout<DK>::bytes,
             [&] { gdn_chunk_intra_kernel<DK>(qkv, g, b, o, work.data(), L, K, V, eps); });
    run_grid(dim3{(unsigned)V, (unsigned)(DK / GDN_BV), 1}, GDN_NT, smem::GdnStateLayout<DK>::bytes,
             [&] { gdn_chunk_state_kernel<DK>(qkv, work.data(), state, o, L, K, V); });
}

bool read_all(FILE* f, void* p, size_t n) { return fread(p, 1, n, f) == n; }

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s in out\n", argv[0]);
        return 2;
    }
    FILE* f = fopen(argv[1], "rb");
    int hdr[4];
    float eps;
    if (!f || !read_all(f, hdr, sizeof hdr) || !read_all(f, &eps, sizeof eps)) return 2;
    const int L = hdr[0], K = hdr[1], V = hdr[2], Dk = hdr[3];
    const size_t C = (size_t)(2 * K + V) * Dk;
    std::vector<float> qkv(L * C), g((size_t)L * V), b((size_t)L * V), state((size_t)V * Dk * Dk);
    std::vector<float> o((size_t)L * V * Dk, NaN);
    for (auto* v : {&qkv, &g, &b, &state})
        if (!read_all(f, v->data(), v->size() * sizeof(float))) return 2;
    fclose(f);
    switch (Dk) {
        case 16: run<16>(qkv.data(), g.data(), b.data(), state.data(), o.data(), L, K, V, eps); break;
        case 32: run<32>(qkv.data(), g.data(), b.data(), state.data(), o.data(), L, K, V, eps); break;
        case 64: run<64>(qkv.data(), g.data(), b.data(), state.data(), o.data(), L, K, V, eps); break;
        case 128: run<128>(qkv.data(), g.data(), b.data(), state.data(), o.data(), L, K, V, eps); break;
        default: return 2;
    }
    FILE* out = fopen(argv[2], "wb");
    if (!out) return 2;
    fwrite(o.data(), sizeof(float), o.size(), out);
    fwrite(state.data(), sizeof(float), state.size(), out);
    fclose(out);
    return 0;
}
