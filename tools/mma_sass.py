"""What the compiler made of the main loop of the tensor-core GEMM (cuda_src/matmul_mma.cu, gemm_mma_kernel), without
a GPU: per instantiation, the instructions of the loop that holds the IMMAs (the body between a backward branch and
its target: one stage of BK blocks), by class.

    python3 tools/mma_sass.py [OBJ_OR_LIB]      (default build/obj-90-lean/matmul_mma.o: `make device-lib`'s object)

Columns: IMMA, FP (FFMA / FMUL / FADD), LDSM (ldmatrix), LDS, other, all; then per IMMA. The kernel is issue-bound
(matmul_mma.cu's header), so instructions per IMMA are its cost per unit of work.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from sass_tools import cuobjdump_candidates, run_cuobjdump  # noqa: E402

INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
NAME = re.compile(r"gemm_mma_kernelILi(\d)ELb(\d)ELi(\d)ELi(\d)E")
SOURCE = re.compile(r"(Q\d_K|Expanded)")   # the weight source: expanded, or the quant type read directly
FORMS = {"0": "Q8", "1": "PER32", "2": "PER16"}


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """mangled name -> [(address, instruction)] of every gemm_mma_kernel in the dump."""
    out, cur = {}, None
    for line in sass.splitlines():
        if "Function :" in line:
            name = line.split("Function :", 1)[1].strip()
            cur = out.setdefault(name, []) if "gemm_mma_kernel" in name else None
            continue
        m = INSTR.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(ins: str) -> str:
    """The opcode of an instruction, predicate dropped (`@!P0 BRA 0x...` -> BRA)."""
    parts = ins.split()
    return (parts[1] if parts[0].startswith("@") else parts[0]).split(".")[0]


def main_loop(body: list[tuple[int, str]]) -> list[str]:
    """The instructions of the largest backward-branch range that holds an IMMA."""
    best: list[str] = []
    for i, (addr, ins) in enumerate(body):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", ins)
        if not m or int(m.group(1), 16) >= addr:
            continue
        target = int(m.group(1), 16)
        loop = [s for a, s in body[: i + 1] if a >= target]
        if any(opcode(s) == "IMMA" for s in loop) and len(loop) > len(best):
            best = loop
    return best


def classify(loop: list[str]) -> Counter:
    c = Counter()
    for ins in loop:
        op = opcode(ins)
        key = ("IMMA" if op == "IMMA" else "FP" if op in ("FFMA", "FMUL", "FADD") else
               "LDSM" if op == "LDSM" else "LDS" if op == "LDS" else "other")
        c[key] += 1
    c["all"] = len(loop)
    return c


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build/obj-90-lean/matmul_mma.o"
    tool = next(cuobjdump_candidates(), None)
    if tool is None:
        raise SystemExit("mma_sass: no cuobjdump (pip install nvidia-cuda-cuobjdump, or put one on PATH)")
    sass = run_cuobjdump(tool, "-sass", target).stdout
    print(f"{'kernel <SC, MIN, BK, STAGES, Q>':41} {'IMMA':>5} {'FP':>5} {'LDSM':>5} {'LDS':>5} {'other':>6} {'all':>6}"
          f"  per IMMA: FP  all")
    def source(name: str) -> str:
        m = SOURCE.search(name)
        return m.group(1) if m else ""
    for name, body in sorted(functions(sass).items(), key=lambda kv: (NAME.search(kv[0]).groups(), source(kv[0]))):
        sc, mn, bk, stages = NAME.search(name).groups()
        c = classify(main_loop(body))
        imma = max(c["IMMA"], 1)
        label = f"{FORMS[sc]:5} MIN={mn} BK={bk} STAGES={stages} {source(name)}"
        print(f"{label:41} {c['IMMA']:5} {c['FP']:5} {c['LDSM']:5} {c['LDS']:5} {c['other']:6} {c['all']:6}"
              f"  {c['FP'] / imma:11.1f} {c['all'] / imma:4.1f}")


if __name__ == "__main__":
    main()
