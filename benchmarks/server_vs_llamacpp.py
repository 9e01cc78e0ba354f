"""llamacmp-server vs llama-server, same GGUF, same run: N concurrent streaming greedy requests (issue 5 target:
aggregate generation t/s >= 1.5x llama-server -np 16).

Each server runs alone on the GPU (one after the other), started with -np N and N times the per-slot context;
after one warm-up request, N requests go out at once over real HTTP (httpx, one thread each), streaming, greedy,
ignore_eos with a fixed n_predict so that both generate the same number of tokens. Reported per server:
  wall t/s   = all generated tokens / (last stream done - first request sent)  (prefill included)
  steady t/s = tokens that arrived while all N streams were generating / that interval (the decode rate at N)
and the ratios. Usage (on the GPU machine):
  python benchmarks/server_vs_llamacpp.py --model M.gguf --llama-server /tmp/lcpp/native/bin/llama-server
  (no --model: writes a random-weight GGUF of --shape first; prompts are token ids, so any vocabulary works)
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n: int, n_vocab: int, length: int = 48) -> list[list[int]]:
    """n different token-id prompts (no shared prefix) of `length` ids: token ids, not text, so that any vocabulary
    works (the 9B-shape benchmark model has a placeholder vocabulary)."""
    hi = min(n_vocab, 20000)
    return [[1 + (i * 7919 + j * (2 * i + 3) * 104729) % (hi - 1) for j in range(length)] for i in range(n)]


def vocab_size(model: str) -> int:
    from llamacmp.gguf_file import GGUFFile
    return int(GGUFFile(model).info("token_embd.weight").shape[0])


class Server:
    """A server process on loopback; stopped (and its log kept) on exit."""

    def __init__(self, argv: list[str], port: int, log_path: Path, env: dict | None = None):
        self.argv, self.port, self.log_path = argv, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.env = env
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        return self

    def wait_ready(self, timeout: float) -> None:
        t_end = time.time() + timeout
        while time.time() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.argv[0]} not healthy after {timeout} s; log: {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def llamacmp_argv(model: str, port: int, np_: int, ctx: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "llamacmp.server.app", "-m", model, "--host", "127.0.0.1", "--port", str(port),
            "-np", str(np_), "-c", str(ctx), "-ngl", "99", *extra]


def llama_server_argv(binary: str, model: str, port: int, np_: int, ctx: int, extra: list[str]) -> list[str]:
    return [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(np_), "-c", str(ctx),
            "-ngl", "99", "--no-webui", *extra]


def stream_completion(url: str, prompt, n_predict: int, timeout: float = 600,
                      extra: dict | None = None) -> tuple[list[int], list[float], int]:
    """One streamed greedy /completion -> (token ids, arrival time of each token chunk, HTTP status)."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "stream": True, "cache_prompt": False,
            "ignore_eos": True, "return_tokens": True, **(extra or {})}
    toks, times = [], []
    with httpx.stream("POST", url + "/completion", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            r.read()
            return toks, times, r.status_code
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            got = chunk.get("tokens") or []
            if got or (chunk.get("content") and not chunk.get("stop")):
                toks.extend(got)
                times.append(time.perf_counter())
    return toks, times, 200


def measure(url: str, texts: list, n_predict: int) -> dict:
    stream_completion(url, texts[0][:8], 8)                  # warm-up
    results: list = [None] * len(texts)

    def one(i: int) -> None:
        results[i] = stream_completion(url, texts[i], n_predict)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r[2] for r in results if r[2] != 200]
    if bad:
        raise RuntimeError(f"requests failed with status {bad}")
    n_tok = sum(len(r[1]) for r in results)
    t_end = max(r[1][-1] for r in results)
    all_in = max(r[1][0] for r in results)          # every stream has its first token
    first_done = min(r[1][-1] for r in results)     # the first stream ends
    steady_n = sum(sum(1 for x in r[1] if all_in < x <= first_done) for r in results)
    steady = steady_n / (first_done - all_in) if first_done > all_in else float("nan")
    return {"tokens": n_tok, "wall_s": t_end - t0, "wall_tps": n_tok / (t_end - t0), "steady_tps": steady,
            "ids": [r[0] for r in results]}


def make_model(shape: str, dtype: str) -> str:
    """A random-weight GGUF of `shape` under /tmp (kept for the next run): 9b with bench_model's placeholder
    vocabulary of the real size, other shapes with the tiny fixture vocabulary."""
    model = f"/tmp/llamacmp-{shape}-{dtype}.gguf"
    if os.path.exists(model):
        return model
    t = time.time()
    if shape == "9b" and dtype == "q8_0":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_model import make_9b
        make_9b(model)
    else:
        from llamacmp.fixtures.qwen_vocab import tiny_vocab
        from llamacmp.fixtures.writer import SHAPES, write_model
        write_model(Path(model), SHAPES[shape], dtype, tiny_vocab(), seed=0)
    print(f"wrote {model} in {time.time() - t:.0f} s", flush=True)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="GGUF both servers load (default: write one of --shape)")
    ap.add_argument("--shape", default="9b", help="fixture shape when no --model (tiny|small|0.8b|9b|27b)")
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--llama-server", default="/tmp/lcpp/native/bin/llama-server")
    ap.add_argument("--np", type=int, default=16, help="slots on both servers = concurrent requests")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--ctx-slot", type=int, default=512, help="context per slot (-c is np times this)")
    ap.add_argument("--load-timeout", type=float, default=600)
    ap.add_argument("--out", default="", help="also write the figures as JSON here")
    ap.add_argument("--only", choices=["both", "llamacmp", "llama.cpp"], default="both")
    a = ap.parse_args()
    model = a.model or make_model(a.shape, a.type)
    texts = prompts(a.np, vocab_size(model))
    ctx = a.np * a.ctx_slot
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    figures = {}
    runs = []
    if a.only in ("both", "llamacmp"):
        runs.append(("llamacmp", llamacmp_argv(model, 0, a.np, ctx, []), env))
    if a.only in ("both", "llama.cpp"):
        runs.append(("llama.cpp", llama_server_argv(a.llama_server, model, 0, a.np, ctx, []), None))
    for name, argv, e in runs:
        port = free_port()
        argv[argv.index("--port") + 1] = str(port)
        with Server(argv, port, Path(f"/tmp/server-{name}.log"), e) as srv:
            t = time.time()
            srv.wait_ready(a.load_timeout)
            print(f"{name}: ready in {time.time() - t:.0f} s", flush=True)
            figures[name] = measure(srv.url, texts, a.n_predict)
            f = figures[name]
            print(f"{name}: {f['tokens']} tokens in {f['wall_s']:.2f} s: wall {f['wall_tps']:.1f} t/s, "
                  f"steady {f['steady_tps']:.1f} t/s", flush=True)
    print(f"\nmodel {model}, -np {a.np}, {a.np} concurrent streamed greedy requests, n_predict {a.n_predict}")
    print("| server | generated tokens | wall s | aggregate t/s (wall) | aggregate t/s (all streams running) |")
    print("|---|---|---|---|---|")
    for name, f in figures.items():
        print(f"| {name} | {f['tokens']} | {f['wall_s']:.2f} | {f['wall_tps']:.1f} | {f['steady_tps']:.1f} |")
    if len(figures) == 2:
        x, y = figures["llamacmp"], figures["llama.cpp"]
        print(f"\nratio llamacmp / llama.cpp: wall {x['wall_tps'] / y['wall_tps']:.2f}x, "
              f"steady {x['steady_tps'] / y['steady_tps']:.2f}x (target >= 1.5x)")
        same = sum(p == q for p, q in zip(x["ids"], y["ids"]))
        print(f"greedy streams with identical ids in both servers: {same}/{a.np} (informational: different arithmetic)")
    if a.out:
        Path(a.out).write_text(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "ids"}
                                           for k, v in figures.items()}, indent=1))


if __name__ == "__main__":
    main()
