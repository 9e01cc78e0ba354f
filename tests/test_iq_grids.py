"""cuda_src/iq_grids.cuh (generated from ggml-common.h by tools/gen_iq_grids.py) holds the same codebooks as the
numpy reference's dequantizer, gguf.quants: the CUDA decoders of the IQ1-3 types read these tables (no GPU needed:
the header is read as text)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

HEADER = Path(__file__).resolve().parent.parent / "cuda_src" / "iq_grids.cuh"
# our table -> (gguf.quants class, bytes per entry)
TABLES = {"kIq2xxsGrid": ("IQ2_XXS", 8), "kIq2xsGrid": ("IQ2_XS", 8), "kIq2sGrid": ("IQ2_S", 8),
          "kIq3xxsGrid": ("IQ3_XXS", 4), "kIq3sGrid": ("IQ3_S", 4), "kIq1sGrid": ("IQ1_S", 8)}


def header_table(name: str) -> np.ndarray:
    """[entries, bytes per entry] of the header's table, byte k = value k (little-endian), as int8 for IQ1."""
    m = re.search(rf"(uint\d+_t) {name}\[(\d+)\] = \{{(.*?)\}};", HEADER.read_text(), re.S)
    ctype, n, body = m.group(1), int(m.group(2)), m.group(3)
    words = np.array([int(v, 16) for v in re.findall(r"0x[0-9a-fA-F]+", body)],
                     np.uint64 if ctype == "uint64_t" else np.uint32)
    assert len(words) == n
    return words.view(np.uint8).reshape(n, -1)


@pytest.mark.parametrize("name", TABLES)
def test_cuda_grid_equals_gguf_quants_grid(name):
    import gguf.quants as gq
    cls_name, width = TABLES[name]
    cls = getattr(gq, cls_name)
    cls.init_grid()
    want = np.asarray(cls.grid).reshape(-1, width)
    got = header_table(name)
    got = got.view(np.int8) if cls_name == "IQ1_S" else got
    assert got.shape == want.shape and np.array_equal(got.astype(np.float32), want)
