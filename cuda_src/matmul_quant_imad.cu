// matmul_quant.cuh's GEMV and GEMM on the IMAD route: one translation unit per route, so the routes compile in
// parallel.
#include "matmul_quant.cuh"

namespace cmp {

int matmul_quant_dot(DotImad, const QuantMatmul& m) { return matmul_quant_route<DotImad>(m); }

}  // namespace cmp
