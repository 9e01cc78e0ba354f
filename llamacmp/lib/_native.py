"""ctypes binding of libcmpkern.so: one signature table mirroring cuda_src/api.h.

Every function of the table returns an int status; `Native` wraps each so that a non-zero status raises
`NativeError` carrying cmp_last_error(). Pointers travel as plain ints (device addresses) or numpy buffers.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

_p, _i, _f, _sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_size_t

# name -> (argument types, the C prototype it mirrors). All return int (0 = success).
SIGNATURES: dict[str, tuple[tuple, str]] = {
    "cmp_init": ((_i,), "int cmp_init(int device)"),
    "cmp_device_count": ((_p,), "int cmp_device_count(int* n)"),
    "cmp_device_name": ((_p, _i), "int cmp_device_name(char* buf, int len)"),
    "cmp_mem_info": ((_p, _p), "int cmp_mem_info(size_t* free_bytes, size_t* total_bytes)"),
    "cmp_set_smem_cap": ((_sz,), "int cmp_set_smem_cap(size_t bytes)"),
    "cmp_set_serial_pieces": ((_i,), "int cmp_set_serial_pieces(int pieces)"),
    "cmp_smem_limit": ((_p,), "int cmp_smem_limit(size_t* bytes)"),
    "cmp_malloc": ((_p, _sz), "int cmp_malloc(void** ptr, size_t bytes)"),
    "cmp_free": ((_p,), "int cmp_free(void* ptr)"),
    "cmp_memcpy_h2d": ((_p, _p, _sz), "int cmp_memcpy_h2d(void* dst, const void* src, size_t bytes)"),
    "cmp_memcpy_d2h": ((_p, _p, _sz), "int cmp_memcpy_d2h(void* dst, const void* src, size_t bytes)"),
    "cmp_memcpy_d2d": ((_p, _p, _sz), "int cmp_memcpy_d2d(void* dst, const void* src, size_t bytes)"),
    "cmp_memcpy2d_d2d": ((_p, _sz, _p, _sz, _sz, _sz),
                         "int cmp_memcpy2d_d2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, "
                         "size_t height)"),
    "cmp_copy_regions": ((_p, _i, _sz),
                         "int cmp_copy_regions(const CmpCopyRegion* regions, int n, size_t max_bytes)"),
    "cmp_memset": ((_p, _i, _sz), "int cmp_memset(void* ptr, int value, size_t bytes)"),
    "cmp_synchronize": ((), "int cmp_synchronize(void)"),
    "cmp_graph_begin": ((), "int cmp_graph_begin(void)"),
    "cmp_graph_end": ((_p,), "int cmp_graph_end(void** exec)"),
    "cmp_graph_kernels": ((_p,), "int cmp_graph_kernels(int* n)"),
    "cmp_graph_launch": ((_p,), "int cmp_graph_launch(void* exec)"),
    "cmp_graph_destroy": ((_p,), "int cmp_graph_destroy(void* exec)"),
    "cmp_timer_start": ((), "int cmp_timer_start(void)"),
    "cmp_timer_stop": ((_p,), "int cmp_timer_stop(float* ms)"),
    "cmp_set_device": ((_i,), "int cmp_set_device(int device)"),
    "cmp_get_device": ((_p,), "int cmp_get_device(int* device)"),
    "cmp_stream_create": ((_p,), "int cmp_stream_create(void** s)"),
    "cmp_set_stream": ((_p,), "int cmp_set_stream(void* s)"),
    "cmp_set_pdl": ((_i, _i, _p), "int cmp_set_pdl(int device, int on, int* in_effect)"),
    "cmp_can_access_peer": ((_p, _i, _i), "int cmp_can_access_peer(int* can, int device, int peer)"),
    "cmp_enable_peer_access": ((_i,), "int cmp_enable_peer_access(int peer)"),
    "cmp_memcpy_peer_async": ((_p, _i, _p, _i, _sz),
                              "int cmp_memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, "
                              "size_t bytes)"),
    "cmp_host_alloc": ((_p, _sz), "int cmp_host_alloc(void** ptr, size_t bytes)"),
    "cmp_host_free": ((_p,), "int cmp_host_free(void* ptr)"),
    "cmp_memcpy_d2h_async": ((_p, _p, _sz), "int cmp_memcpy_d2h_async(void* dst, const void* src, size_t bytes)"),
    "cmp_memcpy_h2d_async": ((_p, _p, _sz), "int cmp_memcpy_h2d_async(void* dst, const void* src, size_t bytes)"),
    "cmp_event_create": ((_p,), "int cmp_event_create(void** e)"),
    "cmp_event_destroy": ((_p,), "int cmp_event_destroy(void* e)"),
    "cmp_event_record": ((_p,), "int cmp_event_record(void* e)"),
    "cmp_event_synchronize": ((_p,), "int cmp_event_synchronize(void* e)"),
    "cmp_stream_wait_event": ((_p,), "int cmp_stream_wait_event(void* e)"),
    "cmp_quantize_q8": ((_p, _p, _p, _i, _i), "int cmp_quantize_q8(const float* x, int8_t* q, float* d, int T, int n)"),
    "cmp_q8_repack": ((_p, _p, _p, _i, _i),
                      "int cmp_q8_repack(const uint8_t* blocks, int8_t* qs, void* d, int rows, int n)"),
    "cmp_matmul_q8": ((_p, _p, _p, _p, _p, _i, _i, _i),
                      "int cmp_matmul_q8(const int8_t* xq, const float* xd, const int8_t* wq, const void* wd, "
                      "float* y, int T, int rows, int n)"),
    "cmp_matmul_q8_multi": ((_p, _p, _i, _p, _p, _p, _p, _i, _i),
                            "int cmp_matmul_q8_multi(const int8_t* xq, const float* xd, int count, "
                            "const int8_t* const* wq, const void* const* wd, float* const* y, const int* rows, int T, "
                            "int n)"),
    "cmp_matmul_q8_ex": ((_p, _p, _i, _p, _p, _p, _p, _p, _i, _i, _i),
                         "int cmp_matmul_q8_ex(const int8_t* xq, const float* xd, int count, "
                         "const int8_t* const* wq, const void* const* wd, float* const* y, const float* const* res, "
                         "const int* rows, int T, int n, int kernels)"),
    "cmp_quant_layout": ((_i, _p, _p, _p, _p),
                         "int cmp_quant_layout(int type, int* block_values, int* block_bytes, int* body_bytes, "
                         "int* head_bytes)"),
    "cmp_quant_repack": ((_i, _p, _p, _p, _i, _i),
                         "int cmp_quant_repack(int type, const uint8_t* blocks, void* body, void* head, int rows, "
                         "int n)"),
    "cmp_matmul_quant": ((_i, _p, _p, _i, _p, _p, _p, _p, _p, _i, _i, _p, _sz, _i),
                         "int cmp_matmul_quant(int type, const int8_t* xq, const float* xd, int count, "
                         "const void* const* body, const void* const* head, float* const* y, const float* const* res, "
                         "const int* rows, int T, int n, void* work, size_t work_bytes, int kernels)"),
    "cmp_gemm_w16_available": ((_p,), "int cmp_gemm_w16_available(int* yes)"),
    "cmp_mma_available": ((_p,), "int cmp_mma_available(int* yes)"),
    "cmp_mma_int8_available": ((_p,), "int cmp_mma_int8_available(int* yes)"),
    "cmp_hmma_available": ((_p,), "int cmp_hmma_available(int* yes)"),
    "cmp_attn_mma_available": ((_p,), "int cmp_attn_mma_available(int* yes)"),
    "cmp_attn_prefill_mma": ((_p, _p, _p, _p, _p, _i, _i, _i, _i, _f),
                             "int cmp_attn_prefill_mma(const float* q, const void* kc, const void* vc, "
                             "const int32_t* pos, float* out, int L, int Hq, int Hk, int Dh, float scale)"),
    "cmp_quant_work_bytes": ((_i, _i, _i, _i, _i, _p),
                             "int cmp_quant_work_bytes(int type, int T, int n, int rows, int kernels, size_t* bytes)"),
    "cmp_embed_quant": ((_i, _p, _p, _p, _p, _i, _i),
                        "int cmp_embed_quant(int type, const int32_t* ids, const void* body, const void* head, "
                        "float* out, int T, int D)"),
    "cmp_rmsnorm_q8": ((_p, _p, _p, _p, _i, _i, _f),
                       "int cmp_rmsnorm_q8(const float* x, const float* w, int8_t* q, float* d, int T, int D, "
                       "float eps)"),
    "cmp_binary_q8": ((_p, _p, _i, _p, _p, _i, _i),
                      "int cmp_binary_q8(const float* a, const float* b, int op, int8_t* q, float* d, int T, int n)"),
    "cmp_gated_rmsnorm_q8": ((_p, _p, _p, _p, _p, _i, _i, _i, _f),
                             "int cmp_gated_rmsnorm_q8(const float* o, const float* z, const float* w, int8_t* q, "
                             "float* d, int T, int V, int Dv, float eps)"),
    "cmp_embed_q8": ((_p, _p, _p, _p, _i, _i),
                     "int cmp_embed_q8(const int32_t* ids, const int8_t* qs, const void* d, float* out, int T, int D)"),
    "cmp_embed_f": ((_p, _p, _i, _p, _i, _i),
                    "int cmp_embed_f(const int32_t* ids, const void* table, int dtype, float* out, int T, int D)"),
    "cmp_rmsnorm": ((_p, _p, _p, _i, _i, _f),
                    "int cmp_rmsnorm(const float* x, const float* w, float* y, int T, int D, float eps)"),
    "cmp_add": ((_p, _p, _p, _sz), "int cmp_add(const float* x, const float* y, float* out, size_t n)"),
    "cmp_swiglu": ((_p, _p, _p, _sz), "int cmp_swiglu(const float* gate, const float* up, float* out, size_t n)"),
    "cmp_sigmoid_mul": ((_p, _p, _p, _sz),
                        "int cmp_sigmoid_mul(const float* x, const float* gate, float* out, size_t n)"),
    "cmp_gather_rows": ((_p, _p, _p, _i, _i),
                        "int cmp_gather_rows(const float* x, const int32_t* rows, float* out, int R, int D)"),
    "cmp_attention_prep": ((_p, _p, _p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _f, _f),
                           "int cmp_attention_prep(const float* qg, const float* k, const float* q_norm, "
                           "const float* k_norm, const int32_t* pos, float* q_out, float* k_out, float* gate_out, "
                           "int T, int Hq, int Hk, int Dh, int n_rot, float rope_base, float eps)"),
    "cmp_gdn_gates": ((_p, _p, _p, _p, _p, _p, _i, _i),
                      "int cmp_gdn_gates(const float* alpha, const float* beta, const float* dt_bias, "
                      "const float* ssm_a, float* g, float* b, int T, int V)"),
    "cmp_gated_rmsnorm": ((_p, _p, _p, _p, _i, _i, _i, _f),
                          "int cmp_gated_rmsnorm(const float* o, const float* z, const float* w, float* out, int T, "
                          "int V, int Dv, float eps)"),
    "cmp_kv_write": ((_p, _p, _p, _p, _p, _i, _i, _i, _i),
                     "int cmp_kv_write(const float* k, const float* v, const int32_t* pos, void* kc, void* vc, "
                     "int kv_dtype, int L, int Hk, int Dh)"),
    "cmp_attention": ((_p, _p, _p, _i, _p, _p, _p, _i, _i, _i, _i, _f, _i),
                      "int cmp_attention(const float* q, const void* kc, const void* vc, int kv_dtype, "
                      "const int32_t* pos, float* out, float* work, int L, int Hq, int Hk, int Dh, float scale, "
                      "int n_split)"),
    "cmp_kv_row_bytes": ((_i, _i, _p), "int cmp_kv_row_bytes(int kv_type, int Dh, int* bytes)"),
    "cmp_kv_write_q": ((_p, _p, _p, _p, _p, _i, _i, _i, _i, _i),
                       "int cmp_kv_write_q(const float* k, const float* v, const int32_t* pos, void* kc, void* vc, "
                       "int k_type, int v_type, int L, int Hk, int Dh)"),
    "cmp_attn_prefill": ((_p, _p, _p, _i, _i, _p, _p, _i, _i, _i, _i, _f, _p, _p, _i),
                         "int cmp_attn_prefill(const float* q, const void* kc, const void* vc, int k_type, "
                         "int v_type, const int32_t* pos, float* out, int L, int Hq, int Hk, int Dh, float scale, "
                         "const int32_t* blocks, const int32_t* counts, int max_blocks)"),
    "cmp_attn_decode": ((_p, _p, _p, _i, _i, _p, _p, _p, _i, _i, _i, _i, _f, _i),
                        "int cmp_attn_decode(const float* q, const void* kc, const void* vc, int k_type, int v_type, "
                        "const int32_t* pos, float* out, float* work, int L, int Hq, int Hk, int Dh, float scale, "
                        "int max_split)"),
    "cmp_attn_decode_splits": ((_i, _p), "int cmp_attn_decode_splits(int n_kv, int* n_split)"),
    "cmp_conv1d_silu": ((_p, _p, _p, _p, _i, _i, _i),
                        "int cmp_conv1d_silu(const float* x, const float* w, float* state, float* out, int L, int C, "
                        "int kernel)"),
    "cmp_gdn": ((_p, _p, _p, _p, _p, _i, _i, _i, _i, _f),
                "int cmp_gdn(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K, "
                "int V, int Dk, float eps)"),
    "cmp_gdn_chunked": ((_p, _p, _p, _p, _p, _i, _i, _i, _i, _f, _p, _sz),
                        "int cmp_gdn_chunked(const float* qkv, const float* g, const float* b, float* state, "
                        "float* o, int L, int K, int V, int Dk, float eps, void* work, size_t work_bytes)"),
    "cmp_gdn_chunked_work_bytes": ((_i, _i, _i, _p),
                                   "int cmp_gdn_chunked_work_bytes(int L, int V, int Dk, size_t* bytes)"),
    "cmp_conv1d_silu_keep": ((_p, _p, _p, _p, _p, _i, _i, _i),
                             "int cmp_conv1d_silu_keep(const float* x, const float* w, float* state, float* steps, "
                             "float* out, int L, int C, int kernel)"),
    "cmp_gdn_keep": ((_p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _f),
                     "int cmp_gdn_keep(const float* qkv, const float* g, const float* b, float* state, float* steps, "
                     "float* o, int L, int K, int V, int Dk, float eps)"),
    "cmp_conv1d_silu_rows": ((_p, _p, _p, _p, _i, _i, _i),
                             "int cmp_conv1d_silu_rows(const float* x, const float* w, float* const* states, "
                             "float* out, int S, int C, int kernel)"),
    "cmp_gdn_rows": ((_p, _p, _p, _p, _p, _i, _i, _i, _i, _f),
                     "int cmp_gdn_rows(const float* qkv, const float* g, const float* b, float* const* states, "
                     "float* o, int S, int K, int V, int Dk, float eps)"),
    "cmp_argmax": ((_p, _p, _i, _i), "int cmp_argmax(const float* x, int32_t* out, int R, int N)"),
    "cmp_sample": ((_p, _p, _p, _i, _p, _p, _i, _p, _f, _p, _p, _i),
                   "int cmp_sample(const float* logits, float* work, const int32_t* hist, int n_hist, "
                   "const int32_t* bias_ids, const float* bias_vals, int n_bias, const CmpSamplerParams* params, "
                   "float u, int32_t* out, int32_t* n_out, int N)"),
    "cmp_quantize_cq2": ((_p, _p, _p, _i, _i),
                         "int cmp_quantize_cq2(const float* x, void* codes, void* scales, int rows, int n)"),
    "cmp_cq2_gemv": ((_p, _p, _p, _p, _p, _i, _i, _i, _i),
                     "int cmp_cq2_gemv(const int8_t* xq, const float* xd, const void* codes, const void* scales, "
                     "float* y, int T, int N, int n, int dot)"),
    "cmp_topk_work_bytes": ((_i, _i, _i, _p), "int cmp_topk_work_bytes(int R, int N, int k, size_t* bytes)"),
    "cmp_topk": ((_p, _p, _p, _i, _i, _i),
                 "int cmp_topk(const float* x, int32_t* ids, void* work, int R, int N, int k)"),
    "cmp_coarse_rescore": ((_p, _p, _p, _i, _p, _p, _p, _i, _i, _i),
                           "int cmp_coarse_rescore(const int8_t* xq, const float* xd, const float* x, int x_f16, "
                           "const float* rows, const int32_t* cand, int32_t* out, int R, int k, int D)"),
    "cmp_matmul_dense": ((_p, _p, _i, _p, _i, _i, _i),
                         "int cmp_matmul_dense(const float* x, const void* w, int w_dtype, float* y, int T, int rows, "
                         "int n)"),
    "cmp_bias_add": ((_p, _p, _p, _i, _i),
                     "int cmp_bias_add(const float* x, const float* b, float* out, int T, int N)"),
    "cmp_gelu": ((_p, _p, _p, _sz), "int cmp_gelu(const float* x, const void* table, float* out, size_t n)"),
    "cmp_layernorm": ((_p, _p, _p, _p, _i, _i, _f),
                      "int cmp_layernorm(const float* x, const float* w, const float* b, float* y, int T, int D, "
                      "float eps)"),
    "cmp_rope_vision": ((_p, _p, _p, _i, _i, _i, _i, _i, _i, _i, _f),
                        "int cmp_rope_vision(const float* x, const int32_t* pos, float* out, int T, int H, int Dh, "
                        "int s0, int s1, int s2, int s3, float base)"),
    "cmp_attention_prep_mrope": ((_p, _p, _p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _i, _i, _i, _i, _f, _f),
                                 "int cmp_attention_prep_mrope(const float* qg, const float* k, const float* q_norm, "
                                 "const float* k_norm, const int32_t* pos, float* q_out, float* k_out, "
                                 "float* gate_out, int T, int Hq, int Hk, int Dh, int n_rot, int s0, int s1, int s2, "
                                 "int s3, float rope_base, float eps)"),
    "cmp_attention_full": ((_p, _p, _p, _p, _i, _i, _i, _i, _i, _i, _f),
                           "int cmp_attention_full(const float* q, const float* k, const float* v, float* out, int T, "
                           "int H, int Dh, int ldq, int ldk, int ldv, float scale)"),
    "cmp_sparse_probe": ((_p, _p, _i, _p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _f, _i, _i),
                         "int cmp_sparse_probe(const float* q, const void* kc, int k_type, const int32_t* gstart, "
                         "const int32_t* gend, const int32_t* glimit, float* mass, float* mean, float* work, int L, "
                         "int G, int Hq, int Hk, int Dh, float scale, int nkb, int n_keys)"),
    "cmp_sparse_select": ((_p, _p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _i, _i, _i, ctypes.c_double),
                          "int cmp_sparse_select(const float* mass, const float* mean, const int32_t* pqb, "
                          "int32_t* pattern, int32_t* blocks, int32_t* counts, void* work, int Hq, int Hl, int P, "
                          "int nqb, int nkb, int qb0, int keep, int sink, double total)"),
    "cmp_probe": ((_i, _i, _p, _p), "int cmp_probe(int unit, int iters, float* ms, double* ops)"),
    "cmp_device_info": ((_p, _p, _p), "int cmp_device_info(int* cc, int* sms, int* driver)"),
}


class CmpSamplerParams(ctypes.Structure):
    """api.h's CmpSamplerParams (passed by pointer, copied by the library)."""
    _fields_ = [("temp", _f), ("top_p", _f), ("min_p", _f), ("penalty_repeat", _f), ("penalty_freq", _f),
                ("penalty_present", _f), ("top_k", _i), ("min_keep", _i)]

# api.h CmpCopyRegion (cmp_copy_regions' device table): dst, src, bytes, three 8-byte words each (64-bit platforms);
# a numpy uint64 array [n, COPY_REGION_WORDS] has its layout, and region k of a table starts k * COPY_REGION_BYTES in.
COPY_REGION_WORDS = 3
COPY_REGION_BYTES = 8 * COPY_REGION_WORDS


def copy_region_table(regions) -> np.ndarray:
    """(dst, src, bytes) regions -> cmp_copy_regions' table, uint64 [n, COPY_REGION_WORDS]: its bytes are n
    CmpCopyRegion."""
    return np.array(list(regions), np.uint64).reshape(-1, COPY_REGION_WORDS)


CMP_F32, CMP_F16 = 0, 1
# api.h CmpKvType: the KV cache types by llamacmp name (f32/f16 equal CmpDtype's codes)
CMP_KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 2, "q4_0": 3, "tq3": 4}
CMP_MM_GEMV2, CMP_MM_GEMM2 = 1, 2   # cmp_matmul_q8_ex kernel choices (api.h CmpMatmulKernels)
CMP_MM_GEMV_PDL = 8   # the same: with GEMV2, its launch with programmatic dependent launch (sm_90+)
CMP_MM_MMA = 4096   # the GEMM on the tensor cores (int8 mma.sync, Volta: f16 HMMA); cmp_matmul_quant takes it too
CMP_MM_MMA_F16 = 8192   # with CMP_MM_MMA: Volta's f16 HMMA GEMM (matmul_hmma.cu) on any card of sm_70+ code
CMP_MM_GEMV_DOT_SHIFT, CMP_MM_GEMM_DOT_SHIFT = 8, 10   # api.h CmpMatmulDotField: where each path's CmpDot goes
CMP_DOTS = {"dp4a": 0, "dp2a": 1, "imad": 2}   # api.h CmpDot by route name (backends/routes.py)
# api.h CmpProbeUnit by the probe table's unit names (backends/probe.py)
CMP_PROBE_UNITS = {"dp4a": 0, "dp2a": 1, "imad": 2, "ffma": 3, "hfma2": 4, "imma": 5, "hmma": 6}
# api.h CmpQuantType: the block types other than Q8_0 with decoders, by GGUF type name (the ggml type ids)
CMP_QUANT_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13,
                   "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19,
                   "IQ3_S": 21, "IQ2_S": 22, "IQ1_M": 29}
CMP_BINARY_SWIGLU, CMP_BINARY_SIGMOID_MUL = 0, 1   # cmp_binary_q8 ops
CMP_ERR_UNSUPPORTED, CMP_ERR_NOMEM = 3, 4


class NativeError(RuntimeError):
    """A libcmpkern call failed; the message is the library's cmp_last_error() text."""

    def __init__(self, func: str, code: int, message: str):
        super().__init__(f"{func}: {message} (code {code})")
        self.func, self.code, self.message = func, code, message


def library_path() -> Path:
    """$LLAMACMP_LIB, else libcmpkern.so beside this file."""
    env = os.environ.get("LLAMACMP_LIB")
    return Path(env) if env else Path(__file__).with_name("libcmpkern.so")


class Native:
    """The loaded library: attribute `cmp_xxx(...)` calls the C function and raises NativeError on failure."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else library_path()
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path} not found: build it with `make` (needs nvcc)")
        self._lib = ctypes.CDLL(str(self.path))
        self._lib.cmp_last_error.restype = ctypes.c_char_p
        self._lib.cmp_last_error.argtypes = ()
        for name, (argtypes, _proto) in SIGNATURES.items():
            try:
                fn = getattr(self._lib, name)
            except AttributeError:     # an OSError, so that callers treat it as "no usable library"
                raise OSError(f"{self.path} has no {name}: it is older than llamacmp/lib/_native.py; rebuild it "
                              "with `make`") from None
            fn.restype, fn.argtypes = ctypes.c_int, argtypes
            setattr(self, name, self._checked(name, fn))

    def _checked(self, name, fn):
        last_error = self._lib.cmp_last_error

        def call(*args):
            rc = fn(*args)
            if rc != 0:
                raise NativeError(name, rc, last_error().decode(errors="replace"))
        call.__name__ = name
        call.__doc__ = SIGNATURES[name][1]
        return call

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self.cmp_device_count(ctypes.byref(n))
        return n.value

    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.cmp_device_name(buf, len(buf))
        return buf.value.decode()

    def set_pdl(self, device: int, on: bool) -> bool:
        """cmp_set_pdl: -> whether the small kernels of `device` now launch with PDL."""
        in_effect = ctypes.c_int(0)
        self.cmp_set_pdl(device, int(on), ctypes.byref(in_effect))
        return bool(in_effect.value)

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        self.cmp_mem_info(ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def smem_limit(self) -> int:
        """cmp_smem_limit: the shared memory per block the current device's kernels size themselves by."""
        b = ctypes.c_size_t(0)
        self.cmp_smem_limit(ctypes.byref(b))
        return b.value

    def quant_layout(self, type_id: int) -> tuple[int, int, int, int]:
        """-> (values per block, file bytes per block, device body bytes, device head bytes) of a CmpQuantType."""
        v = [ctypes.c_int(0) for _ in range(4)]
        self.cmp_quant_layout(type_id, *(ctypes.byref(x) for x in v))
        return tuple(x.value for x in v)

    def quant_work_bytes(self, type_id: int, T: int, n: int, rows: int, kernels: int) -> int:
        """Workspace bytes cmp_matmul_quant needs for one pass over `rows` rows at T tokens with these kernel bits (0
        for the GEMV; the half sums alone where the GEMM reads the type's planes)."""
        b = ctypes.c_size_t(0)
        self.cmp_quant_work_bytes(type_id, T, n, rows, kernels, ctypes.byref(b))
        return b.value

    def gdn_chunked_work_bytes(self, L: int, V: int, Dk: int) -> int:
        """Device bytes of the workspace cmp_gdn_chunked needs for one segment of L tokens."""
        b = ctypes.c_size_t(0)
        self.cmp_gdn_chunked_work_bytes(L, V, Dk, ctypes.byref(b))
        return b.value

    def topk_work_bytes(self, R: int, N: int, k: int) -> int:
        """Device bytes of the work cmp_topk needs for R rows of N values and k candidates."""
        b = ctypes.c_size_t(0)
        self.cmp_topk_work_bytes(R, N, k, ctypes.byref(b))
        return b.value

    def gemm_w16_available(self) -> bool:
        """cmp_gemm_w16_available: whether the DP4A prefill GEMM is gemm_w16_kernel here (compute_80+ code), which
        takes adjacent matrices (CudaBackend.upload_matrices) in one launch."""
        yes = ctypes.c_int(0)
        self.cmp_gemm_w16_available(ctypes.byref(yes))
        return bool(yes.value)

    def mma_available(self) -> bool:
        """cmp_mma_available: whether the current device runs one of this library's tensor-core GEMMs (int8 mma.sync
        from compute_75 code, Volta's f16 HMMA from compute_70)."""
        yes = ctypes.c_int(0)
        self.cmp_mma_available(ctypes.byref(yes))
        return bool(yes.value)

    def mma_int8_available(self) -> bool:
        """cmp_mma_int8_available: whether that GEMM is the int8 mma.sync one (compute_75+ code); else the mma route
        runs Volta's f16 HMMA GEMM."""
        yes = ctypes.c_int(0)
        self.cmp_mma_int8_available(ctypes.byref(yes))
        return bool(yes.value)

    def hmma_available(self) -> bool:
        """cmp_hmma_available: whether the current device runs this library's Volta f16 HMMA GEMM (compute_70+
        code; CMP_MM_MMA_F16 forces it on newer cards)."""
        yes = ctypes.c_int(0)
        self.cmp_hmma_available(ctypes.byref(yes))
        return bool(yes.value)

    def attn_mma_available(self) -> bool:
        """cmp_attn_mma_available: whether the current device runs this library's f16 tensor-core attention prefill
        (compute_80+ code and the shared memory it needs)."""
        yes = ctypes.c_int(0)
        self.cmp_attn_mma_available(ctypes.byref(yes))
        return bool(yes.value)

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p(0)
        self.cmp_malloc(ctypes.byref(p), nbytes)
        return p.value or 0

    def graph_end(self) -> int:
        e = ctypes.c_void_p(0)
        self.cmp_graph_end(ctypes.byref(e))
        return e.value or 0

    def graph_kernels(self) -> int:
        """Kernel launches in the graph this thread last captured (graph_end)."""
        n = ctypes.c_int(0)
        self.cmp_graph_kernels(ctypes.byref(n))
        return n.value

    def _out_ptr(self, fn, *args) -> int:
        """Call `fn(void** out, *args)` and return *out as an int (0 for NULL)."""
        p = ctypes.c_void_p(0)
        fn(ctypes.byref(p), *args)
        return p.value or 0

    def stream_create(self) -> int:
        return self._out_ptr(self.cmp_stream_create)

    def event_create(self) -> int:
        return self._out_ptr(self.cmp_event_create)

    def host_alloc(self, nbytes: int) -> int:
        return self._out_ptr(self.cmp_host_alloc, nbytes)

    def can_access_peer(self, device: int, peer: int) -> bool:
        can = ctypes.c_int(0)
        self.cmp_can_access_peer(ctypes.byref(can), device, peer)
        return bool(can.value)

    def kv_row_bytes(self, kv_type: str, head_dim: int) -> int:
        """Bytes of one KV cache row (one token, one kv head) of this type (cmp_kv_row_bytes)."""
        b = ctypes.c_int(0)
        self.cmp_kv_row_bytes(CMP_KV_TYPES[kv_type], head_dim, ctypes.byref(b))
        return b.value

    def attn_decode_splits(self, n_kv: int) -> int:
        """Key ranges cmp_attn_decode uses for a row of n_kv keys (a function of n_kv only)."""
        n = ctypes.c_int(0)
        self.cmp_attn_decode_splits(n_kv, ctypes.byref(n))
        return n.value

    def probe(self, unit: str, iters: int) -> tuple[float, float]:
        """cmp_probe: one run of a unit's kernel -> (milliseconds, operations). NativeError (code
        CMP_ERR_UNSUPPORTED) where the library's code on this device lacks the instruction."""
        ms, ops = ctypes.c_float(0), ctypes.c_double(0)
        self.cmp_probe(CMP_PROBE_UNITS[unit], iters, ctypes.byref(ms), ctypes.byref(ops))
        return ms.value, ops.value

    def device_info(self) -> tuple[int, int, int]:
        """-> (compute capability as 10 * major + minor, multiprocessors, cudaDriverGetVersion) of the current device."""
        v = [ctypes.c_int(0) for _ in range(3)]
        self.cmp_device_info(*(ctypes.byref(x) for x in v))
        return v[0].value, v[1].value, v[2].value

    def timer_stop(self) -> float:
        ms = ctypes.c_float(0)
        self.cmp_timer_stop(ctypes.byref(ms))
        return ms.value


def cuda_available() -> bool:
    """The library exists, loads, and sees at least one GPU."""
    try:
        return Native().device_count() > 0
    except (OSError, NativeError):
        return False
