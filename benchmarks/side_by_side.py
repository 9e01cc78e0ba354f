"""llamacmp-bench against llama.cpp's llama-bench on the same GGUF in the same run (issue 3 item 7).

    python3 benchmarks/side_by_side.py --model M.gguf [--make-9b [--vocab-cache PKL|DIR]] --llamacpp-src DIR|TARBALL
           [--standin]
           [-p 512,4096,16384] [-n 128] [-d 32768] [-r 2] [--build-dir DIR] [--out results.md]
    python3 benchmarks/side_by_side.py --llamacpp-src TARBALL --standin --build-only \
           --native-targets llama-bench,llama-server,llama-mtmd-cli     (build both trees at once, then stop)
    python3 benchmarks/side_by_side.py --model M.gguf --standin --prebuilt --build-dir DIR ...
           (run the llama-bench builds another machine made in DIR: a GPU machine's time is not spent compiling)

Builds llama-bench (CUDA, sm_90) from the same llama.cpp tree the compat suite uses (≈ b8462), reusing a build
that exists. --standin adds a second build, "no-TC stand-in", patched so that neither host dispatch nor device code
has a tensor-core path (patch_standin_cuda below says exactly what and why): Q8_0 GEMMs run the DP4A MMQ kernels at
every batch size, FlashAttention the FP16 tile/vec kernels, cuBLAS (not reached by a Q8_0 model) plain SGEMM. It is a
stand-in for a card whose tensor cores are throttled (SM70_TOOLCHAIN.md says why a real compute_70 build of llama.cpp
is not practical); after building, every ggml-cuda object is disassembled and the run stops if any HMMA/IMMA/HGMMA/...
instruction remains. Its build folder is standin-notc/ (the older 610-patched standin/ is not reused: it still ran
mma.sync MMQ and cuBLAS HGMMA). Prints one table with every tool's t/s and llamacmp's ratio to each llama.cpp build.
--make-9b writes the model with the real Qwen3.5 vocabulary (--vocab-cache, see bench_model.py): llama-bench refuses
a file without merges.
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

# --- the no-tensor-core stand-in ------------------------------------------------------------------------------------
# Why not "highest compiled arch = 610" (the first stand-in, measured on the H200 2026-11-30: pp4096 11241 t/s against
# native 9053): that answer only changes the HOST's dispatch. Device code is still compiled for sm_90, where common.cuh
# defines TURING_MMA_AVAILABLE / AMPERE_MMA_AVAILABLE from __CUDA_ARCH__, so the MMQ kernel it launched for ne11 < 64
# ran mma.sync (with host tile sizes meant for the DP4A layout), and for ne11 >= 64 ggml_cuda_should_use_mmq() returned
# false (fp16_mma_hardware_available(900) is true) so every Q8_0 prefill GEMM went to cuBLAS (FP16 GemmEx -> HGMMA),
# which is faster than native's MMQ on Hopper. 610 also turned fast_fp16_available() off on the host while the sm_90
# FA-tile kernels were built with FAST_FP16_AVAILABLE (host and device disagreed on the tile config).
# This stand-in instead leaves the arch alone (host and device both see sm_90 fast FP16 and DP4A, like Volta) and
# removes every tensor-core route, on both sides:
#   host   (common.cuh): the *_mma_available / *_mma_hardware_available helpers and cp_async_available answer false,
#          and fast_fp16_hardware_available too (it only steers cuBLAS, whose FP16 GEMMs are HMMA/HGMMA), so
#          ggml_cuda_should_use_mmq() takes MMQ for every batch size, FA picks the tile/vec kernels, mmf is off;
#   device (common.cuh): VOLTA/TURING/AMPERE/BLACKWELL_MMA_AVAILABLE, CP_ASYNC_AVAILABLE and LDMATRIX_TRANS_AVAILABLE
#          are #undef'd, so mmq.cuh compiles its DP4A tiles and every mma.cuh user becomes NO_DEVICE_CODE;
#   cuBLAS: the handle's math mode is CUBLAS_DEFAULT_MATH instead of TF32 tensor-op math (F32 GEMMs: plain SGEMM);
#   cmake:  -DGGML_CUDA_FORCE_MMQ=ON (MMQ also for large batches, mmq_x up to 128 as on Volta).
# What is left: a BF16 weight would still reach cuBLAS's BF16 GemmEx (tensor cores); the Q8_0 benchmark models have
# none. check_no_tensor_cores() disassembles every ggml-cuda object of the build and fails if HMMA/IMMA/HGMMA/...
# remain.
STANDIN_FALSE_HELPERS = ("fast_fp16_hardware_available", "fp16_mma_hardware_available", "bf16_mma_hardware_available",
                         "volta_mma_available", "turing_mma_available", "ampere_mma_available", "cp_async_available",
                         "blackwell_mma_available")
STANDIN_UNDEF = ("VOLTA_MMA_AVAILABLE", "TURING_MMA_AVAILABLE", "AMPERE_MMA_AVAILABLE", "BLACKWELL_MMA_AVAILABLE",
                 "CP_ASYNC_AVAILABLE", "LDMATRIX_TRANS_AVAILABLE")
STANDIN_UNDEF_BEFORE = "static bool fp16_available(const int cc) {"
TF32_MODE = "CUBLAS_TF32_TENSOR_OP_MATH)"
STANDIN_CMAKE = ["-DGGML_CUDA_FORCE_MMQ=ON"]
# SASS opcodes of tensor-core instructions: HMMA (fp16/bf16/tf32 mma.sync), IMMA (int8 mma.sync), HGMMA/IGMMA/QGMMA/
# BGMMA (sm_90 wgmma), BMMA (1-bit), DMMA (fp64 mma), UTC*MMA (sm_100 tcgen05).
TENSOR_CORE_SASS = ("HMMA", "IMMA", "HGMMA", "IGMMA", "QGMMA", "BGMMA", "BMMA", "DMMA", "UTCHMMA", "UTCIMMA",
                    "UTCQMMA", "UTCOMMA")


def patch_standin_cuda(cuda_dir: Path) -> None:
    """Applies the stand-in patch set (see above) to a ggml/src/ggml-cuda folder in place; fails if the tree differs."""
    import re
    common = cuda_dir / "common.cuh"
    text = common.read_text()
    for name in STANDIN_FALSE_HELPERS:
        pat = re.compile(r"static bool " + name + r"\(const int cc\) \{\n.*?\n\}\n", re.S)
        if len(pat.findall(text)) != 1:
            raise SystemExit(f"{common}: helper {name}() not found exactly once; the llama.cpp tree differs")
        text = pat.sub(lambda m: f"static bool {name}(const int cc) {{\n    GGML_UNUSED(cc);\n    return false;"
                                 f"  // llamacmp no-tensor-core stand-in\n}}\n", text)
    if text.count(STANDIN_UNDEF_BEFORE) != 1 or text.count(TF32_MODE) != 1:
        raise SystemExit(f"{common}: the lines to patch were not found; the llama.cpp tree differs")
    undef = "// llamacmp no-tensor-core stand-in: the device code takes the DP4A / FP16 paths, never mma\n" + \
        "".join(f"#undef {m}\n" for m in STANDIN_UNDEF) + "\n"
    text = text.replace(STANDIN_UNDEF_BEFORE, undef + STANDIN_UNDEF_BEFORE).replace(TF32_MODE, "CUBLAS_DEFAULT_MATH)")
    common.write_text(text)
    solve = cuda_dir / "solve_tri.cu"                 # it restores the handle's TF32 mode after its TRSM
    if solve.exists():
        solve.write_text(solve.read_text().replace(TF32_MODE, "CUBLAS_DEFAULT_MATH)"))


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
    """A copy of the tree with the no-tensor-core patch set applied (the -notc suffix: not the old 610 copy)."""
    dst = work / (tree.name + "-notc-standin")
    if not dst.exists():
        tmp = work / (dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(tree, tmp,
                        ignore=lambda d, names: [n for n in names if Path(d) == tree and n.startswith("build")])
        patch_standin_cuda(tmp / "ggml" / "src" / "ggml-cuda")
        tmp.rename(dst)
    return dst


def find_cuobjdump() -> str:
    """cuobjdump: on PATH, in a CUDA toolkit under /usr/local, tools/get_cuda12.sh's (build/cuda12/bin) or the
    clang route's copy (build/clang-cuda-toolchain/disasm)."""
    import glob
    build = Path(__file__).resolve().parents[1] / "build"
    cands = [shutil.which("cuobjdump"), *sorted(glob.glob("/usr/local/cuda*/bin/cuobjdump"), reverse=True),
             str(build / "cuda12" / "bin" / "cuobjdump"), str(build / "clang-cuda-toolchain" / "disasm" / "cuobjdump")]
    for cand in cands:
        if cand and os.access(cand, os.X_OK):
            return cand
    raise SystemExit("cuobjdump not found (PATH, /usr/local/cuda*/bin, build/cuda12/bin, build/clang-cuda-toolchain): "
                     "the stand-in's SASS cannot be checked")


def tensor_core_instructions(objects: list[Path], cuobjdump: str) -> dict[str, dict[str, int]]:
    """{object: {opcode: count}} of tensor-core SASS per object (cuobjdump -sass); objects without any are left out."""
    import re
    pat = re.compile(r"\b(" + "|".join(TENSOR_CORE_SASS) + r")(?=[.\s])")
    env = dict(os.environ, PATH=f"{Path(cuobjdump).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # its nvdisasm

    def one(obj: Path) -> dict[str, int]:
        out = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True, env=env)
        if out.returncode != 0 and "does not contain device code" not in out.stderr:
            raise SystemExit(f"cuobjdump -sass {obj} failed: {out.stderr.strip()}")
        counts: dict[str, int] = {}
        for m in pat.finditer(out.stdout):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        return counts
    with ThreadPoolExecutor(os.cpu_count() or 4) as pool:
        return {str(o): c for o, c in zip(objects, pool.map(one, objects)) if c}


def check_no_tensor_cores(build: Path) -> int:
    """Fails loudly if any ggml-cuda object of the stand-in build holds tensor-core SASS; -> objects checked."""
    objects = sorted(build.glob("ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/**/*.cu.o"))
    if not any("mmq-instance-q8_0" in o.name for o in objects) or not any("fattn-tile" in o.name for o in objects):
        raise SystemExit(f"{build}: the ggml-cuda objects (mmq-instance-q8_0, fattn-tile-*) were not found")
    found = tensor_core_instructions(objects, find_cuobjdump())
    if found:
        lines = "\n".join(f"  {o}: {c}" for o, c in found.items())
        raise SystemExit(f"the no-tensor-core stand-in still holds tensor-core instructions:\n{lines}")
    return len(objects)


def build_tools(tree: Path, build: Path, targets: list[str], jobs: int, extra_flags: list[str]) -> Path:
    """Configures (once) and builds the given llama.cpp targets; returns the bin/ folder."""
    if all((build / "bin" / t).exists() for t in targets):
        return build / "bin"
    flags = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
             "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_COMMIT=49bfddeca",
             "-DLLAMA_BUILD_NUMBER=8462", *extra_flags]
    if not (build / "build.ninja").exists():
        subprocess.run(["cmake", "-S", str(tree), "-B", str(build), *flags], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "--target", *targets, "-j", str(jobs)],
                   check=True, stdout=subprocess.DEVNULL)
    return build / "bin"


def build_all(builds: dict[str, tuple[Path, Path, list[str], list[str]]]) -> dict[str, Path]:
    """Builds every tree at once: each cmake --build gets all cores (ninja keeps them busy through the few
    long template-instance files that would otherwise leave cores idle at the end of a single build)."""
    jobs = os.cpu_count() or 4
    with ThreadPoolExecutor(len(builds)) as pool:
        futures = {name: pool.submit(build_tools, src, build, targets, jobs, flags)
                   for name, (src, build, targets, flags) in builds.items()}
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


def build(args, folders: dict[str, Path]) -> dict[str, Path]:
    """Builds (or reuses) the native tree and, with --standin, its patched copy -> {name: bin folder}."""
    if args.llamacpp_src is None:
        raise SystemExit("--llamacpp-src is required unless --prebuilt")
    args.build_dir.mkdir(parents=True, exist_ok=True)
    tree = source_tree(args.llamacpp_src, args.build_dir)
    builds = {"llama.cpp native": (tree, folders["llama.cpp native"], args.native_targets.split(","), [])}
    if args.standin:
        builds["llama.cpp no-TC stand-in"] = (standin_tree(tree, args.build_dir),
                                              folders["llama.cpp no-TC stand-in"], ["llama-bench"], STANDIN_CMAKE)
    return build_all(builds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--make-9b", action="store_true", help="write the 9B-shape Q8_0 random model first")
    p.add_argument("--vocab-cache", default=None,
                   help="with --make-9b: the qwen35_vocab_v*.pkl (or its folder) for the real vocabulary")
    p.add_argument("--llamacpp-src", type=Path, help="the llama.cpp tree or tarball to build (not with --prebuilt)")
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/llamacpp-cuda"))
    p.add_argument("--standin", action="store_true")
    p.add_argument("--native-targets", default="llama-bench",
                   help="comma-separated targets of the native build (e.g. llama-bench,llama-server,llama-mtmd-cli)")
    p.add_argument("--build-only", action="store_true", help="build (or reuse) the llama.cpp tools and stop")
    p.add_argument("--prebuilt", action="store_true",
                   help="take the llama-bench of BUILD_DIR/native/bin (and standin-notc/bin) as they are, built "
                        "elsewhere (a machine without a GPU) by --build-only, whose stand-in check ran there")
    p.add_argument("-p", default="512")
    p.add_argument("-n", default="128")
    p.add_argument("-d", default="0", help="depths for a separate tg-only run (0: none), e.g. 32768")
    p.add_argument("-r", default="2")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    folders = {"llama.cpp native": args.build_dir / "native"}
    if args.standin:
        folders["llama.cpp no-TC stand-in"] = args.build_dir / "standin-notc"
    if args.prebuilt:
        bins = {name: folder / "bin" for name, folder in folders.items()}
        missing = [str(b / "llama-bench") for b in bins.values() if not (b / "llama-bench").exists()]
        if missing:
            raise SystemExit(f"--prebuilt: not found: {', '.join(missing)}")
    else:
        bins = build(args, folders)
    if args.standin and not args.prebuilt:
        n = check_no_tensor_cores(args.build_dir / "standin-notc")
        print(f"no-TC stand-in: no tensor-core SASS (HMMA/IMMA/HGMMA/...) in its {n} ggml-cuda objects", flush=True)
    if args.build_only:
        print("\n".join(f"{name}: {b}" for name, b in bins.items()))
        return
    if args.model is None:
        raise SystemExit("--model is required unless --build-only")
    if args.make_9b and not args.model.exists():
        from bench_model import make_9b
        make_9b(str(args.model), args.vocab_cache)
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
