// matmul_quant.cuh's GEMV and GEMM on the IMAD route: one translation unit per route, so the routes compile in
// parallel.
#include "matmul_quant.cuh"

namespace cmp {

int matmul_quant_dot(DotImad, const QuantMatmul& m) { return matmul_quant_route<DotImad>(m); }
int matmul_quant_work_dot(DotImad, const QuantMatmul& m, size_t* bytes) {
    return matmul_quant_work_route<DotImad>(m, bytes);
}

}  // namespace cmp
