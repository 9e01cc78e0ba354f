"""tools/gemv_sass.py's SASS reading on a hand-written T = 1 loop (no GPU, no nvcc): the counts the v1/v2/v4
comparison rests on (loads before the first DP4A, late activation-scale loads, spills)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "gemv_sass.py"
spec = importlib.util.spec_from_file_location("gemv_sass", TOOL)
gemv_sass = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gemv_sass)

# two chunks: the first with its x scale loaded before its DP4A chain, the second after the chain's first DP4A
SASS = """
        Function : _Z4demo
        /*0000*/                   STL [R1], R4 ;
        /*0010*/               @!P0 LDG.E.128.CONSTANT R20, desc[UR8][R38.64] ;
        /*0020*/                   LDG.E.128.CONSTANT R24, desc[UR8][R40.64] ;
        /*0030*/               @!P0 LDG.E.U16 R35, desc[UR8][R8.64] ;
        /*0040*/                   LDG.E.CONSTANT R42, desc[UR8][R42.64] ;
        /*0050*/                   IDP.4A.S8.S8 R24, R20, R24, RZ ;
        /*0060*/                   IDP.4A.S8.S8 R21, R21, R25, R24 ;
        /*0070*/                   FFMA.FTZ R4, R21, R42, R4 ;
        /*0080*/                   LDG.E.128.CONSTANT.SYS R8, desc[UR8][R40.64+0x200] ;
        /*0090*/                   IDP.4A.S8.S8 R8, R8, R20, RZ ;
        /*00a0*/                   LDG.E.CONSTANT R26, desc[UR8][R26.64] ;
        /*00b0*/                   IDP.4A.S8.S8 R9, R9, R21, R8 ;
        /*00c0*/                   FFMA.FTZ R4, R9, R26, R4 ;
        /*00d0*/                   LDL R8, [R1] ;
        /*00e0*/                   EXIT ;
        Function : _Z5other
        /*0000*/                   EXIT ;
"""


def test_summary_counts_loads_before_the_first_dp4a_and_late_scales():
    funcs = gemv_sass.functions(SASS)
    assert list(funcs) == ["_Z4demo", "_Z5other"]
    s = gemv_sass.summary(funcs["_Z4demo"])
    assert s == {"ld128": 2, "ld16": 1, "chunks": 2, "late xs": 1, "stl": 1, "ldl": 1, "instrs": 15}


def test_ptxas_resources_reads_registers_and_spills():
    log = """ptxas info    : Compiling entry function '_Z4demo' for 'sm_90'
ptxas info    : Function properties for _Z4demo
    32 bytes stack frame, 52 bytes spill stores, 28 bytes spill loads
ptxas info    : Used 64 registers, used 0 barriers, 32 bytes cumulative stack size
ptxas info    : Compiling entry function '_Z5other' for 'sm_90'
ptxas info    : Function properties for _Z5other
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 47 registers, used 0 barriers
"""
    assert gemv_sass.ptxas_resources(log) == {"_Z4demo": (64, 52), "_Z5other": (47, 0)}
