// Device selection, allocation, copies, the library stream and the error slot.
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common.cuh"

namespace cmp {

namespace {
thread_local char g_error[512] = "";
// The library stream and timing events of each device, created by cmp_init(device). Process-wide by design: one
// CUDA context per process and device, as the runtime API itself has. A thread may instead bind a stream of its own
// (cmp_set_stream): a layer split runs each part on its own thread and stream, one part per GPU.
constexpr int kMaxDevices = 64;
cudaStream_t g_stream[kMaxDevices] = {};
cudaEvent_t g_t0[kMaxDevices] = {}, g_t1[kMaxDevices] = {};
thread_local cudaStream_t t_stream = nullptr;   // this thread's bound stream; null: its device's library stream
// cmp_set_pdl per device: process-wide like the streams (every thread of a device launches the same way).
std::atomic<bool> g_pdl[kMaxDevices] = {};
PerDevice g_code90;                             // compute90_code
std::atomic<bool> g_facts_known[kMaxDevices] = {};
DeviceFacts g_facts[kMaxDevices] = {};          // written before g_facts_known is set (a racing first call writes
                                                // the same values)
std::atomic<size_t> g_smem_cap{0};              // cmp_set_smem_cap: process-wide, 0 = each device's own limit
std::atomic<int> g_serial_pieces{0};              // cmp_set_serial_pieces: process-wide, 0 = each launch's plan
// smem_check per device and kernel: its static shared memory and the dynamic bytes it has opted in to, so a launch
// asks the driver once per kernel and device (the attribute is per context) instead of twice per launch.
struct SmemOptIn {
    size_t static_bytes;
    size_t dynamic;
    int wave = 0;              // wave_blocks: blocks resident at once for this block size and dynamic bytes
    int wave_threads = 0;
    size_t wave_dynamic = 0;
};
std::mutex g_smem_mu;
std::unordered_map<const void*, SmemOptIn> g_smem_known[kMaxDevices];

__global__ void pdl_probe_kernel() {}   // its PTX version is every kernel's: one build, one target list

int current_device() {
    int dev = 0;
    cudaGetDevice(&dev);   // a thread that never chose a device is on device 0, as with the runtime API
    return dev < kMaxDevices ? dev : 0;
}
}  // namespace

int fail(int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return code;
}

bool pdl_on() { return g_pdl[current_device()].load(std::memory_order_relaxed); }

int code_at_least(const void* kernel, int min_ptx, PerDevice& cache, bool* yes) {
    int dev = 0;
    CMP_TRY(check_cuda(cudaGetDevice(&dev), "cudaGetDevice"));
    const bool cached = dev >= 0 && dev < PerDevice::kDevices;
    int v = cached ? cache.v[dev].load(std::memory_order_relaxed) : 0;
    if (v == 0) {
        cudaFuncAttributes fa{};
        CMP_TRY(check_cuda(cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes"));
        v = (fa.ptxVersion >= min_ptx ? 1 : 0) + 1;
        if (cached) cache.v[dev].store(v, std::memory_order_relaxed);
    }
    *yes = v == 2;
    return CMP_OK;
}

int compute90_code(bool* yes) { return code_at_least(pdl_probe_kernel, 90, g_code90, yes); }

int device_facts(DeviceFacts* f) {
    const int dev = current_device();
    if (!g_facts_known[dev].load(std::memory_order_acquire)) {
        DeviceFacts d{};
        CMP_TRY(check_cuda(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev), "SM count"));
        CMP_TRY(check_cuda(cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, dev), "L2 size"));
        CMP_TRY(check_cuda(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                           "shared memory per block"));
        g_facts[dev] = d;
        g_facts_known[dev].store(true, std::memory_order_release);
    }
    *f = g_facts[dev];
    return CMP_OK;
}

int serial_pieces_forced() { return g_serial_pieces.load(std::memory_order_relaxed); }

int smem_limit(size_t* bytes) {
    DeviceFacts f{};
    CMP_TRY(device_facts(&f));
    const size_t cap = g_smem_cap.load(std::memory_order_relaxed);
    *bytes = cap && cap < (size_t)f.smem_optin ? cap : (size_t)f.smem_optin;
    return CMP_OK;
}

int smem_check(const char* name, const void* kernel, size_t dynamic) {
    size_t limit = 0;
    CMP_TRY(smem_limit(&limit));
    std::lock_guard<std::mutex> lock(g_smem_mu);
    auto& known = g_smem_known[current_device()];
    auto it = known.find(kernel);
    if (it == known.end()) {
        cudaFuncAttributes fa{};
        CMP_TRY(check_cuda(cudaFuncGetAttributes(&fa, kernel), name));
        it = known.emplace(kernel, SmemOptIn{fa.sharedSizeBytes, 0}).first;
    }
    SmemOptIn& k = it->second;
    if (k.static_bytes + dynamic > limit)   // checked every launch: cmp_set_smem_cap may have lowered the limit
        return fail(CMP_ERR_UNSUPPORTED, "%s needs %zu B of shared memory per block (%zu static + %zu dynamic), the "
                    "device allows %zu B%s", name, k.static_bytes + dynamic, k.static_bytes, dynamic, limit,
                    g_smem_cap.load(std::memory_order_relaxed) ? " (cmp_set_smem_cap)" : "");
    if (dynamic > k.dynamic) {              // the largest asked so far: a launch with fewer bytes needs no call
        CMP_TRY(check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dynamic),
                           name));
        k.dynamic = dynamic;
    }
    return CMP_OK;
}

int wave_blocks(const char* name, const void* kernel, int threads, size_t dynamic, int* blocks) {
    CMP_TRY(smem_check(name, kernel, dynamic));   // opted in first: the occupancy counts the dynamic bytes
    DeviceFacts f{};
    CMP_TRY(device_facts(&f));
    std::lock_guard<std::mutex> lock(g_smem_mu);
    SmemOptIn& k = g_smem_known[current_device()].at(kernel);   // smem_check recorded it
    if (k.wave_threads != threads || k.wave_dynamic != dynamic) {
        int per_sm = 0;
        CMP_TRY(check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, dynamic), name));
        k.wave = per_sm * f.sms, k.wave_threads = threads, k.wave_dynamic = dynamic;
    }
    *blocks = k.wave;
    return CMP_OK;
}

cudaStream_t stream() { return t_stream ? t_stream : g_stream[current_device()]; }

// ---- cmp_copy_regions: many device copies in one launch ----------------------------------------------------------
// Block (x, r) copies its share of region r: the grid's x blocks stride over the region's words, so a region longer
// than gridDim.x * COPY_BLOCK_BYTES is still copied whole (max_bytes only sizes the grid) and a shorter one leaves
// the blocks past its end idle. The word is the widest that dst and src are equally aligned for: 16 bytes when
// (dst ^ src) % 16 == 0 (restore_steps' regions: arena blocks are 256-aligned, state rows multiples of 16 bytes),
// else 4, else 1; the bytes before dst's first aligned word and after the last whole word go one per thread.
constexpr int COPY_THREADS = 256;
constexpr size_t COPY_BLOCK_BYTES = 32768;   // per block and region: 8 passes of 256 threads x 16 bytes
constexpr int COPY_UNROLL = 4;               // words each thread loads before it stores them (loads in flight)

template <typename W>
__device__ __forceinline__ void copy_region(char* dst, const char* src, size_t bytes) {
    const size_t to_aligned = (sizeof(W) - (size_t)((uintptr_t)dst % sizeof(W))) % sizeof(W);
    const size_t head = to_aligned < bytes ? to_aligned : bytes;
    const size_t words = (bytes - head) / sizeof(W);
    const size_t tail = head + words * sizeof(W);   // the first byte after the whole words
    W* __restrict__ d = reinterpret_cast<W*>(dst + head);
    const W* __restrict__ s = reinterpret_cast<const W*>(src + head);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (COPY_UNROLL - 1) * stride < words; i += COPY_UNROLL * stride) {
        W w[COPY_UNROLL];
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; ++u) w[u] = __ldg(s + i + u * stride);
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; ++u) d[i + u * stride] = w[u];
    }
    for (; i < words; i += stride) d[i] = __ldg(s + i);
    // The edges: head + (bytes - tail) < 2 * sizeof(W) <= 32 bytes, one byte per thread of block 0.
    if (blockIdx.x == 0) {
        const size_t t = threadIdx.x;
        if (t < head) dst[t] = src[t];
        else if (t - head < bytes - tail) dst[tail + t - head] = src[tail + t - head];
    }
}

// Grid (x, n regions), COPY_THREADS threads (at least 32: the edges).
__global__ void __launch_bounds__(COPY_THREADS) copy_regions_kernel(const CmpCopyRegion* __restrict__ regions) {
    pdl_wait_producers();   // launch(): may start while the kernel before it drains
    const CmpCopyRegion r = regions[blockIdx.y];
    char* dst = static_cast<char*>(r.dst);
    const char* src = static_cast<const char*>(r.src);
    // Device memory (cudaMalloc'd, api.h): said so, the copies are global loads and stores, not generic ones.
    __builtin_assume(__isGlobal(dst) && __isGlobal(src));
    const uintptr_t apart = (uintptr_t)dst ^ (uintptr_t)src;   // the same for all of a region's blocks: no divergence
    if (apart % 16 == 0) copy_region<uint4>(dst, src, r.bytes);
    else if (apart % 4 == 0) copy_region<uint32_t>(dst, src, r.bytes);
    else copy_region<uint8_t>(dst, src, r.bytes);
}

}  // namespace cmp

using namespace cmp;

// ==== exported ===================================================================================================

extern "C" const char* cmp_last_error(void) { return g_error; }

extern "C" int cmp_set_smem_cap(size_t bytes) {
    g_smem_cap.store(bytes, std::memory_order_relaxed);
    return CMP_OK;
}

extern "C" int cmp_set_serial_pieces(int pieces) {
    CMP_REQUIRE(pieces >= 0 && pieces <= 64, "cmp_set_serial_pieces: %d pieces (0 = planned, 1..64)", pieces);
    g_serial_pieces.store(pieces, std::memory_order_relaxed);
    return CMP_OK;
}

extern "C" int cmp_smem_limit(size_t* bytes) {
    CMP_REQUIRE(bytes, "cmp_smem_limit: null output");
    return smem_limit(bytes);
}

extern "C" int cmp_device_count(int* n) { return check_cuda(cudaGetDeviceCount(n), "cudaGetDeviceCount"); }

extern "C" int cmp_init(int device) {
    CMP_REQUIRE(device >= 0 && device < kMaxDevices, "cmp_init: device %d out of range", device);
    CMP_TRY(check_cuda(cudaSetDevice(device), "cudaSetDevice"));
    if (!g_stream[device]) {
        CMP_TRY(check_cuda(cudaStreamCreateWithFlags(&g_stream[device], cudaStreamNonBlocking), "cudaStreamCreate"));
        CMP_TRY(check_cuda(cudaEventCreate(&g_t0[device]), "cudaEventCreate"));
        CMP_TRY(check_cuda(cudaEventCreate(&g_t1[device]), "cudaEventCreate"));
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
    return check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()), "cudaMemcpy H2D");
}

extern "C" int cmp_memcpy_d2h(void* dst, const void* src, size_t bytes) {
    CMP_TRY(check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()), "cudaMemcpy D2H"));
    return check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize after D2H");
}

extern "C" int cmp_memcpy_d2d(void* dst, const void* src, size_t bytes) {
    return check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "cudaMemcpy D2D");
}

extern "C" int cmp_memcpy2d_d2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                size_t height) {
    if (width == 0 || height == 0) return CMP_OK;
    return check_cuda(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice, stream()),
                      "cudaMemcpy2D D2D");
}

extern "C" int cmp_copy_regions(const CmpCopyRegion* regions, int n, size_t max_bytes) {
    CMP_REQUIRE(n >= 0 && n <= 65535, "cmp_copy_regions: %d regions (0 .. 65535: the grid's y)", n);
    CMP_REQUIRE(regions || n == 0, "cmp_copy_regions: null region table");
    if (n == 0) return CMP_OK;
    const size_t blocks = (max_bytes + COPY_BLOCK_BYTES - 1) / COPY_BLOCK_BYTES;
    const unsigned x = (unsigned)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
    return launch("copy_regions_kernel", copy_regions_kernel, dim3(x, n), dim3(COPY_THREADS), 0, regions);
}

extern "C" int cmp_memset(void* ptr, int value, size_t bytes) {
    return check_cuda(cudaMemsetAsync(ptr, value, bytes, stream()), "cudaMemset");
}

extern "C" int cmp_synchronize(void) { return check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }

extern "C" int cmp_timer_start(void) {
    const int dev = current_device();
    CMP_REQUIRE(g_t0[dev], "cmp_timer_start: call cmp_init first");
    return check_cuda(cudaEventRecord(g_t0[dev], stream()), "cudaEventRecord");
}

extern "C" int cmp_timer_stop(float* ms) {
    const int dev = current_device();
    CMP_REQUIRE(g_t1[dev], "cmp_timer_stop: call cmp_init first");
    CMP_TRY(check_cuda(cudaEventRecord(g_t1[dev], stream()), "cudaEventRecord"));
    CMP_TRY(check_cuda(cudaEventSynchronize(g_t1[dev]), "cudaEventSynchronize"));
    return check_cuda(cudaEventElapsedTime(ms, g_t0[dev], g_t1[dev]), "cudaEventElapsedTime");
}

extern "C" int cmp_graph_begin(void) {
    CMP_REQUIRE(stream(), "cmp_graph_begin: call cmp_init first");
    return check_cuda(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
}

namespace {
thread_local int t_graph_kernels = 0;   // kernel nodes of this thread's last graph (cmp_graph_kernels)
}

extern "C" int cmp_graph_end(void** exec) {
    cudaGraph_t graph = nullptr;
    CMP_TRY(check_cuda(cudaStreamEndCapture(stream(), &graph), "cudaStreamEndCapture"));
    size_t n = 0;
    t_graph_kernels = 0;
    if (cudaGraphGetNodes(graph, nullptr, &n) == cudaSuccess && n > 0) {
        std::vector<cudaGraphNode_t> nodes(n);
        cudaGraphGetNodes(graph, nodes.data(), &n);
        for (cudaGraphNode_t node : nodes) {
            cudaGraphNodeType type;
            if (cudaGraphNodeGetType(node, &type) == cudaSuccess && type == cudaGraphNodeTypeKernel) ++t_graph_kernels;
        }
    }
    cudaGraphExec_t e = nullptr;
    const int rc = check_cuda(cudaGraphInstantiate(&e, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);  // the executable graph keeps what it needs
    *exec = e;
    return rc;
}

extern "C" int cmp_graph_kernels(int* n) {
    *n = t_graph_kernels;
    return CMP_OK;
}

extern "C" int cmp_graph_launch(void* exec) {
    return check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), stream()), "cudaGraphLaunch");
}

extern "C" int cmp_graph_destroy(void* exec) {
    return check_cuda(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)), "cudaGraphExecDestroy");
}

// ---- several devices: thread binding, peer access, pinned host memory, events (a layer split's bridge) ----------

extern "C" int cmp_set_device(int device) {
    CMP_REQUIRE(device >= 0 && device < kMaxDevices, "cmp_set_device: device %d out of range", device);
    return check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

extern "C" int cmp_get_device(int* device) { return check_cuda(cudaGetDevice(device), "cudaGetDevice"); }

extern "C" int cmp_stream_create(void** s) {
    cudaStream_t st = nullptr;
    CMP_TRY(check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate"));
    *s = st;
    return CMP_OK;
}

extern "C" int cmp_set_stream(void* s) {
    t_stream = static_cast<cudaStream_t>(s);
    return CMP_OK;
}

extern "C" int cmp_set_pdl(int device, int on, int* in_effect) {
    CMP_REQUIRE(device >= 0 && device < kMaxDevices, "cmp_set_pdl: device %d out of range", device);
    bool code90 = false;
    if (on) {   // the code that runs on `device` (its own JIT of the PTX where no SASS matches)
        int prev = 0;
        CMP_TRY(check_cuda(cudaGetDevice(&prev), "cudaGetDevice"));
        CMP_TRY(check_cuda(cudaSetDevice(device), "cudaSetDevice"));
        const int rc = compute90_code(&code90);
        CMP_TRY(check_cuda(cudaSetDevice(prev), "cudaSetDevice"));
        CMP_TRY(rc);
    }
    const bool pdl = on && code90;
    g_pdl[device].store(pdl, std::memory_order_relaxed);
    *in_effect = pdl;
    return CMP_OK;
}

extern "C" int cmp_can_access_peer(int* can, int device, int peer) {
    if (device == peer) {   // the same device: plain device copies, nothing to enable
        *can = 1;
        return CMP_OK;
    }
    return check_cuda(cudaDeviceCanAccessPeer(can, device, peer), "cudaDeviceCanAccessPeer");
}

extern "C" int cmp_enable_peer_access(int peer) {
    int dev = 0;
    CMP_TRY(check_cuda(cudaGetDevice(&dev), "cudaGetDevice"));
    if (dev == peer) return CMP_OK;
    cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();   // not an error for us; clear it so later launch checks are not blamed
        return CMP_OK;
    }
    return check_cuda(e, "cudaDeviceEnablePeerAccess");
}

extern "C" int cmp_memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes) {
    return check_cuda(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream()), "cudaMemcpyPeerAsync");
}

extern "C" int cmp_host_alloc(void** ptr, size_t bytes) {
    // Portable: the pinned block is pinned for every device's context, so both ends of a bridge can DMA it.
    cudaError_t e = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return fail(CMP_ERR_NOMEM, "cudaHostAlloc of %zu bytes: out of pinned host memory", bytes);
    }
    return check_cuda(e, "cudaHostAlloc");
}

extern "C" int cmp_host_free(void* ptr) { return check_cuda(cudaFreeHost(ptr), "cudaFreeHost"); }

extern "C" int cmp_memcpy_d2h_async(void* dst, const void* src, size_t bytes) {
    return check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync D2H");
}

extern "C" int cmp_memcpy_h2d_async(void* dst, const void* src, size_t bytes) {
    return check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync H2D");
}

extern "C" int cmp_event_create(void** e) {
    cudaEvent_t ev = nullptr;
    CMP_TRY(check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate"));
    *e = ev;
    return CMP_OK;
}

extern "C" int cmp_event_destroy(void* e) {
    return check_cuda(cudaEventDestroy(static_cast<cudaEvent_t>(e)), "cudaEventDestroy");
}

extern "C" int cmp_event_record(void* e) {
    return check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(e), stream()), "cudaEventRecord");
}

extern "C" int cmp_event_synchronize(void* e) {
    return check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
}

extern "C" int cmp_stream_wait_event(void* e) {
    return check_cuda(cudaStreamWaitEvent(stream(), static_cast<cudaEvent_t>(e), 0), "cudaStreamWaitEvent");
}
