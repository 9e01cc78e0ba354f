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
from sass_loop import functions, main_loop, opcode  # noqa: E402
from sass_tools import cuobjdump_candidates, run_cuobjdump  # noqa: E402

NAME = re.compile(r"gemm_mma_kernelILi(\d)ELb(\d)ELi(\d)ELi(\d)E")
SOURCE = re.compile(r"(Q\d_K|Expanded)")   # the weight source: expanded, or the quant type read directly
FORMS = {"0": "Q8", "1": "PER32", "2": "PER16"}








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
    kernels = functions(sass, "gemm_mma_kernel")
    for name, body in sorted(kernels.items(), key=lambda kv: (NAME.search(kv[0]).groups(), source(kv[0]))):
        sc, mn, bk, stages = NAME.search(name).groups()
        c = classify(main_loop(body, "IMMA"))
        imma = max(c["IMMA"], 1)
        label = f"{FORMS[sc]:5} MIN={mn} BK={bk} STAGES={stages} {source(name)}"
        print(f"{label:41} {c['IMMA']:5} {c['FP']:5} {c['LDSM']:5} {c['LDS']:5} {c['other']:6} {c['all']:6}"
              f"  {c['FP'] / imma:11.1f} {c['all'] / imma:4.1f}")


if __name__ == "__main__":
    main()
