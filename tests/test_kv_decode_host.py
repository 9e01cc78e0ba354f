"""The KV dequantisation bit tricks of the attention kernels (cuda_src/attention_kv.cuh: tq3 level lookup by byte
permutes, table-free tq3 selects, q8_0 / q4_0 bytes to floats by the 2^23 trick), compiled for the host by nvcc and
checked bit for bit against the plain formulas on every input byte combination (tools/check_kv_decode.cu). No GPU
needed; the decode kernel's layout and its numerics against numpy_ref are in test_attention_cuda.py."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from llamacmp import kv_quant

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tools" / "check_kv_decode.cu"


def test_kv_decode_tricks_are_exact(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc to build tools/check_kv_decode.cu for the host")
    exe = tmp_path / "check_kv_decode"
    subprocess.run(["nvcc", "-O2", "-std=c++17", "-o", str(exe), str(CHECK)], check=True, capture_output=True,
                   cwd=CHECK.parent)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    # 2^24 bit-plane byte triples x 8 values x 2 tq3 decoders, + 256 bytes x 4 positions x 3 (q8_0, q4_0 lo / hi)
    assert run.stdout.strip() == f"ok: {(1 << 24) * 8 * 2 + 256 * 4 * 3} decoded values bit-exact"


def test_checker_levels_are_kv_quant_levels():
    """The checker's expected levels (and tq3_level, which it checks against them) are LLOYD_MAX_8 as float32."""
    src = CHECK.read_text()
    start = src.index("const float levels[8] = {") + len("const float levels[8] = {")
    levels = np.array([float(v.rstrip("f")) for v in src[start:src.index("}", start)].split(",")], np.float32)
    np.testing.assert_array_equal(levels, kv_quant.LLOYD_MAX_8.astype(np.float32))
