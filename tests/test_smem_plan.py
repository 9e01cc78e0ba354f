"""Shared memory per block on every card, checked without a GPU (issue 20's Pascal item; T4, CMP 30-50HX).

The launchers take their sizes and configurations from cuda_src/smem_plan.h; tools/smem_table.cpp prints that
header's table (compiled here with the host C++ compiler), so these tests check the numbers the code uses:
- the kernels of prompt processing and decode fit every card (sm_61 48 KB, sm_75 64 KB, sm_70 96 KB, sm_86 99 KB,
  sm_90 227 KB) at head dims 64 / 128 / 256, with today's configuration on the sm_70 and H200 limits;
- the caps the CUDA tests run under (tests/conftest.py SMEM_CAPS) reach every configuration;
- what does not fit somewhere is a known kernel with a way around it;
- with the sm_61 build (`make ptx61`), each kernel's static shared memory (cuobjdump -res-usage) plus the dynamic
  part of the configuration the launcher picks there fits 48 KB.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cuda_helpers import SMEM_CAPS
from sass_tools import cuobjdump_candidates

ROOT = Path(__file__).resolve().parent.parent
CARDS = {"sm_61": 48 * 1024, "sm_75": 64 * 1024, "sm_70": 96 * 1024, "sm_86": 99 * 1024, "sm_90": 227 * 1024}
# Shared memory per SM (blocks resident together share it; the driver keeps 1 KB per block) where it differs from
# the per-block limit: A100 (sm_80) 164 KB for 163 per block, sm_86 / sm_89 100 for 99, H100 / H200 228 for 227.
SM_SHARED = {"sm_80": 164 * 1024, "sm_86": 100 * 1024, "sm_90": 228 * 1024}
BLOCK_RESERVED = 1024
HEAD_DIMS = (64, 128, 256)
ROUND1_DIMS = (32, 96, 192)   # the round-1 attention kernel's (the v2 kernels take HEAD_DIMS)
# Kernels that do not fit every card, and what runs there instead.
AROUND = {
    "gdn_chunk_intra_kernel": "the backend takes the sequential scan (gdn_scan_kernel, <= 1 KB)",
    "gdn_chunk_state_kernel": "the backend takes the sequential scan (gdn_scan_kernel, <= 1 KB)",
    "attention_full_kernel": "the vision attention at head dim 128 on sm_61 (58 KB; vision towers use 64-80): "
                             "refused naming its bytes",
    "gemm_w16_kernel": "Q8_0 takes gemm2_q8_kernel's 2-block stages (45 KB), the expanded types without mins "
                       "gemm_quant_kernel (54 KB, 27 KB on sm_61)",
    "gemm_w16_kernel+min": "the expanded types with mins take gemm_quant_kernel (54 KB, 27 KB on sm_61)",
    "gemm_w16_kernel+per16": "Q6_K and Q3_K take gemm_quant_kernel (54 KB, 27 KB on sm_61)",
    "gemm_w16_kernel+per16+min": "Q2_K takes gemm_quant_kernel (54 KB, 27 KB on sm_61)",
}
W16_FORMS = ("gemm_w16_kernel", "gemm_w16_kernel+min", "gemm_w16_kernel+per16", "gemm_w16_kernel+per16+min")


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> list[tuple[str, int, int, int, int]]:
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    assert cxx, "no host C++ compiler (g++, c++ or clang++) on PATH"
    exe = tmp_path_factory.mktemp("smem") / "smem_table"
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", "-I", str(ROOT / "cuda_src"),
                    str(ROOT / "tools" / "smem_table.cpp"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    rows = [(k, int(d), int(lim), int(c), int(b)) for k, d, lim, c, b in (line.split() for line in out.splitlines())]
    assert {lim for _, _, lim, _, _ in rows} == set(CARDS.values())
    return rows


def pick(table, kernel, dim, limit):
    (hit,) = [(c, b) for k, d, lim, c, b in table if k == kernel and d == dim and lim == limit]
    return hit


@pytest.mark.parametrize("card", CARDS)
def test_prompt_processing_and_decode_fit_every_card(table, card):
    limit = CARDS[card]
    for Dh in HEAD_DIMS:
        rows, b = pick(table, "attn_prefill_kernel", Dh, limit)
        assert rows and b <= limit, (card, Dh, rows, b)
        cfg, b = pick(table, "probe_scores_kernel", Dh, limit)   # block-sparse prefill
        assert cfg and b <= limit
    for Dh in ROUND1_DIMS:
        rows, b = pick(table, "attention_kernel", Dh, limit)     # the round-1 kernel
        assert rows and b <= limit, (card, Dh, rows, b)
    for Dh in (64, 72, 80):                                       # the vision towers' attention
        rows, b = pick(table, "attention_full_kernel", Dh, limit)
        assert rows and b <= limit, (card, Dh, rows, b)
    stages, b = pick(table, "gemm_quant_kernel", 0, limit)
    assert stages and b <= limit
    bk, b = pick(table, "gemm2_q8_kernel", 0, limit)
    assert bk in (2, 4) and b <= limit
    decode = [r for r in table if r[0].startswith("attn_decode_kernel") and r[2] == limit]
    assert len(decode) == 3 * 4 * 2 and all(c and b <= limit for _, _, _, c, b in decode)


def test_large_cards_keep_todays_configuration(table):
    for card in ("sm_70", "sm_86", "sm_90"):
        assert [pick(table, "attn_prefill_kernel", Dh, CARDS[card])[0] for Dh in HEAD_DIMS] == [64, 64, 64]
        assert [pick(table, "attention_kernel", Dh, CARDS[card])[0] for Dh in ROUND1_DIMS] == [16, 16, 16]
        assert pick(table, "gemm_quant_kernel", 0, CARDS[card])[0] == 2
        assert pick(table, "gemm2_q8_kernel", 0, CARDS[card])[0] == 4   # the launcher: 2 on sm_70's code
        tok = 64 if card == "sm_90" else 128   # the launcher: none on sm_70's code
        assert pick(table, "gemm_w16_kernel", 0, CARDS[card])[0] == tok
        assert pick(table, "gemm_w16_kernel+min", 0, CARDS[card])[0] == tok
        assert pick(table, "gemm_w16_kernel+per16", 0, CARDS[card])[0] == tok
        assert pick(table, "gemm_w16_kernel+per16+min", 0, CARDS[card])[0] == 64   # its 100 KB tile fits none
        assert [pick(table, "attention_full_kernel", Dh, CARDS[card])[0] for Dh in (64, 72, 80, 128)] == [64] * 4
    for kernel in ("gdn_chunk_intra_kernel", "gdn_chunk_state_kernel"):   # 89280 / 80640 B: Qwen3.5's key dim
        assert pick(table, kernel, 128, CARDS["sm_70"])[0] == 1


def test_the_cuda_tests_caps_reach_every_configuration(table):
    """The CUDA tests run under SMEM_CAPS; between them they must reach each configuration a card can pick."""
    caps = [c or CARDS["sm_90"] for c in SMEM_CAPS.values()]
    assert {pick(table, "attn_prefill_kernel", Dh, lim)[0] for Dh in HEAD_DIMS for lim in caps} == {16, 32, 64}
    assert {pick(table, "attn_prefill_kernel", 256, lim)[0] for lim in caps} == {16, 32, 64}
    assert {pick(table, "gemm_quant_kernel", 0, lim)[0] for lim in caps} == {1, 2}
    assert {pick(table, "gemm2_q8_kernel", 0, lim)[0] for lim in caps} == {2, 4}
    for kernel in W16_FORMS[:3]:
        assert {pick(table, kernel, 0, lim)[0] for lim in caps} == {0, 64, 128}, kernel
    # PER16 with mins picks 128 tokens on no card (test_gemm_w16_takes_two_blocks_an_sm_where_they_fit)
    assert {pick(table, "gemm_w16_kernel+per16+min", 0, lim)[0] for lim in caps} == {0, 64}
    assert {pick(table, "attention_kernel", 192, lim)[0] for lim in caps} == {8, 16}
    assert {pick(table, "attention_full_kernel", 72, lim)[0] for lim in caps} == {32, 64}
    for kernel in ("gdn_chunk_intra_kernel", "gdn_chunk_state_kernel"):   # the scan fallback too
        assert {pick(table, kernel, 128, lim)[0] for lim in caps} == {0, 1}


def test_gemm_w16_takes_two_blocks_an_sm_where_they_fit(table):
    """gemm_w16_kernel: tiles of 128 rows x 64 tokens, 256 threads (<= 128 registers: 2 x 256 x 128 = the 64K
    register file), two stages of 4 blocks: 30 KB each (W 128 x 36 ints, X 64 x 36, their scales), 33 KB with mins;
    PER16 32 KB, 38 KB with mins. Two blocks share an SM where 2 x (bytes + 1 KB) fit its shared memory: the A100's
    and H200's. sm_86 / sm_89's 100 KB hold one (8 warps), so there the tile is 128 x 128 (512 threads, one block of
    16 warps: 80 / 88 KB, PER16 84 KB) but for PER16 with mins (100 KB: one 64-token block)."""
    w16, w16min, per16, per16min = (pick(table, k, 0, CARDS["sm_90"]) for k in W16_FORMS)
    assert w16 == (64, 2 * (128 * 36 * 4 + 64 * 36 * 4 + 128 * 4 * 4 + 64 * 4 * 4)) == (64, 61440)
    assert w16min == (64, 61440 + 2 * (128 * 4 * 4 + 64 * 4 * 4)) == (64, 67584)
    # PER16: W's second half scales; with mins both halves' mins and X's two half sums
    assert per16 == (64, 61440 + 2 * 128 * 4 * 4) == (64, 65536)
    assert per16min == (64, 65536 + 2 * (2 * 128 * 4 * 4 + 2 * 64 * 4 * 4)) == (64, 77824)
    assert pick(table, "gemm_w16_kernel", 0, CARDS["sm_86"]) == (128, 81920)
    assert pick(table, "gemm_w16_kernel+min", 0, CARDS["sm_86"]) == (128, 90112)
    assert pick(table, "gemm_w16_kernel+per16", 0, CARDS["sm_86"]) == (128, 86016)
    # 128 x 128 with mins would be 100 KB, 1 KB over sm_86 / sm_89's per-block limit: one 64-token block an SM there
    assert pick(table, "gemm_w16_kernel+per16+min", 0, CARDS["sm_86"]) == (64, 77824)
    assert pick(table, "gemm_w16_kernel", 0, CARDS["sm_75"]) == (64, 61440)   # one block (the cap tests run)
    assert pick(table, "gemm_w16_kernel+per16", 0, CARDS["sm_75"]) == (64, 65536)   # exactly sm_75's 64 KB
    assert pick(table, "gemm_w16_kernel+per16+min", 0, CARDS["sm_75"])[0] == 0
    assert all(pick(table, k, 0, CARDS["sm_61"])[0] == 0 for k in W16_FORMS)
    assert pick(table, "gemm2_q8_kernel", 0, CARDS["sm_90"]) == (4, 81920)
    assert pick(table, "gemm2_q8_kernel", 0, CARDS["sm_75"]) == (2, 45056)
    by_registers = 65536 // (256 * 128)   # __launch_bounds__(256, 2): the register file holds 2 (sm_90's 228 KB 3)
    for card, per_sm in SM_SHARED.items():
        forms = (w16, w16min, per16, per16min)
        blocks = [min(per_sm // (b + BLOCK_RESERVED), by_registers) for _, b in forms]
        assert blocks == ([1] * 4 if card == "sm_86" else [2] * 4), (card, blocks)
        # the plan's rule (per-SM shared memory = the per-block limit + 1 KB) agrees
        limit = per_sm - BLOCK_RESERVED
        assert all(2 * (b + BLOCK_RESERVED) <= limit + BLOCK_RESERVED for _, b in forms) == (card != "sm_86")


def test_what_does_not_fit_is_known(table):
    short = {(k, d, lim) for k, d, lim, c, _ in table if c == 0}
    assert {k for k, _, _ in short} <= set(AROUND), short
    # and nothing that does not fit is chosen: config 0 exactly where the smallest configuration is over
    for k, d, lim, c, b in table:
        assert (c == 0) == (b > lim), (k, d, lim, c, b)


# ---- static + dynamic on the sm_61 build ---------------------------------------------------------------------------

def _res_usage(lib: Path) -> dict[str, int]:
    tried = []
    for tool in cuobjdump_candidates([ROOT / "build" / "cuda12" / "bin" / "cuobjdump"]):
        r = subprocess.run([str(tool), "-res-usage", str(lib)], capture_output=True, text=True, timeout=300)
        if r.returncode == 0 and "Function" in r.stdout:
            found = re.findall(r"Function (\S+):\n[^\n]*SHARED:(\d+)", r.stdout)
            return {name: int(b) for name, b in found}
        tried.append(f"{tool}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    pytest.skip(f"no cuobjdump that reads sm_61 (run tools/get_cuda12.sh). Tried: {tried}")


def test_sm61_build_static_plus_dynamic_fits(table):
    lib = ROOT / "build" / "sm61" / "libcmpkern.so"
    if not lib.exists() or any(p.stat().st_mtime > lib.stat().st_mtime for p in (ROOT / "cuda_src").iterdir()):
        pytest.skip(f"{lib} missing or older than cuda_src/: run `make ptx61` (tools/get_cuda12.sh gives its nvcc)")
    static = _res_usage(lib)
    limit = CARDS["sm_61"]
    assert static and max(static.values()) <= limit
    checked = set()
    for name, s in static.items():
        if m := re.search(r"attn_prefill_kernelILi(\d+)ELi(\d+)E", name):
            Dh, rows = map(int, m.groups())
            chosen, b = pick(table, "attn_prefill_kernel", Dh, limit)
            if rows == chosen:
                assert s + b <= limit, (name, s, b)
                checked.add(("attn_prefill_kernel", Dh))
        elif m := re.search(r"attn_decode_kernelILi(\d+)ELi(\d+)E", name):
            Dh, GP = map(int, m.groups())
            for tq3 in ("", "+tq3"):
                _, b = pick(table, f"attn_decode_kernel<{Dh},{GP}>{tq3}", Dh, limit)
                assert s + b <= limit, (name, s, b)
            checked.add(("attn_decode_kernel", Dh, GP))
        elif m := re.search(r"gemm_quant_kernelILb[01]ELb[01]E(?:NS_\d+Dot\w+?E)?Li(\d)E", name):   # <PER16, MIN, D, STAGES>
            if int(m.group(1)) == pick(table, "gemm_quant_kernel", 0, limit)[0]:
                assert s + pick(table, "gemm_quant_kernel", 0, limit)[1] <= limit, (name, s)
                checked.add(("gemm_quant_kernel",))
        elif m := re.search(r"attention_kernelILi(\d+)E\w*?Lb([01])E", name):   # the round-1 kernel
            Dh, small = 32 * int(m.group(1)), m.group(2) == "1"
            if Dh in ROUND1_DIMS and (pick(table, "attention_kernel", Dh, limit)[0] == 8) == small:
                assert s + pick(table, "attention_kernel", Dh, limit)[1] <= limit, (name, s)
                checked.add(("attention_kernel", Dh))
        elif m := re.search(r"attention_full_kernelILi\d+ELi2E", name):
            assert s + pick(table, "attention_full_kernel", 80, limit)[1] <= limit, (name, s)
            checked.add(("attention_full_kernel",))
        elif "probe_scores_kernel" in name:
            assert s + pick(table, "probe_scores_kernel", 256, limit)[1] <= limit, (name, s)
            checked.add(("probe_scores_kernel",))
    assert {("attn_prefill_kernel", Dh) for Dh in HEAD_DIMS} | {("attention_kernel", Dh) for Dh in ROUND1_DIMS} <= checked
    assert {("attn_decode_kernel", Dh, GP) for Dh in HEAD_DIMS for GP in (1, 2, 4, 8)} <= checked
    assert {("gemm_quant_kernel",), ("probe_scores_kernel",), ("attention_full_kernel",)} <= checked
