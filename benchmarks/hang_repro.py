"""The round-1 attention hang (cuda_src/attention.cu attention_kernel, head dims 32/96/192), outside pytest: the
shapes of the CUDA tests that never finished on the H200 (2026-12-02), through CudaBackend.attention, each call
checked against numpy_ref and timed, with a watchdog that dumps the Python stack and exits where a call does not
come back.

    python3 benchmarks/hang_repro.py [--case k32a,k32b,r192,r96] [--kv f16,f32] [--cap device] [--pdl on|off]
                                     [--reps 3] [--dirty] [--watchdog 10]

The cause (fixed in next/hang): the kernel read its per-row flags live[] / p[] of rows past the end uninitialised,
so a warp of such rows could run a full-mask __shfl_sync on some lanes only while the others waited at the next
tile's __syncthreads. Whether it hangs depends on what the registers held before (the previous kernels on that
SM): --dirty runs a register-heavy v2 prefill (head dim 256) before each call to leave data in them. A hang needs a
block with rows past the end and more than one 32-key tile, as in every case here.

Run with CUDA_LAUNCH_BLOCKING=1 so that the stack names the launch that never completes (cmp_attention, which
launches attention_kernel and, split, attention_merge_kernel). LLAMACMP_LIB picks the library (the one before the
fix: the hang; after it: every line `ok`). Exit status 0: every call came back within tolerance; 1 from the
watchdog (faulthandler: `Timeout (0:00:10)!` and the stack); 2: a wrong result.
"""
from __future__ import annotations

import argparse
import faulthandler
import sys
import time

import numpy as np

from llamacmp.backends.base import StepBatch
from llamacmp.backends.cuda import CudaBackend
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.config import ModelConfig

REF = NumpyBackend()
# name -> (Dh, Hq, Hk, segment lengths, n_past per segment): the tests that hung
CASES = {
    "k32a": (32, 4, 2, [2], [4097]),                  # test_kernels_cuda::test_attention[lengths4-n_past4-32-4-2-f16]
    "k32b": (32, 4, 2, [65, 1, 7], [3, 600, 31]),     # ...[lengths3-n_past3-32-4-2-f16]
    "r192": (192, 8, 2, [70, 1], [0, 600]),           # test_attention_cuda::test_round1_head_dims_match[*-192-*]
    "r96": (96, 8, 2, [70, 1], [0, 600]),             # ...[*-96-*]
}
CAPS = {"sm61": 48 * 1024, "sm75": 64 * 1024, "sm70": 96 * 1024, "device": 0}   # tests/cuda_helpers.SMEM_CAPS
TOL = 1e-4


def cfg_for(Hq: int, Hk: int, Dh: int) -> ModelConfig:
    return ModelConfig(n_layer=4, n_embd=64, n_ff=128, n_head=Hq, n_head_kv=Hk, head_dim=Dh, n_vocab=97,
                       n_ctx_train=1 << 18, rms_eps=1e-6, rope_base=1e7, n_rot=16, rope_sections=(0, 0, 0, 0),
                       conv_kernel=4, ssm_k_heads=2, ssm_v_heads=4, ssm_head_dim=32, full_attention_interval=4)


def states(be, cfg, n_ctx, kv, n_past, rng):
    """numpy and CUDA states holding the same random rows below n_past (tests/test_kernels_cuda._states)."""
    s_ref, s_dev = REF.new_state(cfg, n_ctx, kv), be.new_state(cfg, n_ctx, kv)
    for a_ref, a_dev in ((s_ref.k[0], s_dev.k[0]), (s_ref.v[0], s_dev.v[0])):
        a_ref[:n_past] = rng.standard_normal(a_ref[:n_past].shape)
        be.copy_from_host(a_dev, a_ref)
    s_ref.n_past = s_dev.n_past = n_past
    return s_ref, s_dev


class Dirt:
    """A v2 prefill at head dim 256 (16 q / 4 kv heads, 512 tokens): many blocks of a register-heavy kernel on
    every SM, whose last register values the next kernel's warps find in the registers they do not write."""

    def __init__(self, be, rng):
        self.be, self.cfg = be, cfg_for(16, 4, 256)
        self.q = be.from_host(rng.standard_normal((512, 16, 256)).astype(np.float32), "f32")
        self.k = be.from_host(rng.standard_normal((512, 4, 256)).astype(np.float32), "f32")
        self.v = be.from_host(rng.standard_normal((512, 4 * 256)).astype(np.float32), "f32")
        self.state = be.new_state(self.cfg, 512, "f16")

    def __call__(self):
        self.state.n_past = 0
        self.be.attention(self.q, self.k, self.v, StepBatch.build([(self.state, [0] * 512)]), 0, self.cfg)
        self.be.synchronize()


def run_case(be, name, kv, rep, dirt, watchdog) -> tuple[float, float]:
    """One attention call of CASES[name] -> (relative L2 error against numpy_ref, ms until the result is on the
    host)."""
    Dh, Hq, Hk, lengths, n_past = CASES[name]
    rng = np.random.default_rng(1000 * rep + Dh + sum(n_past))
    cfg = cfg_for(Hq, Hk, Dh)
    pairs = [states(be, cfg, max(n_past) + max(lengths) + 3, kv, p, rng) for p in n_past]
    b_ref = StepBatch.build([(s, [0] * n) for (s, _), n in zip(pairs, lengths)])
    b_dev = StepBatch.build([(s, [0] * n) for (_, s), n in zip(pairs, lengths)])
    T = sum(lengths)
    q = rng.standard_normal((T, Hq, Dh)).astype(np.float32)
    k = rng.standard_normal((T, Hk, Dh)).astype(np.float32)
    v = rng.standard_normal((T, Hk * Dh)).astype(np.float32)
    ref = REF.attention(q, k, v, b_ref, 0, cfg)
    up = [be.from_host(a, "f32") for a in (q, k, v)]
    if dirt is not None:
        dirt()
    print(f"{name} kv={kv} rep={rep}: Dh {Dh} Hq {Hq} Hk {Hk} lengths {lengths} n_past {n_past} ...", flush=True)
    faulthandler.dump_traceback_later(watchdog, exit=True)
    t0 = time.perf_counter()
    got = be.to_host(be.attention(*up, b_dev, 0, cfg))
    ms = (time.perf_counter() - t0) * 1e3
    faulthandler.cancel_dump_traceback_later()
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref)), ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--kv", default="f16,f32")
    ap.add_argument("--cap", default="device", help="comma-separated shared-memory caps: " + ", ".join(CAPS))
    ap.add_argument("--pdl", choices=("on", "off"), default="on",
                    help="off: CudaBackend.launch_pdl and gemv_pdl False (no kernel launched with PDL)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dirty", action="store_true", help="a register-heavy v2 prefill before each call")
    ap.add_argument("--watchdog", type=float, default=10.0, help="seconds a call may take (normal: < 0.1)")
    a = ap.parse_args()
    be = CudaBackend()
    be.launch_pdl = be.gemv_pdl = a.pdl == "on"
    print(f"device {be.native.device_name()}, launch_pdl {be.launch_pdl}, gemv_pdl {be.gemv_pdl}", flush=True)
    dirt = Dirt(be, np.random.default_rng(7)) if a.dirty else None
    bad = 0
    for cap in a.cap.split(","):
        be.native.cmp_set_smem_cap(CAPS[cap])
        for name in a.case.split(","):
            for kv in a.kv.split(","):
                for rep in range(a.reps):
                    err, ms = run_case(be, name, kv, rep, dirt, a.watchdog)
                    ok = err < TOL
                    bad += not ok
                    print(f"  cap {cap}: {'ok' if ok else 'WRONG'} rel {err:.2e}, {ms:.1f} ms", flush=True)
    be.native.cmp_set_smem_cap(0)
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
