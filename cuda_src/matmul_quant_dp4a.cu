// matmul_quant.cuh's GEMV and GEMM on the DP4A (IDP.4A) route: one translation unit per route, so the routes compile in
// parallel.
#include "matmul_quant.cuh"

namespace cmp {

int matmul_quant_dot(DotDp4a, const QuantMatmul& m) { return matmul_quant_route<DotDp4a>(m); }
int matmul_quant_work_dot(DotDp4a, const QuantMatmul& m, size_t* bytes) {
    return matmul_quant_work_route<DotDp4a>(m, bytes);
}

}  // namespace cmp
