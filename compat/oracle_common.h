// Helpers shared by the oracle tools llama_logits.cpp and llama_mtmd.cpp (each tool is one translation unit;
// compat/build_oracle_tools.sh rebuilds both when this header changes). Define ORACLE_TOOL, the tool's name for its
// error messages, before including.
#pragma once
#include "llama.h"

#include <cstdint>
#include <cstdio>
#include <string>

#ifndef ORACLE_TOOL
#error "define ORACLE_TOOL (the tool's name) before including oracle_common.h"
#endif

static int fail(const char * msg) { fprintf(stderr, ORACLE_TOOL ": %s\n", msg); return 1; }

// Index of the largest of x[0..n), the first among equal values (numpy argmax): the greedy token.
static int argmax(const float * x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

// llama.cpp's backends initialised and the model at `path` loaded on the CPU (no layer offloaded); null on failure.
static llama_model * load_model_cpu(const char * path) {
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    return llama_model_load_from_file(path, mp);
}

// The tools' context: n_ctx positions, batches of n_batch tokens, the KV cache in F32 (kv "f32") or F16 (anything
// else), flash attention on or off, 2 threads (the CPU oracle runs beside the tests).
static llama_context_params cpu_context_params(uint32_t n_ctx, uint32_t n_batch, const std::string & kv,
                                               bool flash_attn) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = cp.n_ubatch = n_batch;
    cp.type_k = cp.type_v = kv == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
    cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_threads = cp.n_threads_batch = 2;
    return cp;
}
