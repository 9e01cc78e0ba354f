"""Tensor-core instructions live only in the kernels of the "mma" prefill routes (issue 20: matmul_mma.cu's
gemm_mma_kernel, attention_mma.cu's attn_prefill_mma_kernel); every kernel of the default route (routes.DEFAULT: DP4A, FP32) has no HMMA, IMMA, HGMMA or QGMMA
in its SASS (nor mma/wmma/wgmma in its PTX), and the Q8 kernels do hold DP4A (IDP.4A). Runs without a GPU:
cuobjdump comes from the PyPI package nvidia-cuda-cuobjdump (with nvidia-cuda-nvdisasm for -sass), triton's bundled
copy, or PATH."""
from __future__ import annotations

import re

import pytest
from sass_tools import TENSOR_CORE_PTX, TENSOR_CORE_SASS, cuobjdump_candidates, run_cuobjdump

from llamacmp.lib._native import library_path


def _dump(tool, flag: str, lib) -> str:
    r = run_cuobjdump(tool, flag, lib)
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


MMA_KERNEL = "gemm_mma_kernel"   # the mma GEMM route's kernels (matmul_mma.cu)
ATTN_MMA_KERNEL = "attn_prefill_mma_kernel"   # the mma attention route's (attention_mma.cu)


def _mma_route(name: str) -> bool:
    """Whether a kernel belongs to an mma route; every other kernel is the DP4A/FP32 routes'."""
    return MMA_KERNEL in name or ATTN_MMA_KERNEL in name


def _sass_functions(sass: str) -> dict[str, str]:
    """cuobjdump -sass -> {function name: its SASS} (over every architecture in the file: bodies concatenated)."""
    out: dict[str, str] = {}
    for f in sass.split("Function : ")[1:]:
        name, body = f.split("\n", 1)
        out[name.strip()] = out.get(name.strip(), "") + body
    return out


def _ptx_entries(ptx: str) -> dict[str, str]:
    """cuobjdump -ptx -> {entry name: its PTX up to the next entry}."""
    marks = list(re.finditer(r"\.entry\s+(\w+)\s*\(", ptx))
    return {m.group(1): ptx[m.end():(marks[i + 1].start() if i + 1 < len(marks) else len(ptx))]
            for i, m in enumerate(marks)}


def test_sass_tensor_cores_only_in_the_mma_route(tool_and_lib):
    tool, lib = tool_and_lib
    sass = _dump(tool, "-sass", lib)
    funcs = _sass_functions(sass)
    assert len(funcs) > 50, "cuobjdump printed no SASS functions"
    hits = {n: sorted(set(TENSOR_CORE_SASS.findall(b))) for n, b in funcs.items() if not _mma_route(n)}
    hits = {n: h for n, h in hits.items() if h}
    assert not hits, f"tensor-core instructions outside the mma route's kernels: {sorted(hits.items())[:3]}"
    assert "IDP.4A" in sass, "no DP4A (IDP.4A) in the SASS: the Q8 kernels are not using it"


def test_mma_kernels_use_int8_tensor_cores(tool_and_lib):
    """Every instantiation of the mma route's GEMM (5 weight forms x 4 ring shapes) multiplies with IMMA and has no
    DP4A; in a library with SASS for sm_70 and older only (tools/build_sm70.sh) the kernels are empty (the route is
    refused there at run time), so they hold no tensor-core instruction either."""
    tool, lib = tool_and_lib
    sass = _dump(tool, "-sass", lib)
    mma = {n: b for n, b in _sass_functions(sass).items() if MMA_KERNEL in n}
    assert len(mma) >= 20, f"{len(mma)} {MMA_KERNEL} instantiations in the SASS"
    archs = {int(a) for a in re.findall(r"code for sm_(\d+)", sass)}
    assert archs, "cuobjdump -sass named no architecture"
    if max(archs) < 75:
        hits = sorted({h for b in mma.values() for h in TENSOR_CORE_SASS.findall(b)})
        assert not hits, f"tensor-core instructions in an sm_{max(archs)} build: {hits}"
        return
    lacking = [n for n, b in mma.items() if "IMMA" not in b or "IDP.4A" in b]
    assert not lacking, f"{MMA_KERNEL} without IMMA or with DP4A: {lacking[:3]}"


def test_ptx_mma_only_in_the_mma_route(tool_and_lib):
    tool, lib = tool_and_lib
    ptx = _dump(tool, "-ptx", lib)
    entries = _ptx_entries(ptx)
    assert len(entries) > 50, "cuobjdump -ptx printed no PTX entries: nothing was checked"
    hits = {n: sorted(set(TENSOR_CORE_PTX.findall(b))) for n, b in entries.items() if not _mma_route(n)}
    hits = {n: h for n, h in hits.items() if h}
    assert not hits, f"matrix instructions outside the mma route's kernels: {sorted(hits.items())[:3]}"
    targets = [int(t) for t in re.findall(r"\.target sm_(\d+)", ptx)]
    mma = [b for n, b in entries.items() if MMA_KERNEL in n]
    assert mma and targets, "no mma-route entries or no .target in the PTX"
    # compute_75+ PTX multiplies with mma.sync; compute_70 and older PTX has the kernels empty (refused at run time)
    assert all(("mma.sync" in b) == (max(targets) >= 75) for b in mma)
    attn = [b for n, b in entries.items() if ATTN_MMA_KERNEL in n]
    assert len(attn) == 3, f"{len(attn)} {ATTN_MMA_KERNEL} entries (head dims 64, 128, 256)"
    # the f16 m16n8k16 shape needs compute_80; older PTX has the kernel empty (refused at run time)
    assert all(("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in b) == (max(targets) >= 80) for b in attn)


def test_attention_mma_kernel_uses_f16_tensor_cores(tool_and_lib):
    """The mma attention route multiplies with HMMA where the code is sm_80+, and has no instruction at all of the
    tensor cores in older builds (its kernels are empty there)."""
    tool, lib = tool_and_lib
    sass = _dump(tool, "-sass", lib)
    attn = {n: b for n, b in _sass_functions(sass).items() if ATTN_MMA_KERNEL in n}
    assert len(attn) == 3, f"{len(attn)} {ATTN_MMA_KERNEL} instantiations in the SASS"
    archs = {int(a) for a in re.findall(r"code for sm_(\d+)", sass)}
    if max(archs) < 80:
        assert not sorted({h for b in attn.values() for h in TENSOR_CORE_SASS.findall(b)})
        return
    assert all("HMMA" in b for b in attn.values()), "attn_prefill_mma_kernel without HMMA"


# The kernels of the block-quantized types (matmul_quant.cu): every instantiation is present and multiplies by DP4A.
QUANT_DP4A_KERNELS = ("gemv_quant_kernel", "gemm_quant_kernel")


def test_quant_kernels_use_dp4a(tool_and_lib):
    tool, lib = tool_and_lib
    funcs = _dump(tool, "-sass", lib).split("Function : ")[1:]
    for kernel in QUANT_DP4A_KERNELS:
        bodies = [f for f in funcs if kernel in f.split("\n", 1)[0]]
        assert bodies, f"no {kernel} in the SASS"
        lacking = [f.split("\n", 1)[0] for f in bodies if "IDP.4A" not in f]
        assert not lacking, f"{kernel} instantiations without DP4A: {lacking[:3]}"
        hits = sorted({h for f in bodies for h in TENSOR_CORE_SASS.findall(f)})
        assert not hits, f"tensor-core instructions in {kernel}: {hits}"
