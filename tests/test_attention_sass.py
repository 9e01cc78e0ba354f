"""The round-1 attention kernel (cuda_src/attention.cu attention_kernel, head dims 32/96/192) branches on no register
that a path leaves unwritten. From 3c01277 it read its per-row flags live[] of rows past the end before setting
them; the sm_90 SASS then tested registers no path from the entry had written, lanes of a warp went different
ways around a full-mask __shfl_sync, and the blocks hung at the next tile's __syncthreads: the CUDA tests on the
round-1 kernel that never finished on the H200 (2026-12-02; the repro, benchmarks/hang_repro.py, is in git at
94ef266: the library before the fix hung in it, the fixed one passed). Checked without a GPU on
the SASS (sass_tools.unwritten_branch_reads) of the built library where it is current, else of attention.cu
compiled here for sm_90 (nvcc, ~25 s on 2 cores); skipped, saying why, where neither can be had."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from sass_tools import cuobjdump_candidates, run_cuobjdump, sass_function_copies, unwritten_branch_reads

from llamacmp.lib._native import library_path

ROOT = Path(__file__).resolve().parent.parent
ROUND1 = "attention_kernelILi"   # attention_kernel<DPL, KV, SMALL>'s mangled names (not attn_*_kernel, the v2 ones)
INSTANTIATIONS = 12              # head dims 32 / 96 / 192 x f16 / f32 x 16 rows / SMALL


def _sass(src: str) -> str:
    """A few lines shaped like cuobjdump -sass output, one instruction a line (`/*addr*/ instr ;`)."""
    return "\n".join(f"        /*{16 * k:04x}*/    {line} ;" for k, line in enumerate(src.strip().splitlines()))


# R5 is written only where the branch at 0x30 is not taken; the compare at 0x50 reads it either way.
ONE_PATH = """S2R R0, SR_TID.X
MOV R1, 0x20
ISETP.GE.AND P0, PT, R0, R1, PT
@P0 BRA 0x50
MOV R5, RZ
LOP3.LUT P1, RZ, R5, 0xff, RZ, 0xc0, !PT
@!P1 EXIT
EXIT"""


def test_a_branch_on_a_register_one_path_leaves_unwritten_is_found():
    assert unwritten_branch_reads(_sass(ONE_PATH)) == [
        "/*0050*/ LOP3.LUT P1, RZ, R5, 0xff, RZ, 0xc0, !PT: R5 unwritten on some path from the entry"]


def test_writes_on_every_path_and_guarded_pairs_are_accepted():
    # the fix's shape: the flag cleared before the branch
    fixed = "MOV R5, RZ\n" + ONE_PATH.replace("BRA 0x50", "BRA 0x60")
    assert unwritten_branch_reads(_sass(fixed)) == []
    # a load and its test under one guard; a compare that ANDs the guard in; after the branch that decided it
    assert unwritten_branch_reads(_sass("""S2R R0, SR_TID.X
MOV R1, 0x20
ISETP.GE.AND P0, PT, R0, R1, PT
@!P0 MOV R7, R0
@!P0 ISETP.NE.AND P1, PT, R7, RZ, PT
ISETP.GT.AND P2, PT, R7, RZ, !P0
@P0 BRA 0x80
ISETP.NE.AND P3, PT, R7, RZ, PT
EXIT""")) == []
    # a loop whose back edge is the only path that writes R3: its first pass reads it unwritten
    assert unwritten_branch_reads(_sass("""MOV R1, RZ
ISETP.NE.AND P0, PT, R3, RZ, PT
IADD3 R3, R1, 0x1, RZ
@P0 BRA 0x10
EXIT""")) == ["/*0010*/ ISETP.NE.AND P0, PT, R3, RZ, PT: R3 unwritten on some path from the entry"]
    assert unwritten_branch_reads(_sass("BRX R2 -0x10\nEXIT")) is None   # an indirect branch: not analysed


@pytest.fixture(scope="module")
def round1_sass(tmp_path_factory) -> str:
    tool = next(cuobjdump_candidates(), None)
    if tool is None:
        pytest.skip("no cuobjdump: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (or triton==3.3.1)")
    lib = library_path()
    src = ROOT / "cuda_src"
    if not lib.exists() or any(p.stat().st_mtime > lib.stat().st_mtime for p in src.iterdir()):
        if not shutil.which("nvcc"):
            pytest.skip(f"{lib} is not built (or older than cuda_src) and there is no nvcc to compile attention.cu")
        lib = tmp_path_factory.mktemp("round1") / "attention.o"
        r = subprocess.run(["nvcc", "-O3", "-std=c++17", "--use_fast_math", "-Xptxas", "-O3", "-gencode",
                            "arch=compute_90,code=sm_90", "-c", "-o", str(lib), str(src / "attention.cu")],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    # -ltext: `SASS text section 7 : attention-_ZN...iiifi.sm_90.elf.bin`
    names = sorted({w[w.index("_Z"):].rsplit(".sm_", 1)[0]
                    for w in run_cuobjdump(tool, "-ltext", lib).stdout.split() if ROUND1 in w})
    if not names:
        pytest.skip(f"{lib} holds no SASS of the round-1 attention kernel")
    r = run_cuobjdump(tool, "-sass", lib, "-fun", ",".join(names))
    assert r.returncode == 0, f"{tool} -sass failed: {r.stderr[-2000:]}"
    return r.stdout


@pytest.mark.slow
def test_round1_attention_branches_on_written_registers_only(round1_sass):
    copies = [(n, unwritten_branch_reads(b)) for n, b in sass_function_copies(round1_sass) if ROUND1 in n]
    analysed = [(n, found) for n, found in copies if found is not None]
    assert len({n for n, _ in analysed}) == INSTANTIATIONS, [n for n, _ in copies]
    assert {n: found for n, found in analysed if found} == {}
