"""Layer split over two GPUs (issue 8): pp at an 8K prompt and tg, one GPU against two (host bridge and peer), and
llama.cpp's llama-bench with -sm none / -sm layer on the same file in the same run. Prints a markdown table.

    python3 benchmarks/multi_gpu.py --model /tmp/27b-q8_0.gguf --make [--llama-bench PATH/llama-bench]
           [--devices 0,1] [-p 8192] [-n 64] [-r 2] [-b 8192] [-ub 512] [--shape 27b] [--out table.md]

--make writes the model first (random weights, the real 27B shapes, Q8_0, the real Qwen3.5 vocabulary (248320 tokens
and merges: llama-bench refuses a file without merges) from --vocab-cache PATH or $LLAMACMP_CACHE, see bench_model.py;
~28.6 GB, written streaming by the fixture
writer) and prints how long that took. --shape picks a smaller shape for a dry run (0.8b: ~1 GB).
--devices 0,0 runs the "two GPU" rows as two parts on ONE GPU (proves the script and the split on a 1-GPU machine;
its figures say nothing about two cards).

What is timed (llama-bench's definitions): ppP = P prompt tokens from an empty state in one batch (-b, default the
whole prompt) of -ub micro-batches / P / seconds; tgN = N decode steps from an almost empty state (one token in),
one token per step through CUDA graphs, logits to the host each step. Every figure is the mean of -r runs after
one warm-up. llama.cpp gets the same -p -n -b -ub -r with -fa 1 -ngl 99.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llamacmp.backends.base import StepBatch  # noqa: E402

def make_model(path: str, shape: str, vocab_cache: str | None = None) -> float:
    """Write the random-weight Q8_0 model (bench_model.bench_vocab: the real vocabulary when it can be loaded, so that
    llama-bench loads the file too); -> seconds it took."""
    from bench_model import make_9b
    t0 = time.perf_counter()
    make_9b(path, vocab_cache, shape)
    return time.perf_counter() - t0


# -- llamacmp --------------------------------------------------------------------------------------------------------

def load_one(path: str, device: int):
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.loader import load_model
    return load_model(path, CudaBackend(device=device))


def load_split(path: str, devices: list[int], ub: int):
    from llamacmp.loader import load_split_model
    from llamacmp.split.devices import make_cuda_backends
    return load_split_model(path, make_cuda_backends(devices), None, "host", ub)


def time_pp(lm, n_prompt: int, n_batch: int, ub: int, reps: int) -> list[float]:
    """Seconds per run of an n_prompt-token prefill from an empty state. One GPU: -ub chunks one after another
    (what a single device does with any -b); split: -b batches that the split pipelines in -ub pieces."""
    split = getattr(lm.model, "splits_batches", False)
    step = n_batch if split else ub
    rng = np.random.default_rng(0)
    out = []
    for rep in range(reps + 1):
        st = lm.backend.new_state(lm.cfg, n_prompt + 8)
        toks = [int(t) for t in rng.integers(0, lm.cfg.n_vocab, n_prompt)]
        t0 = time.perf_counter()
        for c0 in range(0, n_prompt, step):
            logits = lm.model.forward(StepBatch.build([(st, toks[c0:c0 + step])]))
        lm.backend.to_host(logits)                        # waits for the device
        dt = time.perf_counter() - t0
        if rep:                                           # the first run is the warm-up
            out.append(dt)
        del st, logits
    return out


def time_tg(lm, n_gen: int, reps: int) -> list[float]:
    """Seconds per run of n_gen greedy decode steps on CUDA graphs (captured in the warm-up)."""
    graphs = lm.backend.decode_graphs(lm.model, 1)
    if graphs is None:
        raise SystemExit("tg needs CUDA graphs (decode_graphs returned None)")
    st = lm.backend.new_state(lm.cfg, n_gen * (reps + 1) + 8)
    lm.backend.to_host(lm.model.forward(StepBatch.build([(st, [1])])))
    tok, out = 1, []
    for rep in range(reps + 1):
        t0 = time.perf_counter()
        for _ in range(n_gen):
            logits = lm.backend.to_host(graphs.step([st], [tok]))
            tok = int(np.argmax(logits[0]))
        dt = time.perf_counter() - t0
        if rep:
            out.append(dt)
    graphs.clear()
    return out


def rate(n: int, secs: list[float]) -> tuple[float, float]:
    r = [n / s for s in secs]
    return float(np.mean(r)), float(np.std(r))


# -- llama.cpp -------------------------------------------------------------------------------------------------------

def llama_bench(binary: str, model: str, args, split_mode: str, devices: list[int]) -> dict[str, tuple[float, float]]:
    cmd = [binary, "-m", model, "-p", str(args.p), "-n", str(args.n), "-b", str(args.b), "-ub", str(args.ub),
           "-r", str(args.r), "-fa", "1", "-ngl", "99", "-sm", split_mode, "-o", "json"]
    env = dict(os.environ)
    if split_mode == "none":
        env["CUDA_VISIBLE_DEVICES"] = str(devices[0])
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in dict.fromkeys(devices))
    print("+", " ".join(cmd), f"(CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        print(res.stderr[-3000:], file=sys.stderr)
        return {}
    rows = {}
    for r in json.loads(res.stdout):
        name = f"pp{r['n_prompt']}" if r["n_prompt"] and not r["n_gen"] else f"tg{r['n_gen']}"
        rows[name] = (float(r["avg_ts"]), float(r["stddev_ts"]))
    return rows


# -- main -------------------------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--make", action="store_true", help="write the model first (unless it exists)")
    ap.add_argument("--vocab-cache", default=None, help="with --make: the qwen35_vocab_v*.pkl (or its folder)")
    ap.add_argument("--shape", default="27b")
    ap.add_argument("--llama-bench", help="a CUDA build of llama.cpp's llama-bench (b8462)")
    ap.add_argument("--devices", default="0,1")
    ap.add_argument("-p", type=int, default=8192)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("-b", type=int, default=0, help="batch size (default: the whole prompt)")
    ap.add_argument("-ub", type=int, default=512)
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    args.b = args.b or args.p
    devices = [int(d) for d in args.devices.split(",")]
    notes = []
    if args.make and not Path(args.model).exists():
        secs = make_model(args.model, args.shape, args.vocab_cache)
        size = Path(args.model).stat().st_size
        notes.append(f"wrote {args.model}: {size / 1e9:.1f} GB in {secs:.0f} s")
        print(notes[-1], file=sys.stderr, flush=True)

    rows = []      # (tool, config, bridge, layers, pp, tg)
    t0 = time.perf_counter()
    one = load_one(args.model, devices[0])
    notes.append(f"1 GPU load: {time.perf_counter() - t0:.0f} s")
    pp1, tg1 = rate(args.p, time_pp(one, args.p, args.b, args.ub, args.r)), rate(args.n, time_tg(one, args.n, args.r))
    rows.append(("llamacmp", f"1 GPU (CUDA{devices[0]})", "-", f"0-{one.cfg.n_layer - 1}", pp1, tg1))
    print(rows[-1], file=sys.stderr, flush=True)
    be = one.backend
    del one
    be.arena.close()                  # give GPU memory back before the split and llama.cpp load the model again

    t0 = time.perf_counter()
    sp = load_split(args.model, devices, args.ub)
    notes.append(f"split load: {time.perf_counter() - t0:.0f} s")
    notes += sp.model.describe()
    layers = " / ".join(f"{p.layers.start}-{p.layers.stop - 1}" for p in sp.model.parts)
    where = "+".join(f"CUDA{d}" for d in devices)
    for bridge in ("host", "peer"):
        try:
            sp.model.set_bridge(bridge)
        except ValueError as e:                 # no P2P between the cards: say so in the table
            rows.append(("llamacmp", f"layer split {where}", bridge, layers, None, None))
            notes.append(str(e))
            continue
        pp, tg = rate(args.p, time_pp(sp, args.p, args.b, args.ub, args.r)), rate(args.n, time_tg(sp, args.n, args.r))
        rows.append(("llamacmp", f"layer split {where}", bridge, layers, pp, tg))
        print(rows[-1], file=sys.stderr, flush=True)
    for part in sp.model.parts:
        part.call(part.backend.arena.close)
    sp.model.close()
    del sp

    if args.llama_bench:
        for mode in ("none", "layer"):
            r = llama_bench(args.llama_bench, args.model, args, mode, devices)
            cfg = f"1 GPU (CUDA{devices[0]})" if mode == "none" else f"-sm layer {where}"
            rows.append(("llama.cpp", cfg, "-", "-", r.get(f"pp{args.p}"), r.get(f"tg{args.n}")))

    def cell(v):
        return "—" if v is None else f"{v[0]:.1f} ± {v[1]:.1f}"

    def ratio(v, base):
        return "—" if v is None or base is None else f"{v[0] / base[0]:.2f}x"
    lines = [f"| tool | config | bridge | layers | pp{args.p} t/s | tg{args.n} t/s | pp vs same tool 1 GPU | "
             f"tg vs same tool 1 GPU |", "|---|---|---|---|---|---|---|---|"]
    base = {}
    for tool, cfg, bridge, lay, pp, tg in rows:
        if cfg.startswith("1 GPU"):
            base[tool] = (pp, tg)
        b = base.get(tool, (None, None))
        lines.append(f"| {tool} | {cfg} | {bridge} | {lay} | {cell(pp)} | {cell(tg)} | {ratio(pp, b[0])} | "
                     f"{ratio(tg, b[1])} |")
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + \
        f"\n- -p {args.p} -n {args.n} -b {args.b} -ub {args.ub} -r {args.r}; model {args.model}\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
