"""The default kernels use no tensor-core instruction: the SASS of libcmpkern.so holds no HMMA, IMMA, HGMMA or
QGMMA (nor the PTX any mma/wmma/wgmma) outside the kernels that exist to use them (TENSOR_CORE_KERNELS: the probe's
timing kernels and the mma routes' GEMMs and attention, matmul_mma.cu, matmul_hmma.cu (Volta's) and
attention_mma.cu), and it does hold DP4A (IDP.4A). Per route (issue 20): the DP2A instantiations of the quantized
matmuls hold no IDP.4A, the IMAD ones neither IDP.4A nor IDP.2A. Runs without a GPU: cuobjdump comes from the PyPI
package nvidia-cuda-cuobjdump (with nvidia-cuda-nvdisasm for -sass), triton's bundled copy, or PATH."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from sass_tools import (HMMA_GEMM_KERNEL, cuobjdump_candidates, hmma_gemm_findings, ptx_mma_hits, run_cuobjdump,
                        sass_functions, tensor_core_hits, tensor_core_ops)

from llamacmp.lib._native import library_path


def _dump(tool, flag: str, lib) -> str:
    """cuobjdump's text, once per (tool, flag, library) for the whole module: six tests read the same dump, which
    for a library of every CUDA 13 architecture is hundreds of MB and minutes of the 2-core CI's time."""
    return _dump_once(str(tool), flag, str(lib))


@functools.lru_cache(maxsize=2)
def _dump_once(tool: str, flag: str, lib: str) -> str:
    r = run_cuobjdump(Path(tool), flag, Path(lib))
    assert r.returncode == 0, f"{tool} {flag} failed: {r.stderr[-2000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def tool_and_lib():
    lib = library_path()
    if not lib.exists():
        pytest.skip(f"{lib} is not built (run `make`)")
    tool = next(cuobjdump_candidates(), None)
    if tool is None:
        pytest.skip("no cuobjdump: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (or triton==3.3.1)")
    return tool, lib


MMA_KERNEL = "gemm_mma_kernel"   # the mma GEMM route's kernel (matmul_mma.cu)
ATTN_MMA_KERNEL = "attn_prefill_mma_kernel"   # the mma attention route's (attention_mma.cu)


def _sass_functions(tool, lib) -> dict[str, str]:
    """mangled name -> SASS body, every function of every arch in the library (split once per module too)."""
    return _functions_once(str(tool), str(lib))


@functools.lru_cache(maxsize=1)
def _functions_once(tool: str, lib: str) -> dict[str, str]:
    sass = _dump(tool, "-sass", lib)
    assert "Function" in sass, "cuobjdump printed no SASS"
    return sass_functions(sass)


def test_sass_has_no_tensor_core_instructions(tool_and_lib):
    tool, lib = tool_and_lib
    sass = _dump(tool, "-sass", lib)
    assert "Function" in sass, "cuobjdump printed no SASS"
    hits = tensor_core_hits(_sass_functions(tool, lib))
    assert not hits, f"tensor-core instructions in the SASS: {hits[:5]}"
    assert "IDP.4A" in sass, "no DP4A (IDP.4A) in the SASS: the Q8 kernels are not using it"


def test_mma_kernels_use_int8_tensor_cores(tool_and_lib):
    """Every instantiation of the mma route's GEMM (5 expanded weight forms and the 3 types it reads directly, Q2_K,
    Q4_K and Q5_K, x 4 ring shapes) multiplies with IMMA and has no DP4A; in a library with SASS for sm_70 and
    older only (tools/build_sm70.sh) the kernels are empty (the route is refused there at run time), so they hold no
    tensor-core instruction either."""
    tool, lib = tool_and_lib
    sass = _dump(tool, "-sass", lib)
    mma = {n: b for n, b in _sass_functions(tool, lib).items() if MMA_KERNEL in n}
    assert len(mma) >= 32, f"{len(mma)} {MMA_KERNEL} instantiations in the SASS"
    archs = {int(a) for a in re.findall(r"code for sm_(\d+)", sass)}
    assert archs, "cuobjdump -sass named no architecture"
    if max(archs) < 75:
        hits = sorted({h for b in mma.values() for h in tensor_core_ops(b)})
        assert not hits, f"tensor-core instructions in an sm_{max(archs)} build: {hits}"
        return
    lacking = [n for n, b in mma.items() if "IMMA" not in b or "IDP.4A" in b]
    assert not lacking, f"{MMA_KERNEL} without IMMA or with DP4A: {lacking[:3]}"


def test_ptx_mma_only_in_the_mma_route(tool_and_lib):
    tool, lib = tool_and_lib
    ptx = _dump(tool, "-ptx", lib)
    assert ".target sm_" in ptx and ".entry" in ptx, "cuobjdump -ptx printed no PTX: nothing was checked"
    hits = ptx_mma_hits(ptx)
    assert not hits, f"matrix instructions in the PTX: {hits[:5]}"
    # the mma route's GEMM: compute_75+ PTX multiplies with mma.sync; compute_70 and older PTX has it empty (refused
    # at run time)
    targets = [int(t) for t in re.findall(r"\.target sm_(\d+)", ptx)]
    mma = [e for e in ptx.split(".entry ")[1:] if MMA_KERNEL in e.split("(", 1)[0]]
    assert mma and targets, "no mma-route entries or no .target in the PTX"
    assert all(("mma.sync" in e) == (max(targets) >= 75) for e in mma)
    attn = [e for e in ptx.split(".entry ")[1:] if ATTN_MMA_KERNEL in e.split("(", 1)[0]]
    assert len(attn) == 3, f"{len(attn)} {ATTN_MMA_KERNEL} entries (head dims 64, 128, 256)"
    # the f16 m16n8k16 shape needs compute_80; older PTX has the kernel empty (refused at run time)
    assert all(("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in e) == (max(targets) >= 80) for e in attn)


def test_volta_gemm_uses_hmma_884(tool_and_lib):
    """Volta's GEMM (matmul_hmma.cu): HMMA.884 in every instantiation of the sm_70 / sm_75 SASS (sm_80+ have no
    m8n8k4 unit: there ptxas emulates it), none below sm_70; its PTX holds m8n8k4 from compute_70 on, nothing older.
    `make ptx70`'s build: tests/test_old_arch_builds.py."""
    tool, lib = tool_and_lib
    assert not hmma_gemm_findings(_dump(tool, "-sass", lib), _sass_functions(tool, lib))
    ptx = _dump(tool, "-ptx", lib)
    targets = [int(t) for t in re.findall(r"\.target sm_(\d+)", ptx)]
    hmma = [e for e in ptx.split(".entry ")[1:] if HMMA_GEMM_KERNEL in e.split("(", 1)[0]]
    assert hmma and targets, "no Volta GEMM entries or no .target in the PTX"
    assert all(("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32" in e) == (max(targets) >= 70) for e in hmma)


def test_attention_mma_kernel_uses_f16_tensor_cores(tool_and_lib):
    """The mma attention route multiplies with HMMA where the code is sm_80+, and has no instruction at all of the
    tensor cores in older builds (its kernels are empty there)."""
    tool, lib = tool_and_lib
    sass = _dump(tool, "-sass", lib)
    attn = {n: b for n, b in _sass_functions(tool, lib).items() if ATTN_MMA_KERNEL in n}
    assert len(attn) == 3, f"{len(attn)} {ATTN_MMA_KERNEL} instantiations in the SASS"
    archs = {int(a) for a in re.findall(r"code for sm_(\d+)", sass)}
    if max(archs) < 80:
        assert not sorted({h for b in attn.values() for h in tensor_core_ops(b)})
        return
    assert all("HMMA" in b for b in attn.values()), "attn_prefill_mma_kernel without HMMA"


# The route-templated kernels of the quantized matmuls (matmul_q8.cu, matmul_quant.cu): the dot type in the mangled
# name -> (an instruction each instantiation must hold, instructions none may hold).
ROUTE_KERNELS = ("gemv_q8_kernel", "gemv_q8_batch_kernel", "gemm_q8_kernel", "gemm2_q8_kernel", "gemv_quant_kernel",
                 "gemm_quant_kernel", "half_sums_kernel")
ROUTE_SASS = {"DotDp4a": ("IDP.4A", ("IDP.2A",)), "DotDp2a": ("IDP.2A", ("IDP.4A",)),
              "DotImad": ("IMAD", ("IDP.4A", "IDP.2A"))}


def test_each_route_uses_only_its_unit(tool_and_lib):
    tool, lib = tool_and_lib
    funcs = _sass_functions(tool, lib)
    for kernel in ROUTE_KERNELS:
        for dot, (needed, banned) in ROUTE_SASS.items():
            bodies = {n: b for n, b in funcs.items() if kernel in n and dot in n}
            assert bodies, f"no {kernel} instantiation for {dot} in the SASS"
            for name, body in bodies.items():
                assert needed in body, f"{name}: no {needed}"
                bad = [op for op in banned if op in body] + tensor_core_ops(body)
                assert not bad, f"{name} ({dot}) holds {bad}"


# The kernels of the block-quantized types (matmul_quant.cu; gemm_w16.cuh's GEMM, Q8_0's too, DP4A only):
# every DP4A-route instantiation is present and multiplies by DP4A (the other routes:
# test_each_route_uses_only_its_unit).
QUANT_DP4A_KERNELS = ("gemv_quant_kernel", "gemm_quant_kernel", "gemm_w16_kernel")


def test_quant_kernels_use_dp4a(tool_and_lib):
    tool, lib = tool_and_lib
    funcs = _dump(tool, "-sass", lib).split("Function : ")[1:]
    for kernel in QUANT_DP4A_KERNELS:
        bodies = [f for f in funcs if kernel in f.split("\n", 1)[0] and "DotDp4a" in f.split("\n", 1)[0]]
        assert bodies, f"no {kernel} in the SASS"
        lacking = [f.split("\n", 1)[0] for f in bodies if "IDP.4A" not in f]
        assert not lacking, f"{kernel} instantiations without DP4A: {lacking[:3]}"
        hits = sorted({h for f in bodies for h in tensor_core_ops(f)})
        assert not hits, f"tensor-core instructions in {kernel}: {hits}"
