"""llamacmp-bench against llama.cpp's llama-bench on the same GGUF in the same run (issue 3 item 7).

    python3 benchmarks/side_by_side.py --model M.gguf [--make-9b [--vocab-cache PKL|DIR]] --llamacpp-src DIR|TARBALL
           [--standin]
           [-p 512,4096,16384] [-n 128] [-d 32768] [-r 2] [--build-dir DIR] [--out results.md]
    python3 benchmarks/side_by_side.py --llamacpp-src TARBALL --standin --build-only \
           --native-targets llama-bench,llama-server,llama-mtmd-cli     (build both trees at once, then stop)
    python3 benchmarks/side_by_side.py --model M.gguf --standin --prebuilt --build-dir DIR ...
           (run the llama-bench builds another machine made in DIR: a GPU machine's time is not spent compiling)
    python3 benchmarks/side_by_side.py --model M.gguf --llamacpp-src TARBALL --standin-only --llamacmp-args \
           "--hw-route dp4a" ...   (one llama.cpp build: the stand-in rows in one device call, the native in another)

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

MTP speculative decoding (issue 19), llama.cpp 0c1e570 built from its own tree (--build-info 0c1e570:0):
    python3 benchmarks/side_by_side.py --model M.gguf [--make-9b --mtp] --build-dir DIR --prebuilt \
           --spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len 1,1.5,2.5,3.5 [--streams 1,4] [-n 128]
llama-bench has no --spec-* flags (0c1e570 either), so this mode measures the servers: llama-server (DIR/native/bin)
and llamacmp-server, each started once per setting (MTP off, then MTP on at each synthetic acceptance length; without
--spec-synth-len at the file's own acceptance) with -np = the most streams, and the same flags. Per setting: the
decode rate of 1 stream (the server's timings.predicted_per_second, median of -r requests) and the aggregate of N
concurrent streams (server_vs_llamacpp.measure: greedy, ignore_eos, -n tokens each; all tokens over the wall time,
"steady" in the JSON), and the mean accepted length from each server's /metrics (spec_decode_* counters). Prints the table (llamacmp / llama.cpp, and each engine's MTP-on / MTP-off).
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


def build_tools(tree: Path, build: Path, targets: list[str], jobs: int, extra_flags: list[str],
                info: str = "49bfddeca:8462") -> Path:
    """Configures (once) and builds the given llama.cpp targets; returns the bin/ folder. info: COMMIT:NUMBER the
    binaries report (the trees come without .git)."""
    if all((build / "bin" / t).exists() for t in targets):
        return build / "bin"
    commit, number = info.split(":")
    # no prebuilt web UI: it would be downloaded (the GPU machine has no network); the page is not measured
    flags = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
             "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", f"-DLLAMA_BUILD_COMMIT={commit}",
             f"-DLLAMA_BUILD_NUMBER={number}", "-DLLAMA_USE_PREBUILT_UI=OFF", *extra_flags]
    if not (build / "build.ninja").exists():
        subprocess.run(["cmake", "-S", str(tree), "-B", str(build), *flags], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "--target", *targets, "-j", str(jobs)],
                   check=True, stdout=subprocess.DEVNULL)
    return build / "bin"


def build_all(builds: dict[str, tuple[Path, Path, list[str], list[str]]], info: str) -> dict[str, Path]:
    """Builds every tree at once: each cmake --build gets all cores (ninja keeps them busy through the few
    long template-instance files that would otherwise leave cores idle at the end of a single build)."""
    jobs = os.cpu_count() or 4
    with ThreadPoolExecutor(len(builds)) as pool:
        futures = {name: pool.submit(build_tools, src, build, targets, jobs, flags, info)
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
    builds = {}
    if "llama.cpp native" in folders:
        builds["llama.cpp native"] = (tree, folders["llama.cpp native"], args.native_targets.split(","), [])
    if args.standin:
        builds["llama.cpp no-TC stand-in"] = (standin_tree(tree, args.build_dir),
                                              folders["llama.cpp no-TC stand-in"], ["llama-bench"], STANDIN_CMAKE)
    return build_all(builds, args.build_info)


# --- MTP speculative decoding through the servers (llama-bench has no --spec-* flags) ------------------------------

def spec_settings(args) -> list[tuple[str, list[str]]]:
    """(label, server flags): MTP off, then MTP on at each --spec-synth-len (or at the file's own acceptance)."""
    on = ["--spec-type", args.spec_type, "--spec-draft-n-max", str(args.spec_draft_n_max)]
    lens = [x for x in args.spec_synth_len.split(",") if x]
    return [("off", [])] + ([(f"mtp L{x}", on + ["--spec-synth-len", x]) for x in lens] or [("mtp", on)])


def draft_mean_len(url: str) -> float:
    """1 + accepted drafts per verification, from the server's /metrics (0c1e570's spec_decode_* counters)."""
    import httpx
    values = dict(line.rsplit(" ", 1) for line in httpx.get(url + "/metrics", timeout=30).text.splitlines()
                  if line.startswith("llamacpp:spec_decode_"))
    steps = float(values.get("llamacpp:spec_decode_num_drafts_total", 0))
    return 1.0 + float(values.get("llamacpp:spec_decode_num_accepted_tokens_total", 0)) / steps if steps else 1.0


def single_stream_tps(url: str, prompt: list[int], n: int, reps: int, extra: dict | None) -> float:
    """The server's own decode rate of one greedy request (timings.predicted_per_second: tokens after the first
    over their time, the same definition in both servers), median of `reps` after a short warm-up."""
    import statistics
    import httpx
    body = {"prompt": prompt, "temperature": 0, "ignore_eos": True, "cache_prompt": False, **(extra or {})}
    httpx.post(url + "/completion", json={**body, "n_predict": 8}, timeout=600).raise_for_status()
    rates = []
    for _ in range(reps):
        r = httpx.post(url + "/completion", json={**body, "n_predict": n}, timeout=600)
        r.raise_for_status()
        t = r.json()["timings"]
        if t["predicted_n"] != n:
            raise RuntimeError(f"{url}: {t['predicted_n']} tokens generated, not {n}")
        rates.append(float(t["predicted_per_second"]))
    return statistics.median(rates)


def spec_side_by_side(args, llama_server: Path) -> dict:
    """-> {engine: {setting: {"streams": {N: measure()'s figures}, "mean_len": L}}}, each server alone on the GPU."""
    import server_vs_llamacpp as sv
    model = str(args.model)
    streams = [int(x) for x in args.streams.split(",")]
    np_, ctx = max(streams), max(streams) * args.ctx_slot
    texts = sv.prompts(np_, sv.vocab_size(model))
    ban = {"logit_bias": [[i, False] for i in sv.malformed_utf8_ids(model)]}   # llama-server's streams need it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(sv.ROOT), os.environ.get("PYTHONPATH")])))
    engines = {"llama.cpp": (lambda port, flags: sv.llama_server_argv(str(llama_server), model, port, np_, ctx,
                                                                       flags + ["--metrics"]), None, ban),
               "llamacmp": (lambda port, flags: sv.llamacmp_argv(model, port, np_, ctx, flags + ["--metrics"]),
                            env, None)}
    out: dict = {}
    for engine, (argv_of, e, extra) in engines.items():
        for label, flags in spec_settings(args):
            port = sv.free_port()
            log = Path(f"/tmp/mtp-{engine}-{label.replace(' ', '_')}.log")
            with sv.Server(argv_of(port, flags), port, log, e) as srv:
                srv.wait_ready(args.load_timeout)
                figs = {n: {"tps": single_stream_tps(srv.url, texts[0], int(args.n), int(args.r), extra)}
                        if n == 1 else {"tps": (m := sv.measure(srv.url, texts[:n], int(args.n), extra))["wall_tps"],
                                        **{k: m[k] for k in ("steady_tps", "wall_tps", "tokens", "per_stream")}}
                        for n in streams}
                out.setdefault(engine, {})[label] = {"streams": figs, "mean_len": draft_mean_len(srv.url)}
            print(f"{engine} {label}: " + ", ".join(f"{n} stream(s) {f['tps']:.1f} t/s" for n, f in figs.items()),
                  flush=True)
    return out


def spec_table(res: dict) -> str:
    """One row per (setting, streams): both engines' t/s (1 stream: the server's decode rate; N: all tokens of N
    concurrent streams over the wall time), llamacmp / llama.cpp, each engine's MTP on / off."""
    head = ("| setting | streams | llama.cpp t/s | llamacmp t/s | llamacmp / llama.cpp | llama.cpp on/off | "
            "llamacmp on/off | mean len llama.cpp | mean len llamacmp |")
    lines = [head, "|" + "---|" * 9]
    a, b = res["llama.cpp"], res["llamacmp"]
    for label in a:
        for n in a[label]["streams"]:
            x, y = a[label]["streams"][n]["tps"], b[label]["streams"][n]["tps"]
            x0, y0 = a["off"]["streams"][n]["tps"], b["off"]["streams"][n]["tps"]
            lines.append(f"| {label} | {n} | {x:.1f} | {y:.1f} | {y / x:.2f}x | {x / x0:.2f}x | {y / y0:.2f}x | "
                         f"{a[label]['mean_len']:.2f} | {b[label]['mean_len']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--make-9b", action="store_true", help="write the 9B-shape Q8_0 random model first")
    p.add_argument("--vocab-cache", default=None,
                   help="with --make-9b: the qwen35_vocab_v*.pkl (or its folder) for the real vocabulary")
    p.add_argument("--llamacpp-src", type=Path, help="the llama.cpp tree or tarball to build (not with --prebuilt)")
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/llamacpp-cuda"))
    p.add_argument("--standin", action="store_true")
    p.add_argument("--standin-only", action="store_true",
                   help="the stand-in build alone, no native one: one llama.cpp build, so that building and measuring "
                        "fit one device call (the native rows in another)")
    p.add_argument("--llamacmp-args", default="",
                   help="extra llamacmp-bench flags, e.g. '--hw-route dp4a' against the stand-in")
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
    p.add_argument("--build-info", default="49bfddeca:8462",
                   help="COMMIT:NUMBER the llama.cpp build reports (0c1e570:0 for llama-cpp-python 0.3.36's tree)")
    p.add_argument("--mtp", action="store_true", help="with --make-9b: the model gets an MTP block")
    p.add_argument("--spec-type", choices=["draft-mtp"],
                   help="MTP side by side through llama-server and llamacmp-server (see the module help)")
    p.add_argument("--spec-draft-n-max", type=int, default=3)
    p.add_argument("--spec-synth-len", default="", help="comma-separated synthetic acceptance lengths")
    p.add_argument("--streams", default="1,4", help="with --spec-type: concurrent streams per measurement")
    p.add_argument("--ctx-slot", type=int, default=1024, help="with --spec-type: context per server slot")
    p.add_argument("--load-timeout", type=float, default=900)
    args = p.parse_args()
    if args.mtp and not args.make_9b:
        p.error("--mtp writes the model's MTP block: it needs --make-9b")
    only_spec = [f"--{k.replace('_', '-')}" for k in ("spec_draft_n_max", "spec_synth_len", "streams", "ctx_slot")
                 if getattr(args, k) != p.get_default(k)]
    if only_spec and not args.spec_type:
        p.error(f"{', '.join(only_spec)}: only with --spec-type draft-mtp (the servers' MTP comparison)")
    if args.standin_only and args.spec_type:
        p.error("--standin-only: the MTP comparison runs the native llama-server")
    args.standin |= args.standin_only
    if args.spec_type and "llama-server" not in args.native_targets:
        args.native_targets += ",llama-server"
    folders = {} if args.standin_only else {"llama.cpp native": args.build_dir / "native"}
    if args.standin:
        folders["llama.cpp no-TC stand-in"] = args.build_dir / "standin-notc"
    if args.prebuilt:
        bins = {name: folder / "bin" for name, folder in folders.items()}
        tool = "llama-server" if args.spec_type else "llama-bench"
        missing = [str(b / tool) for b in bins.values() if not (b / tool).exists()]
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
        make_9b(str(args.model), args.vocab_cache, mtp=args.mtp)
    if args.spec_type:
        res = spec_side_by_side(args, bins["llama.cpp native"] / "llama-server")
        text = spec_table(res)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
            args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
        return
    # llama-bench runs every -p/-n/-d combination: prompt runs at depth 0, and tg alone at each extra depth.
    common = ["-m", str(args.model), "-r", args.r, "-ngl", "99", "-fa", "1"]
    runs = [["-p", args.p, "-n", args.n, "-d", "0"]]
    if args.d != "0":
        runs.append(["-p", "0", "-n", args.n, "-d", args.d])
    tools = {name: [str(b / "llama-bench")] for name, b in bins.items()}
    tools["llamacmp"] = [sys.executable, "-m", "llamacmp.cli.bench", *args.llamacmp_args.split()]
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
