// matmul_quant.cuh's GEMV and GEMM on the DP2A (IDP.2A) route: one translation unit per route, so the routes compile in
// parallel.
#include "matmul_quant.cuh"

namespace cmp {

int matmul_quant_dot(DotDp2a, const QuantMatmul& m) { return matmul_quant_route<DotDp2a>(m); }
int matmul_quant_work_dot(DotDp2a, const QuantMatmul& m, size_t* bytes) {
    return matmul_quant_work_route<DotDp2a>(m, bytes);
}

}  // namespace cmp
