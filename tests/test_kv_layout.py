"""kv_layout (the CUDA KV cache's byte layout) round-trips to exactly kv_quant's values (CPU, fast)."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp import kv_layout, kv_quant


@pytest.mark.parametrize("kv_type", kv_quant.KV_TYPES)
@pytest.mark.parametrize("Dh", [32, 64, 128, 256])
def test_decode_of_encode_is_roundtrip(kv_type, Dh):
    x = np.random.default_rng(Dh).standard_normal((3, 5, Dh)).astype(np.float32) * 3
    x[0, 0] = 0                                                # an all-zero row (zero scales)
    raw = kv_layout.encode(x, kv_type)
    assert raw.nbytes == 15 * kv_layout.row_bytes(kv_type, Dh)
    np.testing.assert_array_equal(kv_layout.decode(raw, kv_type, Dh), kv_quant.roundtrip(x, kv_type))
    assert kv_layout.head_dim_of(kv_type, kv_layout.row_bytes(kv_type, Dh)) == Dh


def test_bytes_per_value_match_llama_cpp_and_tq3():
    for t in kv_quant.KV_TYPES:
        assert kv_layout.row_bytes(t, 256) == 256 * kv_quant.BYTES_PER_VALUE[t]
    assert kv_layout.row_bytes("tq3", 256) / kv_layout.row_bytes("f16", 256) <= 0.21


def test_bad_head_dims_are_named():
    with pytest.raises(ValueError, match="multiple of 32"):
        kv_layout.row_bytes("q8_0", 48)
    with pytest.raises(ValueError, match="tq3"):
        kv_layout.row_bytes("tq3", 96)
