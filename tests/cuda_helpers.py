"""Helpers shared by the CUDA op tests (test_kernels_cuda, test_vision_cuda, test_attention_cuda): the error
measure they hold kernels to, NaN-poisoned outputs, uploads, and the shared-memory caps of older cards."""
from __future__ import annotations

import numpy as np

# Shared memory per block of older cards (api.h cmp_set_smem_cap): the CUDA tests of prefill attention, the quant
# GEMM and the model's logits run under each (conftest.py smem_cap), so that a large GPU runs the configurations
# those cards pick (cuda_src/smem_plan.h; tests/test_smem_plan.py checks that the caps reach every one). 0: the
# device's own limit.
SMEM_CAPS = {"sm61": 48 * 1024, "sm75": 64 * 1024, "sm70": 96 * 1024, "device": 0}


def rel(a, b) -> float:
    """Relative L2 error of `a` against the reference `b` (same shape); fails on a non-finite element of `a`."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), "non-finite output (an element left unwritten?)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def poison(be, *shapes):
    """Allocate f32 blocks of these shapes, fill them with NaN and free them: the next allocations of the same
    sizes (the op's outputs) get these blocks back."""
    ts = [be.empty(s) for s in shapes]
    for t in ts:
        be.native.cmp_memset(t.ptr, 0xFF, t.nbytes)
    del ts


def up(be, a):
    """Upload a host array to `be` as f32."""
    return be.from_host(np.asarray(a, np.float32), "f32")


INT8_DOTS = ("dp4a", "dp2a", "imad")   # the quantized matmuls' routes (llamacmp/backends/routes.py)


class routed:
    """`with routed(be, "dp2a"):` runs the CUDA backend's quantized matmuls (decode and prefill) on that int8 dot,
    as --hw-route dp2a does, and puts the backend's routes back after."""

    def __init__(self, be, dot: str):
        from llamacmp.backends.routes import Routes
        # a prefill GEMM on the tensor cores (conftest's gemm_backend) stays there: its GEMV takes the dot
        prefill = "mma" if be.routes.matmul_prefill == "mma" else dot
        self.be, self.routes = be, Routes(matmul_prefill=prefill, matmul_decode=dot)

    def __enter__(self):
        self.saved, self.be.routes = self.be.routes, self.routes
        return self.be

    def __exit__(self, *exc):
        self.be.routes = self.saved


def dot_bits(dot: str) -> int:
    """cmp_matmul_q8_ex / cmp_matmul_quant kernel bits that put the GEMV and the GEMM on `dot`."""
    from llamacmp.lib._native import CMP_DOTS, CMP_MM_GEMM_DOT_SHIFT, CMP_MM_GEMV_DOT_SHIFT
    return CMP_DOTS[dot] << CMP_MM_GEMV_DOT_SHIFT | CMP_DOTS[dot] << CMP_MM_GEMM_DOT_SHIFT


def captured(be, op):
    """Run op() inside a CUDA graph capture, then replay the graph once -> (op's outputs as host arrays, the
    graph's kernel launches). op must not copy from the host (nothing runs while capturing)."""
    be.native.cmp_graph_begin()
    outs = op()
    exec_ = be.native.graph_end()
    kernels = be.native.graph_kernels()
    try:
        be.native.cmp_graph_launch(exec_)
        be.native.cmp_synchronize()
    finally:
        be.native.cmp_graph_destroy(exec_)
    return [be.to_host(o) for o in outs], kernels


class on_dp4a:
    """`with on_dp4a(be):` every quantized matmul on DP4A (decode and prefill: no tensor cores), routes restored
    after."""

    def __init__(self, be):
        self.be = be

    def __enter__(self):
        from llamacmp.backends.routes import Routes
        self.saved, self.be.routes = self.be.routes, Routes()
        return self.be

    def __exit__(self, *exc):
        self.be.routes = self.saved
