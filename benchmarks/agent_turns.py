"""Per-turn cost of an agent-style conversation on the server's engine (CUDA when present, else numpy): each turn sends
back the previous prompt + the reply minus its last 2 tokens (as a re-rendered template does) + new user tokens, so
the slot rolls back to a prompt-cache checkpoint and re-evaluates only the reply and the new part.

Prints, per context size: turns, mean seconds per turn over the last turns, mean tokens evaluated, and the bytes
the slot copied to the host-RAM cache (-cram) per turn (what grew with the context before the fix).

  PYTHONPATH=. python3 benchmarks/agent_turns.py [--model FILE | --shape small] [--contexts 1024 4096]
"""
from __future__ import annotations

import argparse
import queue
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def run_turns(lm, n_ctx_start: int, turns: int, reply: int, user: int, seed: int = 0) -> dict:
    from llamacmp.engine.scheduler import Engine, EngineConfig
    from llamacmp.engine.tasks import CompletionTask, FinalResult, GenParams
    from llamacmp.sampling import SamplingParams
    engine = Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=n_ctx_start + turns * (reply + user) + 64))
    copied = []
    save_host = engine.ops.save_host

    def counting_save(*args):
        host = save_host(*args)
        copied[-1] += host.nbytes
        return host
    engine.ops.save_host = counting_save
    engine.start()
    rng = np.random.default_rng(seed)
    words = lambda n: [int(t) for t in rng.integers(10, lm.cfg.n_vocab - 10, n)]    # noqa: E731
    prompt, rows = words(n_ctx_start), []
    try:
        for turn in range(turns):
            copied.append(0)
            out: queue.Queue = queue.Queue()
            t0 = time.perf_counter()
            engine.submit(CompletionTask(prompt, GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=reply),
                                         out.put))
            while not isinstance(r := out.get(timeout=600), FinalResult):
                pass
            dt = time.perf_counter() - t0
            rows.append((dt, r.timings.prompt_n, copied[-1], len(prompt)))
            prompt = prompt + list(r.tokens)[:-2] + words(user)      # the reply's last 2 tokens re-rendered away
    finally:
        engine.stop()
    tail = rows[2:] or rows
    return {"context": f"{rows[0][3]}..{rows[-1][3]}", "s/turn": np.mean([x[0] for x in tail]),
            "evaluated": np.mean([x[1] for x in tail]), "host MiB/turn": np.mean([x[2] for x in tail]) / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF (default: a random-weight fixture of --shape)")
    ap.add_argument("--shape", default="small")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--reply", type=int, default=48)
    ap.add_argument("--user", type=int, default=16)
    ap.add_argument("--numpy", action="store_true", help="the numpy reference even where CUDA is present")
    a = ap.parse_args()
    from llamacmp.backends.select import select_backend
    from llamacmp.fixtures import writer
    from llamacmp.fixtures.qwen_vocab import tiny_vocab
    from llamacmp.loader import load_model
    path = a.model or writer.write_model(Path(tempfile.mkdtemp()) / "m.gguf", writer.SHAPES[a.shape], "q8_0",
                                         tiny_vocab())
    lm = load_model(path, select_backend(sys.stderr, cpu_only=a.numpy))
    print(f"{'context':>14} {'s/turn':>8} {'evaluated':>10} {'host MiB/turn':>14}")
    for n in a.contexts:
        r = run_turns(lm, n, a.turns, a.reply, a.user)
        print(f"{r['context']:>14} {r['s/turn']:8.3f} {r['evaluated']:10.1f} {r['host MiB/turn']:14.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
