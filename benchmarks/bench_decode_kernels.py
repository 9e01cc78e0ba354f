"""The two decode kernels reworked on branch next/decode-kernels, timed with CUDA events (cmp_timer_*):

  - cmp_argmax (argmax_kernel, greedy decode's token pick) at the 9B vocabulary, R = 1..16 rows;
  - cmp_gdn at L = 1 (gdn_step_kernel, one sequence's decode token) and cmp_gdn_rows (gdn_step_rows_kernel, S
    sequences in one launch) with the 9B heads (16 k / 32 v, 128 x 128 state);
  - cmp_gdn_keep (gdn_keep_kernel, an MTP verify's GDN layer: L tokens in one launch, every state kept) against L
    decode steps in a row (the launch per token the verify made before next/gdnkeep), in CUDA graphs of 24 layers
    (the 9B's GDN layers) so that no host overhead counts (`--only keep` runs just these).

The kernels they replace are no longer in the library, so each row prints today's H200 profile figure of the old
kernel beside the new time (benchmarks/RESULTS.md, "15:45-15:58 UTC": argmax 93.6 us per token at R = 1, GDN
7.37 us per layer). "hot" calls reuse one buffer (it stays in the 60 MB L2, as the logits just written by the
output GEMV do); "cold" calls rotate over buffers spanning 4x the L2 (the GDN state of a layer, read once per token
after ~300 MB of weights, comes from memory). The sequential scan at L = 2..8 (gdn_scan_kernel, unchanged) is timed
too: its per-token time is the old per-token path.

    python3 benchmarks/bench_decode_kernels.py [--json out.json] [--pdl] [--only argmax|gdn|keep]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from llamacmp.backends.cuda import CudaBackend

import bench_kernels  # benchmarks/ is the script's folder
from bench_gemv import graph_ms

OLD_ARGMAX_US = 93.6    # argmax_kernel, R = 1, N = 248320, H200 torch.profiler, 2026-11-30 15:45-15:58 UTC
OLD_GDN_US = 7.37       # gdn_scan_kernel<128> at L = 1, 9B heads, per layer, same profile
K, V, DK = 16, 32, 128  # 9B GDN heads
POOL_BYTES = 256 << 20  # rotating buffers: ~4x the H200's L2


def timed(be: CudaBackend, fn, reps: int) -> float:
    """Median ms per call over 7 batches of `reps` calls (bench_kernels.timed)."""
    return bench_kernels.timed(be, fn, reps, batches=7)


def argmax_case(be: CudaBackend, R: int, N: int) -> tuple[float, float]:
    """-> (hot ms, cold ms) of cmp_argmax over [R, N] random logits; checks the ids against numpy."""
    nat = be.native
    row_bytes = R * N * 4
    copies = max(2, POOL_BYTES // row_bytes)
    x = be.empty((copies, R, N))
    # random logits (not a memset: a constant row would take a different path through the compares)
    one = np.random.default_rng(R).standard_normal((R, N)).astype(np.float32)
    for c in range(copies):
        nat.cmp_memcpy_h2d(x.ptr + c * row_bytes, one.ctypes.data, row_bytes)
    out = be.empty((R,), "i32")
    hot = timed(be, lambda i: nat.cmp_argmax(x.ptr, out.ptr, R, N), 50)
    cold = timed(be, lambda i: nat.cmp_argmax(x.ptr + (i % copies) * row_bytes, out.ptr, R, N), 50)
    assert np.array_equal(be.ids_to_host(out), np.argmax(one, axis=1)), "argmax gave a wrong id"
    return hot, cold


def bench_argmax(be: CudaBackend, rows_out: list) -> None:
    print(f"{'argmax':<8} {'R':>3} {'N':>7} {'hot us':>8} {'cold us':>8} {'GB/s cold':>10} {'old us (R=1)':>13}")
    for N in (248320, 248321, 151936):
        for R in (1, 2, 4, 8, 16):
            hot, cold = argmax_case(be, R, N)
            old = f"{OLD_ARGMAX_US:>13.1f}" if (R, N) == (1, 248320) else f"{'':>13}"
            print(f"{'':<8} {R:>3} {N:>7} {hot * 1e3:>8.1f} {cold * 1e3:>8.1f} {R * N * 4 / cold / 1e6:>10.0f} {old}")
            rows_out.append({"what": "argmax", "R": R, "N": N, "hot us": hot * 1e3, "cold us": cold * 1e3})


def bench_gdn(be: CudaBackend, rows_out: list) -> None:
    nat = be.native
    rng = np.random.default_rng(2)
    C = (2 * K + V) * DK
    state_bytes = V * DK * DK * 4
    n_states = max(2, POOL_BYTES // state_bytes)    # 128 states of 2 MB: a layer's state is never in L2
    states = be.empty((n_states, V, DK, DK), "f32", "states")
    one = (rng.standard_normal((V, DK, DK)) * 0.1).astype(np.float32)
    for c in range(n_states):
        nat.cmp_memcpy_h2d(states.ptr + c * state_bytes, one.ctypes.data, state_bytes)
    Smax = 16
    qkv = be.from_host(rng.standard_normal((8, C)).astype(np.float32), "f32")
    g = be.from_host(-rng.uniform(0, 1, (8, V)).astype(np.float32), "f32")
    b = be.from_host(rng.uniform(0, 1, (8, V)).astype(np.float32), "f32")
    o = be.empty((8, V * DK))
    sp = lambda c: states.ptr + (c % n_states) * state_bytes   # noqa: E731
    print(f"{'gdn (9B heads)':<28} {'hot us':>8} {'cold us':>8} {'us/token':>9} {'old us/token':>13}")
    hot = timed(be, lambda i: nat.cmp_gdn(qkv.ptr, g.ptr, b.ptr, sp(0), o.ptr, 1, K, V, DK, 1e-6), 200)
    cold = timed(be, lambda i: nat.cmp_gdn(qkv.ptr, g.ptr, b.ptr, sp(i), o.ptr, 1, K, V, DK, 1e-6), 200)
    print(f"  {'step L=1 (cmp_gdn)':<26} {hot * 1e3:>8.2f} {cold * 1e3:>8.2f} {cold * 1e3:>9.2f} {OLD_GDN_US:>13.2f}")
    rows_out.append({"what": "gdn step", "S": 1, "hot us": hot * 1e3, "cold us": cold * 1e3})
    qkv_s = be.from_host(rng.standard_normal((Smax, C)).astype(np.float32), "f32")
    g_s = be.from_host(-rng.uniform(0, 1, (Smax, V)).astype(np.float32), "f32")
    b_s = be.from_host(rng.uniform(0, 1, (Smax, V)).astype(np.float32), "f32")
    o_s = be.empty((Smax, V * DK))
    for S in (2, 4, 8, 16):
        # one pointer table per rotation slot: slot t holds states t*S .. t*S+S-1
        slots = n_states // S
        tab = np.array([[sp(t * S + s) for s in range(S)] for t in range(slots)], np.uint64)
        tab_d = be.from_host(tab.view(np.uint8), "u8")
        tp = lambda t: tab_d.ptr + (t % slots) * S * 8   # noqa: E731
        hot = timed(be, lambda i: nat.cmp_gdn_rows(qkv_s.ptr, g_s.ptr, b_s.ptr, tp(0), o_s.ptr, S, K, V, DK, 1e-6),
                    100)
        cold = timed(be, lambda i: nat.cmp_gdn_rows(qkv_s.ptr, g_s.ptr, b_s.ptr, tp(i), o_s.ptr, S, K, V, DK, 1e-6),
                     100)
        print(f"  {'rows S=%d (cmp_gdn_rows)' % S:<26} {hot * 1e3:>8.2f} {cold * 1e3:>8.2f} {cold * 1e3 / S:>9.2f}"
              f" {'':>13}")
        rows_out.append({"what": "gdn rows", "S": S, "hot us": hot * 1e3, "cold us": cold * 1e3})
    for L in (2, 4, 8):   # the unchanged sequential scan: its per-token time is the old decode path's
        cold = timed(be, lambda i: nat.cmp_gdn(qkv.ptr, g.ptr, b.ptr, sp(i), o.ptr, L, K, V, DK, 1e-6), 100)
        print(f"  {'scan L=%d (gdn_scan_kernel)' % L:<26} {'':>8} {cold * 1e3:>8.2f} {cold * 1e3 / L:>9.2f} {'':>13}")
        rows_out.append({"what": "gdn scan", "L": L, "cold us": cold * 1e3})


def bench_gdn_keep(be: CudaBackend, rows_out: list, layers: int = 24) -> None:
    """A verify's GDN layers (9B heads) as one CUDA graph of `layers` layers, each on its own state: one cmp_gdn_keep
    of L tokens per layer against L cmp_gdn steps per layer, each reading back the state the previous one wrote (the
    launch per token of the old keep path, the same arithmetic). Both favour the old path: the steps write in place
    where it wrote each token's state to its own buffer (less written back to memory), and nothing but their 48 MiB
    of states passes through L2 between replays (a verify streams each layer's weights before its state), so the
    saving printed is a lower bound."""
    nat = be.native
    rng = np.random.default_rng(4)
    C, Lmax = (2 * K + V) * DK, 5
    state_bytes = V * DK * DK * 4
    states = be.empty((layers, V, DK, DK), "f32", "states")
    one = (rng.standard_normal((V, DK, DK)) * 0.1).astype(np.float32)
    for c in range(layers):
        nat.cmp_memcpy_h2d(states.ptr + c * state_bytes, one.ctypes.data, state_bytes)
    qkv = be.from_host(rng.standard_normal((Lmax, C)).astype(np.float32), "f32")
    g = be.from_host(-rng.uniform(0, 1, (Lmax, V)).astype(np.float32), "f32")
    b = be.from_host(rng.uniform(0, 1, (Lmax, V)).astype(np.float32), "f32")
    o = be.empty((Lmax, V * DK))
    steps = be.empty((layers, Lmax - 1, V, DK, DK), "f32", "kept states")
    sp = lambda c: states.ptr + c * state_bytes   # noqa: E731
    print(f"{'gdn keep (9B heads)':<20} {'L':>2} {'one launch us':>14} {'L steps us':>11} {'saved us':>9}"
          f" {'x %d layers' % layers:>12}")
    for L in range(1, Lmax + 1):
        def keep():
            for lay in range(layers):
                nat.cmp_gdn_keep(qkv.ptr, g.ptr, b.ptr, sp(lay), steps.row_ptr(lay), o.ptr, L, K, V, DK, 1e-6)

        def per_token():
            for lay in range(layers):
                for t in range(L):
                    nat.cmp_gdn(qkv.row_ptr(t), g.row_ptr(t), b.row_ptr(t), sp(lay), o.row_ptr(t), 1, K, V, DK, 1e-6)
        one_us = graph_ms(be, keep, 1) * 1e3 / layers
        steps_us = graph_ms(be, per_token, 1) * 1e3 / layers
        print(f"{'':<20} {L:>2} {one_us:>14.2f} {steps_us:>11.2f} {steps_us - one_us:>9.2f}"
              f" {(steps_us - one_us) * layers:>12.1f}")
        rows_out.append({"what": "gdn keep", "L": L, "one launch us": one_us, "L steps us": steps_us})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--pdl", action="store_true", help="launch the small kernels with PDL (cmp_set_pdl)")
    ap.add_argument("--only", choices=("argmax", "gdn", "keep"), help="run one group of cells")
    args = ap.parse_args(argv)
    be = CudaBackend()
    if args.pdl:
        be.native.set_pdl(0, True)
    print(f"device: {be.native.device_name()}   date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f"   pdl: {args.pdl}")
    rows_out: list = []
    for name, bench in (("argmax", bench_argmax), ("gdn", bench_gdn), ("keep", bench_gdn_keep)):
        if args.only in (None, name):
            bench(be, rows_out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
