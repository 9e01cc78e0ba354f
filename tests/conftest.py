"""Shared fixtures: tiny qwen35 GGUFs written by the project's own fixture writer (cached per session)."""
from __future__ import annotations

import pytest

from llamacmp.fixtures.writer import SHAPES, write_model


@pytest.fixture(scope="session")
def tiny_vocab():
    from llamacmp.fixtures.qwen_vocab import tiny_vocab as build
    return build()


@pytest.fixture(scope="session")
def fixture_gguf(tmp_path_factory, tiny_vocab):
    """fixture_gguf(shape, dtype) -> path of a random-weight qwen35 GGUF with the tiny vocabulary."""
    made = {}

    def make(shape: str = "tiny", dtype: str = "f32", seed: int = 0):
        key = (shape, dtype, seed)
        if key not in made:
            path = tmp_path_factory.mktemp("gguf") / f"{shape}-{dtype}-{seed}.gguf"
            made[key] = write_model(path, SHAPES[shape], dtype, tiny_vocab, seed=seed)
        return made[key]

    return make


@pytest.fixture(params=["dp4a", "mma", "hmma"])
def gemm_backend(cuda_backend, request):
    """cuda_backend with its prefill GEMM route (routes.Routes.matmul_prefill) set to each route in turn: the GEMM
    tests run once per route against the same reference and tolerance. mma: the device's tensor-core GEMM (int8
    mma.sync from compute_75 code, Volta's f16 HMMA on compute_70); hmma: Volta's forced (CudaBackend.mma_gemm) on
    any card, so that an H200 runs it. Skipped, saying why, only where the device runs no such code."""
    from dataclasses import replace
    be, saved = cuda_backend, cuda_backend.routes
    if request.param == "mma" and not be.native.mma_available():
        pytest.skip("the mma route needs compute capability 7.0+ code for this device (mma.sync)")
    if request.param == "hmma" and not be.native.hmma_available():
        pytest.skip("Volta's f16 HMMA GEMM needs compute capability 7.0+ code for this device (mma.sync m8n8k4)")
    be.routes = replace(saved, matmul_prefill="dp4a" if request.param == "dp4a" else "mma")
    be.mma_gemm = "hmma" if request.param == "hmma" else "auto"
    yield be
    be.routes, be.mma_gemm = saved, "auto"


@pytest.fixture(params=["fp32", "mma"])
def attn_backend(cuda_backend, request):
    """cuda_backend with its attention prefill route (routes.Routes.attn_prefill) set to each route in turn: the
    attention tests run once per route against the same reference and tolerance. mma is skipped, saying why, only
    where the device runs no such code."""
    from dataclasses import replace
    be, saved = cuda_backend, cuda_backend.routes
    if request.param == "mma" and not be.native.attn_mma_available():
        pytest.skip("the mma attention route needs compute capability 8.0+ code for this device (f16 mma.sync)")
    be.routes = replace(saved, attn_prefill=request.param)
    yield be
    be.routes = saved


@pytest.fixture(params=["sm61", "sm75", "sm70", "device"])
def smem_cap(cuda_backend, request):
    """Every kernel of cuda_backend sized by an older card's shared memory per block (cuda_helpers.SMEM_CAPS, api.h
    cmp_set_smem_cap) in turn -> the cap (0: the device's own). The mma GEMM route is not tested under sm_61's cap:
    that card has no int8 mma (the route is refused there); nor the mma attention route under any cap (it needs
    compute capability 8.0+, whose cards all lend more than the caps)."""
    from cuda_helpers import SMEM_CAPS
    params = getattr(request.node, "callspec", None)
    if request.param == "sm61" and params is not None and params.params.get("gemm_backend") in ("mma", "hmma"):
        pytest.skip("sm_61 runs no mma.sync code: the mma route is refused there")
    if request.param != "device" and params is not None and params.params.get("attn_backend") == "mma":
        pytest.skip("the f16 mma attention needs sm_80+, whose cards lend more shared memory than this cap")
    cap = SMEM_CAPS[request.param]
    cuda_backend.native.cmp_set_smem_cap(cap)
    try:
        yield cap
    finally:
        cuda_backend.native.cmp_set_smem_cap(0)


@pytest.fixture(scope="session")
def cuda_backend():
    """One CudaBackend for the session, or a skip that says why there is none."""
    from llamacmp.lib._native import library_path
    from llamacmp.backends.cuda import CudaBackend, cuda_available
    if not library_path().exists():
        pytest.skip(f"{library_path()} is not built (run `make`; needs nvcc)")
    if not cuda_available():
        pytest.skip("libcmpkern.so loads but sees no CUDA GPU (or the driver is too old for its runtime)")
    return CudaBackend()
