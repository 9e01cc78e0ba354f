"""llamacmp-bench against llama.cpp's llama-bench on the same GGUF in the same run (issue 3 item 7).

    python3 benchmarks/side_by_side.py --model M.gguf [--make-9b] --llamacpp-src DIR|TARBALL [--standin]
           [-p 512,4096,16384] [-n 128] [-d 32768] [-r 2] [--build-dir DIR] [--out results.md]
    python3 benchmarks/side_by_side.py --llamacpp-src TARBALL --standin --build-only \
           --native-targets llama-bench,llama-server,llama-mtmd-cli     (build both trees at once, then stop)

Builds llama-bench (CUDA, sm_90) from the same llama.cpp tree the compat suite uses (≈ b8462), reusing a build
that exists. --standin adds a second build whose ggml_cuda_highest_compiled_arch() answers Pascal (610), so that
llama.cpp takes its DP4A MMQ and non-MMA FlashAttention kernels: a stand-in for a card whose tensor cores are
throttled (SM70_TOOLCHAIN.md says why a real compute_70 build of llama.cpp is not practical). Prints one table
with every tool's t/s and llamacmp's ratio to each llama.cpp build.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ARCH_LINE = "return ggml_cuda_highest_compiled_arch_impl(arch, 0, __CUDA_ARCH_LIST__);"


def source_tree(src: Path, work: Path) -> Path:
    """A directory holding llama.cpp's CMakeLists.txt (a tarball is unpacked once into work/)."""
    if src.is_dir():
        return src
    with tarfile.open(src) as t:
        top = t.getnames()[0].split("/")[0]
        if not (work / top / "CMakeLists.txt").exists():
            t.extractall(work)
    return work / top


def standin_tree(tree: Path, work: Path) -> Path:
    """A copy of the tree whose highest-compiled-arch query answers 610 (Pascal: DP4A, no MMA)."""
    dst = work / (tree.name + "-pascal-standin")
    if not dst.exists():
        shutil.copytree(tree, dst, ignore=lambda d, names: [n for n in names if Path(d) == tree and n.startswith("build")])
        common = dst / "ggml" / "src" / "ggml-cuda" / "common.cuh"
        text = common.read_text()
        if ARCH_LINE not in text:
            raise SystemExit(f"{common}: the line to patch was not found; the llama.cpp tree differs")
        common.write_text(text.replace(ARCH_LINE, "(void) arch; return 610;  // llamacmp stand-in: Pascal paths"))
    return dst


def build_tools(tree: Path, build: Path, targets: list[str], jobs: int) -> Path:
    """Configures (once) and builds the given llama.cpp targets; returns the bin/ folder."""
    if all((build / "bin" / t).exists() for t in targets):
        return build / "bin"
    flags = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
             "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_COMMIT=49bfddeca",
             "-DLLAMA_BUILD_NUMBER=8462"]
    if not (build / "build.ninja").exists():
        subprocess.run(["cmake", "-S", str(tree), "-B", str(build), *flags], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "--target", *targets, "-j", str(jobs)],
                   check=True, stdout=subprocess.DEVNULL)
    return build / "bin"


def build_all(builds: dict[str, tuple[Path, Path, list[str]]]) -> dict[str, Path]:
    """Builds every tree at once: each cmake --build gets all cores (ninja keeps them busy through the few
    long template-instance files that would otherwise leave cores idle at the end of a single build)."""
    jobs = os.cpu_count() or 4
    with ThreadPoolExecutor(len(builds)) as pool:
        futures = {name: pool.submit(build_tools, src, build, targets, jobs)
                   for name, (src, build, targets) in builds.items()}
        return {name: f.result() for name, f in futures.items()}


def bench(cmd: list[str]) -> dict[str, tuple[float, float]]:
    """Run a llama-bench-compatible tool with -o json -> {test name: (avg t/s, sd)}."""
    out = subprocess.run(cmd + ["-o", "json"], check=True, capture_output=True, text=True).stdout
    rows = {}
    for r in json.loads(out):
        name = f"pp{r['n_prompt']}" if r["n_prompt"] and not r["n_gen"] else f"tg{r['n_gen']}"
        if r.get("n_depth"):
            name += f" @ d{r['n_depth']}"
        rows[name] = (float(r["avg_ts"]), float(r["stddev_ts"]))
    return rows


def table(results: dict[str, dict]) -> str:
    tools = list(results)
    tests = list(dict.fromkeys(t for r in results.values() for t in r))
    head = "| test | " + " | ".join(f"{t} t/s" for t in tools) + " | " + \
           " | ".join(f"llamacmp / {t}" for t in tools if t != "llamacmp") + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(tools) - 1)]
    for test in tests:
        cells = [f"{results[t][test][0]:.1f} ± {results[t][test][1]:.1f}" if test in results[t] else "—" for t in tools]
        ours = results.get("llamacmp", {}).get(test, (None,))[0]
        ratios = [f"{ours / results[t][test][0]:.2f}x" if ours and test in results[t] else "—"
                  for t in tools if t != "llamacmp"]
        lines.append(f"| {test} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--make-9b", action="store_true", help="write the 9B-shape Q8_0 random model first")
    p.add_argument("--llamacpp-src", required=True, type=Path)
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/llamacpp-cuda"))
    p.add_argument("--standin", action="store_true")
    p.add_argument("--native-targets", default="llama-bench",
                   help="comma-separated targets of the native build (e.g. llama-bench,llama-server,llama-mtmd-cli)")
    p.add_argument("--build-only", action="store_true", help="build (or reuse) the llama.cpp tools and stop")
    p.add_argument("-p", default="512")
    p.add_argument("-n", default="128")
    p.add_argument("-d", default="0", help="depths for a separate tg-only run (0: none), e.g. 32768")
    p.add_argument("-r", default="2")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    args.build_dir.mkdir(parents=True, exist_ok=True)
    tree = source_tree(args.llamacpp_src, args.build_dir)
    builds = {"llama.cpp native": (tree, args.build_dir / "native", args.native_targets.split(","))}
    if args.standin:
        builds["llama.cpp no-TC stand-in"] = (standin_tree(tree, args.build_dir), args.build_dir / "standin",
                                              ["llama-bench"])
    bins = build_all(builds)
    if args.build_only:
        print("\n".join(f"{name}: {b}" for name, b in bins.items()))
        return
    if args.model is None:
        raise SystemExit("--model is required unless --build-only")
    if args.make_9b and not args.model.exists():
        from bench_model import make_9b
        make_9b(str(args.model))
    # llama-bench runs every -p/-n/-d combination: prompt runs at depth 0, and tg alone at each extra depth.
    common = ["-m", str(args.model), "-r", args.r, "-ngl", "99", "-fa", "1"]
    runs = [["-p", args.p, "-n", args.n, "-d", "0"]]
    if args.d != "0":
        runs.append(["-p", "0", "-n", args.n, "-d", args.d])
    tools = {name: [str(b / "llama-bench")] for name, b in bins.items()}
    tools["llamacmp"] = [sys.executable, "-m", "llamacmp.cli.bench"]
    results = {}
    for name, cmd in tools.items():
        results[name] = {}
        for run in runs:
            results[name].update(bench([*cmd, *common, *run]))
        print(f"{name}: {results[name]}", flush=True)
    text = table(results)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
