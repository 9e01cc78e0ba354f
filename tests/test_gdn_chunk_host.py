"""cuda_src/gdn_chunk.cuh's kernels (the chunked GDN: gdn_chunk_intra_kernel, then gdn_chunk_state_kernel) run on
the CPU by tools/gdn_chunk_host.cpp, from the same source (each block's threads as host threads, the barriers and
warp shuffles emulated), against numpy_ref's gdn: the kernels' index arithmetic, barriers and algebra checked
without a GPU. Shared memory, the workspace and o start as NaN, so reading anything not written fails the check.
The GPU's own run is tests/test_kernels_cuda.py's test_gdn_chunked_*."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.config import ModelConfig

ROOT = Path(__file__).resolve().parent.parent
REF = NumpyBackend()


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ or clang++) on PATH")
    exe = tmp_path_factory.mktemp("gdn") / "gdn_chunk_host"
    subprocess.run([cxx, "-std=c++20", "-O2", "-pthread", "-Wno-unknown-pragmas", "-I", str(ROOT / "cuda_src"),
                    str(ROOT / "tools" / "gdn_chunk_host.cpp"), "-o", str(exe)], check=True)
    return exe


def _cfg(K, V, Dk, eps=1e-6) -> ModelConfig:
    return ModelConfig(n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, head_dim=64, n_vocab=97,
                       n_ctx_train=4096, rms_eps=eps, rope_base=1e7, n_rot=16, rope_sections=(0, 0, 0, 0),
                       conv_kernel=4, ssm_k_heads=K, ssm_v_heads=V, ssm_head_dim=Dk, full_attention_interval=4)


@pytest.mark.parametrize("Dk,K,V,L", [(16, 2, 4, 1), (16, 1, 2, 64), (32, 1, 3, 65), (64, 2, 2, 64 * 5 + 17),
                                      (128, 2, 4, 200), (128, 1, 2, 64 * 3),
                                      pytest.param(128, 16, 32, 130, marks=pytest.mark.slow, id="9b-heads")])
def test_emulated_kernels_match_numpy(emulator, tmp_path, Dk, K, V, L):
    rng = np.random.default_rng(L * 7 + Dk)
    cfg = _cfg(K, V, Dk)
    qkv = rng.standard_normal((L, (2 * K + V) * Dk)).astype(np.float32)
    g = -rng.uniform(0.0, 1.5, (L, V)).astype(np.float32)
    b = rng.uniform(0.0, 1.0, (L, V)).astype(np.float32)
    S0 = (rng.standard_normal((V, Dk, Dk)) * 0.1).astype(np.float32)
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    with open(src, "wb") as f:
        f.write(np.array([L, K, V, Dk], np.int32).tobytes() + np.float32(cfg.rms_eps).tobytes())
        for a in (qkv, g, b, S0):
            f.write(a.tobytes())
    subprocess.run([str(emulator), str(src), str(dst)], check=True, timeout=600)
    out = np.fromfile(dst, np.float32)
    o, S = out[:L * V * Dk].reshape(L, V * Dk), out[L * V * Dk:].reshape(V, Dk, Dk)

    st = REF.new_state(cfg, L + 1, "f32")
    st.ssm[0][:] = S0
    ref = REF.gdn(qkv, g, b, StepBatch.build([(st, [0] * L)]), 0, cfg, chunked=True)
    assert np.isfinite(o).all() and np.isfinite(S).all()
    rel = lambda a, r: float(np.linalg.norm(a - r) / np.linalg.norm(r))   # noqa: E731
    assert rel(o, ref) < 1e-4
    assert rel(o[-(L % 64 or 64):], ref[-(L % 64 or 64):]) < 1e-4   # the last (padded) chunk
    assert rel(S, st.ssm[0]) < 1e-4
