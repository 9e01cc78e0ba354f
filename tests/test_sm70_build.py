"""The sm_70 (Volta / CMP 100-210) build made by tools/build_sm70.sh (clang 19 over PyPI's CUDA 12.9 pieces): its
SASS for sm_70 holds DP4A (IDP.4A) and no tensor-core instruction, its PTX no mma, and it carries every kernel
family. Runs without a GPU. Skips, saying why, where clang 19, the PyPI pieces or an SM70-capable disassembler
(CUDA <= 13.0's nvdisasm, e.g. the one bundled in triton==3.3.1) are missing.

On a GPU, the whole suite runs on this build with
    LLAMACMP_LIB=build/sm70/libcmpkern.so python3 -m pytest -q -m cuda
(the driver JIT-compiles its compute_70 PTX on newer GPUs)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from sass_tools import cuobjdump_candidates, ptx_mma_hits, run_cuobjdump, tensor_core_hits

ROOT = Path(__file__).resolve().parent.parent
SM70 = ROOT / "build" / "sm70"
LIB = SM70 / "libcmpkern.so"
# the toolchain beside the output (tools/build_sm70.sh: SM70_TOOLS defaults to build/sm70-toolchain)
PIECES = ROOT / "build" / "sm70-toolchain" / "pypi" / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
KERNELS = ("quantize_q8_kernel", "argmax_kernel", "gdn_scan_kernel", "gdn_chunked_kernel", "conv1d_silu_kernel")


def _stale() -> bool:
    built = LIB.stat().st_mtime
    return any(p.stat().st_mtime > built for p in (ROOT / "cuda_src").iterdir())


@pytest.fixture(scope="module")
def sm70_lib() -> Path:
    clang = os.environ.get("CLANG") or shutil.which("clang++-19")
    if LIB.exists() and not _stale():
        return LIB
    if not clang:
        pytest.skip("clang++-19 not installed (apt-get install clang-19): the sm_70 build needs it")
    if not PIECES.exists():
        pytest.skip(f"CUDA 12.9 PyPI pieces not in {PIECES.parents[3]}: run `make ptx70` once (it installs them)")
    r = subprocess.run(["bash", str(ROOT / "tools" / "build_sm70.sh")], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"tools/build_sm70.sh failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return LIB


@pytest.fixture(scope="module")
def sass(sm70_lib) -> str:
    tried = []
    # the build's own disassembler first (SM70_DISASM=1): CUDA 13.2+'s nvdisasm refuses SM70
    for tool in cuobjdump_candidates([SM70 / "disasm" / "cuobjdump"]):
        r = run_cuobjdump(tool, "-sass", sm70_lib)
        if r.returncode == 0 and "nvdisasm fatal" not in r.stdout + r.stderr and "Function" in r.stdout:
            return r.stdout
        tried.append(f"{tool}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    pytest.skip("no cuobjdump/nvdisasm that disassembles SM70 (CUDA 13.2+ refuses it): run `SM70_DISASM=1 make "
                f"ptx70`, or set SM70_DISASM_PATH to a CUDA 12 bin folder. Tried: {tried}")


def test_sm70_sass_is_dp4a_without_tensor_cores(sass):
    assert "code for sm_70" in sass
    assert "IDP.4A" in sass, "the DP4A matmul kernels lost their IDP.4A instructions"
    found = tensor_core_hits(sass)      # the probe's timing kernels (sass_tools.TENSOR_CORE_KERNELS) aside
    assert not found, f"tensor-core instructions in the sm_70 build: {found[:5]}"


def test_sm70_build_has_every_kernel_family(sass):
    missing = [k for k in KERNELS if k not in sass]
    assert not missing, f"kernels missing from the sm_70 build: {missing}"


def test_sm70_ptx_targets_compute_70_without_mma(sm70_lib):
    tool = next(cuobjdump_candidates([SM70 / "disasm" / "cuobjdump"]), None)
    if tool is None:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump)")
    r = run_cuobjdump(tool, "-ptx", sm70_lib)
    assert r.returncode == 0, r.stderr[-2000:]
    assert ".target sm_70" in r.stdout
    assert not ptx_mma_hits(r.stdout)
    assert "dp4a" in r.stdout
