"""Engine load: N concurrent greedy streams through the scheduler (continuous batching) vs each alone, and where a
decode step's time goes.

Prints a table (streams, tokens, wall s, aggregate generation t/s, whether every concurrent stream equals the same
request run alone), then the steps in which all N streams were generating, split per step into
  forward = the decode call (on CUDA: the graph launch, or the eager forward) + waiting for the device after it
            (Decoder.sync: a measurement sync, so the device time shows here and not inside the draw);
  host    = the rest of the engine thread's step: the draw (plans, the backend's argmax/sampling launch and the ids'
            copy), accepting / detokenising / stop strings / results (emit), and the scheduler between steps
            (inbox, admission, result hand-over);
with the decode-graph counters (CUDA: captured / replayed / eager steps). Host time should stay well under 1 ms a
step at 16 rows and must not grow with the vocabulary.

--http runs the same N streams through the real server instead (ServerContext + uvicorn in this process, the
clients in a child process over loopback, streamed /completion with ignore_eos): the same split then includes what
the event loop's per-token work (JSON, SSE writes) takes from the engine thread (the GIL), and the clients' steady
aggregate t/s is printed (tokens delivered while all N streams ran / that interval, as server_vs_llamacpp.py).

The split wraps the engine's decode / draw / step methods on this one Engine object (a measurement of this script,
nothing in the engine changes). Usage:
  python benchmarks/engine_load.py --shape tiny --streams 16 --n-predict 64          (numpy on a CPU machine)
  python benchmarks/engine_load.py --model /tmp/m9bv.gguf --streams 16 --n-predict 128
  python benchmarks/engine_load.py --model /tmp/m9bv.gguf --streams 16 --n-predict 128 --http
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llamacmp.engine.scheduler import Engine, EngineConfig  # noqa: E402
from llamacmp.engine.tasks import CompletionTask, ErrorResult, FinalResult, GenParams  # noqa: E402
from llamacmp.sampling import SamplingParams  # noqa: E402


class StepClock:
    """Times the engine's decode steps: wraps decode, _draw and _step of one Engine object. sync: wait for the device
    right after the decode call (the device time then shows on its own; without it the wait is inside the draw).
    Through the server (--http) there is no such sync: it would make the event loop's work, which the engine lets
    run while the device works, land in the engine's host time."""

    def __init__(self, engine: Engine, sync: bool = True):
        self.sync = sync
        self.rows: list[tuple] = []       # n, launch, device, draw, step, gap, one_off
        self._cur: dict = {}
        self._last_end = 0.0
        dec = engine.decoder
        real_decode, real_draw, real_step = dec.decode, engine._draw, engine._step
        cur = self._cur

        def one_offs() -> int:
            g = getattr(dec, "graphs", None)
            return g.n_eager + g.n_captured if g is not None else 0

        def decode(states, tokens):
            before = one_offs()
            t0 = time.perf_counter()
            out = real_decode(states, tokens)
            t1 = time.perf_counter()
            if self.sync:
                dec.sync()
            cur["launch"], cur["device"], cur["n"] = t1 - t0, time.perf_counter() - t1, len(states)
            cur["one_off"] = one_offs() != before      # an eager step or a graph capture (not a replay)
            return out

        def draw(*args):
            t0 = time.perf_counter()
            out = real_draw(*args)
            cur["draw"] = cur.get("draw", 0.0) + time.perf_counter() - t0
            return out

        def step():
            cur.clear()
            t0 = time.perf_counter()
            gap = t0 - self._last_end if self._last_end else 0.0
            real_step()
            self._last_end = time.perf_counter()
            if "n" in cur:
                self.rows.append((cur["n"], cur["launch"], cur["device"], cur.get("draw", 0.0),
                                  self._last_end - t0, gap, cur["one_off"]))
        dec.decode, engine._draw, engine._step = decode, draw, step

    def clear(self) -> None:
        self.rows.clear()
        self._last_end = 0.0

    def report(self, n: int, decoder) -> str:
        mine = [r for r in self.rows if r[0] == n][1:]                  # the first one follows admission: skipped
        rows = np.array([r[1:6] for r in mine if not r[6]])
        if not len(rows):
            return f"no decode step had all {n} streams generating"
        n_one_off = sum(r[6] for r in mine)
        launch, device, draw, step, gap = (rows[:, i].mean() * 1e3 for i in range(5))
        emit = step - launch - device - draw
        host = draw + emit + gap
        g = getattr(decoder, "graphs", None)
        graphs = (f"graphs: {g.n_captured} captured, {g.n_replayed} replayed, {g.n_eager} eager steps; "
                  f"{n_one_off} eager / capturing steps at {n} left out" if g is not None
                  else "no decode graphs (eager forward)")
        head = (f"decode steps with all {n} streams generating: {len(rows)} ({graphs})\n"
                f"mean ms/step: total {step + gap:.3f} (median {np.median(rows[:, 3] + rows[:, 4]) * 1e3:.3f}) = ")
        if not self.sync:
            return (f"{head}decode call {launch:.3f} + draw {draw:.3f} (includes waiting for the device) + emit "
                    f"{emit:.3f} + between steps {gap:.3f}; emit + between per row {(emit + gap) / n * 1e3:.1f} us")
        return (f"{head}forward {launch + device:.3f} (decode call {launch:.3f} + device wait {device:.3f}) + host "
                f"{host:.3f} (draw {draw:.3f}, emit {emit:.3f}, between steps {gap:.3f}); host per row "
                f"{host / n * 1e3:.1f} us\n"
                f"| streams | forward ms/step | host ms/step | host us/row | steps |\n|---|---|---|---|---|\n"
                f"| {n} | {launch + device:.3f} | {host:.3f} | {host / n * 1e3:.1f} | {len(rows)} |")


def params(n_predict: int, ignore_eos: bool) -> GenParams:
    return GenParams(SamplingParams(temp=0, ignore_eos=ignore_eos), n_predict=n_predict, cache_prompt=False)


def run(engine: Engine, prompts: list[list[int]], n: int, ignore_eos: bool) -> tuple[list[list[int]], float]:
    qs = []
    t0 = time.perf_counter()
    for p in prompts:
        q: queue.Queue = queue.Queue()
        engine.submit(CompletionTask(p, params(n, ignore_eos), q.put))
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


def make_prompts(n: int, length: int, n_vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(0, min(256, n_vocab), length)] for _ in range(n)]


def model_path(a) -> Path:
    if a.model:
        return Path(a.model)
    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab, tiny_vocab
    from llamacmp.fixtures.writer import SHAPES, write_model
    path = Path(tempfile.mkdtemp()) / f"{a.shape}-{a.type}-{a.vocab}.gguf"
    write_model(path, SHAPES[a.shape], a.type, tiny_vocab() if a.vocab == "tiny" else load_qwen35_vocab())
    return path


def engine_mode(a, path: Path) -> None:
    from llamacmp.backends.select import select_backend
    from llamacmp.loader import load_model
    lm = load_model(path, select_backend())
    if a.gdn_rows:
        lm.backend.gdn_rows = True
    engine = Engine(lm, EngineConfig(n_slots=a.streams, n_ctx_slot=a.prompt_len + a.n_predict + 8))
    clock = StepClock(engine)
    engine.start()
    prompts = make_prompts(a.streams, a.prompt_len, lm.cfg.n_vocab)
    run(engine, prompts[:1], 4, not a.eos)                                       # warm-up
    alone = [run(engine, [p], a.n_predict, not a.eos) for p in prompts[:4]]
    solo = clock.report(1, engine.decoder)
    clock.clear()
    together, wall = run(engine, prompts, a.n_predict, not a.eos)
    same = all(together[i] == alone[i][0][0] for i in range(len(alone)))
    for i in range(len(alone)):       # where a concurrent stream first leaves its solo run (None: never)
        first = next((j for j, (x, y) in enumerate(zip(alone[i][0][0], together[i])) if x != y), None)
        print(f"stream {i}: first difference at token {first}")
    t1 = alone[0][1]
    print(f"backend {lm.backend.name}, model {path.name}, n_vocab {lm.cfg.n_vocab}, prompt {a.prompt_len} tokens, "
          f"n_predict {a.n_predict}, ignore_eos {not a.eos}, gdn_rows {getattr(lm.backend, 'gdn_rows', None)}")
    print("| streams | generated tokens | wall s | aggregate t/s | equal to alone |")
    print("|---|---|---|---|---|")
    print(f"| 1 | {len(alone[0][0][0])} | {t1:.2f} | {len(alone[0][0][0]) / t1:.1f} | - |")
    n_tok = sum(len(t) for t in together)
    print(f"| {a.streams} | {n_tok} | {wall:.2f} | {n_tok / wall:.1f} | {same} (first {len(alone)}) |")
    print(f"\nalone (1 stream): {solo}\n\n{a.streams} streams: {clock.report(a.streams, engine.decoder)}")
    engine.stop()


def http_mode(a, path: Path) -> None:
    import uvicorn
    from llamacmp.args import parse_args
    from llamacmp.backends.select import select_backend
    from llamacmp.server.app import create_app
    from llamacmp.server.context import ServerContext
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx_slot = a.prompt_len + a.n_predict + 64
    p = parse_args("server", ["-m", str(path), "--port", str(port), "-np", str(a.streams),
                              "-c", str(a.streams * ctx_slot)]).params
    ctx = ServerContext(p)
    app = create_app(ctx)
    ctx.load(select_backend())
    if a.gdn_rows:                     # before the first decode step (the engine is idle until the clients come)
        ctx.lm.backend.gdn_rows = True
    clock = StepClock(ctx.engine, sync=False)   # the engine thread picks the wrapped methods up at its next turn
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    prompts = make_prompts(a.streams, a.prompt_len, ctx.n_vocab)

    def clients(ps: list[list[int]]) -> dict:
        out = subprocess.run([sys.executable, __file__, "--clients", url, "--n-predict", str(a.n_predict)]
                             + (["--eos"] if a.eos else []), input=json.dumps(ps), capture_output=True, text=True,
                             timeout=1200)
        if out.returncode != 0:
            raise RuntimeError(f"clients failed: {out.stderr[-2000:]}")
        return json.loads(out.stdout)
    try:
        clients(prompts[:1])                                                   # warm-up
        clock.clear()
        solo = clients(prompts[:1])
        solo_split = clock.report(1, ctx.engine.decoder)
        clock.clear()
        many = clients(prompts)
        print(f"backend {ctx.lm.backend.name}, model {path.name}, n_vocab {ctx.n_vocab}, http streams over loopback, "
              f"n_predict {a.n_predict}, ignore_eos {not a.eos}")
        print(f"1 stream: {solo['tokens']} tokens, steady {solo['steady_tps']:.1f} t/s\n{solo_split}\n")
        print(f"{a.streams} streams: {many['tokens']} tokens, per stream {many['per_stream']}, steady aggregate "
              f"{many['steady_tps']:.1f} t/s\n{clock.report(a.streams, ctx.engine.decoder)}")
    finally:
        server.should_exit = True
        th.join(timeout=10)
        ctx.engine.stop()


def clients_mode(url: str, n_predict: int, eos: bool) -> None:
    """(child process) the streams of --http: one thread each; prints {tokens, per_stream, steady_tps} as JSON."""
    import httpx
    prompts = json.loads(sys.stdin.read())
    marks: list[list[tuple[float, int]]] = [[] for _ in prompts]
    errors: list[str] = []

    def one(i: int) -> None:
        body = {"prompt": prompts[i], "n_predict": n_predict, "temperature": 0, "stream": True,
                "cache_prompt": False, "ignore_eos": not eos}
        try:
            with httpx.stream("POST", url + "/completion", json=body, timeout=1200) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        n = json.loads(line[6:]).get("tokens_predicted", 0)
                        if n > (marks[i][-1][1] if marks[i] else 0):
                            marks[i].append((time.perf_counter(), n))
        except Exception as e:  # noqa: BLE001 - reported as this process's failure
            errors.append(f"stream {i}: {e}")
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors or any(not m for m in marks):
        raise SystemExit(f"streams failed: {errors[:3]}")
    all_in = max(m[0][0] for m in marks)
    first_done = min(m[-1][0] for m in marks)

    def by(m, t):
        return max([c for w, c in m if w <= t] or [0])
    steady = sum(by(m, first_done) - by(m, all_in) for m in marks) / (first_done - all_in) \
        if first_done > all_in else float("nan")
    print(json.dumps({"tokens": sum(m[-1][1] for m in marks), "per_stream": [m[-1][1] for m in marks],
                      "steady_tps": steady}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="")
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--vocab", choices=("tiny", "qwen35"), default="tiny",
                    help="without --model: the fixture vocabulary (qwen35: the real 248k one, from the cache)")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--eos", action="store_true", help="stop at EOG (default: ignore_eos, every stream n_predict)")
    ap.add_argument("--http", action="store_true", help="through the HTTP server (see the module doc)")
    ap.add_argument("--gdn-rows", action="store_true",
                    help="CUDA: decode steps launch each layer's conv / GDN once for all sequences (gdn_rows)")
    ap.add_argument("--clients", default="", help=argparse.SUPPRESS)       # the child process of --http
    a = ap.parse_args()
    if a.clients:
        clients_mode(a.clients, a.n_predict, a.eos)
        return
    path = model_path(a)
    (http_mode if a.http else engine_mode)(a, path)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
