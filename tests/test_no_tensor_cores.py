"""The default kernels use no tensor-core instruction: the SASS of libcmpkern.so holds no HMMA, IMMA, HGMMA or
QGMMA (nor the PTX any mma/wmma/wgmma), and it does hold DP4A (IDP.4A). Runs without a GPU: cuobjdump comes from
the PyPI package nvidia-cuda-cuobjdump (with nvidia-cuda-nvdisasm for -sass), triton's bundled copy, or PATH."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llamacmp.lib._native import library_path

TENSOR_CORE_SASS = re.compile(r"\b(HMMA|IMMA|HGMMA|QGMMA|OMMA|UTC\w*MMA)\b")
TENSOR_CORE_PTX = re.compile(r"\b(mma\.sync|wmma\.|wgmma\.|tcgen05\.mma)")


def _candidates():
    try:
        import nvidia
        for root in nvidia.__path__:
            for sub in ("cu13/bin", "cuda_cuobjdump/bin", "cu12/bin"):
                yield Path(root) / sub / "cuobjdump"
    except ImportError:
        pass
    try:
        import triton
        yield Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    except ImportError:
        pass
    if shutil.which("cuobjdump"):
        yield Path(shutil.which("cuobjdump"))


def find_cuobjdump() -> Path | None:
    return next((p for p in _candidates() if p.is_file() and os.access(p, os.X_OK)), None)


def _dump(tool: Path, flag: str, lib: Path) -> str:
    env = dict(os.environ, PATH=f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}")  # nvdisasm beside it
    r = subprocess.run([str(tool), flag, str(lib)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{tool} {flag} failed: {r.stderr[-2000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def tool_and_lib():
    lib = library_path()
    if not lib.exists():
        pytest.skip(f"{lib} is not built (run `make`)")
    tool = find_cuobjdump()
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
    hits = sorted(set(TENSOR_CORE_PTX.findall(ptx)))
    assert not hits, f"matrix instructions in the PTX: {hits}"
