"""Server load test on loopback (issue 5): T client threads for S seconds against llamacmp-server, streamed and
not, with random early disconnects. Checks, and exits 1 unless all hold:
  - no 5xx answer;
  - every greedy stream that ran to its end gave exactly the tokens the same request gave alone (the references
    are taken first, one request at a time, on the same server; requests use cache_prompt false so that each
    evaluates its prompt from scratch, alone or not);
  - host RSS and device memory of the server flat over the second half of the run (sampled every few seconds;
    growth <= 2% + 64 MiB);
  - every slot idle at the end;
  - with --bad: the bad requests of issue 22 (NaN/1e999/huge ints, deep nesting, lone surrogates, malformed tool
    calls, template-global overrides, oversized n_probs/stop/grammar, image without a projector, ...) interleaved:
    each answered 4xx, never 5xx; and /health answering 200 throughout (polled every second).
Usage:
  python benchmarks/server_stress.py URL [--threads 16] [--seconds 30]          (a running server; no memory check)
  python benchmarks/server_stress.py --model M.gguf --np 32 --threads 32 --seconds 300   (starts llamacmp-server)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_vs_llamacpp import ROOT, Server, free_port, llamacmp_argv, make_model, prompts, vocab_size  # noqa: E402

MIB = 1 << 20


def greedy_body(prompt, n: int, stream: bool) -> dict:
    return {"prompt": prompt, "n_predict": n, "temperature": 0, "stream": stream, "cache_prompt": False,
            "return_tokens": True}


def run_greedy(client: httpx.Client, prompt, n: int, rng: random.Random | None, p_drop: float):
    """-> (status, token ids, finished). With rng, the client may go away mid-stream (finished False)."""
    with client.stream("POST", "/completion", json=greedy_body(prompt, n, True)) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [], False
        toks = []
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            toks.extend(chunk.get("tokens") or [])
            if chunk.get("stop"):
                return 200, toks, True
            if rng is not None and rng.random() < p_drop:      # the client goes away mid-stream
                return 200, toks, False
        return 200, toks, False


def other_request(client: httpx.Client, rng: random.Random) -> int:
    """The mixed traffic of the old stress test: chat or completion, sampled or greedy, streamed or not."""
    stream = rng.random() < 0.5
    if rng.random() < 0.5:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": f"hi {rng.random()}"}]}
    else:
        path, body = "/completion", {"prompt": "The quick brown fox " * rng.randint(1, 20)}
    body.update({"max_tokens": rng.randint(1, 48), "temperature": rng.choice([0, 0.8]), "stream": stream})
    if not stream:
        return client.post(path, json=body).status_code
    with client.stream("POST", path, json=body) as r:
        for _ in r.iter_lines():
            if rng.random() < 0.05:
                break
        return r.status_code


_USER = [{"role": "user", "content": "hi"}]
BAD = [  # (path, raw JSON body): each must be answered 4xx (issue 22)
    ("/completion", '{"prompt": "Hi", "temperature": NaN}'),
    ("/completion", '{"prompt": "Hi", "top_p": 1e999}'),
    ("/completion", '{"prompt": "Hi", "n_predict": ' + "9" * 5000 + "}"),
    ("/completion", '{"prompt": "Hi", "x": ' + "[" * 5000 + "]" * 5000 + "}"),
    ("/completion", '{"prompt": "\\ud800"}'),
    ("/completion", '{"prompt": "Hi", "n_probs": 1000000}'),
    ("/completion", json.dumps({"prompt": "Hi", "stop": ["x" * 1000] * 1000})),
    ("/completion", json.dumps({"prompt": "Hi", "grammar": "root ::= " + " | ".join(['"a"'] * 60000)})),
    ("/completion", '{"prompt": "Hi", "json_schema": ' + '{"items":' * 200 + "{}" + "}" * 200 + "}"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}, *_USER]})),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "chat_template_kwargs": {"raise_exception": 1}})),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]})),
    ("/v1/messages", json.dumps({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": 5}]}]})),
    ("/slots/\u00b2?action=erase", "{}"),
    ("/detokenize", '{"tokens": [Infinity]}'),
]


def bad_request(client: httpx.Client, rng: random.Random) -> int:
    path, raw = BAD[rng.randrange(len(BAD))]
    return client.post(path, content=raw.encode(), headers={"Content-Type": "application/json"}).status_code


def device_mib(pid: int) -> float:
    """Device memory nvidia-smi attributes to `pid` (MiB); nan without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return float("nan")
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    return float("nan")


def rss_mib(pid: int) -> float:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def flat(samples: list[tuple[float, float]]) -> tuple[bool, str]:
    """Second half of the run: max - first <= 2% of first + 64 MiB."""
    half = [v for t, v in samples[len(samples) // 2:] if v == v]
    if len(half) < 2:
        return True, "not sampled"
    grow = max(half) - half[0]
    return grow <= 0.02 * half[0] + 64, f"{half[0]:.0f} -> {half[-1]:.0f} MiB (max {max(half):.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", nargs="?", default="")
    ap.add_argument("--model", default="", help="start llamacmp-server on this GGUF (enables the memory check)")
    ap.add_argument("--shape", default="", help="start it on a random-weight GGUF of this shape (as --model)")
    ap.add_argument("--np", type=int, default=32, help="slots of the started server")
    ap.add_argument("--ctx-slot", type=int, default=512)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--pool", type=int, default=24, help="distinct greedy requests with reference outputs")
    ap.add_argument("--p-drop", type=float, default=0.01, help="chance a greedy stream is dropped per token")
    ap.add_argument("--other", type=float, default=0.2, help="share of requests from the old mixed traffic (text "
                    "prompts and chat: give 0 for a model whose vocabulary cannot tokenize text)")
    ap.add_argument("--bad", type=float, default=0.0, help="share of requests that are issue 22's bad requests")
    ap.add_argument("--load-timeout", type=float, default=600)
    ap.add_argument("--cache-ram", type=int, default=0, help="-cram of the started server in MiB (default 0: the "
                    "host prompt cache, llama.cpp's 8192 MiB by default, keeps every overwritten slot's history by "
                    "design and would read as growth in the memory check)")
    a = ap.parse_args()
    if a.shape and not a.model:
        a.model = make_model(a.shape, "q8_0")
    if not a.url and not a.model:
        ap.error("give a server URL, --model or --shape")
    server = None
    if a.model:
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        server = Server(llamacmp_argv(a.model, port, a.np, a.np * a.ctx_slot,
                                      ["--metrics", "-cram", str(a.cache_ram)]), port,
                        Path("/tmp/server-stress.log"), env).__enter__()
        server.wait_ready(a.load_timeout)
        a.url = server.url
    try:
        ok = stress(a, server.proc.pid if server else 0)
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    raise SystemExit(0 if ok else 1)


def stress(a, pid: int) -> bool:
    rng0 = random.Random(0)
    n_vocab = vocab_size(a.model) if a.model else 256
    pool = [(p[:rng0.randint(4, 48)], rng0.randint(8, 96)) for p in prompts(a.pool, n_vocab)]
    with httpx.Client(base_url=a.url, timeout=600) as c:
        t = time.time()
        ref = []
        for p, n in pool:
            status, toks, done = run_greedy(c, p, n, None, 0.0)
            if status != 200 or not done:
                print(f"reference request failed: status {status}")
                return False
            ref.append(toks)
        print(f"{len(pool)} references alone in {time.time() - t:.0f} s", flush=True)
    counts: collections.Counter = collections.Counter()
    bad_counts: collections.Counter = collections.Counter()
    health: list[float] = []                 # seconds per /health answer; inf where it failed
    checked, mismatched, dropped = [0], [], [0]
    lock = threading.Lock()
    mem: list[tuple[float, float]] = []
    rss: list[tuple[float, float]] = []
    t0 = time.time()
    stop = t0 + a.seconds

    def sampler() -> None:
        while time.time() < stop:
            if pid:
                mem.append((time.time() - t0, device_mib(pid)))
                rss.append((time.time() - t0, rss_mib(pid)))
            time.sleep(5)

    def health_poller() -> None:
        with httpx.Client(base_url=a.url, timeout=30) as c:
            while time.time() < stop:
                t1 = time.time()
                try:
                    ok = c.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                health.append(time.time() - t1 if ok else float("inf"))
                time.sleep(1.0)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=a.url, timeout=600) as c:
            while time.time() < stop:
                if rng.random() < a.bad:
                    code = bad_request(c, rng)
                    with lock:
                        bad_counts[code] += 1
                    continue
                if rng.random() < a.other:
                    code = other_request(c, rng)
                    with lock:
                        counts[code] += 1
                    continue
                i = rng.randrange(len(pool))
                code, toks, done = run_greedy(c, pool[i][0], pool[i][1], rng, a.p_drop)
                with lock:
                    counts[code] += 1
                    if code == 200 and done:
                        checked[0] += 1
                        if toks != ref[i]:
                            mismatched.append(i)
                    elif code == 200:
                        dropped[0] += 1
    threads = [threading.Thread(target=worker, args=(i + 1,)) for i in range(a.threads)]
    threads.append(threading.Thread(target=sampler))
    threads.append(threading.Thread(target=health_poller))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    time.sleep(2.0)
    busy = [s["id"] for s in httpx.get(a.url + "/slots").json() if s["is_processing"]]
    mem_ok, mem_txt = flat(mem)
    rss_ok, rss_txt = flat(rss)
    n5xx = sum(v for k, v in counts.items() if k >= 500)
    print(f"{a.threads} clients for {a.seconds:.0f} s: status codes {dict(counts)}; 5xx: {n5xx}")
    print(f"greedy streams completed and checked: {checked[0]}, equal to alone: {checked[0] - len(mismatched)}, "
          f"different: {len(mismatched)} (pool ids {sorted(set(mismatched))[:10]}); dropped by the client: {dropped[0]}")
    print(f"host RSS (second half): {rss_txt} {'flat' if rss_ok else 'GROWING'}; "
          f"device memory: {mem_txt} {'flat' if mem_ok else 'GROWING'}")
    bad_wrong = sum(v for k, v in bad_counts.items() if not 400 <= k < 500)
    if a.bad:
        print(f"bad requests: status codes {dict(bad_counts)}; not 4xx: {bad_wrong}")
    slow = max(health, default=float("nan"))
    print(f"/health: {len(health)} polls, {sum(h == float('inf') for h in health)} failed, slowest {slow:.2f} s")
    print(f"busy slots after the run: {busy}")
    if pid:
        print("samples (s, device MiB, RSS MiB):",
              [(round(t), m if m != m else round(m), r if r != r else round(r)) for (t, m), (_, r) in zip(mem, rss)])
    return (not busy and n5xx == 0 and not mismatched and mem_ok and rss_ok and checked[0] > 0 and bad_wrong == 0
            and all(h != float("inf") for h in health))


if __name__ == "__main__":
    main()
