"""tools/sass_diff.py's normalization on hand-written cuobjdump text (no GPU, no cuobjdump): two builds' copies of a
function differ only in instruction addresses and the anonymous namespace's hash, which it leaves out; a changed
instruction is a different function."""
import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "sass_diff.py"
spec = importlib.util.spec_from_file_location("sass_diff", TOOL)
sass_diff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_diff)


def dump(anon: str, base: int, op: str) -> str:
    name = f"_ZN3cmp44_GLOBAL__N__{anon}17rmsnorm_q8_kernelEPKf"
    return (f"\t\tFunction : {name}\n"
            f"        /*{base:04x}*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n"
            f"        /*{base + 16:04x}*/                   {op} ;   /* 0x0000000000187919 */\n")


# the anonymous namespace's name as nvcc writes it: a hash of the build, or none, then the file and a hash of it
@pytest.mark.parametrize("a_anon,b_anon", [("4f192ed9_11_quantize_cu_1b994226", "79f742c5_11_quantize_cu_1b994226"),
                                           ("11_quantize_cu_0b714dab", "11_quantize_cu_4f7a618b")])
def test_builds_differing_in_addresses_and_namespace_hash_are_the_same(a_anon, b_anon):
    a = sass_diff.normalized(dump(a_anon, 0x0000, "S2R R24, SR_TID.X"))
    b = sass_diff.normalized(dump(b_anon, 0x0100, "S2R R24, SR_TID.X"))
    assert list(a) == list(b) and a == b
    assert list(a) == ["_ZN3cmp44_GLOBAL__N__11_quantize_cu_17rmsnorm_q8_kernelEPKf"]


def test_a_changed_instruction_is_a_different_function():
    a = sass_diff.normalized(dump("11_quantize_cu_1b994226", 0, "S2R R24, SR_TID.X"))
    b = sass_diff.normalized(dump("11_quantize_cu_1b994226", 0, "S2R R19, SR_TID.X"))
    assert list(a) == list(b) and a != b
