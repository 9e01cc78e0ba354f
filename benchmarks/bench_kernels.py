"""Kernel timings on the GPU against measured ceilings: device copy bandwidth, Q8 GEMV (decode) GB/s, Q8 GEMM
(prefill) DP4A TOPS, attention and GDN. Weights rotate over a buffer several times the L2, so the GEMV reads
come from memory, not cache. Prints a table; `--json PATH` also writes the rows.

    python3 benchmarks/bench_kernels.py [--quick] [--json out.json]
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


def timed(be: CudaBackend, fn, reps: int) -> float:
    """Median ms per call over `reps` calls (device events around each batch of calls), after a warm-up."""
    fn(0)
    be.synchronize()
    samples = []
    for r in range(5):
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


def bench_matmul(be: CudaBackend, pool: WeightPool, T: int) -> float:
    """-> ms per call of y [T, rows] = x . W^T, rotating over the pool's copies."""
    rows, n = pool.rows, pool.n
    x = be.from_host(np.random.default_rng(T).standard_normal((T, n)).astype(np.float32), "f32")
    xq, xd = be.quantize(x)
    y = be.empty((T, rows))
    call = be.native.cmp_matmul_q8

    def run(i):
        c = i % pool.copies
        call(xq.ptr, xd.ptr, pool.qs.ptr + c * rows * n, pool.d.ptr + c * rows * (n // 32) * 2, y.ptr, T, rows, n)
    return timed(be, run, 20 if T <= 16 else 3)


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
    scan (cmp_gdn) or the chunked WY/UT kernel (cmp_gdn_chunked)."""
    K, V, Dk = 16, 32, 128
    rng = np.random.default_rng(2)
    C = (2 * K + V) * Dk
    qkv = be.from_host(rng.standard_normal((L, C)).astype(np.float32), "f32")
    g = be.from_host(-rng.uniform(0, 1, (L, V)).astype(np.float32), "f32")
    b = be.from_host(rng.uniform(0, 1, (L, V)).astype(np.float32), "f32")
    S = be.zeros((V, Dk, Dk), "f32", "state")
    o = be.empty((L, V * Dk))
    fn = be.native.cmp_gdn_chunked if chunked else be.native.cmp_gdn
    return timed(be, lambda i: fn(qkv.ptr, g.ptr, b.ptr, S.ptr, o.ptr, L, K, V, Dk, 1e-6), 3)


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
    args = ap.parse_args(argv)
    be = CudaBackend()
    rows_out = []
    if args.gdn_only:
        bench_gdn_rows(be, rows_out)
        _write_json(args.json, rows_out)
        return
    bw = copy_bandwidth(be)
    print(f"device: {be.native.device_name()}   date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"device-to-device copy: {bw:.0f} GB/s (read + write)")
    rows_out.append({"what": "copy", "GB/s": bw})
    print(f"{'matmul':<10} {'rows':>6} {'n':>6} {'T':>4} {'ms':>8} {'GB/s':>7} {'%copy':>6} {'TOPS':>7}")
    for name, rows, n in (SHAPES_9B[:3] if args.quick else SHAPES_9B):
        pool = WeightPool(be, rows, n)
        for T in (1, 2, 4, 8, 512):
            ms = bench_matmul(be, pool, T)
            gbs = pool.wbytes / ms / 1e6
            tops = 2.0 * rows * n * T / ms / 1e9
            print(f"{name:<10} {rows:>6} {n:>6} {T:>4} {ms:>8.4f} {gbs:>7.0f} {100 * gbs / bw:>5.0f}% {tops:>7.1f}")
            rows_out.append({"what": f"matmul_q8 {name}", "rows": rows, "n": n, "T": T, "ms": ms, "GB/s": gbs,
                             "TOPS": tops})
    if args.matmul_only:
        return
    print(f"{'attention (9B heads, f16 KV)':<34} {'ms':>8}")
    for n_kv, L in ((4096, 1), (32768, 1), (512, 512), (4096, 512)):
        ms = bench_attention(be, n_kv, L)
        print(f"  n_kv={n_kv:<6} L={L:<5}{'':<18} {ms:>8.3f}")
        rows_out.append({"what": "attention", "n_kv": n_kv, "L": L, "ms": ms})
    bench_gdn_rows(be, rows_out)
    _write_json(args.json, rows_out)


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
