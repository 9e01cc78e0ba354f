// Serial pieces (issue 20): a launch whose tiles fill the device's waves badly cuts each tile's reduction range (the
// GEMMs' K, the attention prefill's keys) into `pieces` ranges that blocks run in turn (gemm_chunks.h serial_pieces
// plans it). A split launch runs tiles * pieces units piece-major (every tile's first piece, then every tile's
// second, ...); a unit of piece p > 0 waits for its tile's piece p - 1, takes up the partial state that piece parked
// (in the tile's outputs, and where the kernel needs it a small array of its own), runs its range and parks its
// state for the next piece, or finishes the tile. Each thread's arithmetic is the unsplit loop's in the same order:
// the same bits. Units are numbered in the order blocks start (a ticket), so a unit only ever waits on one that
// started before it: no deadlock whatever order the hardware dispatches blocks in. The counters are zero between
// launches (a tile's last piece clears its count, the last unit to end clears the ticket); the launches of one
// translation unit's split kernels on a device run one after another (one stream a device; a kernel launched with
// PDL waits for the one before it before it takes a ticket), so one set of counters a translation unit serves them.
// Used by gemm_w16.cuh (matmul_q8.cu, matmul_quant_*.cu), matmul_q8.cu's gemm2 and attention.cu's prefill.
#pragma once

#include <algorithm>

#include "common.cuh"
#include "gemm_chunks.h"

namespace cmp {
namespace {

constexpr int SPLIT_MAX_TILES = 16384;   // tiles a split launch may have (more: one piece)
__device__ int split_done[SPLIT_MAX_TILES];   // pieces of each tile parked, this launch
__device__ unsigned split_ticket, split_ended;  // units started / ended, this launch

// The unit this block runs, by its ticket, broadcast through `word` (the first word of the kernel's dynamic shared
// memory: no static shared memory, so smem_plan.h's sizes stay each kernel's whole; free until the caller writes
// it). Every thread of the block calls it.
__device__ __forceinline__ int split_unit(void* word) {
    if (threadIdx.x == 0) *static_cast<volatile int*>(word) = (int)atomicAdd(&split_ticket, 1u);
    __syncthreads();
    const int unit = *static_cast<volatile int*>(word);
    __syncthreads();
    return unit;
}

// Waits until the tile's piece `piece - 1` has parked its state (read it through L2: load_cg). Every thread calls it.
__device__ __forceinline__ void split_wait(int tile, int piece) {
    if (threadIdx.x == 0) {
        while (*reinterpret_cast<volatile int*>(&split_done[tile]) < piece) {
        }
        __threadfence();
    }
    __syncthreads();
}

// This unit (piece `piece`, not the tile's last) has parked its state. Every thread calls it after its stores.
__device__ __forceinline__ void split_parked(int tile, int piece) {
    __syncthreads();   // every thread's state written before the tile's count says so
    if (threadIdx.x == 0) {
        __threadfence();
        atomicExch(&split_done[tile], piece + 1);
        atomicAdd(&split_ended, 1u);   // (the last unit to end is a tile's last piece, which waits for this one)
    }
}

// The tile's last piece (of a launch of `units` units) has taken up the state: clear the tile's count (its own wait
// was its last read) and, as the last unit to end, the ticket. Thread 0's part; any thread may call it.
__device__ __forceinline__ void split_finished(int tile, unsigned units) {
    if (threadIdx.x != 0) return;
    split_done[tile] = 0;
    if (atomicAdd(&split_ended, 1u) == units - 1) {   // every other unit has started (taken its ticket) and ended
        split_ticket = 0;
        split_ended = 0;
    }
}

// The pieces of a launch of `tiles` whole tiles, `wave` of them resident at once (wave_blocks of the whole-tile
// kernel), each tile's reduction `stages` long (a bound on a forced count too; a launcher whose ranges are known on
// the device only passes none: SPLIT_NO_BOUND), a piece at least `min_stages` of them: cmp_set_serial_pieces' count
// where a test forces one (every count gives the same bits), else gemm_chunks.h's plan under the kernel's model.
// 1 where the tiles exceed `max_tiles`, the launcher's per-tile counters.
constexpr int SPLIT_NO_BOUND = 1 << 30;
inline int launch_pieces(int tiles, int max_tiles, int wave, int stages, int min_stages,
                         const chunks::SplitModel& model = chunks::SplitModel{}) {
    if (tiles > max_tiles) return 1;
    const int forced = serial_pieces_forced();
    return forced ? std::min(forced, stages) : chunks::serial_pieces(tiles, wave, stages, min_stages, model);
}

}  // namespace
}  // namespace cmp
