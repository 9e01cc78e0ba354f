"""cuda_src/quant_blocks.cuh's decoders (repack, load, decode) run on the CPU by tools/quant_decode_host.cpp, from the
same source, against gguf.quants' dequantization, bit for bit: the layout, bit order and scale arithmetic of the IQ1-3
grid types' decoders (quant_blocks_iq.cuh) checked where no GPU is (CI). The other types' decoders (those that use no
inline PTX) are run too, as a check of the harness itself. The kernels
around the decoders are tests/test_quant_cuda.py's (GPU)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from llamacmp.fixtures.quant_blocks import random_blocks
from llamacmp.gguf_file import GRID_TYPES, GGUFFile, QuantTensor
from llamacmp.lib._native import CMP_QUANT_TYPES

ROOT = Path(__file__).resolve().parent.parent
HEADERS = ("quant_blocks.cuh", "quant_blocks_iq.cuh", "iq_grids.cuh", "api.h")
CONTROL_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q6_K")   # GPU-tested decoders without prmt
FIXTURES = ROOT / "compat" / "fixtures" / "quant"
MAIN_FIXTURE = {"IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ2_S": "IQ2_M", "IQ3_XXS": "IQ3_XXS", "IQ3_S": "IQ3_S",
                "IQ1_S": "IQ1_S", "IQ1_M": "IQ1_M"}


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """The harness, built where quant_blocks.cuh's "common.cuh" is an empty stand-in (the harness defines first what
    the decoders need of it)."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ or clang++) on PATH")
    folder = tmp_path_factory.mktemp("qdh")
    for h in HEADERS:
        shutil.copy(ROOT / "cuda_src" / h, folder / h)
    (folder / "common.cuh").write_text("")
    exe = folder / "quant_decode_host"
    subprocess.run([cxx, "-std=c++17", "-O2", "-w", "-fno-strict-aliasing", "-I", str(folder),
                    str(ROOT / "tools" / "quant_decode_host.cpp"), "-o", str(exe)], check=True)
    return exe


def _decode(exe: Path, t: QuantTensor, folder: Path) -> np.ndarray:
    rows, n = t.shape
    (folder / "in.bin").write_bytes(np.ascontiguousarray(t.blocks).tobytes())
    subprocess.run([str(exe), str(CMP_QUANT_TYPES[t.type_name]), str(rows), str(n), str(folder / "in.bin"),
                    str(folder / "out.bin")], check=True)
    return np.fromfile(folder / "out.bin", np.float32).reshape(rows, n)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("amplitude", [1.0, 1e-4, 300.0])      # 1e-4: subnormal f16 d of every type here
@pytest.mark.parametrize("type_name", [*GRID_TYPES, *CONTROL_TYPES])
def test_decoder_equals_gguf_quants_on_random_blocks(decoder, tmp_path, type_name, amplitude):
    t = random_blocks(type_name, 7, 1024, np.random.default_rng([17, len(type_name)]), amplitude=amplitude)
    _same_bits(_decode(decoder, t, tmp_path), t.dequantize())


@pytest.mark.parametrize("type_name", GRID_TYPES)
def test_decoder_equals_gguf_quants_on_llama_quantize_blocks(decoder, tmp_path, type_name):
    """Every tensor of the type in its llama-quantize fixture (compat/fixtures/quant)."""
    f = GGUFFile(FIXTURES / f"q256-{MAIN_FIXTURE[type_name]}.gguf")
    tensors = [f.tensor(n) for n in f.names() if f.info(n).type_name == type_name]
    assert len(tensors) >= 5
    for t in tensors:
        _same_bits(_decode(decoder, t, tmp_path), t.dequantize())
