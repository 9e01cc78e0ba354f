"""Kernel timings on the GPU against measured ceilings: device copy bandwidth, Q8 GEMV (decode) GB/s, Q8 GEMM
(prefill) DP4A TOPS, attention and GDN. Weights rotate over a buffer several times the L2, so the GEMV reads
come from memory, not cache. Prints a table; `--json PATH` also writes the rows.

    python3 benchmarks/bench_kernels.py [--quick] [--matmul-only] [--json out.json]
    python3 benchmarks/bench_kernels.py --gemm-routes dp4a mma [--json out.json]   (prefill GEMM per route only)
    python3 benchmarks/bench_kernels.py --conv-only [--json out.json]                (GDN conv1d + SiLU only)
    python3 benchmarks/bench_kernels.py --gemm-pieces [--json out.json]   (DP4A GEMM: serial pieces vs whole tiles)
    python3 benchmarks/bench_kernels.py --producers [--json out.json]     (the prefill Q8 producers, GB/s vs copy)

The matmul table times each shape with the v1 kernels and the v2 ones (cmp_matmul_q8_ex) side by side; the
producer table times the unfused op + quantize against the fused Q8 producers.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from llamacmp.backends.base import StepBatch
from llamacmp.backends.cuda import CudaBackend
from llamacmp.config import ModelConfig

# 9B projections (rows, n): attn_qkv, attn_gate(z), ffn gate/up, ffn down, attn_q (q+gate), ssm_out
SHAPES_9B = [("gdn qkv", 8192, 4096), ("gdn z", 4096, 4096), ("ffn gate", 12288, 4096), ("ffn down", 4096, 12288),
             ("attn q", 8192, 4096), ("ssm_out", 4096, 4096)]


def timed(be: CudaBackend, fn, reps: int, batches: int = 5) -> float:
    """Median ms per call over `batches` batches of `reps` calls (device events around each batch), after a warm-up;
    fn(i) gets the call's index (for rotating buffers)."""
    fn(0)
    be.synchronize()
    samples = []
    for r in range(batches):
        be.native.cmp_timer_start()
        for i in range(reps):
            fn(r * reps + i)
        samples.append(be.native.timer_stop() / reps)
    return float(np.median(samples))


def copy_bandwidth(be: CudaBackend, nbytes: int = 2 << 30) -> float:
    a, b = be.empty((nbytes,), "u8"), be.empty((nbytes,), "u8")
    be.native.cmp_memset(a.ptr, 0x37, nbytes)
    ms = timed(be, lambda i: be.native.cmp_memcpy_d2d(b.ptr, a.ptr, nbytes), 5)
    return 2 * nbytes / ms / 1e6   # GB/s, bytes read + written


class WeightPool:
    """`copies` distinct-address copies of one random Q8 matrix [rows, n], spanning pool_bytes (>> L2)."""

    def __init__(self, be: CudaBackend, rows: int, n: int, pool_bytes: int = 1536 << 20):
        self.rows, self.n = rows, n
        self.wbytes = rows * n + rows * (n // 32) * 2
        self.copies = max(2, pool_bytes // self.wbytes)
        rng = np.random.default_rng(0)
        one_q = rng.integers(-127, 128, (rows, n), dtype=np.int8)
        one_d = (rng.uniform(0.5, 1.5, (rows, n // 32)) * 1e-3).astype(np.float16)
        self.qs = be.empty((self.copies, rows, n), "i8")
        self.d = be.empty((self.copies, rows, n // 32), "f16")
        for c in range(self.copies):
            be.native.cmp_memcpy_h2d(self.qs.ptr + c * one_q.nbytes, one_q.ctypes.data, one_q.nbytes)
            be.native.cmp_memcpy_h2d(self.d.ptr + c * one_d.nbytes, one_d.ctypes.data, one_d.nbytes)


def bench_matmul(be: CudaBackend, pool: WeightPool, T: int, kernels: int = 0) -> float:
    """-> ms per call of y [T, rows] = x . W^T, rotating over the pool's copies. kernels: cmp_matmul_q8_ex's
    CMP_MM_* bits (0 = the v1 kernels, 3 = v2 GEMV + v2 GEMM)."""
    import ctypes
    rows, n = pool.rows, pool.n
    x = be.from_host(np.random.default_rng(T).standard_normal((T, n)).astype(np.float32), "f32")
    xq, xd = be.quantize(x)
    y = be.empty((T, rows))
    call = be.native.cmp_matmul_q8_ex
    P1, I1 = ctypes.c_void_p * 1, ctypes.c_int * 1
    args = [(P1(pool.qs.ptr + c * rows * n), P1(pool.d.ptr + c * rows * (n // 32) * 2)) for c in range(pool.copies)]
    yp, rp = P1(y.ptr), I1(rows)

    def run(i):
        wq, wd = args[i % pool.copies]
        call(xq.ptr, xd.ptr, 1, wq, wd, yp, None, rp, T, n, kernels)
    return timed(be, run, 20 if T <= 16 else 3)


def bench_fused(be: CudaBackend, rows_out: list) -> None:
    """The Q8 producers per decode token and layer, unfused (op + cmp_quantize_q8) against fused, T = 1 and 16."""
    print(f"{'producer':<26} {'T':>3} {'unfused us':>11} {'fused us':>9}")
    rng = np.random.default_rng(4)
    for T in (1, 16):
        for name, n in (("rmsnorm D=4096", 4096), ("swiglu F=12288", 12288), ("gated_rmsnorm 32x128", 4096)):
            a = be.from_host(rng.standard_normal((T, n)).astype(np.float32), "f32")
            b = be.from_host(rng.standard_normal((T, n)).astype(np.float32), "f32")
            w = be.from_host(np.ones(n if name.startswith("rms") else 128, np.float32), "f32")
            q, d = be.empty((T, n), "i8"), be.empty((T, n // 32), "f32")
            tmp = be.empty((T, n))
            nat = be.native
            if name.startswith("rmsnorm"):
                unf = lambda i: (nat.cmp_rmsnorm(a.ptr, w.ptr, tmp.ptr, T, n, 1e-6),
                                 nat.cmp_quantize_q8(tmp.ptr, q.ptr, d.ptr, T, n))
                fus = lambda i: nat.cmp_rmsnorm_q8(a.ptr, w.ptr, q.ptr, d.ptr, T, n, 1e-6)
            elif name.startswith("swiglu"):
                unf = lambda i: (nat.cmp_swiglu(a.ptr, b.ptr, tmp.ptr, T * n),
                                 nat.cmp_quantize_q8(tmp.ptr, q.ptr, d.ptr, T, n))
                fus = lambda i: nat.cmp_binary_q8(a.ptr, b.ptr, 0, q.ptr, d.ptr, T, n)
            else:
                unf = lambda i: (nat.cmp_gated_rmsnorm(a.ptr, b.ptr, w.ptr, tmp.ptr, T, 32, 128, 1e-6),
                                 nat.cmp_quantize_q8(tmp.ptr, q.ptr, d.ptr, T, n))
                fus = lambda i: nat.cmp_gated_rmsnorm_q8(a.ptr, b.ptr, w.ptr, q.ptr, d.ptr, T, 32, 128, 1e-6)
            t_u, t_f = timed(be, unf, 50), timed(be, fus, 50)
            print(f"{name:<26} {T:>3} {t_u * 1e3:>11.1f} {t_f * 1e3:>9.1f}")
            rows_out.append({"what": f"fused {name}", "T": T, "unfused ms": t_u, "fused ms": t_f})


# The Q8 producers of a prefill layer on the 27B widths (hidden 5120, FFN 17408, attention gate 24 x 256, GDN
# output 48 x 128): (name, f32 inputs read, values per row).
PRODUCERS_27B = [("rmsnorm_q8 D=5120", 1, 5120), ("swiglu_q8 F=17408", 2, 17408), ("sigmoid_mul_q8 n=6144", 2, 6144),
                 ("gated_rmsnorm_q8 48x128", 2, 6144), ("quantize_q8 n=5120", 1, 5120)]


def bench_producers(be: CudaBackend, rows_out: list) -> None:
    """The fused Q8 producers at prefill sizes: us a call and GB/s (f32 read + codes and scales written) against the
    device-to-device copy rate (read + write)."""
    bw = copy_bandwidth(be)
    print(f"device: {be.native.device_name()}   copy {bw:.0f} GB/s (read + write)")
    print(f"{'producer':<26} {'T':>5} {'us':>9} {'GB/s':>7} {'%copy':>6}")
    rng = np.random.default_rng(5)
    nat = be.native
    for T in (512, 4096):
        for name, reads, n in PRODUCERS_27B:
            a, b = (be.from_host(rng.standard_normal((T, n)).astype(np.float32), "f32") for _ in range(2))
            w = be.from_host(np.ones(128 if name.startswith("gated") else n, np.float32), "f32")
            q, d = be.empty((T, n), "i8"), be.empty((T, n // 32), "f32")
            call = {"rmsnorm_q8": lambda i: nat.cmp_rmsnorm_q8(a.ptr, w.ptr, q.ptr, d.ptr, T, n, 1e-6),
                    "swiglu_q8": lambda i: nat.cmp_binary_q8(a.ptr, b.ptr, 0, q.ptr, d.ptr, T, n),
                    "sigmoid_mul_q8": lambda i: nat.cmp_binary_q8(a.ptr, b.ptr, 1, q.ptr, d.ptr, T, n),
                    "gated_rmsnorm_q8": lambda i: nat.cmp_gated_rmsnorm_q8(a.ptr, b.ptr, w.ptr, q.ptr, d.ptr, T,
                                                                           n // 128, 128, 1e-6),
                    "quantize_q8": lambda i: nat.cmp_quantize_q8(a.ptr, q.ptr, d.ptr, T, n)}[name.split()[0]]
            ms = timed(be, call, 20)
            gbs = T * n * (4 * reads + 1 + 4 / 32) / ms / 1e6
            print(f"{name:<26} {T:>5} {ms * 1e3:>9.1f} {gbs:>7.0f} {100 * gbs / bw:>5.0f}%", flush=True)
            rows_out.append({"what": f"producer {name}", "T": T, "ms": ms, "GB/s": gbs, "copy GB/s": bw})
            del a, b, w, q, d


def bench_attention(be: CudaBackend, n_kv: int, L: int, kv_type: str = "f16") -> float:
    cfg = ModelConfig(n_layer=4, n_embd=4096, n_ff=12288, n_head=16, n_head_kv=4, head_dim=256, n_vocab=1000,
                      n_ctx_train=262144, rms_eps=1e-6, rope_base=1e7, n_rot=64, rope_sections=(0, 0, 0, 0),
                      conv_kernel=4, ssm_k_heads=16, ssm_v_heads=32, ssm_head_dim=128, full_attention_interval=4)
    st = be.new_state(cfg, n_kv, kv_type)
    st.n_past = n_kv - L
    rng = np.random.default_rng(1)
    for a in (st.k[0], st.v[0]):
        be.copy_from_host(a, rng.standard_normal(a.shape).astype(np.float32))
    q = be.from_host(rng.standard_normal((L, 16, 256)).astype(np.float32), "f32")
    k = be.from_host(rng.standard_normal((L, 4, 256)).astype(np.float32), "f32")
    v = be.from_host(rng.standard_normal((L, 4 * 256)).astype(np.float32), "f32")
    batch = StepBatch.build([(st, [0] * L)])
    return timed(be, lambda i: be.attention(q, k, v, batch, 0, cfg), 5)


def bench_gdn(be: CudaBackend, L: int, chunked: bool = False) -> float:
    """The delta rule over one L-token segment with the 9B heads (16 k / 32 v, 128 x 128 state): the sequential
    scan (cmp_gdn) or the chunked WY kernels (cmp_gdn_chunked: intra-chunk, then state passing)."""
    K, V, Dk = 16, 32, 128
    rng = np.random.default_rng(2)
    C = (2 * K + V) * Dk
    qkv = be.from_host(rng.standard_normal((L, C)).astype(np.float32), "f32")
    g = be.from_host(-rng.uniform(0, 1, (L, V)).astype(np.float32), "f32")
    b = be.from_host(rng.uniform(0, 1, (L, V)).astype(np.float32), "f32")
    S = be.zeros((V, Dk, Dk), "f32", "state")
    o = be.empty((L, V * Dk))
    if not chunked:
        return timed(be, lambda i: be.native.cmp_gdn(qkv.ptr, g.ptr, b.ptr, S.ptr, o.ptr, L, K, V, Dk, 1e-6), 3)
    work = be.empty((be.native.gdn_chunked_work_bytes(L, V, Dk),), "u8", "the chunked GDN workspace")
    return timed(be, lambda i: be.native.cmp_gdn_chunked(qkv.ptr, g.ptr, b.ptr, S.ptr, o.ptr, L, K, V, Dk, 1e-6,
                                                         work.ptr, work.nbytes), 3)


def bench_conv(be: CudaBackend, L: int, C: int = 8192, kernel: int = 4) -> float:
    """The GDN layers' causal conv1d + SiLU over one L-token segment (cmp_conv1d_silu; 9B: 8192 channels, kernel 4)."""
    rng = np.random.default_rng(4)
    x = be.from_host(rng.standard_normal((L, C)).astype(np.float32), "f32")
    w = be.from_host(rng.standard_normal((C, kernel)).astype(np.float32), "f32")
    state = be.zeros((kernel - 1, C), "f32", "conv state")
    out = be.empty((L, C))
    return timed(be, lambda i: be.native.cmp_conv1d_silu(x.ptr, w.ptr, state.ptr, out.ptr, L, C, kernel), 5)


def bench_argmax(be: CudaBackend, R: int, N: int) -> float:
    x = be.from_host(np.random.default_rng(3).standard_normal((R, N)).astype(np.float32), "f32")
    out = be.empty((R,), "i32")
    return timed(be, lambda i: be.native.cmp_argmax(x.ptr, out.ptr, R, N), 20)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--matmul-only", action="store_true")
    ap.add_argument("--gdn-only", action="store_true", help="only the GDN scan vs chunked rows and the argmax")
    ap.add_argument("--conv-only", action="store_true", help="only the GDN conv1d + SiLU at L = 1 .. 16384 (9B)")
    ap.add_argument("--attention-only", action="store_true",
                    help="only the attention table (benchmarks/bench_attention.py: old vs new, per KV type)")
    ap.add_argument("--gemm-routes", nargs="+", choices=tuple(GEMM_ROUTES), default=None,
                    help="only: the prefill GEMM on the 9B shapes at T = 512 and 4096 with each of these routes "
                         "(dp4a: the v2 DP4A GEMM, mma: the int8 tensor-core GEMM), TOPS and the ratio to the first")
    ap.add_argument("--gemm-pieces", action="store_true",
                    help="only: the DP4A GEMM on the 9B and 27B shapes at T = 512 and 4096, each launch's serial "
                         "pieces of K (its plan) against whole tiles (cmp_set_serial_pieces(1))")
    ap.add_argument("--producers", action="store_true",
                    help="only: the fused Q8 producers (rmsnorm, SwiGLU, sigmoid gate, gated rmsnorm, quantize) at "
                         "T = 512 and 4096 on the 27B widths, GB/s against the copy rate")
    args = ap.parse_args(argv)
    be = CudaBackend()
    if args.producers:
        rows_out = []
        bench_producers(be, rows_out)
        _write_json(args.json, rows_out)
        return
    if args.gemm_pieces:
        rows_out = []
        bench_gemm_pieces(be, rows_out)
        _write_json(args.json, rows_out)
        return
    if args.gemm_routes:
        rows_out = []
        bench_gemm_routes(be, args.gemm_routes, rows_out)
        _write_json(args.json, rows_out)
        return
    if args.attention_only:
        try:
            from benchmarks.bench_attention import run as bench_attention_rows
        except ImportError:      # run as a script: benchmarks/ itself is on sys.path
            from bench_attention import run as bench_attention_rows
        _write_json(args.json, bench_attention_rows(be, args.quick))
        return
    rows_out = []
    if args.conv_only:
        print(f"device: {be.native.device_name()}   date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        for L in (1, 512, 4096, 16384):
            ms = bench_conv(be, L)
            gbs = 2 * L * 8192 * 4 / ms / 1e6   # x read + out written
            print(f"conv1d_silu L={L:<6} C=8192 k=4 {ms * 1e3:>9.1f} us {gbs:>7.0f} GB/s", flush=True)
            rows_out.append({"what": "conv1d_silu", "L": L, "C": 8192, "ms": ms, "GB/s": gbs})
        _write_json(args.json, rows_out)
        return
    if args.gdn_only:
        bench_gdn_rows(be, rows_out)
        _write_json(args.json, rows_out)
        return
    bw = copy_bandwidth(be)
    print(f"device: {be.native.device_name()}   date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"device-to-device copy: {bw:.0f} GB/s (read + write)")
    rows_out.append({"what": "copy", "GB/s": bw})
    # v1 = the kernels of round 1 (GEMV T <= 8, 64x64 GEMM), v2 = CMP_MM_GEMV2 | CMP_MM_GEMM2 (GEMV T <= 16,
    # 128x128 GEMM from T = 96). T = 16 on v1 is the 64x64 GEMM.
    print(f"{'matmul':<10} {'rows':>6} {'n':>6} {'T':>4} {'kern':>4} {'ms':>8} {'GB/s':>7} {'%copy':>6} {'TOPS':>7}"
          f" {'v2/v1':>6}")
    shapes = SHAPES_9B if not args.quick else [SHAPES_9B[i] for i in (0, 1, 2, 3)]
    for name, rows, n in shapes:
        pool = WeightPool(be, rows, n)
        for T in (1, 2, 4, 8, 16, 512, 2048):
            if T == 2048 and args.quick:
                continue
            t_old = None
            for kname, kernels in (("v1", 0), ("v2", 3)):
                ms = bench_matmul(be, pool, T, kernels)
                gbs = pool.wbytes / ms / 1e6
                tops = 2.0 * rows * n * T / ms / 1e9
                speed = f"{t_old / ms:>5.2f}x" if t_old else ""
                t_old = t_old or ms
                print(f"{name:<10} {rows:>6} {n:>6} {T:>4} {kname:>4} {ms:>8.4f} {gbs:>7.0f} {100 * gbs / bw:>5.0f}% "
                      f"{tops:>7.1f} {speed:>6}")
                rows_out.append({"what": f"matmul_q8 {name}", "kernels": kname, "rows": rows, "n": n, "T": T,
                                 "ms": ms, "GB/s": gbs, "TOPS": tops})
        del pool
    bench_fused(be, rows_out)
    if args.matmul_only:
        _write_json(args.json, rows_out)
        return
    print(f"{'attention (9B heads, f16 KV)':<34} {'ms':>8}")
    for n_kv, L in ((4096, 1), (32768, 1), (512, 512), (4096, 512)):
        ms = bench_attention(be, n_kv, L)
        print(f"  n_kv={n_kv:<6} L={L:<5}{'':<18} {ms:>8.3f}")
        rows_out.append({"what": "attention", "n_kv": n_kv, "L": L, "ms": ms})
    bench_gdn_rows(be, rows_out)
    _write_json(args.json, rows_out)


# cmp_matmul_q8_ex kernel bits of each prefill GEMM route (T > 16: the GEMM; the GEMV bits do not matter there)
GEMM_ROUTES = {"dp4a": 3, "mma": 3 | 256}
GEMM_SHAPES_9B = [("ffn up", 12288, 4096), ("ffn down", 4096, 12288), ("ssm_out", 4096, 4096)]


def bench_gemm_routes(be: CudaBackend, routes: list[str], rows_out: list) -> None:
    """The prefill GEMM (Q8_0 weights) per route: ms, TOPS (2 * rows * n * T per call), speed-up over routes[0]."""
    print(f"device: {be.native.device_name()}   date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'gemm':<10} {'rows':>6} {'n':>6} {'T':>5} {'route':>6} {'ms':>8} {'TOPS':>7} {'vs ' + routes[0]:>8}")
    for name, rows, n in GEMM_SHAPES_9B:
        pool = WeightPool(be, rows, n)
        for T in (512, 4096):
            first = None
            for route in routes:
                ms = bench_matmul(be, pool, T, GEMM_ROUTES[route])
                tops = 2.0 * rows * n * T / ms / 1e9
                first = first or ms
                print(f"{name:<10} {rows:>6} {n:>6} {T:>5} {route:>6} {ms:>8.3f} {tops:>7.1f} {first / ms:>7.2f}x",
                      flush=True)
                rows_out.append({"what": f"gemm {name}", "route": route, "rows": rows, "n": n, "T": T, "ms": ms,
                                 "TOPS": tops})
        del pool


# The projections whose launches fill an H200's waves worst at 512 tokens (128 x 128 tiles, one block an SM): 27B
# down / out (5120 rows: 160 tiles on 132 SMs), 27B attention q+k+v (14336: 448), 9B attention q+k+v (10240: 320),
# and two that fill them well (27B gate+up: 1088 tiles, 9B down: 128). gemm_w16_kernel's 128 x 64 tiles at two
# blocks an SM (branch next/w16x2) are twice the tiles on twice the slots: the same fill.
GEMM_PIECE_SHAPES = [("27b down", 5120, 17408), ("27b ssm_out", 5120, 6144), ("27b attn qkv", 14336, 5120),
                     ("27b gate+up", 34816, 5120), ("9b attn qkv", 10240, 4096), ("9b down", 4096, 12288)]


def bench_gemm_pieces(be: CudaBackend, rows_out: list) -> None:
    """The DP4A GEMM (Q8_0) with each launch's serial pieces of K (gemm_chunks.h serial_pieces) against whole tiles:
    ms, TOPS, speed-up. Both give the same bits (tests/test_kernels_cuda.py)."""
    print(f"device: {be.native.device_name()}   date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'gemm':<13} {'rows':>6} {'n':>6} {'T':>5} {'whole ms':>9} {'pieces ms':>9} {'TOPS':>6} {'gain':>6}")
    for name, rows, n in GEMM_PIECE_SHAPES:
        pool = WeightPool(be, rows, n)
        for T in (512, 4096):
            ms = {}
            for pieces in (1, 0):
                be.native.cmp_set_serial_pieces(pieces)
                try:
                    ms[pieces] = bench_matmul(be, pool, T, GEMM_ROUTES["dp4a"])
                finally:
                    be.native.cmp_set_serial_pieces(0)
            tops = 2.0 * rows * n * T / ms[0] / 1e9
            print(f"{name:<13} {rows:>6} {n:>6} {T:>5} {ms[1]:>9.3f} {ms[0]:>9.3f} {tops:>6.1f} {ms[1] / ms[0]:>5.2f}x",
                  flush=True)
            rows_out.append({"what": f"gemm pieces {name}", "rows": rows, "n": n, "T": T, "whole ms": ms[1],
                             "pieces ms": ms[0], "TOPS": tops})
        del pool


def bench_gdn_rows(be: CudaBackend, rows_out: list) -> None:
    print(f"{'gdn (9B heads)':<20} {'scan ms':>10} {'chunked ms':>11} {'speed-up':>9}")
    for L in (1, 512, 4096, 16384):
        scan = bench_gdn(be, L)
        chunk = bench_gdn(be, L, chunked=True)
        print(f"  L={L:<16} {scan:>10.3f} {chunk:>11.3f} {scan / chunk:>8.2f}x")
        rows_out.append({"what": "gdn", "L": L, "scan ms": scan, "chunked ms": chunk})
    for R in (1, 4):
        ms = bench_argmax(be, R, 248320)
        print(f"argmax R={R} N=248320 {ms * 1e3:>10.1f} us")
        rows_out.append({"what": "argmax", "R": R, "N": 248320, "ms": ms})


def _write_json(path: str | None, rows_out: list) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
