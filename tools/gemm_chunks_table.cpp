// The choices of cuda_src/gemm_chunks.h for the cases tests/test_gemm_chunks.py reads from stdin, one per line:
// "rows cap_rows tokens tile wave" in, "chunk_rows waves launches" out. Host C++ only (no CUDA).
//   g++ -std=c++17 -I cuda_src tools/gemm_chunks_table.cpp -o gemm_chunks_table
#include <stdio.h>

#include "gemm_chunks.h"

int main() {
    int rows, cap, tokens, tile, wave;
    while (scanf("%d %d %d %d %d", &rows, &cap, &tokens, &tile, &wave) == 5) {
        const cmp::chunks::Chunking c = cmp::chunks::wave_chunk(rows, cap, tokens, tile, wave);
        printf("%d %d %d\n", c.rows, c.waves, c.launches);
    }
    return 0;
}
