// The choices of cuda_src/gemm_chunks.h for the cases tests/test_gemm_chunks.py reads from stdin, one per line:
//   "c rows cap_rows tokens tile tok_tile wave" -> "chunk_rows waves launches" (wave_chunk)
//   "p tiles wave stages min_stages per_sm solo_pct cost_pct"   -> "pieces" (serial_pieces)
// Host C++ only (no CUDA):  g++ -std=c++17 -I cuda_src tools/gemm_chunks_table.cpp -o gemm_chunks_table
#include <stdio.h>

#include "gemm_chunks.h"

int main() {
    char kind;
    while (scanf(" %c", &kind) == 1) {
        if (kind == 'c') {
            int rows, cap, tokens, tile, tok_tile, wave;
            if (scanf("%d %d %d %d %d %d", &rows, &cap, &tokens, &tile, &tok_tile, &wave) != 6) return 1;
            const cmp::chunks::Chunking c = cmp::chunks::wave_chunk(rows, cap, tokens, tile, tok_tile, wave);
            printf("%d %d %d\n", c.rows, c.waves, c.launches);
        } else if (kind == 'p') {
            int tiles, wave, stages, min_stages;
            cmp::chunks::SplitModel m;
            if (scanf("%d %d %d %d %d %d %d", &tiles, &wave, &stages, &min_stages, &m.per_sm, &m.solo_pct,
                      &m.cost_pct) != 7)
                return 1;
            printf("%d\n", cmp::chunks::serial_pieces(tiles, wave, stages, min_stages, m));
        } else {
            return 1;
        }
    }
    return 0;
}
