"""What the compiler made of the Q8_0 GEMV kernels of cuda_src/matmul_q8.cu, without a GPU: registers and spills
(ptxas -v) and, from the SASS, how many loads each kernel issues before its first DP4A waits for data.

    python3 tools/gemv_sass.py [--arch sm_90] [--cubin F.cubin --ptxas-log F.txt] [--diff A B]

Columns, per kernel (the main loop of a T = 1 GEMV streams 16-byte weight chunks, one f16 weight scale per chunk,
one 16-byte activation chunk and one f32 activation scale):
  regs / spill   registers per thread and spill-store bytes (ptxas -v)
  ld128 / ld16   16-byte loads (weights and the first x chunk) and f16 scale loads issued before the first DP4A:
                 the memory requests a warp has in flight when it first stalls
  chunks         DP4A chains (16-byte chunks) in the loop body
  late xs        chunks whose activation-scale load is issued after the chunk's first DP4A (which waits for the x
                 chunk): two dependent cache round trips instead of one
  stl/ldl        local-memory stores / loads (spills)
  instrs         SASS instructions of the whole kernel
--diff A B prints whether two kernels' SASS is the same instruction for instruction. Kernels are named by regular
expressions searched in the mangled names (the first match is taken), e.g. gemv_q8_kernelILi1ENS_7DotDp4a (v1's
gemv_q8_kernel<NT, D> at T = 1) or gemv_q8_batch_kernelILi1E.*DotDp4a (the batch-invariant GEMV,
gemv_q8_batch_kernel<NT, R, U, MINB, D>, at T = 1: the decode GEMV). The defaults: both at T = 1 and the batch
kernel at T = 2. The ld128 / ld16 columns count loads before the first IDP.4A, so they describe DP4A instantiations
only.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_KERNELS = ["gemv_q8_kernelILi1ENS_7DotDp4a", "gemv_q8_batch_kernelILi1E.*DotDp4a",
                   "gemv_q8_batch_kernelILi2E.*DotDp4a"]
INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def cuobjdump() -> Path:
    """The cuobjdump that tests/sass_tools.py would pick (PyPI nvidia packages, triton, PATH)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from sass_tools import cuobjdump_candidates
    for tool in cuobjdump_candidates():
        return tool
    raise SystemExit("gemv_sass: no cuobjdump (pip install nvidia-cuda-cuobjdump, or put one on PATH)")


def compile_cubin(arch: str, out: Path) -> str:
    """nvcc the one file to a cubin (the project's flags); returns ptxas -v's report."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmd = [nvcc, "-O3", "-std=c++17", "--use_fast_math", f"-arch={arch}", "-Xptxas", "-v", "-cubin",
           str(ROOT / "cuda_src/matmul_q8.cu"), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gemv_sass: nvcc failed:\n{r.stderr[-3000:]}")
    return r.stderr


def ptxas_resources(log: str) -> dict[str, tuple[int, int]]:
    """mangled name -> (registers, spill-store bytes) from ptxas -v output."""
    out, cur, spill = {}, None, 0
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur, spill = m.group(1), 0
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            out[cur] = (int(m.group(1)), spill)
    return out


def functions(sass: str) -> dict[str, list[str]]:
    """mangled name -> its instructions (predicates kept, addresses dropped)."""
    out, cur = {}, None
    for line in sass.splitlines():
        if "Function :" in line:
            cur = line.split("Function :")[1].strip()
            out[cur] = []
            continue
        m = INSTR.match(line)
        if m and cur:
            out[cur].append(m.group(2))
    return out


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].replace(".SYS", "")


def summary(instrs: list[str]) -> dict[str, int]:
    """The columns of the table (see the module doc) for one kernel."""
    ops = [opcode(i) for i in instrs]
    dp4a = [k for k, o in enumerate(ops) if o.startswith("IDP.4A")]
    first = dp4a[0] if dp4a else len(ops)
    before = ops[:first]
    starts = [k for k in dp4a if instrs[k].rstrip().endswith("RZ")]   # a chain starts from a zero accumulator
    late = 0
    for s in starts:
        fma = next((k for k in range(s, len(ops)) if ops[k].startswith("FFMA")), len(ops))
        late += any(o.startswith("LDG.E.CONSTANT") for o in ops[s:fma])
    return {"ld128": sum(o.startswith("LDG.E.128") for o in before),
            "ld16": sum(o.startswith("LDG.E.U16") for o in before),
            "chunks": len(starts), "late xs": late,
            "stl": sum(o.startswith("STL") for o in ops), "ldl": sum(o.startswith("LDL") for o in ops),
            "instrs": len(ops)}


def find(funcs: dict[str, list[str]], key: str) -> str:
    hits = [f for f in funcs if re.search(key, f)]
    if not hits:
        raise SystemExit(f"gemv_sass: no kernel matches {key!r}")
    return hits[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--cubin", help="an existing cubin (skips the compile; give --ptxas-log for the registers)")
    ap.add_argument("--ptxas-log")
    ap.add_argument("--kernels", default=",".join(DEFAULT_KERNELS), help="comma-separated name patterns")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"), action="append", default=[])
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.cubin:
            cubin, log = Path(args.cubin), Path(args.ptxas_log).read_text() if args.ptxas_log else ""
        else:
            cubin = Path(tmp) / "matmul_q8.cubin"
            log = compile_cubin(args.arch, cubin)
        tool = cuobjdump()
        env = dict(os.environ, PATH=f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}")
        r = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise SystemExit(f"gemv_sass: cuobjdump failed: {r.stderr[-2000:]}")
    funcs, res = functions(r.stdout), ptxas_resources(log)
    print(f"{'kernel':<36} {'regs':>4} {'spill':>5} {'ld128':>5} {'ld16':>4} {'chunks':>6} {'late xs':>7} "
          f"{'stl/ldl':>7} {'instrs':>6}")
    for key in args.kernels.split(","):
        name = find(funcs, key)
        s = summary(funcs[name])
        regs, spill = res.get(name, (-1, -1))
        print(f"{key:<36} {regs:>4} {spill:>5} {s['ld128']:>5} {s['ld16']:>4} {s['chunks']:>6} {s['late xs']:>7} "
              f"{s['stl']:>3}/{s['ldl']:<3} {s['instrs']:>6}")
    for a, b in args.diff:
        fa, fb = funcs[find(funcs, a)], funcs[find(funcs, b)]
        same = sum(x == y for x, y in zip(fa, fb))
        verdict = "identical" if fa == fb else f"{same} of {max(len(fa), len(fb))} instructions equal"
        print(f"{a} vs {b}: {verdict}")


if __name__ == "__main__":
    main()
