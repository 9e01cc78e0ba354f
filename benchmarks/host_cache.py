"""What the host-RAM prompt cache (-cram) costs the engine's thread: `save_host` of a slot (its KV rows, GDN conv and
recurrent states and device checkpoints to host memory: when a new conversation takes a slot that held another, or
/slots save) and `load_host` back, every other slot's decode stalled meanwhile. Only the model file's header is read
(the states' shapes); the states hold zeros, which copy as fast as anything.

Prints per slot length: bytes; the ms save_host holds the engine's thread (the first save apart: it allocates the
pinned staging); the ms until the host copy holds its contents (HostState.ready(): a worker thread fills it), with
GB/s; load_host's ms. Medians of --reps; every copy is kept, as the cache keeps its entries, so each save needs fresh
host memory.

  PYTHONPATH=. python3 benchmarks/host_cache.py --model m9b.gguf [--tokens 72 4096] [--checkpoints 2] [--reps 5]

For a before / after of two trees, run this file with PYTHONPATH at each tree (it uses only save_host / load_host).
"""
from __future__ import annotations

import argparse
import statistics
import time


def measure(model: str, tokens: list[int], checkpoints: int, reps: int, kv: str = "f16") -> list[dict]:
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.engine.checkpoints import state_ops_for
    from llamacmp.loader import open_model
    cfg = open_model(model).cfg
    be = CudaBackend()
    ops = state_ops_for(be)
    rows = []
    for n in tokens:
        src, dst = be.new_state(cfg, n + 1, kv), be.new_state(cfg, n + 1, kv)
        src.n_past = n
        ckpts = [ops.snapshot(src, None) for _ in range(checkpoints)]
        save, filled, load, held = [], [], [], []
        for _ in range(reps):
            be.synchronize()
            t0 = time.perf_counter()
            host = ops.save_host(src, list(range(n)), None, ckpts)
            t1 = time.perf_counter()
            getattr(host, "ready", lambda: None)()      # (a tree before HostState.ready: filled on return)
            t2 = time.perf_counter()
            ops.load_host(dst, host, None)
            be.synchronize()
            save.append(t1 - t0)
            filled.append(t2 - t0)
            load.append(time.perf_counter() - t2)
            held.append(host)          # kept, as the cache keeps its entries: each save needs fresh host memory
        med = statistics.median
        rows.append({"tokens": n, "checkpoints": checkpoints, "mib": host.nbytes / 2**20,
                     "first_ms": save[0] * 1e3, "save_ms": med(save) * 1e3, "filled_ms": med(filled) * 1e3,
                     "load_ms": med(load) * 1e3, "filled_gbs": host.nbytes / med(filled) / 1e9})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file (only its header is read)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[72, 4096])
    ap.add_argument("--checkpoints", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    for r in measure(a.model, a.tokens, a.checkpoints, a.reps):
        print(f"tokens {r['tokens']:6d}  checkpoints {r['checkpoints']}  {r['mib']:8.1f} MiB  engine thread: save "
              f"{r['save_ms']:7.2f} ms (first {r['first_ms']:.1f})  contents in {r['filled_ms']:7.2f} ms "
              f"({r['filled_gbs']:4.1f} GB/s)  load {r['load_ms']:7.2f} ms", flush=True)


if __name__ == "__main__":
    main()
