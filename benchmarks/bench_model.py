"""Whole-model prefill (ppN) and decode (tgN) on the CUDA backend, llama-bench style, on a qwen35 GGUF.

    python3 benchmarks/bench_model.py MODEL.gguf [-p 512] [-n 128] [-r 2] [--make-9b] [--prefill-routes dp4a mma]

--make-9b writes MODEL.gguf first (random weights, the real 9B shapes, Q8_0, ~10 GB: run that only on the GPU
machine) with the real Qwen3.5 vocabulary (248320 tokens and its merges, so that llama.cpp's llama-bench and
llama-server load the same file) from bench_vocab(): --vocab-cache PATH names the cached pickle or its folder (default
$LLAMACMP_CACHE, ~/.cache/llamacmp; see qwen_vocab.load_qwen35_vocab_anywhere for the lookup without the tokenizer
source). When none can be found it warns and writes a placeholder vocabulary of the same size (no merges): llamacmp
runs it, llama.cpp refuses it ("cannot find tokenizer merges in model file").
The tokenizer is not needed to run: the model is built from the GGUF's config and weights alone.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamacmp.backends.base import StepBatch
from llamacmp.backends.cuda import CudaBackend, Q8Matrix, QuantMatrix
from llamacmp.backends.cuda_graphs import CapturedStep
from llamacmp.config import ModelConfig
from llamacmp.gguf_file import GGUFFile
from llamacmp.models import model_class
from llamacmp.weights import load_weights

QWEN35_VOCAB = 248320


@dataclass
class PlaceholderVocab:
    tokens: list
    merges: list
    token_types: list
    eos_id: int = 0


def bench_vocab(vocab_cache: str | None = None):
    """The vocabulary for a benchmark model: the real Qwen3.5 one when it can be loaded (llama.cpp needs its merges);
    otherwise a warning and a placeholder of the real size. An explicit vocab_cache that cannot be used is an error."""
    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab_anywhere
    try:
        return load_qwen35_vocab_anywhere(Path(vocab_cache) if vocab_cache else None)
    except (FileNotFoundError, ValueError) as e:
        if vocab_cache:
            raise SystemExit(f"--vocab-cache {vocab_cache}: {e}")
        print(f"WARNING: no real Qwen3.5 vocabulary ({e}); writing a placeholder vocabulary WITHOUT merges: llama.cpp "
              f"(llama-bench, llama-server) will refuse this file ('cannot find tokenizer merges in model file'); "
              f"pass --vocab-cache PATH to a qwen35_vocab_v*.pkl", file=sys.stderr, flush=True)
    n = QWEN35_VOCAB
    return PlaceholderVocab([f"<t{i}>" for i in range(n)], [], [1] * n)


def make_9b(path: str, vocab_cache: str | None = None, shape: str = "9b", mtp: bool = False,
            preset: str | None = None) -> None:
    """mtp: with the MTP block (the writer's Shape.mtp, issue 19). preset: llama-quantize's type mix of that name
    (Q4_K_M, Q5_K_M, Q6_K, IQ4_XS; memory_fit.preset_types, checked against llama-quantize --dry-run) with random
    blocks drawn directly: the same tensor types and bytes as a llama-quantize file of the shape in seconds instead
    of minutes, for speed runs (benchmarks/device/quant_files.sh makes the llama-quantize files)."""
    from dataclasses import replace
    from llamacmp.fixtures.writer import SHAPES, write_model
    s = replace(SHAPES[shape], mtp=True) if mtp else SHAPES[shape]
    types = file_type = None
    if preset:
        from memory_fit import FILE_TYPES, preset_types
        types, file_type = preset_types(shape, preset, mtp), FILE_TYPES[preset]
    kind = (preset or "q8_0").lower()
    write_model(path, s, "q8_0", bench_vocab(vocab_cache), name=f"llamacmp-bench-{shape}{'-mtp' * mtp}-{kind}",
                types=types, file_type=file_type)


def load(path: str, be: CudaBackend):
    f = GGUFFile(path)
    n_vocab = f.info("token_embd.weight").shape[0]
    cfg = ModelConfig.from_metadata(f.metadata, n_vocab=n_vocab, tied=not f.has("output.weight"))
    return cfg, model_class(f.architecture)(cfg, load_weights(f, cfg), be)


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads: every matrix except the embedding table (one row is gathered)."""
    total, seen = 0, set()
    for obj in [model.output] + [getattr(x, n) for lay in model.layers for x in (lay, lay.attn, lay.gdn) if x
                                 for n in x.__slots__]:
        for m in (obj if isinstance(obj, list) else [obj]):
            if isinstance(m, (Q8Matrix, QuantMatrix)) and id(m) not in seen and m is not model.token_embd:
                seen.add(id(m))
                total += m.qs.nbytes + m.d.nbytes if isinstance(m, Q8Matrix) else \
                    m.body.nbytes + (m.head.nbytes if m.head is not None else 0)
    return total


def time_prefill(be: CudaBackend, cfg, model, p: int, reps: int, n_ctx: int, rng) -> float:
    """ppN: median seconds over `reps` of one forward of p random token ids (drawn from rng) on a fresh state,
    the device idle at the start and the logits copied back at the end."""
    times = []
    for _ in range(reps):
        st = be.new_state(cfg, n_ctx)
        ids = [int(i) for i in rng.integers(0, cfg.n_vocab, p)]
        be.synchronize()
        t0 = time.perf_counter()
        be.to_host(model.forward(StepBatch.build([(st, ids)])))
        times.append(time.perf_counter() - t0)
        del st
    return float(np.median(times))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, nargs="*", default=[512])
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("--make-9b", action="store_true")
    ap.add_argument("--vocab-cache", default=None,
                    help="with --make-9b: the qwen35_vocab_v*.pkl (or its folder) for the real vocabulary")
    ap.add_argument("--compare-unfused", action="store_true",
                    help="also time graph decode with one launch per projection (what fusing them saves)")
    ap.add_argument("--compare-kernels", action="store_true",
                    help="only: ppN and greedy graph tgN with the old path (unfused ops, v1 kernels) against the new "
                         "(fused Q8 producers and residual epilogues, v2 GEMV/GEMM), then with the GEMV's and the "
                         "small kernels' PDL launch, then exit")
    ap.add_argument("--prefill-routes", nargs="+", choices=("dp4a", "mma"), default=None,
                    help="only: ppN with each of these prefill GEMM routes (routes.Routes.matmul_prefill: the DP4A "
                         "GEMM, or the int8 tensor-core GEMM), then exit")
    args = ap.parse_args(argv)
    if args.make_9b and not os.path.exists(args.model):
        t0 = time.time()
        make_9b(args.model, args.vocab_cache)
        print(f"wrote {args.model} ({os.path.getsize(args.model) / 1e9:.2f} GB) in {time.time() - t0:.0f} s")
    be = CudaBackend()
    t0 = time.time()
    cfg, model = load(args.model, be)
    be.synchronize()
    wb = weight_bytes_per_token(model)
    print(f"device: {be.native.device_name()}  loaded in {time.time() - t0:.0f} s; "
          f"weights read per decode token {wb / 1e9:.2f} GB; date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rng = np.random.default_rng(0)
    n_ctx = max(args.p + [args.n]) + args.n + 8
    if args.compare_kernels:
        compare_kernels(be, cfg, model, args.p, args.n, args.r, n_ctx, wb)
        return
    if args.prefill_routes:
        compare_prefill_routes(be, cfg, model, args.p, args.r, n_ctx, args.prefill_routes)
        return

    # warm-up: a short prefill and a few decode steps
    st = be.new_state(cfg, n_ctx)
    be.to_host(model.forward(StepBatch.build([(st, list(rng.integers(0, cfg.n_vocab, 16)))])))
    for _ in range(3):
        be.to_host(model.forward(StepBatch.build([(st, [1])])))
    del st

    print("| model | test | t/s | ms |")
    print("| --- | --- | ---: | ---: |")
    for p in args.p:
        t = time_prefill(be, cfg, model, p, args.r, n_ctx, rng)
        print(f"| qwen35 9B-shape Q8_0 | pp{p} | {p / t:.1f} | {1e3 * t:.1f} |")
    times = []
    for _ in range(args.r):
        st = be.new_state(cfg, n_ctx)
        be.to_host(model.forward(StepBatch.build([(st, [1])])))
        tok = 1
        t0 = time.perf_counter()
        for _ in range(args.n):
            logits = be.to_host(model.forward(StepBatch.build([(st, [tok])])))
            tok = int(np.argmax(logits[-1]))
        times.append(time.perf_counter() - t0)
        del st
    t = float(np.median(times))
    tps = args.n / t
    print(f"| qwen35 9B-shape Q8_0 | tg{args.n} | {tps:.1f} | {1e3 * t / args.n:.2f}/tok |")
    print(f"decode (eager, one Python call per op): {wb * tps / 1e9:.0f} GB/s of weights streamed")

    # The same decode with the step captured once as a CUDA graph and replayed (token id and position uploaded,
    # logits copied back and argmax'd on the host every step, as a sampler would need them).
    for fused in ([True, False] if args.compare_unfused else [True]):
        be.fuse_projections = fused
        times = []
        for _ in range(args.r):
            st = be.new_state(cfg, n_ctx)
            logits = be.to_host(model.forward(StepBatch.build([(st, [1])])))
            step = CapturedStep(be, model, [st])
            step.step([1])                                   # warm-up replay
            t0 = time.perf_counter()
            for _ in range(args.n):
                logits = step.step([int(np.argmax(logits[-1]))])
            times.append(time.perf_counter() - t0)
            del step, st
        t = float(np.median(times))
        tps = args.n / t
        label = "CUDA graph" + ("" if fused else ", unfused projections")
        print(f"| qwen35 9B-shape Q8_0 | tg{args.n} ({label}) | {tps:.1f} | {1e3 * t / args.n:.2f}/tok |")
    be.fuse_projections = True
    print(f"decode (graph, last row): {wb * tps / 1e9:.0f} GB/s of weights streamed; roofline at the measured copy rate "
          f"of 4252 GB/s: {4252e9 / wb:.0f} t/s")


def compare_prefill_routes(be: CudaBackend, cfg, model, pp: list[int], reps: int, n_ctx: int,
                           routes: list[str]) -> None:
    """ppN of the same loaded model with each prefill GEMM route (a warm-up prefill per route first)."""
    from dataclasses import replace
    rng = np.random.default_rng(0)
    print("| route | test | t/s | ms |")
    print("| --- | --- | ---: | ---: |")
    base = be.routes
    for route in routes:
        be.routes = replace(base, matmul_prefill=route)
        time_prefill(be, cfg, model, min(pp), 1, n_ctx, rng)
        for p in pp:
            t = time_prefill(be, cfg, model, p, reps, n_ctx, rng)
            print(f"| {route} | pp{p} | {p / t:.1f} | {1e3 * t:.1f} |", flush=True)
    be.routes = base


def compare_kernels(be: CudaBackend, cfg, model, pp: list[int], n: int, reps: int, n_ctx: int, wb: int) -> None:
    """ppN (one forward of N tokens) and tgN (greedy CUDA-graph decode, 4 bytes to the host per token, as
    llamacmp-bench) for the old and the new kernel paths of the same loaded model; medians of `reps`."""
    rng = np.random.default_rng(0)
    print("| path | test | t/s | ms |")
    print("| --- | --- | ---: | ---: |")
    # (label, fused ops + v2 kernels, the GEMV's PDL launch, PDL launch of the small kernels)
    paths = (("old: unfused, v1 kernels", False, False, False), ("new: fused, v2 kernels", True, False, False),
             ("fused, v2 kernels, GEMV PDL", True, True, False),
             ("fused, v2 kernels, GEMV PDL, small kernels PDL", True, True, True))
    saved = be.gemv_pdl, be.launch_pdl
    for label, on, pdl, small_pdl in paths:
        be.fuse_ops = be.gemv_v2 = be.gemm_v2 = on
        be.gemv_pdl, be.launch_pdl = pdl, small_pdl
        st = be.new_state(cfg, n_ctx)                     # warm-up of this path
        be.to_host(model.forward(StepBatch.build([(st, list(rng.integers(0, cfg.n_vocab, 128)))])))
        del st
        for p in pp:
            t = time_prefill(be, cfg, model, p, reps, n_ctx, rng)
            print(f"| {label} | pp{p} | {p / t:.1f} | {1e3 * t:.1f} |", flush=True)
        times = []
        for _ in range(reps):
            st = be.new_state(cfg, n_ctx)
            be.to_host(model.forward(StepBatch.build([(st, [1])])))
            step = CapturedStep(be, model, [st], greedy=True)
            step.set_tokens([1])
            step.step_greedy()                            # warm-up replay
            t0 = time.perf_counter()
            for _ in range(n - 1):
                step.step_greedy(read=False)
            step.step_greedy()                            # the last one reads the ids: waits for the stream
            times.append(time.perf_counter() - t0)
            del step, st
        t = float(np.median(times))
        print(f"| {label} | tg{n} (greedy graph) | {n / t:.1f} | {1e3 * t / n:.3f}/tok |", flush=True)
    be.fuse_ops = be.gemv_v2 = be.gemm_v2 = True
    be.gemv_pdl, be.launch_pdl = saved
    print(f"weights per decode token {wb / 1e9:.2f} GB; roofline at 4252 GB/s copy: {4252e9 / wb:.0f} t/s")


if __name__ == "__main__":
    main()
