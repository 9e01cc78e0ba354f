"""Which kernels two builds of libcmpkern.so compiled differently, without a GPU: a refactor of cuda_src whose SASS is
unchanged needs no new measurement (what the other library measured stands), and a change shows which kernels it
touched. Functions are compared instruction for instruction, with the instruction addresses and the anonymous
namespaces' hashes left out of the text (_GLOBAL__N__[<hash>_]<len>_<file>_cu_<hash>: the hashes differ between
builds and between versions of the file).

    python3 tools/sass_diff.py A.so B.so          -> functions only in A, only in B, and in both but different

(2026-12-06: main `873f0c9a` against next/s30 `438d8cf0`: 1285 functions the same, rmsnorm_q8's differ.)
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from sass_tools import cuobjdump_candidates, run_cuobjdump, sass_functions  # noqa: E402

ANON = re.compile(r"_GLOBAL__N__(?:[0-9a-f]{8}_)?(\d+_\w+?_cu)_[0-9a-f]{8}")
ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")


def normalized(sass: str) -> dict[str, str]:
    """cuobjdump -sass text -> function name (anonymous namespaces unnamed) -> digest of its instructions."""
    def plain(text: str) -> str:
        return ANON.sub(r"_GLOBAL__N__\1_", text)
    return {plain(name): hashlib.sha1(ADDRESS.sub("", plain(body)).encode()).hexdigest()
            for name, body in sass_functions(sass).items()}


def library_sass(lib: Path) -> dict[str, str]:
    tool = next(iter(cuobjdump_candidates()), None)
    if tool is None:
        raise SystemExit("sass_diff: no cuobjdump (pip install nvidia-cuda-cuobjdump, or put one on PATH)")
    r = run_cuobjdump(tool, "-sass", lib)
    if r.returncode != 0:
        raise SystemExit(f"sass_diff: cuobjdump failed on {lib}:\n{r.stderr[-2000:]}")
    return normalized(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    a, b = library_sass(args.a), library_sass(args.b)
    same = [k for k in a if b.get(k) == a[k]]
    print(f"the same: {len(same)} functions")
    for title, names in (("only in A", [k for k in a if k not in b]), ("only in B", [k for k in b if k not in a]),
                         ("different", [k for k in a if k in b and a[k] != b[k]])):
        print(f"{title}: {len(names)}")
        for n in names:
            print(f"  {n}")


if __name__ == "__main__":
    main()
