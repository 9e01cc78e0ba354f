"""llamacmp-server vs llama-server, same GGUF, same run: N concurrent streaming greedy requests (issue 5 target:
aggregate generation t/s >= 1.5x llama-server -np 16).

Each server runs alone on the GPU (one after the other), started with -np N and N times the per-slot context;
after a warm-up of N short concurrent requests (so that one-time work for a batch of N, e.g. capturing its CUDA
graph, stays out of the figures), N requests go out at once over real HTTP (httpx, one thread each), streaming, greedy,
ignore_eos with a fixed n_predict so that both generate the same number of tokens (checked: every stream's
final tokens_predicted must equal n_predict, else the run fails naming the counts). Tokens are counted by the servers'
tokens_predicted counters, never by stream chunks (llama-server holds back tokens that end in an incomplete UTF-8
character and sends no chunk for them; see stream_completion). Reported per server:
  wall t/s   = all generated tokens / (last stream done - first request sent)  (prefill and admission included)
  steady t/s = tokens delivered while all N streams were generating / that interval (the decode rate at N)
and the ratios. Both are fair once the counts are equal; wall t/s is the headline (what N clients get end to end, the
issue 5 target), steady t/s isolates batched decode (a held-back token is counted when its chunk arrives, at most a
few steps late, so steady t/s is slightly noisier for llama-server). Usage (on the GPU machine):
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
    works (a benchmark model may carry a placeholder vocabulary)."""
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


# Both servers without the host-RAM prompt cache: the requests send cache_prompt false, and a slot that held the
# warm-up's request (72 tokens) was copied into that cache when a measured request took it, in the measured start
# (2026-12-05, H100, 9B: ~170 ms a slot, one slot after the other, MTP on and off alike; since HostCopies ~5 ms on
# the engine thread, but the 3rd and later saves of a burst wait for its worker: RESULTS.md "twenty-eighth session").
NO_RAM_CACHE = ["--cache-ram", "0"]


def llamacmp_argv(model: str, port: int, np_: int, ctx: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "llamacmp.server.app", "-m", model, "--host", "127.0.0.1", "--port", str(port),
            "-np", str(np_), "-c", str(ctx), "-ngl", "99", *NO_RAM_CACHE, *extra]


def llama_server_argv(binary: str, model: str, port: int, np_: int, ctx: int, extra: list[str]) -> list[str]:
    return [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(np_), "-c", str(ctx),
            "-ngl", "99", "--no-webui", *NO_RAM_CACHE, *extra]


def stream_completion(url: str, prompt, n_predict: int, timeout: float = 600,
                      extra: dict | None = None) -> tuple[list[int], list[tuple[float, int]], int]:
    """One streamed greedy /completion -> (token ids seen in chunks, [(arrival time, tokens_predicted)] per chunk that
    advanced the server's generated-token counter, HTTP status).

    Counted by `tokens_predicted` (the slot's n_decoded, in every partial and in the final chunk), not by chunks:
    llama-server sends NO chunk for a token that leaves the text with an incomplete UTF-8 character (process_token:
    validate_utf8), and the next chunk carries only its own id, so chunks and ids undercount what it generated
    (2026-11-30, 9B random weights + real vocabulary: 1301 chunks for 2048 generated tokens)."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "stream": True, "cache_prompt": False,
            "ignore_eos": True, "return_tokens": True, **(extra or {})}
    toks, marks = [], []
    with httpx.stream("POST", url + "/completion", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            r.read()
            return toks, marks, r.status_code
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"the server ended the stream with an error after {len(marks)} tokens: "
                                   f"{json.dumps(chunk['error'])[:300]}")
            toks.extend(chunk.get("tokens") or [])
            n = chunk.get("tokens_predicted")
            if n is None:
                raise RuntimeError(f"{url}: a stream chunk without tokens_predicted: {chunk}")
            if n > (marks[-1][1] if marks else 0):
                marks.append((time.perf_counter(), int(n)))
    return toks, marks, 200


def generated_by(marks: list[tuple[float, int]], t: float) -> int:
    """Tokens a stream had delivered by time t (its counter at the last chunk that arrived at or before t)."""
    n = 0
    for when, count in marks:
        if when > t:
            break
        n = count
    return n


def malformed_utf8_ids(model: str) -> list[int]:
    """Ids of the byte-level (NORMAL) tokens whose bytes are not valid UTF-8 on their own (pieces of a multi-byte
    character). llama-server b8462 runs every streamed chunk of /completion through the chat PEG parser
    (server_task_result_cmpl_partial::update -> common_chat_parse), which throws "Failed to parse input" on malformed
    UTF-8: the stream then ends with an error event after fewer than n_predict tokens (random weights emit such
    pieces often). Text built only from valid pieces is always valid, so banning these ids keeps every stream alive."""
    from llamacmp.fixtures.qwen_vocab import NORMAL, bytes_to_unicode
    from llamacmp.gguf_file import GGUFFile
    meta = GGUFFile(model).metadata
    inv = {c: b for b, c in bytes_to_unicode().items()}
    bad = []
    for i, (tok, typ) in enumerate(zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"])):
        if typ != NORMAL or any(c not in inv for c in tok):
            continue
        try:
            bytes(inv[c] for c in tok).decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)
    return bad


WARM_TOKENS = 64


def measure(url: str, texts: list, n_predict: int, extra: dict | None = None) -> dict:
    # Warm-up with all N streams at once (short prompts): the servers' one-time work for a batch of N (llamacmp
    # captures the CUDA graph of those N slots, llama.cpp its graphs for that batch; with MTP, llamacmp's draft
    # policy explores drafting at N: an eager round and graph captures per new shape) happens here, not in the
    # measured run. WARM_TOKENS: 8 tokens ended before the policy explored (too few left to repay it: 'short'),
    # so every 4-stream run at acceptance 0 paid it inside its measurement (2026-12-05, H100: 3 rounds, ~27 ms).
    concurrent(url, [t[:8] for t in texts], WARM_TOKENS, extra)
    results, t0 = concurrent(url, texts, n_predict, extra)
    per_stream = [r[1][-1][1] if r[1] else 0 for r in results]
    n_tok = sum(per_stream)
    t_end = max(r[1][-1][0] for r in results)
    all_in = max(r[1][0][0] for r in results)       # every stream has its first token
    first_done = min(r[1][-1][0] for r in results)  # the first stream has its last token
    steady_n = sum(generated_by(r[1], first_done) - generated_by(r[1], all_in) for r in results)
    steady = steady_n / (first_done - all_in) if first_done > all_in else float("nan")
    # where the wall time goes: the start (until every stream has its first token), the steady part, the tail
    # (after the first stream's last token), with the tokens delivered in each
    start_n = sum(generated_by(r[1], all_in) for r in results)
    mid_s, mid_n = (first_done - all_in, steady_n) if first_done > all_in else (0.0, 0)
    return {"tokens": n_tok, "per_stream": per_stream, "chunks": sum(len(r[1]) for r in results),
            "wall_s": t_end - t0, "wall_tps": n_tok / (t_end - t0), "steady_tps": steady,
            "start_s": all_in - t0, "steady_s": mid_s, "tail_s": t_end - all_in - mid_s,
            "start_n": start_n, "steady_n": mid_n, "tail_n": n_tok - start_n - mid_n,
            "ids": [r[0] for r in results]}


def concurrent(url: str, texts: list, n_predict: int, extra: dict | None) -> tuple[list, float]:
    """One streamed request per text, all at once (a thread each) -> (stream_completion's results, start time)."""
    results: list = [None] * len(texts)
    errors: list = []

    def one(i: int) -> None:
        try:
            results[i] = stream_completion(url, texts[i], n_predict, extra=extra)
        except Exception as e:  # noqa: BLE001 - reported below, with the stream it came from
            errors.append(f"stream {i}: {e}")
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(texts)} streams failed; first: {errors[0][:1000]}")
    bad = [r[2] for r in results if r[2] != 200]
    if bad:
        raise RuntimeError(f"requests failed with status {bad}")
    return results, t0


def make_model(shape: str, dtype: str, vocab_cache: str | None = None) -> str:
    """A random-weight GGUF of `shape` under /tmp (kept for the next run): 9b with bench_model.bench_vocab (the real
    vocabulary when it can be loaded: llama-server refuses a file without merges), other shapes with the tiny
    fixture vocabulary."""
    model = f"/tmp/llamacmp-{shape}-{dtype}.gguf"
    if os.path.exists(model):
        return model
    t = time.time()
    if shape == "9b" and dtype == "q8_0":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_model import make_9b
        make_9b(model, vocab_cache)
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
    ap.add_argument("--utf8-bias", choices=["llama.cpp", "both", "none"], default="llama.cpp",
                    help="which server's requests ban the malformed-UTF-8 token pieces (malformed_utf8_ids: without "
                         "it llama-server aborts streams on random weights); llamacmp does not need it and pays a "
                         "per-step host cost for ~1k biased ids, so by default only llama-server gets it")
    ap.add_argument("--vocab-cache", default=None,
                    help="when writing the 9b model: the qwen35_vocab_v*.pkl (or its folder) for the real vocabulary")
    a = ap.parse_args()
    model = a.model or make_model(a.shape, a.type, a.vocab_cache)
    texts = prompts(a.np, vocab_size(model))
    ctx = a.np * a.ctx_slot
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    figures = {}
    runs = []
    if a.only in ("both", "llamacmp"):
        runs.append(("llamacmp", llamacmp_argv(model, 0, a.np, ctx, []), env))
    if a.only in ("both", "llama.cpp"):
        runs.append(("llama.cpp", llama_server_argv(a.llama_server, model, 0, a.np, ctx, []), None))
    ban = {"logit_bias": [[i, False] for i in malformed_utf8_ids(model)]}
    extras = {"llamacmp": ban if a.utf8_bias == "both" else None,
              "llama.cpp": ban if a.utf8_bias in ("both", "llama.cpp") else None}
    print(f"malformed-UTF-8 pieces banned ({len(ban['logit_bias'])} ids) for: "
          f"{[k for k, v in extras.items() if v] or 'none'}", flush=True)
    for name, argv, e in runs:
        port = free_port()
        argv[argv.index("--port") + 1] = str(port)
        with Server(argv, port, Path(f"/tmp/server-{name}.log"), e) as srv:
            t = time.time()
            srv.wait_ready(a.load_timeout)
            print(f"{name}: ready in {time.time() - t:.0f} s", flush=True)
            figures[name] = measure(srv.url, texts, a.n_predict, extras[name])
            if name == "llamacmp":      # e.g. a failed graph capture: every decode step then runs eagerly
                srv.log.flush()
                notes = [ln for ln in srv.log_path.read_text(errors="replace").splitlines()
                         if "decode graphs off" in ln or ln.startswith(("W ", "E "))]
                print("llamacmp log warnings:" + "".join(f"\n  {ln[:300]}" for ln in notes[:5]) if notes
                      else "llamacmp log: no warnings (none about decode graphs)", flush=True)
            f = figures[name]
            print(f"{name}: {f['tokens']} tokens ({f['chunks']} chunks) in {f['wall_s']:.2f} s: wall "
                  f"{f['wall_tps']:.1f} t/s, steady {f['steady_tps']:.1f} t/s; per stream {f['per_stream']}",
                  flush=True)
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
        print(f"greedy streams with identical ids in both servers: {same}/{a.np} (informational: different "
              f"arithmetic; ids as streamed, and llama-server's streams omit held-back ids)")
    if a.out:
        Path(a.out).write_text(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "ids"}
                                           for k, v in figures.items()}, indent=1))
    short = {name: f["per_stream"] for name, f in figures.items() if any(n != a.n_predict for n in f["per_stream"])}
    if short:
        raise SystemExit(f"not every stream generated n_predict={a.n_predict} tokens, the rates are not comparable: "
                         f"{short}")


if __name__ == "__main__":
    main()
