// The table of cuda_src/smem_plan.h: for each kernel sized there, each dimension it is built for and each card's
// shared memory per block, the configuration its launcher picks (0: none fits) and the dynamic bytes it takes.
// Host C++ only (no CUDA): tests/test_smem_plan.py compiles and runs it.
//   g++ -std=c++17 -I cuda_src tools/smem_table.cpp -o smem_table && ./smem_table
// Output: one line per case, "kernel dim limit config bytes" (dim: head dim, GDN key dim, or 0).
#include <stdio.h>

#include <initializer_list>

#include "smem_plan.h"

using namespace cmp::smem;

namespace {

// sm_61, sm_75, sm_70, sm_80 / sm_86 / sm_89 (the smallest: 99 KB on sm_86 / sm_89), sm_90
constexpr size_t LIMITS[] = {48 * 1024, 64 * 1024, 96 * 1024, 99 * 1024, 227 * 1024};

void row(const char* kernel, int dim, size_t limit, Plan p) {
    printf("%s %d %zu %d %zu\n", kernel, dim, limit, p.config, p.bytes);
}

template <int DK>
void gdn(size_t limit) {
    row("gdn_chunk_intra_kernel", DK, limit, gdn_chunk_intra_plan<DK>(limit));
    row("gdn_chunk_state_kernel", DK, limit, gdn_chunk_state_plan<DK>(limit));
}

}  // namespace

int main() {
    for (size_t limit : LIMITS) {
        for (int Dh : {64, 72, 80, 128})   // the vision towers' head dims (64-80), and the kernel's largest
            row("attention_full_kernel", Dh, limit, attention_full_plan(Dh, limit));
        for (int Dh : {32, 96, 192})   // the round-1 kernel's head dims (the v2 kernels take the others)
            row("attention_kernel", Dh, limit, attention_plan(Dh, limit));
        for (int Dh : {64, 128, 256}) {
            row("attn_prefill_kernel", Dh, limit, attn_prefill_plan(Dh, limit));
            row("probe_scores_kernel", Dh, limit, probe_scores_plan(Dh, limit));
            for (int GP : {1, 2, 4, 8})
                for (bool tq3 : {false, true}) {
                    const size_t b = attn_decode_bytes(Dh, GP, tq3);
                    printf("attn_decode_kernel<%d,%d>%s %d %zu %d %zu\n", Dh, GP, tq3 ? "+tq3" : "", Dh, limit,
                           b <= limit ? 1 : 0, b);
                }
        }
        row("gemm_quant_kernel", 0, limit, gemm_quant_plan(limit));
        row("gemm2_q8_kernel", 0, limit, gemm2_q8_plan(limit));
        row("gemm_w16_kernel", 0, limit, gemm_w16_plan(limit, false, false));
        row("gemm_w16_kernel+min", 0, limit, gemm_w16_plan(limit, true, false));
        row("gemm_w16_kernel+per16", 0, limit, gemm_w16_plan(limit, false, true));
        row("gemm_w16_kernel+per16+min", 0, limit, gemm_w16_plan(limit, true, true));
        gdn<16>(limit);
        gdn<32>(limit);
        gdn<64>(limit);
        gdn<128>(limit);
    }
    return 0;
}
