"""Where a prefill's time goes, by phase: projection GEMMs, attention, Gated DeltaNet, glue (issue 20 item 5).

    python3 benchmarks/profile_prefill.py MODEL.gguf [-p 512 4096 16384] [--route mma] [--attn-route fp32]
                                          [--top 12] [--by-grid] [--json out.json]

For each ppN: one warm-up forward, one timed plainly (wall clock, the logits copied back, as bench_model's ppN), then
one under torch.profiler's CUDA activity trace (CUPTI sees the library's kernels: one process, one context). Each
kernel name falls into one phase (PHASES, first match wins); the table gives per phase the kernels' device time and
its share of their sum, and the sum against the plain forward's wall time (the rest is launch gaps and host work).
--by-grid lists each kernel per grid size: a GEMM's one-tile launches (a full wave's latency for a few blocks) apart.
Needs torch with CUDA (the H200 image has it); nothing else of torch is used.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import load  # noqa: E402
from profile_decode import kernel_times  # noqa: E402

from llamacmp.backends.base import StepBatch  # noqa: E402
from llamacmp.backends.cuda import CudaBackend  # noqa: E402

# (phase, kernel-name pattern): the projections (GEMMs, the expanded types' weight expansion and half sums), the
# kernels that quantize their activations (alone or fused with a norm or residual add), the attention layers'
# kernels (prep: norm + rope; KV write; the attention itself), the GDN layers' conv, gates and scan.
PHASES = (
    ("gemm", re.compile(r"gemm|gemv|expand_kernel|half_sums")),
    ("quantize", re.compile(r"quantize_q8|rmsnorm_q8|binary_q8|q8_repack")),
    ("attention", re.compile(r"attention|attn_|kv_write")),
    ("gdn", re.compile(r"gdn|conv1d")),
    ("glue", re.compile(r".")),   # norms, elementwise, embedding, argmax ...
)


def phase_of(kernel: str) -> str:
    return next(name for name, pat in PHASES if pat.search(kernel))


def profile_one(be: CudaBackend, cfg, model, p: int, rng,
                by_grid: bool = False) -> tuple[float, dict[str, tuple[int, float]]]:
    """(plain wall seconds, {kernel: (launches, device µs)}) of one forward of p random tokens on a fresh state."""
    from torch.profiler import ProfilerActivity, profile

    def forward():
        st = be.new_state(cfg, p + 8)
        ids = [int(i) for i in rng.integers(0, cfg.n_vocab, p)]
        be.synchronize()
        t0 = time.perf_counter()
        be.to_host(model.forward(StepBatch.build([(st, ids)])))
        return time.perf_counter() - t0

    forward()                      # warm-up: workspaces and kernels' first loads
    wall = forward()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        times = kernel_times(Path(tmp) / "trace.json", by_grid)
    if not times:
        raise SystemExit("the profiler saw no kernels (CUPTI unavailable?)")
    return wall, times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", type=int, nargs="+", default=[512, 4096, 16384])
    ap.add_argument("--route", choices=("dp4a", "mma"), default="mma", help="routes.Routes.matmul_prefill")
    ap.add_argument("--attn-route", choices=("fp32", "mma"), default="fp32", help="routes.Routes.attn_prefill")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per ppN")
    ap.add_argument("--by-grid", action="store_true", help="one row per kernel and grid size")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    be = CudaBackend(0)
    be.routes = replace(be.routes, matmul_prefill=args.route, attn_prefill=args.attn_route)
    cfg, model = load(args.model, be)
    rng = np.random.default_rng(0)
    print(f"device: {be.native.device_name()}; model {args.model}; prefill route {args.route}; "
          f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows = []
    for p in args.p:
        wall, times = profile_one(be, cfg, model, p, rng, args.by_grid)
        total = sum(us for _, us in times.values())
        phases = {name: 0.0 for name, _ in PHASES}
        for k, (_, us) in times.items():
            phases[phase_of(k)] += us
        print(f"\npp{p}: {p / wall:.1f} t/s, forward {1e3 * wall:.1f} ms plain; kernels sum to {total / 1e3:.1f} ms")
        print("| phase | ms | share of kernel time |")
        print("|---|---:|---:|")
        for name, us in phases.items():
            print(f"| {name} | {us / 1e3:.2f} | {100 * us / total:.1f}% |")
        print("| kernel | phase | launches | ms | share |")
        print("|---|---|---:|---:|---:|")
        for k, (c, us) in sorted(times.items(), key=lambda kv: -kv[1][1])[:args.top]:
            print(f"| {k[:100]} | {phase_of(k)} | {c} | {us / 1e3:.2f} | {100 * us / total:.1f}% |")
        rows.append({"p": p, "wall_ms": 1e3 * wall, "kernel_ms": total / 1e3,
                     "phases_ms": {k: v / 1e3 for k, v in phases.items()},
                     "kernels": {k: [c, us / 1e3] for k, (c, us) in times.items()}})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
