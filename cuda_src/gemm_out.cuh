// Where a prefill GEMM launch's rows go. A launch may multiply several matrices of one input at once (issue 20): a
// launch costs whole waves of blocks, so the GDN's qkv + z + beta + alpha (8192 + 4096 + 32 + 32 rows, 9B) as four
// launches at 512 tokens are 2 + 1 + 1 + 1 waves of 132 blocks on an H200, as one launch 3 (388 blocks); at the 27B
// shape (10240 + 6144 + 48 + 48 rows) 3 + 2 + 1 + 1 against 4. The matrices lie one after another in memory (Q8_0:
// CudaBackend.upload_matrices; expanded types: the workspace), so the GEMM's loop reads them as one matrix of all their
// rows; only the store tells them apart: launch rows [end[s - 1], end[s]) are matrix s's, written to y[s] (and res[s]
// added) with its own row stride ldy[s]. A tile may hold rows of two matrices (beta's and alpha's). Every output is
// still one block's sum in the block order, so the bits do not depend on which matrices share a launch.
// The DP4A GEMM (gemm_w16.cuh) and the tensor-core GEMMs (matmul_mma.cu, matmul_hmma.cu) store through this; their
// direct forms read the block types' rows through GemmPlanes / PlaneRow (below).
#pragma once

#include "common.cuh"

namespace cmp {

constexpr int GEMM_MAX_OUTS = 4;   // matrices per launch (api.h: cmp_matmul_q8_ex / cmp_matmul_quant take 4 at most)

struct GemmOut {
    int count;
    int end[GEMM_MAX_OUTS];           // the launch row where matrix s ends (cumulative rows)
    float* y[GEMM_MAX_OUTS];          // [T, ldy[s]]: matrix s's row 0 at column 0
    const float* res[GEMM_MAX_OUTS];  // [T, ldy[s]] added to y[s], or null
    int ldy[GEMM_MAX_OUTS];
};

// Matrices i .. j-1 of a call (outputs y[k] [T, rows[k]], residuals res[k] or none) as one launch's rows.
inline GemmOut run_out(float* const* y, const float* const* res, const int* rows, int i, int j) {
    GemmOut out{};
    for (int k = i, end = 0; k < j; ++k) {
        out.y[k - i] = y[k];
        out.res[k - i] = res ? res[k] : nullptr;
        out.ldy[k - i] = rows[k];
        out.end[k - i] = end += rows[k];
    }
    out.count = j - i;
    return out;
}

// Whether any matrix's residual is its output (in place): such a launch cannot park partial sums in its output.
inline bool out_in_place(const GemmOut& out) {
    for (int s = 0; s < out.count; ++s)
        if (out.res[s] == out.y[s]) return true;
    return false;
}

// Launch row r's destination: its matrix's y, res and row stride, and its column there.
struct RowOut {
    float* y;
    const float* res;
    int ld, c;
    // output (token t, this row) = v, plus the residual
    __device__ __forceinline__ void store(int t, float v) const {
        const size_t i = (size_t)t * ld + c;
        y[i] = res ? res[i] + v : v;
    }
    // A partial sum parked in the output (gemm_w16.cuh's serial pieces: the next piece of the tile takes it up), and
    // its reading through L2 (another block wrote it during this kernel).
    __device__ __forceinline__ void park(int t, float v) const { y[(size_t)t * ld + c] = v; }
    __device__ __forceinline__ float unpark(int t) const { return load_cg(y + (size_t)t * ld + c); }
};

// Found by compile-time indices into the parameter struct only (a dynamic index would copy it to local memory); call
// it once per row after the main loop, where registers are free.
__device__ __forceinline__ RowOut row_out(const GemmOut& out, int r) {
    RowOut o{out.y[0], out.res[0], out.ldy[0], r};
#pragma unroll
    for (int s = 1; s < GEMM_MAX_OUTS; ++s)
        if (s < out.count && r >= out.end[s - 1]) o = RowOut{out.y[s], out.res[s], out.ldy[s], r - out.end[s - 1]};
    return o;
}

// Where the rows come from in the GEMMs' direct forms (matmul_mma.cu's gemm_mma_planes, gemm_w16.cuh's W16Planes):
// the repacked planes (quant_blocks.cuh layout) of a run's matrices; matrix s's rows are the launch rows
// [out.end[s - 1], out.end[s]) of the launch's GemmOut.
struct GemmPlanes {
    const uint8_t* body[GEMM_MAX_OUTS];   // [rows_s, nb * Q::BODY]
    const uint8_t* head[GEMM_MAX_OUTS];   // [rows_s, nb * Q::HEAD]
};

// One row of a run's planes (Q a quant type of quant_blocks.cuh). A thread's weight row is the same in every stage,
// so its matrix and planes are found once.
template <class Q>
struct PlaneRow {
    const uint8_t *body, *head;
    int nb;
    // Launch row `row` (< R): its matrix by compile-time indices into the parameters (as row_out; a dynamic index
    // would copy them to local memory), then that matrix's row.
    static __device__ __forceinline__ PlaneRow at(const GemmPlanes& p, const GemmOut& out, int row, int n) {
        const uint8_t *body = p.body[0], *head = p.head[0];
        int first = 0;
#pragma unroll
        for (int s = 1; s < GEMM_MAX_OUTS; ++s)
            if (s < out.count && row >= out.end[s - 1]) body = p.body[s], head = p.head[s], first = out.end[s - 1];
        const int nb = n / Q::BV;
        const size_t r = (size_t)(row - first) * nb;
        return {body + r * Q::BODY, head + r * Q::HEAD, nb};
    }
    // the row's 32-value block c as loaded (the registers that decode unpacks)
    __device__ __forceinline__ typename Q::Raw load(int c) const { return Q::load(body, head, nb, c); }
};

}  // namespace cmp
