// The only exported C ABI of libcmpkern.so. llamacmp/lib/_native.py mirrors this file in one ctypes table.
//
// Rules: every function returns 0 on success or a CmpError code; cmp_last_error() then gives the text (per
// thread). The library never prints and never exits. All device pointers are plain cudaMalloc'd memory; shapes use
// the letters of llamacmp/backends/base.py (T tokens, L tokens of one segment, D hidden, Hq/Hk heads, Dh head dim,
// K/V GDN heads, Dk/Dv their dims, C conv channels). Matrices are row-major. Everything runs on the library's one
// stream (cmp_init); only cmp_memcpy_d2h and cmp_synchronize wait for it.
//
// Kernels that need a sequence position read it from device memory (`pos`), so a decode step can be captured as a
// CUDA graph and replayed with new positions.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum CmpError { CMP_OK = 0, CMP_ERR_CUDA = 1, CMP_ERR_ARG = 2, CMP_ERR_UNSUPPORTED = 3, CMP_ERR_NOMEM = 4 };
enum CmpDtype { CMP_F32 = 0, CMP_F16 = 1 };

const char* cmp_last_error(void);

// ---- memory.cu: device, allocation, copies, stream -------------------------------------------------------------
int cmp_init(int device);                                   // select the device, create the library's stream
int cmp_device_count(int* n);
int cmp_device_name(char* buf, int len);
int cmp_mem_info(size_t* free_bytes, size_t* total_bytes);
// Shared memory per block: every kernel that takes more than a few KB picks its configuration (smem_plan.h) from
// the device's opt-in limit, queried once per device. cmp_set_smem_cap(bytes) lowers that limit for every device of
// the process (0: each device's own), so that a large GPU runs the configurations of a card with less (tests:
// 49152 for sm_61, 65536 for sm_75, 98304 for sm_70); a kernel that fits in none is CMP_ERR_UNSUPPORTED naming
// itself and its bytes. cmp_smem_limit: the current device's limit under the cap.
int cmp_set_smem_cap(size_t bytes);
// Serial pieces (serial_pieces.cuh): the int8 prefill GEMMs (gemm_w16.cuh; matmul_q8.cu's gemm2 for Q8_0 on Volta,
// Pascal, DP2A and IMAD) cut the K range of each tile, the FP32 attention prefill
// (attention.cu, dense causal) the key range of each row tile, into pieces run in turn where that fills the device's
// waves better (gemm_chunks.h serial_pieces; the sums and their bits are the unsplit ones). A test knob like
// cmp_set_smem_cap: cmp_set_serial_pieces(p) makes every launch that can split take p pieces (a GEMM at most one a
// stage), 0 = each launch's own plan (the default). Process-wide.
int cmp_set_serial_pieces(int pieces);
int cmp_smem_limit(size_t* bytes);
int cmp_malloc(void** ptr, size_t bytes);                   // returns CMP_ERR_NOMEM when it does not fit
int cmp_free(void* ptr);
int cmp_memcpy_h2d(void* dst, const void* src, size_t bytes);
int cmp_memcpy_d2h(void* dst, const void* src, size_t bytes);   // waits for the stream
int cmp_memcpy_d2d(void* dst, const void* src, size_t bytes);
// height rows of width bytes from src (row pitch spitch bytes) to dst (row pitch dpitch): a column block of a
// row-major matrix (Backend.concat along columns).
int cmp_memcpy2d_d2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
// n device-to-device copies in one launch: regions [n] (device memory; n <= 65535) of (dst, src, bytes) each, in
// any order, so no region's dst may overlap another region's dst or src. Copied in 16-byte words where dst and src
// are equally aligned mod 16 (else 4-byte words, else bytes), any byte count and offset. max_bytes sizes the grid:
// the largest region's bytes (a larger region is still copied whole, by fewer blocks than it could use). A
// sequence's rewind after a speculative verify (CudaBackend.restore_steps: every GDN layer's conv and SSM state) is
// one launch of a table made once, instead of a copy per layer and state.
typedef struct CmpCopyRegion {
    void* dst;
    const void* src;
    size_t bytes;
} CmpCopyRegion;
int cmp_copy_regions(const CmpCopyRegion* regions, int n, size_t max_bytes);
int cmp_memset(void* ptr, int value, size_t bytes);
int cmp_synchronize(void);
// CUDA graphs of the library stream: begin capturing (relaxed mode: nothing runs until launched), end and
// instantiate into *exec (an opaque cudaGraphExec_t), replay, destroy. Captured kernels read positions and token
// ids from device buffers, so one capture serves every decode step of a fixed batch shape.
int cmp_graph_begin(void);
int cmp_graph_end(void** exec);
int cmp_graph_kernels(int* n);   // kernel launches in the graph this thread last ended (tests: launches per op)
int cmp_graph_launch(void* exec);
int cmp_graph_destroy(void* exec);
// Timing helpers for benchmarks: event pairs on the library stream. ms = elapsed between the two records.
int cmp_timer_start(void);
int cmp_timer_stop(float* ms);
// Several devices (a layer split, llamacmp/split/). "The stream" above is the calling thread's bound
// stream (cmp_set_stream) or, when none is bound, the library stream of the thread's current device (cmp_init
// creates it). A split part runs on its own thread: cmp_set_device + cmp_stream_create + cmp_set_stream once.
int cmp_set_device(int device);                             // this thread's current device (cudaSetDevice)
int cmp_get_device(int* device);
int cmp_stream_create(void** s);                            // a non-blocking stream on the current device, for
                                                            // the process (a backend's stream lives as long)
int cmp_set_stream(void* s);                                // bind s to this thread; NULL: the device's stream
// Programmatic dependent launch of the small kernels (norms, gates, conv, scan, sampling) on `device`: 1 lets each
// start while the kernel before it drains (it waits for it before touching memory); taken only where the code running
// there is compute_90+ (an sm_70 build JIT-compiled on a newer GPU cannot wait). *in_effect gets what holds.
int cmp_set_pdl(int device, int on, int* in_effect);
int cmp_can_access_peer(int* can, int device, int peer);    // 1 when device can read peer's memory (same: 1)
int cmp_enable_peer_access(int peer);                       // from the current device; already enabled is fine
// bytes from src (on src_device) to dst (on dst_device), on the stream; over NVLink/PCIe P2P when enabled.
int cmp_memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes);
int cmp_host_alloc(void** ptr, size_t bytes);               // pinned, portable host memory; CMP_ERR_NOMEM if none
int cmp_host_free(void* ptr);
// Copies between device memory and PINNED host memory, queued on the stream (no wait; fence with an event).
int cmp_memcpy_d2h_async(void* dst, const void* src, size_t bytes);
int cmp_memcpy_h2d_async(void* dst, const void* src, size_t bytes);
// Events (no timing) as fences: record on the stream; the host waits (synchronize) or the stream waits.
int cmp_event_create(void** e);                             // on the current device
int cmp_event_destroy(void* e);
int cmp_event_record(void* e);
int cmp_event_synchronize(void* e);                         // host-side wait
int cmp_stream_wait_event(void* e);                         // the stream waits (the event may be another device's)

// ---- quantize.cu ----------------------------------------------------------------------------------------------
// x [T, n] f32 -> q [T, n] int8, d [T, n/32] f32: per 32-block q = rint(x * 127/max|x|), d = f16(max|x|/127)
// (numpy_ref.quantize_q8_blocks). n % 32 == 0.
int cmp_quantize_q8(const float* x, int8_t* q, float* d, int T, int n);
// Fused producers of Q8 activations (the f32 intermediate is never written); each gives exactly the q, d of the
// unfused op followed by cmp_quantize_q8 (same fp32 expressions, same reduction order).
// x [T, D], w [D] -> q [T, D], d [T, D/32] of rmsnorm(x) * w (cmp_rmsnorm). D % 32 == 0.
int cmp_rmsnorm_q8(const float* x, const float* w, int8_t* q, float* d, int T, int D, float eps);
// a, b [T, n] -> q, d of silu(a) * b (op 0, cmp_swiglu) or a * sigmoid(b) (op 1, cmp_sigmoid_mul). n % 32 == 0.
int cmp_binary_q8(const float* a, const float* b, int op, int8_t* q, float* d, int T, int n);
// o, z [T, V*Dv], w [Dv] -> q, d of cmp_gated_rmsnorm's output. Dv % 32 == 0.
int cmp_gated_rmsnorm_q8(const float* o, const float* z, const float* w, int8_t* q, float* d, int T, int V, int Dv,
                         float eps);
// GGUF Q8_0 bytes blocks [rows, n/32, 34] (f16 scale then 32 int8) -> qs [rows, n] int8, d [rows, n/32] f16.
int cmp_q8_repack(const uint8_t* blocks, int8_t* qs, void* d, int rows, int n);

// ---- matmul_q8.cu ---------------------------------------------------------------------------------------------
// y [T, rows] = x [T, n] . W [rows, n]^T with x given as cmp_quantize_q8 output (xq [T, n], xd [T, n/32]) and
// W as qs [rows, n] int8 + wd [rows, n/32] f16. DP4A integer block dots, fp32 accumulation.
int cmp_matmul_q8(const int8_t* xq, const float* xd, const int8_t* wq, const void* wd, float* y,
                  int T, int rows, int n);
// The same for `count` (1..4) matrices that share x, in one launch when T <= 8: wq[i] [rows[i], n],
// wd[i] [rows[i], n/32], y[i] [T, rows[i]]; the pointer arrays and rows[] are host memory.
int cmp_matmul_q8_multi(const int8_t* xq, const float* xd, int count, const int8_t* const* wq, const void* const* wd,
                        float* const* y, const int* rows, int T, int n);
// The same with a choice of kernel generation and an optional residual: y[i] = res[i] + x . W_i^T where res (host
// array of `count` device pointers [T, rows[i]], entries may be NULL) is not NULL. `kernels`: CmpMatmulKernels bits;
// 0 = the v1 kernels of cmp_matmul_q8_multi. CMP_MM_GEMV2: GEMV up to T = 16 whose per-row result does not depend
// on T (batch invariant); CMP_MM_GEMM2: 128x128-tile GEMM from T = 96; CMP_MM_GEMV_PDL (with GEMV2): the GEMV is
// launched with programmatic dependent launch where its code is compute_90+ (starts streaming weights while the
// previous kernel finishes; a plain launch elsewhere). Bit values 4, 16 and 32 (the retired v3 / v4 GEMV choices)
// are refused as unknown.
// The int8 dot unit (the route, llamacmp/backends/routes.py) is a field of the same bits: CMP_MM_GEMV_DOT_SHIFT
// holds the CmpDot of the GEMV (T <= 16), CMP_MM_GEMM_DOT_SHIFT that of the GEMMs; 0 = DP4A. DP2A and IMAD run on
// both GEMVs and both GEMMs.
// CMP_MM_MMA: the GEMM (T above the GEMV's rows) on the tensor cores (the "mma" prefill route of issue 20), every T
// from there: int8 mma.sync (matmul_mma.cu) where the device runs compute_75+ code, else Volta's f16 HMMA GEMM
// (matmul_hmma.cu, compute_70 code); refused where the device runs older code. CMP_MM_MMA_F16 (with CMP_MM_MMA):
// Volta's GEMM on any card of compute capability 7.0+ (slow on newer ones: for the tests); the results of both equal
// the DP4A GEMMs' within fp32 rounding.
enum CmpMatmulKernels { CMP_MM_GEMV2 = 1, CMP_MM_GEMM2 = 2, CMP_MM_GEMV_PDL = 8, CMP_MM_MMA = 4096,
                        CMP_MM_MMA_F16 = 8192 };
enum CmpMatmulDotField { CMP_MM_GEMV_DOT_SHIFT = 8, CMP_MM_GEMM_DOT_SHIFT = 10 };
// The int8 dot of a route: DP4A (IDP.4A), DP2A (two IDP.2A on sign-extended 16-bit pairs), IMAD (byte extracts and
// four integer multiply-adds). The same integers on every route.
enum CmpDot { CMP_DOT_DP4A = 0, CMP_DOT_DP2A = 1, CMP_DOT_IMAD = 2 };
int cmp_matmul_q8_ex(const int8_t* xq, const float* xd, int count, const int8_t* const* wq, const void* const* wd,
                     float* const* y, const float* const* res, const int* rows, int T, int n, int kernels);

// ---- matmul_quant.cu ------------------------------------------------------------------------------------------
// The GGUF block types other than Q8_0, by ggml type id. On the device a matrix is the file's blocks rewritten into
// per-row planes: a body [rows, n/BV * body_bytes] (the quants, rearranged so that each 32-value sub-block is one
// contiguous run of each plane) and a head [rows, n/BV * head_bytes] (scales); body + head bytes = the file's:
// cuda_src/quant_blocks.cuh.
enum CmpQuantType { CMP_Q4_0 = 2, CMP_Q4_1 = 3, CMP_Q5_0 = 6, CMP_Q5_1 = 7, CMP_Q2_K = 10, CMP_Q3_K = 11,
                    CMP_Q4_K = 12, CMP_Q5_K = 13, CMP_Q6_K = 14, CMP_IQ2_XXS = 16, CMP_IQ2_XS = 17, CMP_IQ3_XXS = 18,
                    CMP_IQ1_S = 19, CMP_IQ4_NL = 20, CMP_IQ3_S = 21, CMP_IQ2_S = 22, CMP_IQ4_XS = 23, CMP_IQ1_M = 29 };
// Values and bytes per block in the file, and the device layout's body and head bytes per block.
int cmp_quant_layout(int type, int* block_values, int* block_bytes, int* body_bytes, int* head_bytes);
// GGUF blocks [rows, n/BV, block_bytes] (device memory) -> body, head as above (row pointers: rows are independent).
int cmp_quant_repack(int type, const uint8_t* blocks, void* body, void* head, int rows, int n);
// y[i] [T, rows[i]] = (res[i] +) x . W_i^T for `count` (1..4) matrices of one type that share x (xq [T, n] int8,
// xd [T, n/32] f32: cmp_quantize_q8 output); body/head/y/res: host arrays of device pointers (res NULL or entries
// NULL: no residual). T <= 16: one GEMV launch whose per-row result does not depend on T (batch invariant). T > 16:
// int8-dot GEMM over weights expanded into `work` (work_bytes of device memory; cmp_quant_work_bytes gives what one
// pass over `rows` rows needs, less works in row chunks down to 128 rows); with CMP_MM_MMA on the int8 tensor-core
// kernel, Q2_K, Q4_K and Q5_K are read as repacked up to 4096 tokens (Q5_K 1024), and on the DP4A route's
// gemm_w16_kernel (compute_80+ code) Q4_K up to 4096 tokens, Q2_K and Q5_K 512: there `work` holds only the
// activation half sums (T * n/16 floats, types with mins), all `count` matrices in one launch.
// `kernels`: only the dot fields of CmpMatmulKernels (the route of the GEMV and of the GEMM; 0 = DP4A), CMP_MM_MMA
// and CMP_MM_MMA_F16.
int cmp_matmul_quant(int type, const int8_t* xq, const float* xd, int count, const void* const* body,
                     const void* const* head, float* const* y, const float* const* res, const int* rows, int T, int n,
                     void* work, size_t work_bytes, int kernels);
// Workspace bytes cmp_matmul_quant needs to take a matrix (or a run of matrices) of `rows` rows in one pass with
// these kernel bits: 0 for T <= 16, only the half sums where it reads the type's planes.
int cmp_quant_work_bytes(int type, int T, int n, int rows, int kernels, size_t* bytes);
// out [T, D] = dequantized rows table[ids[t]] (table: body, head as above; ids [T] int32 on the device); the values
// of gguf.quants.dequantize exactly.
int cmp_embed_quant(int type, const int32_t* ids, const void* body, const void* head, float* out, int T, int D);

// *yes = 1 where the DP4A prefill GEMM runs gemm_w16_kernel (compute_80+ code, 60 KB of shared memory per block):
// cmp_matmul_q8_ex and cmp_matmul_quant then multiply matrices that lie one after another in memory (and the
// expanded per-32 types' group) in one launch. matmul_q8.cu.
int cmp_gemm_w16_available(int* yes);

// ---- matmul_mma.cu -------------------------------------------------------------------------------------------
// *yes = 1 where this library's code for the current device has a tensor-core GEMM (int8 mma.sync from compute_75
// code, Volta's f16 HMMA from compute_70), which cmp_matmul_q8_ex and cmp_matmul_quant run CMP_MM_MMA on; 0
// elsewhere (they refuse it there).
int cmp_mma_available(int* yes);
// *yes = 1 where it is the int8 one (CMP_MM_MMA without CMP_MM_MMA_F16 runs Volta's f16 HMMA GEMM elsewhere).
int cmp_mma_int8_available(int* yes);

// ---- matmul_hmma.cu ------------------------------------------------------------------------------------------
// *yes = 1 where this library's code for the current device has Volta's f16 HMMA GEMM (compute_70+ code), which
// CMP_MM_MMA runs on compute_70 code and CMP_MM_MMA_F16 everywhere.
int cmp_hmma_available(int* yes);

// ---- attention_mma.cu -----------------------------------------------------------------------------------------
// The tensor-core attention prefill (issue 20, attn_prefill route "mma"): what cmp_attn_prefill computes for f16 K
// and V caches, dense causal (no block lists), with Q (scaled) and the probabilities rounded to f16 for f16
// mma.sync (fp32 accumulation). Dh in {64, 128, 256}. *yes = 1 where the current device runs it (compute_80+ code
// and 101376 bytes of shared memory per block); cmp_attn_prefill_mma refuses elsewhere.
int cmp_attn_mma_available(int* yes);
int cmp_attn_prefill_mma(const float* q, const void* kc, const void* vc, const int32_t* pos, float* out, int L,
                         int Hq, int Hk, int Dh, float scale);

// ---- elementwise.cu -------------------------------------------------------------------------------------------
// out [T, D] = table[ids[t]]; Q8 table qs [N, D] int8 + d [N, D/32] f16; ids [T] int32 on the device.
int cmp_embed_q8(const int32_t* ids, const int8_t* qs, const void* d, float* out, int T, int D);
// out [T, D] = table[ids[t]]; table [N, D] f32 or f16.
int cmp_embed_f(const int32_t* ids, const void* table, int dtype, float* out, int T, int D);
// y [T, D] = x / rms(x) * w, w [D].
int cmp_rmsnorm(const float* x, const float* w, float* y, int T, int D, float eps);
int cmp_add(const float* x, const float* y, float* out, size_t n);           // out [n] = x + y
int cmp_swiglu(const float* gate, const float* up, float* out, size_t n);    // out [n] = silu(gate) * up
int cmp_sigmoid_mul(const float* x, const float* gate, float* out, size_t n);  // out [n] = x * sigmoid(gate)
// out [R, D] = x [T, D] rows `rows` [R] int32 (device).
int cmp_gather_rows(const float* x, const int32_t* rows, float* out, int R, int D);
// qg [T, Hq, 2, Dh] (per head q then gate), k [T, Hk, Dh], q_norm/k_norm [Dh], pos [T] int32 (device) ->
// q_out [T, Hq, Dh], k_out [T, Hk, Dh]: per-head RMSNorm * norm weight, then NeoX rotation of the first n_rot dims;
// gate_out [T, Hq*Dh].
int cmp_attention_prep(const float* qg, const float* k, const float* q_norm, const float* k_norm, const int32_t* pos,
                       float* q_out, float* k_out, float* gate_out, int T, int Hq, int Hk, int Dh, int n_rot,
                       float rope_base, float eps);
// alpha, beta [T, V], dt_bias, ssm_a [V] -> g [T, V] = softplus(alpha + dt_bias) * ssm_a, b [T, V] = sigmoid(beta).
int cmp_gdn_gates(const float* alpha, const float* beta, const float* dt_bias, const float* ssm_a, float* g, float* b,
                  int T, int V);
// o, z [T, V*Dv], w [Dv] -> out [T, V*Dv] = rmsnorm_per_head(o) * w * silu(z).
int cmp_gated_rmsnorm(const float* o, const float* z, const float* w, float* out, int T, int V, int Dv, float eps);

// ---- attention.cu ---------------------------------------------------------------------------------------------
// One segment of L tokens at positions pos [L] (device). k, v [L, Hk, Dh] f32 -> cache rows kc/vc [n_ctx, Hk, Dh]
// (kv_dtype CmpDtype) at pos[t].
int cmp_kv_write(const float* k, const float* v, const int32_t* pos, void* kc, void* vc, int kv_dtype, int L, int Hk,
                 int Dh);
// q [L, Hq, Dh] f32, caches kc/vc [n_ctx, Hk, Dh] (rows 0 .. pos[L-1] valid), pos [L] (device) -> out [L, Hq*Dh]:
// causal softmax(q k^T * scale) v, GQA (q head h reads kv head h / (Hq/Hk)). The keys are split into n_split
// ranges whose partial results are merged by log-sum-exp; work [n_split, L*Hq, Dh+2] f32 is needed when n_split > 1.
int cmp_attention(const float* q, const void* kc, const void* vc, int kv_dtype, const int32_t* pos, float* out,
                  float* work, int L, int Hq, int Hk, int Dh, float scale, int n_split);

// ---- attention.cu, v2: quantized KV cache, FlashAttention-2-style prefill, split-K decode ------------------------
// KV cache element types (-ctk / -ctv). F32 and F16 equal CmpDtype's codes. Cache rows are [n_ctx, Hk] rows of
// cmp_kv_row_bytes(type, Dh) bytes each; layouts in cuda_src/attention_kv.cuh and llamacmp/kv_layout.py, numerics
// in llamacmp/kv_quant.py (q8_0, q4_0: llama.cpp's rules; tq3: Walsh-Hadamard rotation + 8-level Lloyd-Max).
enum CmpKvType { CMP_KV_F32 = 0, CMP_KV_F16 = 1, CMP_KV_Q8_0 = 2, CMP_KV_Q4_0 = 3, CMP_KV_TQ3 = 4 };
// *bytes = bytes of one cache row (one token, one kv head) of this type; CMP_ERR_UNSUPPORTED for a head dim the
// type cannot hold (Dh a multiple of 32; tq3: 32, 64 or a multiple of 128).
int cmp_kv_row_bytes(int kv_type, int Dh, int* bytes);
// k, v [L, Hk, Dh] f32 -> quantized into kc (k_type) and vc (v_type) at rows pos[t] (device).
int cmp_kv_write_q(const float* k, const float* v, const int32_t* pos, void* kc, void* vc, int k_type, int v_type,
                   int L, int Hk, int Dh);
// Prefill: q [L, Hq, Dh] f32, caches (rows 0 .. pos[L-1] valid), pos [L] = pos[0] + t (device) -> out [L, Hq*Dh]
// = causal softmax(q k^T * scale) v, GQA. Dh in {64, 128, 256}. fp32 throughout (no tensor cores).
// Block-sparse (blocks != NULL): 64-token blocks in absolute positions (query block i holds positions 64i ..
// 64i+63, key block j keys 64j .. 64j+63). For kv head h and query block qb touched by the segment,
// rel = qb - pos[0]/64 (0 .. nqb-1, nqb = pos[L-1]/64 - pos[0]/64 + 1):
//   counts [Hk, nqb] int32: number of key blocks visited;
//   blocks [Hk, nqb, max_blocks] int32: their key-block indices, strictly ascending, each <= qb, the diagonal qb
//   included (the kernel relies on it for non-empty rows); entries past counts are ignored.
// One list serves every q head of the kv head's group (GQA shares each K/V tile): take the union of the group's
// per-q-head masks. Within a visited block the causal mask still applies. Device memory.
int cmp_attn_prefill(const float* q, const void* kc, const void* vc, int k_type, int v_type, const int32_t* pos,
                     float* out, int L, int Hq, int Hk, int Dh, float scale, const int32_t* blocks,
                     const int32_t* counts, int max_blocks);
// Decode (few rows): each row t attends keys 0 .. pos[t] (device), split into cmp_attn_decode_splits(pos[t] + 1)
// ranges computed on the device from the row's own length only (batch-invariant; a captured graph gets the same
// splits as an eager call), merged by log-sum-exp. max_split >= the splits of every row (the grid);
// work [max_split, L*Hq, Dh+2] f32. Dh in {64, 128, 256}; Hq/Hk in 1..8.
int cmp_attn_decode(const float* q, const void* kc, const void* vc, int k_type, int v_type, const int32_t* pos,
                    float* out, float* work, int L, int Hq, int Hk, int Dh, float scale, int max_split);
// *n_split = the most key ranges cmp_attn_decode uses for any row of at most n_kv keys (the max_split to pass).
// A row of n keys uses ceil(n / c) ranges of c = max(128, 64 * ceil(ceil(n / 128) / 64)) keys: <= 128.
int cmp_attn_decode_splits(int n_kv, int* n_split);

// ---- gdn.cu ---------------------------------------------------------------------------------------------------
// One segment. x [L, C], w [C, kernel], state [kernel-1, C] -> out [L, C] = silu(causal depthwise conv over
// [state; x]); state <- the last kernel-1 rows of [state; x]. kernel <= 8.
int cmp_conv1d_silu(const float* x, const float* w, float* state, float* out, int L, int C, int kernel);
// One segment. qkv [L, C] (C = 2*K*Dk + V*Dv, Dv == Dk), g, b [L, V], state [V, Dk, Dv] f32 -> o [L, V*Dv]:
// the gated delta rule (base.Backend.gdn), q/k L2-normalised with eps, q scaled by 1/sqrt(Dk). Updates state.
int cmp_gdn(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K, int V, int Dk,
            float eps);

// The chunked WY form of the same rule (numpy_ref.gdn_chunked, 64-token chunks, fp32), for prefill segments.
// Same arguments and result as cmp_gdn, plus a device workspace of work_bytes >= cmp_gdn_chunked_work_bytes(L, V,
// Dk) (one segment's; a caller may reuse it for the next segment on the stream); Dk in {16, 32, 64, 128}. Needs
// 89280 B of shared memory per block at Dk 128 (56512 at 64): returns CMP_ERR_UNSUPPORTED, nothing run, where the
// device has less (then use cmp_gdn).
int cmp_gdn_chunked(const float* qkv, const float* g, const float* b, float* state, float* o, int L, int K, int V,
                    int Dk, float eps, void* work, size_t work_bytes);
// *bytes = the workspace cmp_gdn_chunked needs for a segment of L tokens: 4 * ceil(L / 64) * V * (64 * Dk + 64 * 64
// + 3 * 64) (memplan.gdn_chunk_work_bytes).
int cmp_gdn_chunked_work_bytes(int L, int V, int Dk, size_t* bytes);

// Speculative verification of one segment: what cmp_conv1d_silu / cmp_gdn compute, each token of the gdn with the
// decode step's arithmetic (one launch walking the tokens; every output equals its one-token decode bit for bit),
// keeping the state after every token t < L-1 in steps (the state itself ends after token L-1, as with the plain
// calls): conv steps [L, kernel-1, C] (all L written), gdn steps [L-1, V, Dk, Dk] (may be null for L = 1). Rewind
// to token k: copy steps[k-1] over the state (cmp_memcpy_d2d).
int cmp_conv1d_silu_keep(const float* x, const float* w, float* state, float* steps, float* out, int L, int C,
                         int kernel);
int cmp_gdn_keep(const float* qkv, const float* g, const float* b, float* state, float* steps, float* o, int L, int K,
                 int V, int Dk, float eps);

// A decode batch of S sequences, one token each (row s of the inputs and outputs), sequence s's state at states[s]
// (a device array of S device pointers): one launch computing, for every sequence, exactly what cmp_conv1d_silu /
// cmp_gdn compute for it alone (L = 1). x, out [S, C]; qkv [S, C]; g, b [S, V]; o [S, V*Dk]. S <= 65535.
int cmp_conv1d_silu_rows(const float* x, const float* w, float* const* states, float* out, int S, int C, int kernel);
int cmp_gdn_rows(const float* qkv, const float* g, const float* b, float* const* states, float* o, int S, int K, int V,
                 int Dk, float eps);

// ---- sampling.cu ----------------------------------------------------------------------------------------------
// x [R, N] f32 -> out [R] int32 (device): index of the largest value per row, the lowest index among ties, NaN
// never chosen.
int cmp_argmax(const float* x, int32_t* out, int R, int N);
// llama.cpp's default sampler chain for one row (llamacmp/sampling.py with samplers in the default order and
// typ_p = 1): logits [N] + logit bias (bias_ids/bias_vals [n_bias], distinct ids; -inf for ignored EOG ids) ->
// repeat/frequency/presence penalties over the window hist [n_hist <= 4096] (the last penalty_last_n accepted
// tokens; n_hist 0 disables them) -> top-k (top_k = min(max(top_k, min_keep), N), 1..1024) -> top-p -> min-p ->
// temperature (<= 0: the best candidate) -> categorical draw by inverse CDF at u in [0, 1) (the host's seeded
// generator). work [N] f32 scratch; out [1] int32 (device); n_out [1] int32 (device, may be null): the candidates
// left for the draw (1 at temp <= 0), so the host can tell whether its sampler would have drawn a number at all.
// All arrays device memory; params host memory.
typedef struct CmpSamplerParams {
    float temp, top_p, min_p, penalty_repeat, penalty_freq, penalty_present;
    int top_k, min_keep;
} CmpSamplerParams;
int cmp_sample(const float* logits, float* work, const int32_t* hist, int n_hist, const int32_t* bias_ids,
               const float* bias_vals, int n_bias, const CmpSamplerParams* params, float u, int32_t* out,
               int32_t* n_out, int N);

// ---- coarse_head.cu: the MTP draft's argmax through a CQ2 copy of its LM head (numpy_ref coarse_argmax) -----------
// x [rows, n] f32 -> CQ2 (llamacmp/backends/cq2_ref.py): codes [rows, n/32 * 8] (2-bit codes), scales [rows, n/32]
// (f16); cq2_ref.quantize_cq2 bit for bit. n a multiple of 32.
int cmp_quantize_cq2(const float* x, void* codes, void* scales, int rows, int n);
// y [T, N] f32 = the Q8 activations xq [T, n] int8, xd [T, n/32] f32 (cmp_quantize_q8) times the CQ2 matrix codes
// [N, n/32 * 8], scales [N, n/32] (cmp_quantize_cq2), cq2_ref.cq2_gemv to fp32 rounding; dot: the int8 dot route
// (CmpDot). Up to 4 activation rows a launch (more: several launches).
int cmp_cq2_gemv(const int8_t* xq, const float* xd, const void* codes, const void* scales, float* y, int T, int N,
                 int n, int dot);
// Device bytes of the work cmp_topk needs for R rows of N values and k candidates.
int cmp_topk_work_bytes(int R, int N, int k, size_t* bytes);
// x [R, N] f32 -> ids [R, k] int32 (device): per row the ids of the k largest values, the larger first and the lower
// id among equal values (NaN counts as -inf). 1 <= k <= min(32, N), R <= 65535; work: cmp_topk_work_bytes.
int cmp_topk(const float* x, int32_t* ids, void* work, int R, int N, int k);
// Per row r: among the candidates cand [R, k] int32 (ids), whose rows of the exact head are rows [R * k, D] f32
// (row r * k + j for cand[r, j]), the id whose logit is largest (the lowest id among ties; NaN never chosen; a row of
// only NaN gives cand[r, 0]) -> out [R] int32 (device). The logit is the dot product of that row with the row's
// activations as the head's GEMV sees them: xq [R, D] int8 and xd [R, D/32] f32 (cmp_quantize_q8) for a
// block-quantized head (x unused), else (xq null) x [R, D] f32, rounded to f16 first where x_f16 (an f16 head, as
// cmp_matmul_dense). 1 <= k <= 32.
int cmp_coarse_rescore(const int8_t* xq, const float* xd, const float* x, int x_f16, const float* rows,
                       const int32_t* cand, int32_t* out, int R, int k, int D);

// ---- dense.cu -------------------------------------------------------------------------------------------------
// y [T, rows] = x [T, n] f32 . W [rows, n]^T, W f32 or f16 (w_dtype: CmpDtype); FP32 (FFMA) accumulation, no tensor
// cores. For f16 weights x is rounded to f16 first (numpy_ref.matmuls). T <= 8: a warp-per-row GEMV; larger T: a
// 64x64 or 128x128-tile GEMM. Any n (16-byte loads when n % 4 == 0).
int cmp_matmul_dense(const float* x, const void* w, int w_dtype, float* y, int T, int rows, int n);

// ---- vision.cu: the vision tower's ops (numpy_ref.NumpyBackend.bias_add ... attention_full) -----------------------
int cmp_bias_add(const float* x, const float* b, float* out, int T, int N);   // out [T, N] = x [T, N] + b [N]
// out [n] = GELU(x [n]) as Backend.gelu: x <= -10: 0; x >= 10: x; else table[f16 bits of x] (table [65536] f16 on
// the device: f16(gelu_tanh(h)) for every half h, built by the caller from the reference formula).
int cmp_gelu(const float* x, const void* table, float* out, size_t n);
// y [T, D] = (x - mean) / sqrt(mean((x - mean)^2) + eps) * w + b per row; w, b [D].
int cmp_layernorm(const float* x, const float* w, const float* b, float* y, int T, int D, float eps);
// x [T, H*Dh], pos [T, 4] int32 (device) -> out [T, H*Dh]: ggml_rope_multi VISION mode (Backend.rope_vision): pair
// i < Dh/2 rotates (i, i + Dh/2) by pos[t, axis] * base^(-2 (s - start) / (Dh/2)), s = i % (s0+s1+s2+s3) in the
// section `axis` that starts at `start`. Dh % 4 == 0.
int cmp_rope_vision(const float* x, const int32_t* pos, float* out, int T, int H, int Dh, int s0, int s1, int s2,
                    int s3, float base);
// cmp_attention_prep with per-token positions pos [T, 4] int32 (device) and IMROPE sections s0..s3
// (Backend.attention_prep with batch.rope_pos).
int cmp_attention_prep_mrope(const float* qg, const float* k, const float* q_norm, const float* k_norm,
                             const int32_t* pos, float* q_out, float* k_out, float* gate_out, int T, int Hq, int Hk,
                             int Dh, int n_rot, int s0, int s1, int s2, int s3, float rope_base, float eps);
// q [T, ldq], k [T, ldk], v [T, ldv] (head h at columns h*Dh; ld >= H*Dh lets q, k, v be views of one fused
// [T, 3*H*Dh] projection) -> out [T, H*Dh]: per head softmax(scale q k^T) v over all T rows, non-causal. Dh <= 128;
// needs (128 * S + 64 * 68) * 4 B of shared memory, S = Dh rounded up to 4 (+4 if a multiple of 8): 83 KiB at
// Dh 128 (sm_70, sm_80+; CMP_ERR_UNSUPPORTED on sm_75's 64 KiB), 55 KiB at Dh 72.
int cmp_attention_full(const float* q, const float* k, const float* v, float* out, int T, int H, int Dh, int ldq,
                       int ldk, int ldv, float scale);

// ---- sparse.cu: block-sparse prefill probe (llamacmp/sparse_attn.group_stats) ------------------------------------
// One prefill chunk of L query rows: G query groups, group g = rows gstart[g] .. gend[g]-1 of q [L, Hq, Dh] f32
// averaged into one query that sees keys 0 .. glimit[g] (positions) of the cache kc (rows [n_ctx, Hk] of k_type,
// as cmp_attn_prefill reads it; keys n_keys and beyond are never read; n_keys <= 64 * nkb). For every q head h (GQA:
// kv head h / (Hq/Hk)) and 64-key block j < nkb: mass [Hq, G, nkb] = the group query's softmax(scale q.k) over its
// visible keys, summed over the block; mean [Hq, G, nkb] = the mean of scale q.k over the block's visible keys
// (-inf where none). work: G*Hq*Dh + 4*Hq*G*nkb floats. gstart, gend, glimit [G] int32; all device memory.
int cmp_sparse_probe(const float* q, const void* kc, int k_type, const int32_t* gstart, const int32_t* gend,
                     const int32_t* glimit, float* mass, float* mean, float* work, int L, int G, int Hq, int Hk,
                     int Dh, float scale, int nkb, int n_keys);
// The block-sparse selection from cmp_sparse_probe's mass/mean [Hq, G, nkb] (G = P probe groups, then nqb query
// blocks) to cmp_attn_prefill's lists, on the device (llamacmp/sparse_attn.select_lists is the reference): pqb [P]
// each probe's query block (0 .. nqb-1); Hl lists of Hq/Hl pooled q heads; query blocks qb0 .. qb0+nqb-1, nkb =
// qb0 + nqb; keep, sink, total from sparse_attn.selection_budget. -> pattern [Hl] (index into sparse_attn.PATTERNS),
// blocks [Hl, nqb, nkb] (kept key blocks ascending, padded with the diagonal), counts [Hl, nqb] int32.
// work: 8*n + 4*n*(P + nqb + 1) + 2*n + n*nqb bytes, n = Hl*nkb (sparse_attn.select_work_bytes). Device memory.
int cmp_sparse_select(const float* mass, const float* mean, const int32_t* pqb, int32_t* pattern, int32_t* blocks,
                      int32_t* counts, void* work, int Hq, int Hl, int P, int nqb, int nkb, int qb0, int keep,
                      int sink, double total);

// ---- probe.cu: what each unit a route could use runs at on this device (llamacmp/backends/probe.py) --------------
// The units: the three int8 dot primitives of the matmul routes (common.cuh; codes equal to CmpDot), FP32 FMA,
// HFMA2, int8 mma.sync (compute_75+ code) and f16 HMMA mma.sync (compute_70+).
enum CmpProbeUnit { CMP_PROBE_DP4A = 0, CMP_PROBE_DP2A = 1, CMP_PROBE_IMAD = 2, CMP_PROBE_FFMA = 3,
                    CMP_PROBE_HFMA2 = 4, CMP_PROBE_IMMA = 5, CMP_PROBE_HMMA = 6 };
// Runs one unit's kernel (`iters` steps per chain, a few blocks per SM) -> its time in *ms and the operations it did
// in *ops (2 per multiply-add; an int8 dot4 is 8). CMP_ERR_UNSUPPORTED where the library's code on this device
// lacks the instruction (cmp_last_error says which compute_XX it needs).
int cmp_probe(int unit, int iters, float* ms, double* ops);
// The current device: compute capability as 10 * major + minor, multiprocessors, cudaDriverGetVersion.
int cmp_device_info(int* cc, int* sms, int* driver);

#ifdef __cplusplus
}
#endif
