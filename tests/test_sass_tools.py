"""The tensor-core patterns of tests/sass_tools.py know every matrix opcode family (no GPU or cuobjdump needed), and
its cuobjdump runner splits a library of several archs (nvcc and cuobjdump needed, no GPU)."""
from __future__ import annotations

import os

import pytest
from sass_tools import TENSOR_CORE_PTX, TENSOR_CORE_SASS


@pytest.mark.parametrize("line", [
    "HMMA.16816.F32 R4, R8, R12, R4 ;", "IMMA.16832.S8.S8 R0, R4, R8, R0 ;", "BMMA.88128.AND.POPC R0, R2, R4, R0 ;",
    "DMMA.884 R0, R4, R8, R0 ;", "HGMMA.64x128x16.F32 R24, gdesc[UR4], R24 ;",
    "IGMMA.64x64x32.S32.S8.S8 R0, gdesc[UR8] ;",
    "QGMMA.64x128x32.F32.E4M3.E4M3 R0, gdesc[UR4] ;", "BGMMA.64x64x256.AND.POPC R0, gdesc[UR4] ;",
    "UTCHMMA gdesc[UR4], gdesc[UR6], tmem[UR8] ;", "UTCIMMA gdesc[UR4], gdesc[UR6], tmem[UR8] ;"])
def test_every_tensor_core_opcode_is_caught(line):
    assert TENSOR_CORE_SASS.search(line), line


@pytest.mark.parametrize("line", ["IDP.4A.S8.S8 R0, R4, R8, R0 ;", "HFMA2.MMA R0, R4, R8, R0 ;",
                                  "FFMA R0, R1, R2, R3 ;", "IMAD.WIDE R2, R4, R5, R2 ;"])
def test_dp4a_and_fma_are_not_tensor_core(line):
    assert not TENSOR_CORE_SASS.search(line), line


def test_ptx_patterns():
    assert TENSOR_CORE_PTX.search("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%r1}, ...")
    assert TENSOR_CORE_PTX.search("wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8")
    assert not TENSOR_CORE_PTX.search("dp4a.s32.s32 %r1, %r2, %r3, %r4;")


def test_tensor_core_hits_skip_only_the_probe_kernels():
    from sass_tools import ptx_mma_hits, tensor_core_hits
    sass = ("\tFunction : _ZN3cmp12_GLOBAL__N_117probe_hmma_kernelEPiii\n  /*0010*/ HMMA.884.F32 R0, R2, R4, R0 ;\n"
            "\tFunction : _Z14gemm_q8_kernelIN3cmp7DotDp4aEEv\n  /*0010*/ IDP.4A.S8.S8 R0, R1, R2, R0 ;\n"
            "\tFunction : _Z9bad_kernelv\n  /*0010*/ IMMA.16832.S8.S8 R0, R2, R4, R0 ;\n")
    assert tensor_core_hits(sass) == [("_Z9bad_kernelv", "IMMA")]
    ptx = (".entry _ZN3cmp12_GLOBAL__N_117probe_imma_kernelEPiii(\n mma.sync.aligned.m16n8k32 ...\n}\n"
           ".entry _Z9bad_kernelv(\n wmma.load ...\n}\n")
    assert ptx_mma_hits(ptx) == [("_Z9bad_kernelv", "wmma.")]


def test_every_tensor_core_opcode_ends_in_mma():
    """sass_tools.tensor_core_ops finds the opcodes by their "MMA": it holds only while every alternative does."""
    alternatives = TENSOR_CORE_SASS.pattern.removeprefix(r"\b(").removesuffix(r")\b").split("|")
    assert len(alternatives) >= 10 and all(a.endswith("MMA") for a in alternatives), alternatives


def test_tensor_core_ops_is_the_regex_findall():
    """tensor_core_ops(text) == TENSOR_CORE_SASS.findall(text): on SASS-like lines and on 20000 random strings of
    opcode pieces (words that only contain or end in MMA, prefixes, underscores, dots, non-ASCII letters)."""
    import random
    from sass_tools import tensor_core_ops
    line = ("  /*0010*/ HMMA.16816.F32 R4, R8, R12, R4 ;\n  /*0020*/ HFMA2.MMA R0, -RZ, RZ, 0, 0 ;\n"
            "  /*0030*/ @P0 IMMA.16832.S8.S8 R0, R4, R8, R0 ;\n  /*0040*/ UTCHMMA gdesc[UR4] ;\n  XHMMA HMMA_ _HMMA\n")
    assert tensor_core_ops(line) == ["HMMA", "IMMA", "UTCHMMA"] == TENSOR_CORE_SASS.findall(line)
    pieces = ["HMMA", "IMMA", "MMA", "HFMA2.MMA", "UTCHMMA", "UTCMMA", "UTC_MMA", "XHMMA", "HMMAX", "HMMA_", "_HMMA",
              "HMMAMMA", "MMAHMMA", "OMMA", "QGMMA", "HGMMA.64x", "1HMMA", "MM", "A", " ", ".", "\n", "@P0 ", "R1", "é"]
    rnd = random.Random(0)
    for _ in range(20000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 8)))
        assert tensor_core_ops(text) == TENSOR_CORE_SASS.findall(text), text


def test_cubin_archs_reads_the_elf_listing():
    import subprocess
    from sass_tools import _cubin_archs

    def listing(text, rc=0):
        return subprocess.CompletedProcess([], rc, text, "")
    two = "ELF file    1: libcmpkern.1.sm_75.cubin\nELF file    2: libcmpkern.2.sm_90.cubin\n" \
          "ELF file   10: attention.sm_75.cubin\nELF file   11: attention.sm_90a.cubin\n"
    assert _cubin_archs(listing(two)) == ["sm_75", "sm_90", "sm_90a"]
    assert _cubin_archs(listing(two, rc=1)) == []                          # one plain call instead
    assert _cubin_archs(listing(two + "ELF file   12: odd.cubin\n")) == []    # a cubin of no named arch: idem
    assert _cubin_archs(listing("")) == []


KERNEL = r"""
extern "C" __global__ void k(const int *a, int *c) { c[threadIdx.x] = __dp4a(a[threadIdx.x], a[threadIdx.x], 1); }
"""


def test_sass_of_two_archs_is_one_calls_sections(tmp_path):
    """run_cuobjdump's one process per arch gives the sections of a single `cuobjdump -sass` of the file."""
    import re
    import shutil
    import subprocess
    from collections import Counter
    from sass_tools import cuobjdump_candidates, run_cuobjdump
    tool = next(cuobjdump_candidates(), None)
    if shutil.which("nvcc") is None or tool is None:
        pytest.skip("needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    (tmp_path / "k.cu").write_text(KERNEL)
    obj = tmp_path / "k.o"
    subprocess.run(["nvcc", "-c", "-o", str(obj), str(tmp_path / "k.cu"), "-gencode", "arch=compute_75,code=sm_75",
                    "-gencode", "arch=compute_90,code=sm_90"], check=True, capture_output=True, timeout=300)
    one = subprocess.run([str(tool), "-sass", str(obj)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PATH=f"{tool.parent}{os.pathsep}{os.environ['PATH']}"))
    split = run_cuobjdump(tool, "-sass", obj)
    assert split.returncode == 0 and set(re.findall(r"code for (sm_\d+)", split.stdout)) == {"sm_75", "sm_90"}
    sections = lambda t: Counter(re.split(r"(?m)^(?=Fatbin )", t)[1:])     # noqa: E731
    assert sections(split.stdout) == sections(one.stdout) and "IDP.4A" in split.stdout
