"""Where a decode token's time goes, kernel by kernel (issue 3: the tg gap's measured cause).

    python3 benchmarks/profile_decode.py MODEL.gguf [-n 64] [--depth 512] [--top 30] [--no-pdl] [--rows R] [--hidden]

Replays the greedy decode graph (as llamacmp-bench's tg) under torch.profiler's CUDA activity trace (CUPTI sees the
library's kernels too: one process, one context) and prints, per kernel name, launches and device µs per token,
and the spans' sum against the token's wall time. With programmatic dependent launch (the default on sm_90) a
kernel's span starts before its producer ends and includes its wait for it, so spans overlap: their sum can exceed
the wall time, and a short kernel after a long one shows part of the long one's time.
--rows R: one step of R sequences (each at --depth), as the server's decode graph of R generating slots. --hidden:
the step MTP on decodes with (Decoder(hidden=True): the graph also gives the hidden state the MTP head reads, and
each step's R rows of it are copied out as Speculator.observe_plain does), to set against the same R without it
(issue 19: a plain step of 4 streams with MTP on against off).
Needs torch with CUDA (the H200 image has it); nothing else of torch is used.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import load, weight_bytes_per_token  # noqa: E402

from llamacmp.backends.base import StepBatch  # noqa: E402
from llamacmp.backends.cuda import CudaBackend  # noqa: E402
from llamacmp.backends.cuda_graphs import CapturedStep  # noqa: E402


def kernel_times(trace: Path, by_grid: bool = False) -> dict[str, tuple[int, float]]:
    """{kernel name: (launches, device µs)} from the profiler's Chrome trace (its "kernel" events, and its copies:
    the step's uploads, --hidden's copy of the hidden rows). by_grid: one entry per kernel and grid ("name grid
    [x, y, z]"), so that a kernel's small launches show apart from its large ones."""
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for ev in json.loads(trace.read_text()).get("traceEvents", []):
        if ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in ev:
            name = ev["name"].replace("(anonymous namespace)::", "").split("(")[0]
            if by_grid and "grid" in ev.get("args", {}):
                name += f" grid {ev['args']['grid']}"
            out[name][0] += 1
            out[name][1] += float(ev["dur"])
    return {k: (v[0], v[1]) for k, v in out.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=64, help="tokens profiled")
    ap.add_argument("--depth", type=int, default=512, help="tokens in the context before the profiled ones")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--no-pdl", action="store_true",
                    help="launch without programmatic dependent launch: spans no longer overlap, so the wall time "
                         "minus their sum is the token's idle gaps (the token itself runs a little slower)")
    ap.add_argument("--rows", type=int, default=1, help="sequences in the step (the server's generating slots)")
    ap.add_argument("--hidden", action="store_true",
                    help="the MTP-on step: the graph also gives the hidden state, whose rows are copied out each step")
    args = ap.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    be = CudaBackend(0)
    if args.no_pdl:
        be.gemv_pdl = be.launch_pdl = False
    cfg, model = load(args.model, be)
    rng = np.random.default_rng(0)
    R = args.rows
    states = [be.new_state(cfg, args.depth + 2 * args.n + 8) for _ in range(R)]   # 2 warm-up steps, n timed, n profiled
    for st in states:
        be.to_host(model.forward(StepBatch.build([(st, list(rng.integers(0, cfg.n_vocab, args.depth)))])))
    step = CapturedStep(be, model, states, greedy=True, hidden=args.hidden)
    step.set_tokens([1] * R)
    kept = []

    def one(read: bool) -> None:
        step.step_greedy(read=read)
        if args.hidden:       # observe_plain's copy of the step's rows (the graph rewrites h at its next replay)
            kept[:] = [be.concat([be.rows(step.h, 0, R)], axis=0)]

    one(True)                                             # capture + warm-up replay
    one(True)
    t0 = time.perf_counter()
    for _ in range(args.n - 1):
        one(False)
    one(True)
    wall_plain = (time.perf_counter() - t0) / args.n
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.n - 1):
            one(False)
        one(True)
        wall = (time.perf_counter() - t0) / args.n
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        times = kernel_times(Path(tmp) / "trace.json")
    if not times:
        raise SystemExit("the profiler saw no kernels (CUPTI unavailable?)")
    spans = sum(us for _, us in times.values()) / args.n
    launches = sum(c for c, _ in times.values()) / args.n
    print(f"device: {be.native.device_name()}; model {args.model}; depth {args.depth}; {args.n} steps of {R} "
          f"row(s){', MTP hidden state' if args.hidden else ''}; "
          f"weights {weight_bytes_per_token(model) / 1e9:.2f} GB/token")
    print(f"token: {1e3 * wall_plain:.3f} ms unprofiled ({R / wall_plain:.1f} t/s), {1e3 * wall:.3f} ms profiled; "
          f"kernel spans sum to {spans:.0f} µs in {launches:.0f} launches "
          + ("(no PDL: the rest of the wall time is idle gaps)" if args.no_pdl else "(overlapping where launched with PDL)"))
    print("| kernel | launches/token | µs/token (spans) | % of the spans' sum | µs/launch |")
    print("|---|---:|---:|---:|---:|")
    for name, (c, us) in sorted(times.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"| {name[:70]} | {c / args.n:.0f} | {us / args.n:.1f} | {100 * us / args.n / spans:.1f}% | "
              f"{us / c:.2f} |")


if __name__ == "__main__":
    main()
