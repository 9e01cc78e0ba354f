"""The block-quantized prefill GEMM's rows per launch (cuda_src/gemm_chunks.h), checked without a GPU.

tools/gemm_chunks_table.cpp runs the header's wave_chunk on the host for the cases here; a brute force over every
chunk size is the reference: the fewest waves in all, then the fewest launches, then the largest chunk."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TILE = 128
H200_WAVE = 132   # gemm_w16_kernel: one 512-thread block per SM of the H200's 132


def reference(rows: int, cap_rows: int, tokens: int, tile: int, wave: int) -> tuple[int, int, int]:
    """(chunk rows, waves, launches) of the best uniform chunking, by trying every chunk of 1..cap tiles."""
    row_tiles, token_tiles = -(-rows // tile), -(-tokens // tile)
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

    def run(cases):
        text = "".join(" ".join(map(str, c)) + "\n" for c in cases)
        out = subprocess.run([str(exe)], input=text, check=True, capture_output=True, text=True).stdout
        return [tuple(map(int, line.split())) for line in out.splitlines()]
    return run


def test_the_9b_ffn_gate_goes_in_whole_waves(chunker):
    """The H200 case that motivated it: ffn_gate (12288 rows, K = 4096: 10752 rows fit the 64 MiB workspace) at 512
    tokens went as 10752 + 1536 rows (4 + 1 waves); 8448 + 3840 rows take 3 waves, the least 96 x 4 tiles can."""
    ((chunk, waves, launches),) = chunker([(12288, 10752, 512, TILE, H200_WAVE)])
    assert (chunk, waves, launches) == (8448, 3, 2)


def test_without_a_wave_the_whole_workspace(chunker):
    """wave 0 (not known): the largest chunk the workspace holds, as before whole waves were counted."""
    assert chunker([(12288, 10752, 512, TILE, 0)])[0][0] == 10752
    assert chunker([(300, 10752, 512, TILE, 0)])[0][:3:2] == (384, 1)


def test_every_choice_is_the_brute_force_best(chunker):
    """Rows with partial last tiles, workspaces from one tile up, token counts across tile edges, waves of small
    cards (sm_61 at 1-2 blocks an SM: 30-60) and the H200's."""
    cases = [(rows, cap, tokens, TILE, wave)
             for rows in (1, 127, 128, 259, 1024, 4096, 12288, 12289, 248320)
             for cap in (128, 256, 1024, 3456, 10752, 65536)
             for tokens in (17, 128, 200, 512, 4096)
             for wave in (0, 1, 30, 60, 80, 132, 264)]
    got = chunker(cases)
    for case, choice in zip(cases, got):
        assert choice == reference(*case), case
        assert choice[0] <= case[1] and choice[0] % TILE == 0, case   # never more than the workspace holds
