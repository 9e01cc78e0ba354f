"""The MTP draft's LM head step (issue 19, --spec-draft-coarse): what the argmax of T draft rows costs through the
exact head (quantize + the head's GEMV + argmax) against the coarse head (quantize + the CQ2 copy's GEMV + top-k +
the candidates' exact rows + rescoring), and the CQ2 GEMV alone (cmp_cq2_gemv on given Q8 activations), at the 9B
head's shape by default, and what making the copy costs.

    python3 benchmarks/bench_coarse_head.py [--rows 248320] [--cols 4096] [--type Q8_0|Q6_K] [--ks 1,16,32]
        [--ts 1,2,4] [--topk-rs 1,2,4] [--topk-k 16] [--topk-only]

Each path is captured once as a CUDA graph of `--reps` draft steps, one after another (as a draft graph runs its
rounds) and replayed; µs per step = the replay's event time / reps. The head is random valid blocks (timings do not
depend on the values); a replay reads the whole head, far more than the 60 MB L2. MB = the device bytes of the
matrix a step reads (the exact head, or the CQ2 copy's codes and scales); GB/s = those bytes per step time (the
activations, logits and candidates' rows are not counted). Prints a table; asserts nothing.

Then cmp_topk alone (the same graphs of `--reps` calls) at R = --topk-rs rows of --rows values, k = --topk-k, on
random normal logits: its time depends on the values (how many pass its threshold), and logits look like those. It
checks the ids against numpy's (top_ids) and fails on a difference. --topk-only skips the head paths.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from llamacmp.backends.cuda import CudaBackend
from llamacmp.backends.cuda_graphs import RecordedGraph
from llamacmp.backends.numpy_ref import top_ids
from llamacmp.fixtures.quant_blocks import random_blocks
from llamacmp.lib._native import CMP_DOTS
from llamacmp.memplan import TensorDesc, coarse_head_bytes, tensor_bytes


def timed(be, record, reps: int, replays: int = 5) -> float:
    """µs per step of `record` (one step) captured `reps` times in one graph: median over replays."""
    g = RecordedGraph(be, lambda: [record() for _ in range(reps)])
    g.launch()
    be.synchronize()
    out = []
    for _ in range(replays):
        be.native.cmp_timer_start()
        g.launch()
        out.append(be.native.timer_stop() * 1e3 / reps)
    return float(np.median(out))


def bench_topk(be, N: int, rs: list[int], k: int, reps: int) -> None:
    """cmp_topk alone at [R, N] for each R, k candidates: µs per call; the ids checked against numpy's."""
    print(f"\n| cmp_topk, N {N}, k {k} ({reps} calls a graph) | µs / call |")
    print("|---|---:|")
    for R in rs:
        x = np.random.default_rng(R).standard_normal((R, N)).astype(np.float32) * 3
        logits = be.from_host(x, "f32")
        ids = be.empty((R, k), "i32")
        work = be.empty((be.native.topk_work_bytes(R, N, k),), "u8")
        us = timed(be, lambda: be.native.cmp_topk(logits.ptr, ids.ptr, work.ptr, R, N, k), reps)
        got = be.ids_to_host(ids)
        assert np.array_equal(got, top_ids(x, k)), f"cmp_topk R={R}: ids differ from numpy's"
        print(f"| R = {R} | {us:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=248320)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--type", default="Q8_0", help="the exact head's GGUF type (Q8_0, Q6_K, ...)")
    ap.add_argument("--ks", default="1,16,32", help="candidates of the coarse paths")
    ap.add_argument("--ts", default="1,2,4", help="draft rows T (activation rows of one step)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--topk-rs", default="1,2,4", help="rows of the cmp_topk cells")
    ap.add_argument("--topk-k", type=int, default=16, help="candidates of the cmp_topk cells")
    ap.add_argument("--topk-only", action="store_true", help="only the cmp_topk cells")
    a = ap.parse_args()
    be = CudaBackend()
    if a.topk_only:
        bench_topk(be, a.rows, [int(s) for s in a.topk_rs.split(",")], a.topk_k, a.reps)
        return
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    head = be.upload_matrix(random_blocks(a.type, a.rows, a.cols, rng))
    be.synchronize()
    print(f"head {a.type} [{a.rows}, {a.cols}] uploaded in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    coarse = be.coarse_copy(head)
    be.synchronize()
    made_ms = 1e3 * (time.perf_counter() - t0)
    exact_b = tensor_bytes(TensorDesc("head", a.type, (a.rows, a.cols)))
    coarse_b = coarse_head_bytes(a.rows, a.cols)
    print(f"coarse copy: {coarse_b / 1e6:.0f} MB of CQ2 made on the device in {made_ms:.1f} ms "
          f"(the exact head: {exact_b / 1e6:.0f} MB)")
    print(f"\n| path ({a.reps} steps a graph) | T | µs / step | MB read | GB/s | x 3 steps (one L2.5 round) µs |")
    print("|---|---:|---:|---:|---:|---:|")
    for T in (int(v) for v in a.ts.split(",")):
        x = be.from_host(rng.standard_normal((T, a.cols)).astype(np.float32), "f32")
        xq, xd = be.quantize(x)
        y = be.empty((T, a.rows), "f32")
        dot = CMP_DOTS[be.routes.matmul_decode]
        rows = [("exact: GEMV + argmax", exact_b, lambda: be.argmax(be.matmuls(x, [head])[0]))]
        rows += [(f"coarse k={k}: CQ2 GEMV + top-k + rescore", coarse_b,
                  lambda k=k: be.coarse_argmax(x, coarse, head, k)) for k in (int(s) for s in a.ks.split(","))]
        rows += [("CQ2 GEMV alone (cmp_cq2_gemv)", coarse_b,
                  lambda: be.native.cmp_cq2_gemv(xq.ptr, xd.ptr, coarse.codes.ptr, coarse.scales.ptr, y.ptr, T,
                                                 a.rows, a.cols, dot))]
        base = None
        for name, nbytes, record in rows:
            us = timed(be, record, a.reps)
            base = us if base is None else base
            print(f"| {name} | {T} | {us:.1f} | {nbytes / 1e6:.0f} | {nbytes / us / 1e3:.0f} | "
                  f"{3 * us:.0f} ({3 * (us - base):+.0f}) |")
    bench_topk(be, a.rows, [int(s) for s in a.topk_rs.split(",")], a.topk_k, a.reps)


if __name__ == "__main__":
    main()
