"""Server stress on loopback: T client threads for S seconds, mixed chat/completion requests, streamed and not,
random early disconnects. Prints request counts by status and checks that no 5xx came back and that every slot is
idle at the end. Usage: python benchmarks/server_stress.py URL [--threads 16] [--seconds 30]"""
from __future__ import annotations

import argparse
import collections
import random
import threading
import time

import httpx


def one(client: httpx.Client, rng: random.Random) -> int:
    stream = rng.random() < 0.5
    if rng.random() < 0.5:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": f"hi {rng.random()}"}]}
    else:
        path, body = "/completion", {"prompt": "The quick brown fox " * rng.randint(1, 20)}
    body.update({"max_tokens": rng.randint(1, 48), "temperature": rng.choice([0, 0.8]), "stream": stream})
    if not stream:
        return client.post(path, json=body).status_code
    with client.stream("POST", path, json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if rng.random() < 0.05:              # the client goes away mid-stream
                break
        return r.status_code


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30)
    a = ap.parse_args()
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()
    stop = time.time() + a.seconds

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=a.url, timeout=120) as c:
            while time.time() < stop:
                code = one(c, rng)
                with lock:
                    counts[code] += 1
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(1.0)
    busy = [s["id"] for s in httpx.get(a.url + "/slots").json() if s["is_processing"]]
    print("status codes:", dict(counts), "| busy slots after the run:", busy)
    raise SystemExit(1 if busy or any(c >= 500 for c in counts) else 0)


if __name__ == "__main__":
    main()
