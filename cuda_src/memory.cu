// Device selection, allocation, copies, the library stream and the error slot.
#include "common.cuh"

namespace cmp {

namespace {
thread_local char g_error[512] = "";
// The library's one stream and timing events, created by cmp_init. Process-wide by design: one CUDA context per
// process and device, as the runtime API itself has.
cudaStream_t g_stream = nullptr;
cudaEvent_t g_t0 = nullptr, g_t1 = nullptr;
}  // namespace

int fail(int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return code;
}

cudaStream_t stream() { return g_stream; }

}  // namespace cmp

using namespace cmp;

// ==== exported ===================================================================================================

extern "C" const char* cmp_last_error(void) { return g_error; }

extern "C" int cmp_device_count(int* n) { return check_cuda(cudaGetDeviceCount(n), "cudaGetDeviceCount"); }

extern "C" int cmp_init(int device) {
    CMP_TRY(check_cuda(cudaSetDevice(device), "cudaSetDevice"));
    if (!g_stream) {
        CMP_TRY(check_cuda(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "cudaStreamCreate"));
        CMP_TRY(check_cuda(cudaEventCreate(&g_t0), "cudaEventCreate"));
        CMP_TRY(check_cuda(cudaEventCreate(&g_t1), "cudaEventCreate"));
    }
    return CMP_OK;
}

extern "C" int cmp_device_name(char* buf, int len) {
    int dev = 0;
    cudaDeviceProp p;
    CMP_TRY(check_cuda(cudaGetDevice(&dev), "cudaGetDevice"));
    CMP_TRY(check_cuda(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties"));
    snprintf(buf, len, "%s (sm_%d%d, %d SMs)", p.name, p.major, p.minor, p.multiProcessorCount);
    return CMP_OK;
}

extern "C" int cmp_mem_info(size_t* free_bytes, size_t* total_bytes) {
    return check_cuda(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

extern "C" int cmp_malloc(void** ptr, size_t bytes) {
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // clear the sticky-free allocation error so later launches are not blamed
        return fail(CMP_ERR_NOMEM, "cudaMalloc of %zu bytes: out of device memory", bytes);
    }
    return check_cuda(e, "cudaMalloc");
}

extern "C" int cmp_free(void* ptr) { return check_cuda(cudaFree(ptr), "cudaFree"); }

extern "C" int cmp_memcpy_h2d(void* dst, const void* src, size_t bytes) {
    // Pageable host memory: the runtime stages it, so the copy is complete when this returns.
    return check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream), "cudaMemcpy H2D");
}

extern "C" int cmp_memcpy_d2h(void* dst, const void* src, size_t bytes) {
    CMP_TRY(check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_stream), "cudaMemcpy D2H"));
    return check_cuda(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize after D2H");
}

extern "C" int cmp_memcpy_d2d(void* dst, const void* src, size_t bytes) {
    return check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream), "cudaMemcpy D2D");
}

extern "C" int cmp_memset(void* ptr, int value, size_t bytes) {
    return check_cuda(cudaMemsetAsync(ptr, value, bytes, g_stream), "cudaMemset");
}

extern "C" int cmp_synchronize(void) { return check_cuda(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize"); }

extern "C" int cmp_timer_start(void) {
    CMP_REQUIRE(g_t0, "cmp_timer_start: call cmp_init first");
    return check_cuda(cudaEventRecord(g_t0, g_stream), "cudaEventRecord");
}

extern "C" int cmp_timer_stop(float* ms) {
    CMP_REQUIRE(g_t1, "cmp_timer_stop: call cmp_init first");
    CMP_TRY(check_cuda(cudaEventRecord(g_t1, g_stream), "cudaEventRecord"));
    CMP_TRY(check_cuda(cudaEventSynchronize(g_t1), "cudaEventSynchronize"));
    return check_cuda(cudaEventElapsedTime(ms, g_t0, g_t1), "cudaEventElapsedTime");
}

extern "C" int cmp_graph_begin(void) {
    CMP_REQUIRE(g_stream, "cmp_graph_begin: call cmp_init first");
    return check_cuda(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
}

extern "C" int cmp_graph_end(void** exec) {
    cudaGraph_t graph = nullptr;
    CMP_TRY(check_cuda(cudaStreamEndCapture(g_stream, &graph), "cudaStreamEndCapture"));
    cudaGraphExec_t e = nullptr;
    const int rc = check_cuda(cudaGraphInstantiate(&e, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);  // the executable graph keeps what it needs
    *exec = e;
    return rc;
}

extern "C" int cmp_graph_launch(void* exec) {
    return check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), g_stream), "cudaGraphLaunch");
}

extern "C" int cmp_graph_destroy(void* exec) {
    return check_cuda(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)), "cudaGraphExecDestroy");
}
