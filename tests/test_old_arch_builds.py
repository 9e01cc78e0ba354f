"""The builds for the cards CUDA 13 dropped: `make ptx61` (Pascal: P40, GTX 10x0) and `make ptx70` (Volta: V100,
CMP 100-210) -> build/sm61 (sm70)/libcmpkern.so, with whichever route tools/cuda_archs.sh finds (a CUDA 12.x nvcc,
e.g. tools/get_cuda12.sh's, else clang 19 over PyPI's CUDA 12.9 pieces). Checked without a GPU:
- the PTX targets exactly that architecture and holds no instruction a newer one introduced (mma, ldmatrix,
  cp.async, redux, griddepcontrol, ...; sass_tools.PTX_SINCE), and it holds dp4a;
- every cubin is that architecture's SASS, with DP4A (IDP.4A), no tensor-core instruction, every kernel family.
A case skips, naming what is missing, where no route or no SM61/SM70-capable disassembler (CUDA <= 13.0's nvdisasm:
tools/get_cuda12.sh's build/cuda12/bin, or `CUDA_DISASM=1 make ptx70`'s copy from triton 3.3.1) exists.

On a GPU, the whole suite runs on such a build with
    LLAMACMP_LIB=build/sm61/libcmpkern.so python3 -m pytest -q -m cuda
(the driver JIT-compiles its compute_61 PTX on newer GPUs: benchmarks/device/plans/jit.plan)."""
from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest
from sass_tools import cuobjdump_candidates, hmma_gemm_findings, ptx_above, run_cuobjdump, tensor_core_hits

ROOT = Path(__file__).resolve().parent.parent
ARCHS = (61, 70)
KERNELS = ("quantize_q8_kernel", "argmax_kernel", "gdn_scan_kernel", "gdn_chunk_intra_kernel", "gdn_chunk_state_kernel",
           "conv1d_silu_kernel", "sample_kernel")
PYPI_PIECES = ROOT / "build" / "clang-cuda-toolchain" / "pypi" / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
# disassemblers that still know SM61 / SM70, before the generic candidates
DISASM = (ROOT / "build" / "cuda12" / "bin" / "cuobjdump",
          ROOT / "build" / "clang-cuda-toolchain" / "disasm" / "cuobjdump")


def _stale(lib: Path) -> bool:
    built = lib.stat().st_mtime
    return any(p.stat().st_mtime > built for p in (ROOT / "cuda_src").iterdir())


@pytest.fixture(scope="module", params=ARCHS, ids=lambda a: f"sm{a}")
def arch_lib(request) -> tuple[int, Path]:
    arch = request.param
    lib = ROOT / "build" / f"sm{arch}" / "libcmpkern.so"
    if lib.exists() and not _stale(lib):
        return arch, lib
    route = subprocess.run(["bash", "tools/cuda_archs.sh", str(arch)], cwd=ROOT, capture_output=True, text=True)
    if route.returncode != 0:
        pytest.skip(f"no route builds sm_{arch} here: " + " ".join(route.stderr.split()))
    if route.stdout.split()[0] == "clang" and not PYPI_PIECES.exists():
        # tests download nothing: the clang route's first build fetches PyPI's CUDA 12.9 wheels
        pytest.skip(f"{lib} not built and the clang route's CUDA 12.9 pieces are not in {PYPI_PIECES}: "
                    f"run `make ptx{arch}` once")
    r = subprocess.run(["make", f"ptx{arch}"], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"make ptx{arch} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return arch, lib


def _dump(flag: str, lib: Path, arch: int) -> str:
    tried = []
    for tool in cuobjdump_candidates(DISASM):
        r = run_cuobjdump(tool, flag, lib)
        out = r.stdout + r.stderr
        if r.returncode == 0 and "nvdisasm fatal" not in out and ("Function" in r.stdout or flag == "-ptx"):
            return r.stdout
        tried.append(f"{tool}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    pytest.skip(f"no cuobjdump/nvdisasm that reads SM{arch} (CUDA 13.2+ refuses it): run tools/get_cuda12.sh, or "
                f"`CUDA_DISASM=1 make ptx70`, or set CUDA_DISASM_PATH to a CUDA 12 bin folder. Tried: {tried}")


@functools.lru_cache(maxsize=1)
def _sass(lib: Path, arch: int) -> str:
    """The SASS dump, once per library: two tests read it (one arch of libcmpkern.so: ~30 s of cuobjdump)."""
    return _dump("-sass", lib, arch)


def test_ptx_targets_the_arch_with_nothing_newer(arch_lib):
    arch, lib = arch_lib
    ptx = _dump("-ptx", lib, arch)
    targets = set(re.findall(r"^\.target\s+(\w+)", ptx, re.M))
    assert targets == {f"sm_{arch}"}, f"PTX targets {targets}, not only sm_{arch}"
    newer = ptx_above(ptx, arch)
    assert not newer, f"instructions above sm_{arch} in its PTX: {newer}"
    assert "dp4a" in ptx


def test_sass_is_the_arch_dp4a_without_tensor_cores(arch_lib):
    arch, lib = arch_lib
    sass = _sass(lib, arch)
    codes = set(re.findall(r"code for (sm_\d+)", sass))
    assert codes == {f"sm_{arch}"}, f"SASS for {codes}, not only sm_{arch}"
    assert "IDP.4A" in sass, "the DP4A matmul kernels lost their IDP.4A instructions"
    found = tensor_core_hits(sass)      # the probe's timing kernels (sass_tools.TENSOR_CORE_KERNELS) aside
    assert not found, f"tensor-core instructions in the sm_{arch} build: {found[:5]}"
    missing = [k for k in KERNELS if k not in sass]
    assert not missing, f"kernels missing from the sm_{arch} build: {missing}"


def test_volta_gemm_is_hmma_884_on_sm70_and_absent_on_sm61(arch_lib):
    """sm_70: every instantiation of Volta's GEMM multiplies with HMMA.884 (m8n8k4, f32 accumulation); sm_61: its
    bodies are empty (no mma.sync below sm_70: test_ptx_targets_the_arch_with_nothing_newer checks the PTX)."""
    arch, lib = arch_lib
    sass = _sass(lib, arch)
    assert not hmma_gemm_findings(sass)
    if arch == 70:
        assert "HMMA.884.F32.F32" in sass


def test_ptx_check_sees_newer_instructions():
    """The check itself: an sm_61 PTX with a match.sync (sm_70) or cp.async (sm_80) is caught; sm_70 takes match."""
    ptx = "match.any.sync.b32 %r1, %r2, -1;\ncp.async.cg.shared.global [%r3], [%rd1], 16;\ndp4a.s32.s32 %r4, %r5;"
    assert ptx_above(ptx, 61) == ["cp.async", "match.any.sync"]
    assert ptx_above(ptx, 70) == ["cp.async"]
    assert ptx_above(ptx, 90) == []


def test_clang_route_refuses_bad_architectures():
    """Checked before anything is fetched or compiled."""
    for args, says in (([], "usage"), (["60"], "bad architecture '60'"), (["61", "sm_70"], "bad architecture 'sm_70'")):
        r = subprocess.run(["bash", "tools/build_clang_cuda.sh", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode != 0 and says in r.stderr, (args, r.stderr)
