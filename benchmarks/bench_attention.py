"""Attention kernel timings with the 9B heads (16 q / 4 kv heads, head dim 256): the v2 kernels
(FlashAttention-2-style prefill, split-K decode) per KV cache type (the round-1 kernel they replaced at this head
dim is gone; its figures are in RESULTS.md); also run by
`python3 benchmarks/bench_kernels.py --attention-only`.

    python3 benchmarks/bench_attention.py [--quick] [--json out.json]
    python3 benchmarks/bench_attention.py --decode-only [--n-kv 32768,131072]   (issue 7: tq3 vs f16 decode)
    python3 benchmarks/bench_attention.py --ubatch 512      (prefill as the model runs it: 512-row ubatches)

Each call is one layer's attention op as the model runs it (KV write of the new rows + attention). Prefill rows
are causal over the segment itself (n_kv = L, as in pp512 / pp4096 / pp16384), or with --ubatch U the last U-row
ubatch of such a prompt (U rows at the end of n_kv keys: the launch the model makes last, the largest); decode rows
are one token over n_kv keys. Figures printed: ms per call; prefill TFLOPS counted as 4 * Hq * Dh * (causal q.k pairs) (S and PV,
2 flops per FMA) against the FP32 FMA ceiling; decode GB/s counted as the K+V bytes of n_kv rows.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from llamacmp import kv_layout
from llamacmp.backends.base import StepBatch
from llamacmp.backends.cuda import CudaBackend
from llamacmp.config import ModelConfig

HQ, HK, DH = 16, 4, 256


def _cfg() -> ModelConfig:
    return ModelConfig(n_layer=4, n_embd=4096, n_ff=12288, n_head=HQ, n_head_kv=HK, head_dim=DH, n_vocab=1000,
                       n_ctx_train=262144, rms_eps=1e-6, rope_base=1e7, n_rot=64, rope_sections=(0, 0, 0, 0),
                       conv_kernel=4, ssm_k_heads=16, ssm_v_heads=32, ssm_head_dim=128, full_attention_interval=4)


def timed(be: CudaBackend, fn, reps: int, samples: int = 3) -> float:
    """Median ms per call (device events around each batch of calls), after a warm-up call."""
    fn()
    be.synchronize()
    out = []
    for _ in range(samples):
        be.native.cmp_timer_start()
        for _ in range(reps):
            fn()
        out.append(be.native.timer_stop() / reps)
    return float(np.median(out))


def bench_case(be: CudaBackend, n_kv: int, L: int, kt: str, vt: str, reps: int) -> float:
    """ms per attention call: L new rows at positions n_kv-L .. n_kv-1 of an n_kv-row cache."""
    cfg = _cfg()
    st = be.new_state(cfg, n_kv, kt, vt)
    rng = np.random.default_rng(1)
    fill_cache(be, st.k[0], kt, rng)
    fill_cache(be, st.v[0], vt, rng)
    st.n_past = n_kv - L
    q = be.from_host(rng.standard_normal((L, HQ, DH)).astype(np.float32), "f32")
    k = be.from_host(rng.standard_normal((L, HK, DH)).astype(np.float32), "f32")
    v = be.from_host(rng.standard_normal((L, HK * DH)).astype(np.float32), "f32")
    batch = StepBatch.build([(st, [0] * L)])
    return timed(be, lambda: be.attention(q, k, v, batch, 0, cfg), reps)


def fill_cache(be: CudaBackend, buf, kv_type: str, rng: np.random.Generator, period: int = 4096) -> None:
    """Valid rows of Gaussian values (kv_layout.encode), `period` rows tiled over the whole cache: codes vary across
    keys and lanes as in a real cache (a constant byte pattern would send every lane to the same table entry)."""
    row = HK * kv_layout.row_bytes(kv_type, DH)               # bytes of one token's rows
    n = buf.nbytes // row
    x = rng.standard_normal((min(period, n), HK, DH)).astype(np.float32)
    block = np.ascontiguousarray(kv_layout.encode(x, kv_type)).view(np.uint8).reshape(len(x), row)
    for r0 in range(0, n, len(block)):
        m = min(len(block), n - r0)
        be.native.cmp_memcpy_h2d(buf.ptr + r0 * row, block.ctypes.data, m * row)


DECODE_PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "tq3"), ("tq3", "tq3")]


def run(be: CudaBackend, quick: bool = False, decode_only: bool = False, n_kvs: tuple[int, ...] | None = None,
        ubatch: int = 0) -> list[dict]:
    rows = []
    fma_peak = FP32_PEAK_TFLOPS
    print(f"attention, 9B heads ({HQ} q / {HK} kv, Dh {DH}); FP32 FMA ceiling ~{fma_peak:.0f} TFLOPS")
    print(f"{'case':<28} {'K/V':<10} {'kern':>4} {'ms':>9} {'TFLOPS':>7} {'% fp32':>6} {'GB/s':>6} {'B/token':>8}")
    # prefill, causal over the segment itself
    for n_kv in (() if decode_only else (512, 4096, 16384)):
        L = min(ubatch, n_kv) if ubatch else n_kv
        flops = 4.0 * HQ * DH * (L * (n_kv - L) + L * (L + 1) / 2)   # row i of the L sees n_kv - L + i + 1 keys
        ms = bench_case(be, n_kv, L, "f16", "f16", 1 if L >= 4096 else 3)
        tf = flops / ms / 1e9
        case = f"prefill L={L}" + (f" @ {n_kv}" if L < n_kv else "")
        print(f"{case:<28} {'f16/f16':<10} {'v2':>4} {ms:>9.3f} {tf:>7.1f} "
              f"{100 * tf / fma_peak:>5.0f}% {'':>6} {'':>8}")
        rows.append({"what": "attn prefill", "L": L, "n_kv": n_kv, "kv": "f16/f16", "kernels": "v2", "ms": ms,
                     "TFLOPS": tf})
    # decode, one row over n_kv keys, per KV type
    if n_kvs is None:
        n_kvs = (4096, 32768) if quick else (4096, 32768, 131072)
    for n_kv in n_kvs:
        for kt, vt in DECODE_PAIRS:
            bpt = (kv_layout.row_bytes(kt, DH) + kv_layout.row_bytes(vt, DH)) * HK   # per token per layer
            ms = bench_case(be, n_kv, 1, kt, vt, 20)
            gbs = bpt * n_kv / ms / 1e6
            print(f"decode n_kv={n_kv:<15} {kt + '/' + vt:<10} {'v2':>4} {ms:>9.4f} {'':>7} "
                  f"{'':>6} {gbs:>6.0f} {bpt:>8}")
            rows.append({"what": "attn decode", "n_kv": n_kv, "kv": f"{kt}/{vt}", "kernels": "v2",
                         "ms": ms, "GB/s": gbs, "bytes/token/layer": bpt})
    decode_summary(rows)
    return rows


def decode_summary(rows: list[dict]) -> None:
    """Issue 7's criterion per context length: v2 decode with each quantized KV pair against f16/f16 (< 1 = faster)."""
    v2 = {(r["n_kv"], r["kv"]): r["ms"] for r in rows if r["what"] == "attn decode" and r["kernels"] == "v2"}
    for n_kv in sorted({n for n, _ in v2}):
        f16 = v2.get((n_kv, "f16/f16"))
        if not f16:
            continue
        ratios = "  ".join(f"{kv} {ms / f16:.2f}x" for (n, kv), ms in v2.items() if n == n_kv and kv != "f16/f16")
        print(f"decode n_kv={n_kv}: time vs f16/f16 ({f16:.4f} ms): {ratios}")


FP32_PEAK_TFLOPS = 67.0   # H200: 132 SMs x 128 FP32 lanes x ~1.98 GHz x 2 flops per FMA


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="decode at 4096 and 32768 keys only")
    ap.add_argument("--decode-only", action="store_true", help="skip the prefill cases")
    ap.add_argument("--n-kv", help="decode context lengths, comma-separated (default 4096,32768,131072)")
    ap.add_argument("--ubatch", type=int, default=0,
                    help="prefill rows: the last U-row ubatch of each prompt (the model's launches), not all at once")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    n_kvs = tuple(int(x) for x in args.n_kv.split(",")) if args.n_kv else None
    be = CudaBackend()
    print(f"device: {be.native.device_name()}   date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows = run(be, args.quick, args.decode_only, n_kvs, args.ubatch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
