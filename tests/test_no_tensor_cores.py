"""The default kernels use no tensor-core instruction: the SASS of libcmpkern.so holds no HMMA, IMMA, HGMMA or
QGMMA (nor the PTX any mma/wmma/wgmma), and it does hold DP4A (IDP.4A). Runs without a GPU: cuobjdump comes from
the PyPI package nvidia-cuda-cuobjdump (with nvidia-cuda-nvdisasm for -sass), triton's bundled copy, or PATH."""
from __future__ import annotations

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


def test_sass_has_no_tensor_core_instructions(tool_and_lib):
    tool, lib = tool_and_lib
    sass = _dump(tool, "-sass", lib)
    assert "Function" in sass or "function" in sass, "cuobjdump printed no SASS"
    hits = sorted(set(TENSOR_CORE_SASS.findall(sass)))
    assert not hits, f"tensor-core instructions in the SASS: {hits}"
    assert "IDP.4A" in sass, "no DP4A (IDP.4A) in the SASS: the Q8 kernels are not using it"


def test_ptx_has_no_mma(tool_and_lib):
    tool, lib = tool_and_lib
    ptx = _dump(tool, "-ptx", lib)
    assert ".target sm_" in ptx and ".entry" in ptx, "cuobjdump -ptx printed no PTX: nothing was checked"
    hits = sorted(set(TENSOR_CORE_PTX.findall(ptx)))
    assert not hits, f"matrix instructions in the PTX: {hits}"


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
