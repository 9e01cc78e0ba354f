"""Decode GEMV timings for the 9B shapes (issue 3): µs per call and % of the device-to-device copy rate for the
v1 and v2 (batch-invariant) GEMVs of cmp_matmul_q8_ex (v2 also with its PDL launch), at T = 1, 4, 16.

    python3 benchmarks/bench_gemv.py [--quick] [--json out.json]

Each launch set is the one a decode step runs (the projections that share an input go in one launch): the GDN
input projections (qkv 8192 + z 4096 + beta 32 + alpha 32 rows), attention q/k/v (8192 + 1024 + 1024), FFN gate+up
(2 x 12288), one 12288 x 4096 matrix alone, the 4096 x 4096 out projections, FFN down (4096 x 12288) and the
lm_head (248320 x 4096). Weights rotate over copies spanning >> the 60 MB L2, so they come from memory.

Timing: `reps` calls are captured into one CUDA graph and replayed (as the decode step is): no Python or launch
overhead per call, unlike bench_kernels.py's eager loop, whose floor (~8 µs per ctypes call) hid the 4096 x 4096
GEMV. Two columns:
  chain   back-to-back GEMVs: the kernel's time including the gap to the next launch.
  +prod   each GEMV after the Q8 producer of its input (cmp_quantize_q8 [T, n], like rmsnorm_q8 in decode), minus
          the time of the producers alone: what the GEMV adds to a decode step (PDL can only gain here and in
          chain, where it lets the GEMV start while the kernel before it drains).
% copy = weight bytes (int8 + f16 scales) per second against the device-to-device copy rate (read + write bytes).

    python3 benchmarks/bench_gemv.py --quant [--types Q4_K,Q6_K] [--no-gemm] [--json out.json]

The block types other than Q8_0 (cmp_matmul_quant, issue 18) and Q8_0 (the default v2 + PDL GEMV, v2 GEMM) on
the matrices 4096 x 12288, 12288 x 4096 and 4096 x 4096 (rows x n) of random valid blocks: the GEMV at T = 1, 4, 16
(`--ts 1,2,4,8,16` picks others; chain column as above; GB/s = the type's bytes on the device per second) and the
prefill GEMM at T = 512 and 4096
(TOPS = 2 T rows n / time, eager calls timed by events; quantized types include their per-call weight expansion, but
for those the GEMM reads from their planes: on DP4A's gemm_w16_kernel Q4_K up to 4096 tokens, Q2_K / Q5_K 512).
`--dot dp2a|imad` runs that table on another route's int8 dot (issue 20; llamacmp/backends/routes.py), GEMV and GEMM;
`--gemm-mma` runs its GEMM on the int8 tensor cores (the mma route's; Q2_K, Q4_K, Q5_K read from their planes),
`--gemm-ts 512,1024,4096` at other token counts.
`--gemm-all` times the GEMM on all three matrices; `--smem-cap BYTES` runs the table under cmp_set_smem_cap (another
card's shared memory per block), e.g. 98304 (sm_70's 96 KB) for the DP4A GEMM's 128 x 128 tiles on an H200, the tile
sm_86 / sm_89 get (smem_plan.h gemm_w16_plan), against its own 128 x 64.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import time

import numpy as np

from llamacmp.backends.cuda import CudaBackend
from llamacmp.gguf_file import GRID_TYPES
from llamacmp.lib._native import CMP_MM_GEMM2, CMP_MM_GEMV2, CMP_MM_MMA
from llamacmp.lib._native import CMP_DOTS, CMP_MM_GEMM_DOT_SHIFT, CMP_MM_GEMV_DOT_SHIFT, CMP_MM_GEMV_PDL
from llamacmp.lib._native import CMP_QUANT_TYPES

# (name, [rows of each matrix in the launch], n)
SETS_9B = [
    ("gdn in qkv+z+b+a", [8192, 4096, 32, 32], 4096),
    ("attn q+k+v", [8192, 1024, 1024], 4096),
    ("ffn gate+up", [12288, 12288], 4096),
    ("ffn gate alone", [12288], 4096),
    ("out proj", [4096], 4096),
    ("ffn down", [4096], 12288),
    ("lm_head", [248320], 4096),
]
KERNELS = [("v1", 0), ("v2", CMP_MM_GEMV2 | CMP_MM_GEMM2), ("v2+pdl", CMP_MM_GEMV2 | CMP_MM_GEMM2 | CMP_MM_GEMV_PDL)]


def copy_bandwidth(be: CudaBackend, nbytes: int = 2 << 30) -> float:
    """GB/s of a device-to-device copy (bytes read + written), median of 5."""
    a, b = be.empty((nbytes,), "u8"), be.empty((nbytes,), "u8")
    be.native.cmp_memset(a.ptr, 0x37, nbytes)
    be.native.cmp_memcpy_d2d(b.ptr, a.ptr, nbytes)
    samples = []
    for _ in range(5):
        be.native.cmp_timer_start()
        be.native.cmp_memcpy_d2d(b.ptr, a.ptr, nbytes)
        samples.append(be.native.timer_stop())
    return 2 * nbytes / float(np.median(samples)) / 1e6


class LaunchSet:
    """`copies` distinct-address copies of random Q8 matrices [rows_i, n] (one launch's weights), spanning at
    least pool_bytes."""

    def __init__(self, be: CudaBackend, rows: list[int], n: int, pool_bytes: int = 1536 << 20):
        self.rows, self.n = rows, n
        self.wbytes = sum(r * n + r * (n // 32) * 2 for r in rows)
        self.copies = max(2, -(-pool_bytes // self.wbytes))
        rng = np.random.default_rng(0)
        self.mats = []   # [copy] -> [(qs, d) device tensors]
        host = [(rng.integers(-127, 128, (r, n), dtype=np.int8),
                 (rng.uniform(0.5, 1.5, (r, n // 32)) * 1e-3).astype(np.float16)) for r in rows]
        for _ in range(self.copies):
            self.mats.append([(be.from_host(q, "i8", "bench weights"), be.from_host(d, "f16", "bench scales"))
                              for q, d in host])


def graph_ms(be: CudaBackend, record, reps: int) -> float:
    """ms per replay (median of 5) of a graph holding what `record()` launches."""
    nat = be.native
    record()                      # eager once: one-time launcher work stays out of the capture
    be.synchronize()
    nat.cmp_graph_begin()
    try:
        record()
    finally:
        exec_ = nat.graph_end()
    try:
        nat.cmp_graph_launch(exec_)
        be.synchronize()
        samples = []
        for _ in range(5):
            nat.cmp_timer_start()
            nat.cmp_graph_launch(exec_)
            samples.append(nat.timer_stop())
        return float(np.median(samples))
    finally:
        nat.cmp_graph_destroy(exec_)


def bench_set(be: CudaBackend, ls: LaunchSet, T: int, kernels: int, reps: int) -> tuple[float, float]:
    """-> (µs per GEMV back to back, µs per GEMV after a producer net of the producers)."""
    n, k = ls.n, len(ls.rows)
    rng = np.random.default_rng(T)
    x = be.from_host(rng.standard_normal((T, n)).astype(np.float32), "f32")
    xq, xd = be.empty((T, n), "i8"), be.empty((T, n // 32), "f32")
    be.native.cmp_quantize_q8(x.ptr, xq.ptr, xd.ptr, T, n)
    ys = [be.empty((T, r)) for r in ls.rows]
    P, I = ctypes.c_void_p * k, ctypes.c_int * k
    args = [(P(*(q.ptr for q, _ in c)), P(*(d.ptr for _, d in c))) for c in ls.mats]
    yp, rp = P(*(y.ptr for y in ys)), I(*ls.rows)
    call, quant = be.native.cmp_matmul_q8_ex, be.native.cmp_quantize_q8

    def gemvs(with_producer: bool, with_gemv: bool = True):
        def record():
            for i in range(reps):
                if with_producer:
                    quant(x.ptr, xq.ptr, xd.ptr, T, n)
                if with_gemv:
                    wq, wd = args[i % ls.copies]
                    call(xq.ptr, xd.ptr, k, wq, wd, yp, None, rp, T, n, kernels)
        return record

    chain = graph_ms(be, gemvs(False), reps) / reps
    both = graph_ms(be, gemvs(True), reps) / reps
    prod = graph_ms(be, gemvs(True, False), reps) / reps
    return chain * 1e3, (both - prod) * 1e3


QUANT_SHAPES = [(4096, 12288), (12288, 4096), (4096, 4096)]   # rows x n
Q8_DEFAULT = CMP_MM_GEMV2 | CMP_MM_GEMM2 | CMP_MM_GEMV_PDL


class QuantPool:
    """Distinct-address copies of one random matrix of `type_name` (Q8_0 too) spanning >= pool_bytes, as
    (pointer-args, bytes) per copy: (body, head) for the block types, (qs, d) for Q8_0."""

    def __init__(self, be: CudaBackend, type_name: str, rows: int, n: int, pool_bytes: int = 768 << 20):
        from llamacmp.fixtures.quant_blocks import random_blocks
        w = random_blocks(type_name, rows, n, np.random.default_rng(0))
        self.type_name, self.rows, self.n = type_name, rows, n
        first = be.upload_matrix(w)
        self.wbytes = (first.qs.nbytes + first.d.nbytes if type_name == "Q8_0" else
                       first.body.nbytes + (first.head.nbytes if first.head is not None else 0))
        self.mats = [first] + [be.upload_matrix(w) for _ in range(max(1, -(-pool_bytes // self.wbytes)) - 1)]

    def call(self, be: CudaBackend, i: int, xq, xd, y, T: int, work=None, dots: int = 0) -> None:
        m, P, I = self.mats[i % len(self.mats)], ctypes.c_void_p * 1, ctypes.c_int * 1
        if self.type_name == "Q8_0":
            be.native.cmp_matmul_q8_ex(xq.ptr, xd.ptr, 1, P(m.qs.ptr), P(m.d.ptr), P(y.ptr), None, I(self.rows), T,
                                       self.n, Q8_DEFAULT | dots)
        else:
            be.native.cmp_matmul_quant(m.type_id, xq.ptr, xd.ptr, 1, P(m.body.ptr), P(m.head_ptr), P(y.ptr), None,
                                       I(self.rows), T, self.n, work.ptr if work else 0, work.nbytes if work else 0,
                                       dots)


def bench_quant(be: CudaBackend, types: list[str], bw: float, reps: int, gemm: bool = True,
                dot: str = "dp4a", ts: tuple[int, ...] = (1, 4, 16), gemm_all: bool = False,
                gemm_mma: bool = False, gemm_ts: tuple[int, ...] = (512, 4096)) -> list[dict]:
    dots = (CMP_DOTS[dot] << CMP_MM_GEMV_DOT_SHIFT | CMP_DOTS[dot] << CMP_MM_GEMM_DOT_SHIFT
            | (CMP_MM_MMA if gemm_mma else 0))
    out = []
    print(f"{'type':<7} {'rows x n':>12} {'MB':>6} {'T':>5} {'us':>9} {'GB/s':>7} {'%copy':>6} {'TOPS':>7}")
    for type_name in types:
        for rows, n in QUANT_SHAPES:
            pool = QuantPool(be, type_name, rows, n)
            for T in (*ts, *gemm_ts):
                if T > 16 and (((rows, n) != (12288, 4096) and not gemm_all) or not gemm):
                    continue
                rng = np.random.default_rng(T)
                x = be.from_host(rng.standard_normal((T, n)).astype(np.float32), "f32")
                xq, xd = be.quantize(x)
                y = be.empty((T, rows))
                work = None
                if T > 16 and type_name != "Q8_0":
                    work = be.empty((min(be.native.quant_work_bytes(CMP_QUANT_TYPES[type_name], T, n, rows, dots),
                                         be.QUANT_WORK_BYTES),), "u8")
                if T <= 16:
                    k = min(reps, max(4, int(3e9 // pool.wbytes)))
                    us = graph_ms(be, lambda: [pool.call(be, i, xq, xd, y, T, None, dots) for i in range(k)], k) / k * 1e3
                else:
                    pool.call(be, 0, xq, xd, y, T, work, dots)
                    samples = []
                    for i in range(3):
                        be.native.cmp_timer_start()
                        pool.call(be, i, xq, xd, y, T, work, dots)
                        samples.append(be.native.timer_stop())
                    us = float(np.median(samples)) * 1e3
                gbs, tops = pool.wbytes / us / 1e3, 2.0 * T * rows * n / us / 1e6
                print(f"{type_name:<7} {f'{rows}x{n}':>12} {pool.wbytes / 1e6:>6.1f} {T:>5} {us:>9.1f} {gbs:>7.0f} "
                      f"{100 * gbs / bw:>5.0f}% {tops:>7.1f}", flush=True)
                out.append({"type": type_name, "dot": dot, "gemm": "mma" if gemm_mma else dot, "rows": rows, "n": n,
                            "T": T, "us": us, "GB/s": gbs, "TOPS": tops, "MB": pool.wbytes / 1e6})
            del pool
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="T = 1 only, and no 12288 x 4096 alone")
    ap.add_argument("--json")
    ap.add_argument("--quant", action="store_true", help="the block types' GEMV and GEMM table instead (see above)")
    # default: the types the loader runs on CUDA; the IQ1-3 grid types (untested on a GPU yet) only when named
    ap.add_argument("--types", default="Q8_0," + ",".join(t for t in CMP_QUANT_TYPES if t not in GRID_TYPES),
                    help="with --quant: comma-separated GGUF type names (Q8_0 and the block types)")
    ap.add_argument("--reps", type=int, default=30, help="GEMV calls per captured graph")
    ap.add_argument("--no-gemm", action="store_true", help="with --quant: GEMV only")
    ap.add_argument("--dot", choices=list(CMP_DOTS), default="dp4a", help="with --quant: the int8 dot route")
    ap.add_argument("--ts", default="1,4,16", help="with --quant: comma-separated GEMV token counts (1..16)")
    ap.add_argument("--gemm-ts", default="512,4096", help="with --quant: comma-separated GEMM token counts (> 16)")
    ap.add_argument("--gemm-all", action="store_true",
                    help="with --quant: the GEMM on every matrix, not 12288 x 4096 only")
    ap.add_argument("--gemm-mma", action="store_true",
                    help="with --quant: the prefill GEMM on the int8 tensor cores (CMP_MM_MMA, the mma route's)")
    ap.add_argument("--smem-cap", type=int, default=0,
                    help="with --quant: shared memory per block in bytes (cmp_set_smem_cap; 0: the device's own)")
    args = ap.parse_args(argv)
    if (args.gemm_all or args.smem_cap or args.gemm_mma) and not args.quant:
        ap.error("--gemm-all / --smem-cap / --gemm-mma: with --quant only")
    if args.smem_cap < 0:
        ap.error(f"--smem-cap: bytes of shared memory per block, 0 or more (got {args.smem_cap})")
    if args.dot != "dp4a" and not args.quant:
        ap.error("--dot: only the --quant table runs on other routes (the v1 / v2 GEMV table is DP4A)")
    be = CudaBackend()
    bw = copy_bandwidth(be)
    print(f"device: {be.native.device_name()}   date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"device-to-device copy: {bw:.0f} GB/s (read + write)")
    out = [{"what": "copy", "GB/s": bw}]
    if args.quant:
        types = args.types.split(",")
        unknown = [t for t in types if t != "Q8_0" and t not in CMP_QUANT_TYPES]
        if unknown:
            ap.error(f"--types: unknown type(s) {', '.join(unknown)} (known: Q8_0, {', '.join(CMP_QUANT_TYPES)})")
        ts = tuple(int(t) for t in args.ts.split(","))
        if not all(1 <= t <= 16 for t in ts):
            ap.error(f"--ts: GEMV token counts are 1..16 (got {args.ts})")
        gemm_ts = tuple(int(t) for t in args.gemm_ts.split(","))
        if not all(t > 16 for t in gemm_ts):
            ap.error(f"--gemm-ts: GEMM token counts are above 16 (got {args.gemm_ts})")
        print(f"int8 dot route: {args.dot}" + (", GEMM on the int8 tensor cores" if args.gemm_mma else "")
              + (f", shared memory capped at {args.smem_cap} B" if args.smem_cap else ""))
        be.native.cmp_set_smem_cap(args.smem_cap)
        try:
            rows = bench_quant(be, types, bw, args.reps, not args.no_gemm, args.dot, ts, args.gemm_all, args.gemm_mma,
                               gemm_ts)
        finally:
            be.native.cmp_set_smem_cap(0)
        out += [dict(r, smem_cap=args.smem_cap) for r in rows]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return
    print(f"{'launch set':<18} {'MB':>7} {'T':>3} {'kern':>6} {'chain us':>9} {'%copy':>6} {'+prod us':>9} {'%copy':>6}"
          f" {'vs v2':>6}")
    sets = [s for s in SETS_9B if not (args.quick and s[0] == "ffn gate alone")]
    for name, rows, n in sets:
        ls = LaunchSet(be, rows, n)
        for T in ((1,) if args.quick else (1, 4, 16)):
            ref = None
            for kname, kernels in KERNELS:
                if kname == "v1" and T > 8:
                    continue   # v1's GEMV stops at T = 8 (the 64x64 GEMM runs T = 16)
                chain, net = bench_set(be, ls, T, kernels, min(args.reps, max(4, int(3e9 // ls.wbytes))))
                gb_chain, gb_net = ls.wbytes / chain / 1e3, ls.wbytes / net / 1e3
                if kname == "v2":
                    ref = chain
                vs = f"{ref / chain:5.2f}x" if ref and kname != "v2" and kname != "v1" else ""
                print(f"{name:<18} {ls.wbytes / 1e6:>7.1f} {T:>3} {kname:>6} {chain:>9.1f} "
                      f"{100 * gb_chain / bw:>5.0f}% {net:>9.1f} {100 * gb_net / bw:>5.0f}% {vs:>6}", flush=True)
                out.append({"what": name, "rows": rows, "n": n, "T": T, "kernels": kname, "chain us": chain,
                            "after producer us": net, "MB": ls.wbytes / 1e6})
        del ls
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
