"""tools/sass_diff.py's normalization on hand-written cuobjdump text (no GPU, no cuobjdump): two builds' copies of a
function differ only in instruction addresses and the anonymous namespace's hash, which it leaves out; a changed
instruction is a different function."""
import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "sass_diff.py"
spec = importlib.util.spec_from_file_location("sass_diff", TOOL)
sass_diff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_diff)


def dump(hash_: str, base: int, op: str) -> str:
    name = f"_ZN3cmp44_GLOBAL__N__{hash_}_11_quantize_cu_1b99422617rmsnorm_q8_kernelEPKf"
    return (f"\t\tFunction : {name}\n"
            f"        /*{base:04x}*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n"
            f"        /*{base + 16:04x}*/                   {op} ;   /* 0x0000000000187919 */\n")


def test_builds_differing_in_addresses_and_namespace_hash_are_the_same():
    a = sass_diff.normalized(dump("4f192ed9", 0x0000, "S2R R24, SR_TID.X"))
    b = sass_diff.normalized(dump("79f742c5", 0x0100, "S2R R24, SR_TID.X"))
    assert list(a) == list(b) and a == b
    assert "_GLOBAL__N__4f192ed9" not in next(iter(a))


def test_a_changed_instruction_is_a_different_function():
    a = sass_diff.normalized(dump("4f192ed9", 0, "S2R R24, SR_TID.X"))
    b = sass_diff.normalized(dump("4f192ed9", 0, "S2R R19, SR_TID.X"))
    assert list(a) == list(b) and a != b
