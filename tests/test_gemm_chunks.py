"""The prefill GEMMs' wave planning (cuda_src/gemm_chunks.h), checked without a GPU: the block-quantized GEMM's rows
per launch and the DP4A GEMM's serial pieces of K.

tools/gemm_chunks_table.cpp runs the header's wave_chunk and serial_pieces on the host for the cases here. For the
chunks a brute force over every chunk size is the reference: the fewest waves in all, then the fewest launches, then
the largest chunk. For the pieces: the least time (waves / pieces, the last wave's by its busiest SM where blocks
share SMs), a split only where it saves the model's cost."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TILE = 128        # weight rows per tile (every prefill GEMM), and tokens (all but gemm_w16_kernel)
W16_TOK = 64      # gemm_w16_kernel's tokens per tile
H200_WAVE = 132   # a block per SM of the H200's 132 (the 128 x 128 GEMMs)
H200_W16_WAVE = 264   # gemm_w16_kernel: two 256-thread blocks per SM


def reference(rows: int, cap_rows: int, tokens: int, tile: int, tok_tile: int, wave: int) -> tuple[int, int, int]:
    """(chunk rows, waves, launches) of the best uniform chunking, by trying every chunk of 1..cap tiles."""
    row_tiles, token_tiles = -(-rows // tile), -(-tokens // tok_tile)
    best = None
    for c in range(min(cap_rows // tile, row_tiles), 0, -1):
        sizes = [c] * (row_tiles // c) + ([row_tiles % c] if row_tiles % c else [])
        waves = sum(-(-s * token_tiles // max(wave, 1)) for s in sizes)
        key = (waves, len(sizes)) if wave > 0 else (0, 0)
        if best is None or key < best[0]:
            best = (key, (c * tile, waves, len(sizes)))
    return best[1]


@pytest.fixture(scope="module")
def chunker(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    assert cxx, "no host C++ compiler (g++, c++ or clang++) on PATH"
    exe = tmp_path_factory.mktemp("chunks") / "gemm_chunks_table"
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", "-I", str(ROOT / "cuda_src"),
                    str(ROOT / "tools" / "gemm_chunks_table.cpp"), "-o", str(exe)], check=True)

    def run(cases, kind="c"):
        text = "".join(kind + " " + " ".join(map(str, c)) + "\n" for c in cases)
        out = subprocess.run([str(exe)], input=text, check=True, capture_output=True, text=True).stdout
        return [tuple(map(int, line.split())) for line in out.splitlines()]
    return run


def test_the_9b_ffn_gate_goes_in_whole_waves(chunker):
    """The H200 case that motivated it: ffn_gate (12288 rows, K = 4096: 10752 rows fit the 64 MiB workspace) at 512
    tokens went as 10752 + 1536 rows (4 + 1 waves); 8448 + 3840 rows take 3 waves, the least 96 x 4 tiles can."""
    ((chunk, waves, launches),) = chunker([(12288, 10752, 512, TILE, TILE, H200_WAVE)])
    assert (chunk, waves, launches) == (8448, 3, 2)


def test_the_w16_tiles_count_their_own_tokens(chunker):
    """gemm_w16_kernel's 128 x 64 tiles at two blocks an SM: the same ffn_gate case is 96 x 8 tiles on 264 slots;
    10752 + 1536 rows take 3 + 1 waves (84 x 8 = 672 tiles: 2.55 waves; 12 x 8 = 96), 8448 + 3840 rows 2 + 1 (66 x 8
    = 528, 30 x 8 = 240). Its tokens counted in 128-token tiles (half its blocks) would make that 2 waves."""
    got = chunker([(12288, 10752, 512, TILE, W16_TOK, H200_W16_WAVE), (12288, 10752, 512, TILE, TILE, H200_W16_WAVE)])
    assert got == [(8448, 3, 2), (8448, 2, 2)]


def test_without_a_wave_the_whole_workspace(chunker):
    """wave 0 (not known): the largest chunk the workspace holds, as before whole waves were counted."""
    assert chunker([(12288, 10752, 512, TILE, TILE, 0)])[0][0] == 10752
    assert chunker([(300, 10752, 512, TILE, W16_TOK, 0)])[0][:3:2] == (384, 1)


def test_every_choice_is_the_brute_force_best(chunker):
    """Rows with partial last tiles, workspaces from one tile up, token counts across tile edges, waves of small
    cards (sm_61 at 1-2 blocks an SM: 30-60) and the H200's; token tiles of 128 and gemm_w16_kernel's 64."""
    cases = [(rows, cap, tokens, TILE, tok_tile, wave)
             for rows in (1, 127, 128, 259, 1024, 4096, 12288, 12289, 248320)
             for cap in (128, 256, 1024, 3456, 10752, 65536)
             for tokens in (17, 64, 65, 128, 200, 512, 4096)
             for tok_tile in (TILE, W16_TOK)
             for wave in (0, 1, 30, 60, 80, 132, 264)]
    got = chunker(cases)
    for case, choice in zip(cases, got):
        assert choice == reference(*case), case
        assert choice[0] <= case[1] and choice[0] % TILE == 0, case   # never more than the workspace holds


ONE_A_SM = (1, 100, 3)     # SplitModel's default: every wave whole (gemm2_q8_kernel, the attention prefill)
W16_H200 = (2, 92, 5)      # gemm_w16_kernel at 64 tokens: two blocks an SM, a lone one at 92%, a split costs 5%


def wave_time(units: int, wave: int, per_sm: int, solo_pct: int) -> float:
    """Waves of `units` blocks: whole waves, then the last one's busiest SM (ceil(rest / SMs) blocks) at the rate of
    blocks alone (solo_pct of the SM's), at most a wave."""
    full, rest = divmod(units, wave)
    if not rest:
        return full
    busiest = -(-rest // max(wave // per_sm, 1))
    return full + (1.0 if busiest >= per_sm else min(1.0, busiest / per_sm / (solo_pct / 100)))


def pieces_reference(tiles: int, wave: int, stages: int, min_stages: int, per_sm: int = 1, solo_pct: int = 100,
                     cost_pct: int = 3) -> int:
    """The pieces (2..4) with the least time wave_time(tiles * p) / p (the fewest where equal), taken only where the
    tiles fill at least one wave and it saves cost_pct percent of the whole tiles' time; each piece keeps min_stages
    stages."""
    if wave <= 0 or tiles < wave:
        return 1
    times = {p: wave_time(tiles * p, wave, per_sm, solo_pct) / p for p in range(2, 5) if stages // p >= min_stages}
    if not times:
        return 1
    best = min(sorted(times), key=lambda p: times[p])   # (min keeps the first: the fewest pieces where equal)
    return best if times[best] <= wave_time(tiles, wave, per_sm, solo_pct) * (1 - cost_pct / 100) + 1e-9 else 1


def test_the_27b_down_projection_takes_four_pieces(chunker):
    """5120 rows x 512 tokens = 160 tiles of 128 x 128 on the H200's 132 SMs, one block each: 2 waves whole (1.21
    would do), 5 waves of quarter tiles (1.25) in 4 pieces; K = 17408 is 136 stages of 4 blocks. The 9B's 4096 rows
    (128 tiles) fit one wave: whole. An 80-SM card (CMP 100-210) takes the 9B's 128 tiles in 3 pieces: 5 waves of
    thirds (1.67) against 2."""
    assert chunker([(160, 132, 136, 4, *ONE_A_SM), (128, 132, 32, 4, *ONE_A_SM), (128, 80, 32, 4, *ONE_A_SM)],
                   "p") == [(4,), (1,), (3,)]


def test_two_blocks_an_sm_split_only_what_pays(chunker):
    """gemm_w16_kernel's 128 x 64 tiles, two blocks an SM (264 slots on the H200), T = 512, as measured (2026-12-04,
    whole / split ms): the 27B's down projection (320 tiles, 136 stages) splits in 4 (1.190 whole, 1.032 in 2 pieces,
    1.005 in 4: its last wave leaves one block an SM, 1.54 waves whole, 1.27 in 2, 1.25 in 4: a split pays its cost
    once); the 9B's attention q+k+v (640 tiles; 0.474 / 0.486),
    the 27B's (896; 0.811 / 0.833) and gate+up (2176; 1.936 / 1.951) go whole, which the one-block model split (it
    counts their last waves, one block an SM, as whole waves); the 9B's down projection (256 tiles) fits one wave."""
    cases = [(320, 264, 136, 4), (640, 264, 32, 4), (896, 264, 40, 4), (2176, 264, 40, 4), (256, 264, 96, 4)]
    assert chunker([(*c, *W16_H200) for c in cases], "p") == [(4,), (1,), (1,), (1,), (1,)]
    assert [pieces_reference(*c) for c in cases[1:4]] == [2, 2, 4]   # the one-block model


def test_every_piece_choice_is_the_brute_force_best(chunker):
    cases = [(tiles, wave, stages, 4, *model)
             for tiles in (1, 31, 80, 128, 131, 132, 133, 160, 200, 264, 320, 388, 448, 516, 640, 768, 1088, 4000)
             for wave in (0, 1, 30, 60, 80, 132, 264)
             for stages in (1, 4, 8, 12, 16, 32, 136)
             for model in (ONE_A_SM, W16_H200, (3, 80, 4))
             if wave % model[0] == 0]
    got = chunker(cases, "p")
    for case, (pieces,) in zip(cases, got):
        assert pieces == pieces_reference(*case), case
        assert pieces == 1 or case[2] // pieces >= case[3], case
