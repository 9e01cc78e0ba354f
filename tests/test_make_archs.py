"""`make` builds for the GPUs present with the nvcc present: proved with a fake nvcc / nvidia-smi on PATH (make -n).

make -n still runs the architecture probe and the sub-make (the recipe is marked `+`), so the nvcc command lines it
prints are the ones a real build would run.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _make(tmp_path: Path, *args: str, nvcc_release: str | None, caps: list[str] | None,
          cuda12_release: str | None = None, clang: bool = False, **env_extra: str) -> subprocess.CompletedProcess:
    """caps None: nvidia-smi fails as without a driver; nvcc_release None: no nvcc at all; cuda12_release: a second
    nvcc outside PATH where make looks for a CUDA 12 toolkit (CUDA12_NVCC); clang: clang++-19 on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvcc_release is not None:
        _nvcc(bin_dir, nvcc_release)
    cuda12 = ""
    if cuda12_release is not None:
        (tmp_path / "cuda12").mkdir(exist_ok=True)
        _nvcc(tmp_path / "cuda12", cuda12_release)
        cuda12 = str(tmp_path / "cuda12" / "nvcc")
    if clang:
        _stub(bin_dir, "clang++-19", 'echo "clang version 19.1.7"\n')
    if caps is None:
        _stub(bin_dir, "nvidia-smi", 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA '
              'driver." >&2\nexit 9\n')
    else:
        _stub(bin_dir, "nvidia-smi", "".join(f"echo {c}\n" for c in caps))
    # the real tools, without any real nvcc or clang
    for tool in ("make", "sh", "bash", "sed", "sort", "tr", "grep", "python3", "nproc", "mkdir", "cat", "env", "ls",
                 "dirname"):
        real = shutil.which(tool)
        if real and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(real)
    env = {k: v for k, v in os.environ.items()
           if k not in ("NVCC", "CLANG", "CUDA_ROUTE", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    # CUDA12_NVCC: only the stub, never a toolkit of this machine (/usr/local/cuda-12*, build/cuda12)
    env.update(PATH=str(bin_dir), LIBCUDA="/nonexistent/libcuda.so.1", CUDA12_NVCC=cuda12, **env_extra)
    # -B: every command, also where this checkout already built the objects (CI builds all-archs first)
    return subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def _nvcc(folder: Path, release: str) -> None:
    _stub(folder, "nvcc", f'[ "$1" = --version ] && echo "Cuda compilation tools, release {release}, '
          f'V{release}.1" && exit 0\necho "nvcc $*"\n')


def _archs(out: str) -> set[str]:
    return {w.split("code=sm_")[1] for w in out.split() if "code=sm_" in w}


def test_cuda12_targets_the_pascal_and_volta_cards_present(tmp_path):
    r = _make(tmp_path, nvcc_release="12.4", caps=["7.0", "6.1", "7.0"])
    assert r.returncode == 0, r.stderr
    assert _archs(r.stdout) == {"61", "70"}
    assert "compute_70,code=compute_70" in r.stdout          # PTX of the newest for newer GPUs
    assert "sm_61, sm_70" in r.stderr


def test_one_gpu_one_architecture_and_one_job_per_core(tmp_path):
    r = _make(tmp_path, "JOBS=7", nvcc_release="13.0", caps=["9.0"])
    assert r.returncode == 0, r.stderr
    assert _archs(r.stdout) == {"90"}
    assert "jobs=-j7" in r.stdout


def test_cuda13_refuses_volta_and_names_the_routes(tmp_path):
    r = _make(tmp_path, nvcc_release="13.0", caps=["7.0"])
    assert r.returncode != 0
    assert "CUDA 12.x" in r.stderr and "tools/get_cuda12.sh" in r.stderr and "clang-19" in r.stderr
    assert "code=sm_" not in r.stdout and "build_clang_cuda" not in r.stdout


def test_no_gpu_builds_nothing_and_says_numpy(tmp_path):
    for release in ("13.0", None):
        r = _make(tmp_path, nvcc_release=release, caps=None)
        assert r.returncode == 0, r.stderr
        assert "numpy backend" in r.stderr
        assert "code=sm_" not in r.stdout


def test_all_archs_per_toolkit(tmp_path):
    r12 = _make(tmp_path, "all-archs", nvcc_release="12.8", caps=None)
    assert _archs(r12.stdout) == {"61", "70", "75", "80", "86", "89", "90"}
    (tmp_path / "13").mkdir()
    r13 = _make(tmp_path / "13", "all-archs", nvcc_release="13.0", caps=None)
    assert _archs(r13.stdout) == {"75", "80", "86", "89", "90"}


def test_newer_gpu_gets_the_newest_ptx_and_older_than_dp4a_is_refused(tmp_path):
    r = _make(tmp_path, nvcc_release="12.4", caps=["12.0"])
    assert r.returncode == 0 and _archs(r.stdout) == {"90"}
    r = _make(tmp_path, nvcc_release="12.4", caps=["6.0"])
    assert r.returncode != 0 and "DP4A" in r.stderr


def test_gpu_without_nvcc_says_what_to_install(tmp_path):
    r = _make(tmp_path, nvcc_release=None, caps=["7.5"])
    assert r.returncode != 0 and "no nvcc" in r.stderr


def _nvcc_used(out: str) -> set[str]:
    """The compilers of the printed compile lines."""
    return {line.split()[0] for line in out.splitlines() if " -c -o " in line}


def test_cuda13_with_a_cuda12_toolkit_beside_builds_pascal_with_it(tmp_path):
    r = _make(tmp_path, nvcc_release="13.0", cuda12_release="12.4", caps=["6.1", "9.0"])
    assert r.returncode == 0, r.stderr
    assert _nvcc_used(r.stdout) == {str(tmp_path / "cuda12" / "nvcc")}
    assert _archs(r.stdout) == {"61", "90"}
    assert "cannot target sm_61" in r.stderr


def test_cuda13_only_with_clang19_takes_the_clang_route(tmp_path):
    r = _make(tmp_path, nvcc_release="13.0", caps=["6.1"], clang=True)
    assert r.returncode == 0, r.stderr
    assert "tools/build_clang_cuda.sh 61" in r.stdout
    assert "CLANG_CUDA_LIB=llamacmp/lib/libcmpkern.so" in r.stdout
    assert "code=sm_" not in r.stdout


def test_cuda_route_forces_one(tmp_path):
    r = _make(tmp_path, nvcc_release="13.0", cuda12_release="12.4", caps=["7.0"], clang=True, CUDA_ROUTE="clang")
    assert r.returncode == 0, r.stderr
    assert "tools/build_clang_cuda.sh 70" in r.stdout and "code=sm_" not in r.stdout
    (tmp_path / "n").mkdir()
    r = _make(tmp_path / "n", nvcc_release="13.0", caps=["7.0"], clang=True, CUDA_ROUTE="nvcc")
    assert r.returncode != 0 and "build_clang_cuda" not in r.stdout
    assert "tools/get_cuda12.sh" in r.stderr


def test_ptx61_builds_sm61_sass_and_compute61_ptx_apart_from_the_library(tmp_path):
    r = _make(tmp_path, "ptx61", nvcc_release="12.4", caps=None)
    assert r.returncode == 0, r.stderr
    assert _archs(r.stdout) == {"61"}
    assert "arch=compute_61,code=compute_61" in r.stdout
    assert "-o build/sm61/libcmpkern.so" in r.stdout and "llamacmp/lib/libcmpkern.so" not in r.stdout
    (tmp_path / "13").mkdir()
    r = _make(tmp_path / "13", "ptx61", nvcc_release="13.0", caps=None, clang=True)
    assert r.returncode == 0, r.stderr
    assert "CLANG_CUDA_LIB=build/sm61/libcmpkern.so bash tools/build_clang_cuda.sh 61" in r.stdout


def test_cuda_arch_is_routed_and_checked(tmp_path):
    r = _make(tmp_path, "CUDA_ARCH=61", nvcc_release="13.0", caps=None)
    assert r.returncode != 0 and "sm_61 needs a CUDA 12.x nvcc or clang 19" in r.stderr
    r = _make(tmp_path, "CUDA_ARCH=60", nvcc_release="12.4", caps=None)
    assert r.returncode != 0 and "bad architecture '60'" in r.stderr
