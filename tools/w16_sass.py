"""What the compiler made of the main loop of the DP4A GEMM (cuda_src/gemm_w16.cuh, gemm_w16_kernel), without a GPU:
per instantiation, the instructions of the loop that holds the IDP.4As (the body between a backward branch and its
target: one stage of 4 blocks, 1024 IDP.4A a warp), by class, and the spill traffic in it.

    python3 tools/w16_sass.py [OBJ_OR_LIB_OR_CUBIN]   (default build/obj-90-lean/matmul_quant_dp4a.o)

Columns: IDP (IDP.4A), FMA (FFMA / FMUL / FADD: the FP32 work that shares IDP's pipe), I2F, LDS, STS, LDG (LDG and
LDGSTS), LOCAL (LDL / STL: spills), INT (LOP3 / SHF / PRMT / IADD3 / IMAD / LEA / SEL / ISETP and the like), other,
all. The weight source is W16Q8, expanded (MIN / PER16) or a type's planes (the direct form); TOK the token tile,
S the serial pieces' kernel.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
from sass_loop import functions, main_loop, opcode  # noqa: E402
from sass_tools import cuobjdump_candidates, run_cuobjdump  # noqa: E402

NAME = re.compile(r"gemm_w16_kernelI(.*)NS_\d+Dot(\w+?)ELi(\d+)ELb(\d)ELi(\d+)E")
INT = {"LOP3", "SHF", "PRMT", "IADD3", "IMAD", "LEA", "SEL", "ISETP", "IABS", "IMNMX", "VIMNMX", "MOV", "SGXT",
       "VIADD", "BMSK", "FLO", "POPC", "LOP", "IADD", "SHL", "SHR", "IMUL", "BFE", "BFI", "FSEL", "UIADD3",
       "ULOP3", "USHF", "UIMAD", "UMOV", "ULEA", "USEL", "ISETP", "UISETP", "PLOP3", "P2R", "R2P", "HADD2", "F2FP"}
COLS = ("IDP", "FMA", "I2F", "LDS", "STS", "LDG", "LOCAL", "INT", "other", "all")






def classify(loop: list[str]) -> Counter:
    c = Counter()
    for ins in loop:
        op = opcode(ins)
        key = ("IDP" if op == "IDP" else "FMA" if op in ("FFMA", "FMUL", "FADD") else
               "I2F" if op in ("I2F", "I2FP") else op if op in ("LDS", "STS") else
               "LDG" if op in ("LDG", "LDGSTS") else "LOCAL" if op in ("LDL", "STL") else
               "INT" if op in INT else "other")
        c[key] += 1
    c["all"] = len(loop)
    return c


def source(w: str) -> str:
    """The weight source's name from the mangled template argument."""
    m = re.search(r"W16PlanesINS_\d+(\w+?)EE", w)
    if m:
        return f"planes {m.group(1)}"
    m = re.search(r"W16ExpandedILb(\d)ELb(\d)E", w)
    if m:
        return f"expanded MIN={m.group(1)} PER16={m.group(2)}"
    return "Q8_0" if "W16Q8" in w else w


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build/obj-90-lean/matmul_quant_dp4a.o"
    tool = next(cuobjdump_candidates(), None)
    if tool is None:
        raise SystemExit("w16_sass: no cuobjdump (pip install nvidia-cuda-cuobjdump, or put one on PATH)")
    sass = run_cuobjdump(tool, "-sass", target).stdout
    rows = []
    for name, body in functions(sass, "gemm_w16_kernel").items():
        m = NAME.search(name)
        if not m:
            continue
        w, dot, _bk, split, tok = m.groups()
        rows.append(((source(w), int(tok), int(split), dot), classify(main_loop(body, "IDP"))))
    print(f"{'source':30} {'dot':5} {'TOK':>3} {'S':>1} " + " ".join(f"{c:>5}" for c in COLS))
    for (src, tok, split, dot), c in sorted(rows):
        print(f"{src:30} {dot:5} {tok:3} {split:1} " + " ".join(f"{c[k]:5}" for k in COLS))


if __name__ == "__main__":
    main()
