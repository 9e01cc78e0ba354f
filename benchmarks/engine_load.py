"""Engine load: N concurrent greedy streams through the scheduler (continuous batching) vs each alone.

Prints a table: streams, tokens, wall s, aggregate generation t/s, and whether every concurrent stream equals the
same request run alone. Usage:
  python benchmarks/engine_load.py --shape 0.8b --type q8_0 --streams 16 --n-predict 64
"""
from __future__ import annotations

import argparse
import queue
import tempfile
import time
from pathlib import Path

import numpy as np

from llamacmp.backends.select import select_backend
from llamacmp.engine.scheduler import Engine, EngineConfig
from llamacmp.engine.tasks import CompletionTask, ErrorResult, FinalResult, GenParams
from llamacmp.fixtures.qwen_vocab import tiny_vocab
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model
from llamacmp.sampling import SamplingParams


def run(engine: Engine, prompts: list[list[int]], n: int) -> tuple[list[list[int]], float]:
    qs = []
    t0 = time.perf_counter()
    for p in prompts:
        q: queue.Queue = queue.Queue()
        engine.submit(CompletionTask(p, GenParams(SamplingParams(temp=0), n_predict=n, cache_prompt=False), q.put))
        qs.append(q)
    out = []
    for q in qs:
        while True:
            r = q.get(timeout=600)
            if isinstance(r, ErrorResult):
                raise RuntimeError(r.message)
            if isinstance(r, FinalResult):
                out.append(r.tokens)
                break
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="")
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    a = ap.parse_args()
    path = Path(a.model) if a.model else Path(tempfile.mkdtemp()) / f"{a.shape}-{a.type}.gguf"
    if not a.model:
        write_model(path, SHAPES[a.shape], a.type, tiny_vocab())
    lm = load_model(path, select_backend())
    engine = Engine(lm, EngineConfig(n_slots=a.streams, n_ctx_slot=a.prompt_len + a.n_predict + 8))
    engine.start()
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, 256, a.prompt_len)] for _ in range(a.streams)]
    run(engine, prompts[:1], 4)                                       # warm-up
    alone = [run(engine, [p], a.n_predict) for p in prompts[:4]]
    together, wall = run(engine, prompts, a.n_predict)
    same = all(together[i] == alone[i][0][0] for i in range(len(alone)))
    for i in range(len(alone)):       # where a concurrent stream first leaves its solo run (None: never)
        solo, both = alone[i][0][0], together[i]
        first = next((j for j, (x, y) in enumerate(zip(solo, both)) if x != y), None)
        print(f"stream {i}: first difference at token {first}")
    t1 = alone[0][1]
    print(f"backend {lm.backend.name}, model {a.shape} {a.type}, prompt {a.prompt_len} tokens, n_predict {a.n_predict}")
    print("| streams | generated tokens | wall s | aggregate t/s | equal to alone |")
    print("|---|---|---|---|---|")
    print(f"| 1 | {a.n_predict} | {t1:.2f} | {a.n_predict / t1:.1f} | - |")
    n_tok = sum(len(t) for t in together)
    print(f"| {a.streams} | {n_tok} | {wall:.2f} | {n_tok / wall:.1f} | {same} (first {len(alone)}) |")
    engine.stop()


if __name__ == "__main__":
    main()
