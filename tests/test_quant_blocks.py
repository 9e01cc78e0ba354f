"""The random-block fixture helper: valid blocks of every loaded type, of the asked magnitude."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.fixtures.quant_blocks import QUANTIZABLE, quantize, random_blocks
from llamacmp.gguf_file import QUANT_BLOCKS, Q8Tensor, QuantTensor


@pytest.mark.parametrize("type_name", [*QUANT_BLOCKS, "Q8_0"])
def test_random_blocks_dequantize_to_finite_values_of_the_asked_size(type_name):
    rng = np.random.default_rng(1)
    t = random_blocks(type_name, 3, 512, rng, amplitude=0.05)
    assert isinstance(t, Q8Tensor if type_name == "Q8_0" else QuantTensor)
    assert t.shape == (3, 512)
    w = t.dequantize()
    assert w.shape == (3, 512) and np.isfinite(w).all()
    rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    assert 0.005 < rms < 0.5, rms
    same = random_blocks(type_name, 3, 512, np.random.default_rng(1), amplitude=0.05)
    assert np.array_equal(same.blocks, t.blocks)


def test_iq1_m_scale_is_packed_in_the_top_nibbles():
    """IQ1_M's d has no field of its own (iq1m_scale_t): random_blocks writes it over the scales' top nibbles and
    leaves their 12 low bits (the sub-scales) as drawn."""
    from llamacmp.fixtures.quant_blocks import IQ1_M_SCALES, write_f16
    blocks = np.random.default_rng(3).integers(0, 256, (2, 3, 56), dtype=np.uint8)
    before = blocks.copy()
    d = np.array([[0.5, -2.0, 1e-5], [3.0, 0.125, -0.75]])
    write_f16(blocks, "IQ1_M", IQ1_M_SCALES, d)
    sc = np.ascontiguousarray(blocks[..., 48:56]).view(np.uint16)
    bits = (sc[..., 0] >> 12) | ((sc[..., 1] >> 8) & 0xF0) | ((sc[..., 2] >> 4) & 0xF00) | (sc[..., 3] & 0xF000)
    assert np.array_equal(bits.astype(np.uint16).view(np.float16), d.astype(np.float16))
    old = np.ascontiguousarray(before[..., 48:56]).view(np.uint16)
    assert np.array_equal(sc & 0x0FFF, old & 0x0FFF) and np.array_equal(blocks[..., :48], before[..., :48])


def test_random_blocks_refuses_bad_requests():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="TQ1_0"):
        random_blocks("TQ1_0", 1, 256, rng)
    with pytest.raises(ValueError, match="Q4_K needs cols a multiple of 256, got 96"):
        random_blocks("Q4_K", 1, 96, rng)


@pytest.mark.parametrize("type_name", QUANTIZABLE)
def test_quantize_roundtrips_within_the_type_step(type_name):
    w = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    t = quantize(w, type_name)
    assert t.type_name == type_name and t.shape == (4, 64)
    step = (w.max() - w.min()) / (16 if type_name.startswith("Q4") else 32)
    assert np.abs(t.dequantize() - w).max() <= step


def test_quantize_names_the_missing_quantizer():
    with pytest.raises(ValueError, match="no quantizer for 'Q4_K'"):
        quantize(np.zeros((1, 256), np.float32), "Q4_K")
