// Rows per launch of the block-quantized prefill GEMM (matmul_quant.cuh): its weights are expanded per chunk of
// rows into a workspace, and each chunk is one launch of tiles of 128 weight rows (and 128 tokens, or 64: the DP4A
// gemm_w16_kernel's). A launch costs its waves (ceil(tiles / blocks resident on the whole device)), so filling the
// workspace to the brim is wrong where it leaves a part-empty wave per chunk: on an H200 (132 SMs, one 16-warp
// block each, as gemm_w16_kernel was then) ffn_gate's 12288 rows at 512 tokens went as 10752 + 1536 rows, 3 waves
// at 85% and one at 36%, where 8448 + 3840 rows take 3 waves (the 9B's Q4_K GEMMs at 65% mean fill: 103 ms of a
// 140 ms pp512). So the chunk is the one with the fewest waves in all, then the fewest launches (each expands its
// rows once, so launches cost only their latency), then the largest.
// Plain C++ without CUDA: tests/test_gemm_chunks.py compiles this header on the host (tools/gemm_chunks_table.cpp)
// and checks every choice against a brute force over all chunkings.
#pragma once

namespace cmp {
namespace chunks {

struct Chunking {
    int rows;      // weight rows per launch (the last launch: what is left)
    int waves;     // waves of all launches
    int launches;
};

constexpr int ceil_div_i(long long a, long long b) { return (int)((a + b - 1) / b); }

// The waves and launches of `rows` weight rows in chunks of `chunk_tiles` row tiles (of `tile` rows), `token_tiles`
// tiles of tokens each, `wave` blocks resident at once.
constexpr Chunking cost(int rows, int tile, int chunk_tiles, int token_tiles, int wave) {
    const int row_tiles = ceil_div_i(rows, tile);
    const int full = row_tiles / chunk_tiles, rest = row_tiles % chunk_tiles;
    const int waves = full * ceil_div_i((long long)chunk_tiles * token_tiles, wave) +
                      (rest ? ceil_div_i((long long)rest * token_tiles, wave) : 0);
    return Chunking{chunk_tiles * tile, waves, full + (rest ? 1 : 0)};
}

// The chunking of `rows` weight rows (tiles of `tile` rows) into launches of at most `cap_rows` rows (a multiple of
// tile: the workspace) for `tokens` tokens in tiles of `tok_tile`, with `wave` blocks resident on the device at once
// (0: unknown, then the largest chunk). rows, cap_rows > 0.
constexpr Chunking wave_chunk(int rows, int cap_rows, int tokens, int tile, int tok_tile, int wave) {
    const int row_tiles = ceil_div_i(rows, tile), token_tiles = ceil_div_i(tokens, tok_tile);
    const int cap = cap_rows / tile < row_tiles ? cap_rows / tile : row_tiles;
    Chunking best = cost(rows, tile, cap, token_tiles, wave > 0 ? wave : 1);
    if (wave <= 0) return best;
    for (int c = cap - 1; c >= 1; --c) {   // from the largest down: a tie keeps the larger chunk
        const Chunking k = cost(rows, tile, c, token_tiles, wave);
        if (k.waves < best.waves || (k.waves == best.waves && k.launches < best.launches)) best = k;
    }
    return best;
}

// Serial pieces (gemm_w16.cuh's K; attention.cu's prefill cuts its dense key range alike, with no stage bound: the
// key tiles are known on the device only): each tile's K range cut into `pieces` consecutive stage ranges, run by
// `pieces` blocks in turn (piece p carries its partial sums to piece p + 1), so that a launch of `tiles` tiles is
// tiles * pieces units of 1 / pieces of a tile's time each. A launch whose tiles fill few waves badly then fills
// them: the 27B's down and out projections at 512 tokens (5120 rows: 160 tiles of 128 x 128 on an H200's 132 SMs,
// or gemm_w16_kernel's 320 of 128 x 64 at 2 blocks an SM) take 2 waves at 61% whole, 5 waves of a quarter of a
// tile (1.25 tile-times) in 4 pieces. The pieces of every tile run in order, so the sums and their bits are the
// unsplit loop's. Only where tiles >= wave: each piece then starts at least a wave of units after the one before
// it, which has ended by then (a resident block never waits on another).
// A launch's time in waves is counted by SplitModel: a kernel with per_sm blocks resident on an SM, whose last,
// part-full wave leaves at most `busiest` blocks on any SM, takes that wave in busiest / per_sm of a wave's time at
// the rate of a lone block (solo_pct percent of the SM's full rate: one block of gemm_w16_kernel's two on the H200
// nearly fills it), at most a whole wave; with one block an SM (the default) every wave is whole, as before. The
// split taken is the count of pieces with the least time (the fewest where equal), and only where it saves at least
// cost_pct percent of the whole tiles' time: a split launch pays its cost once, whatever its count (each unit of a
// later piece waits for its tile's earlier one; the partial sums a boundary parks are a tile's outputs, small against
// a piece's stages): on the H200 the 27B's down projection at 512 tokens took 1.005 ms in 4 pieces, 1.032 in 2,
// 1.190 whole (2026-12-04), where the model's times are 1.250, 1.272 and 1.543 waves. Each piece keeps at least
// min_stages of the tile's stages.
constexpr int SPLIT_MAX_PIECES = 4;
struct SplitModel {
    int per_sm = 1;       // blocks resident per SM
    int solo_pct = 100;   // a block alone on an SM: its rate, percent of the SM's full rate (per_sm > 1)
    int cost_pct = 3;     // what a split must save, percent
};

// The time of `units` blocks in thousandths of a wave (`wave` blocks resident on the device at once).
constexpr long long wave_time(long long units, int wave, const SplitModel& m) {
    long long t = units / wave * 1000;
    const long long rest = units % wave;
    if (rest) {
        const int sms = wave / m.per_sm > 0 ? wave / m.per_sm : 1;
        const long long busiest = (rest + sms - 1) / sms;
        const long long part = busiest * 100000 / ((long long)m.per_sm * m.solo_pct);
        t += busiest >= m.per_sm || part > 1000 ? 1000 : part;
    }
    return t;
}

constexpr int serial_pieces(int tiles, int wave, int stages, int min_stages, const SplitModel& m = SplitModel{}) {
    if (wave <= 0 || tiles < wave) return 1;
    int best = 0;
    long long best_t = 0;   // the time of best's units: compared as best_t / best
    for (int p = 2; p <= SPLIT_MAX_PIECES && stages / p >= min_stages; ++p) {
        const long long t = wave_time((long long)tiles * p, wave, m);
        if (best == 0 || t * best < best_t * p) {
            best = p;
            best_t = t;
        }
    }
    // the split's time below the whole tiles' by cost_pct percent
    if (best == 0 || best_t * 100 > wave_time(tiles, wave, m) * best * (100 - m.cost_pct)) return 1;
    return best;
}

}  // namespace chunks
}  // namespace cmp
