"""The numpy reference for block-quantized weights: llama.cpp's x86 activation quantizers (Q8_0 / Q8_1 / Q8_K)
and exact dots of the dequantized operands, per weight type; embed of a quantized table; a whole forward."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.backends.quant_ref import (ACTIVATION_TYPE, Activations, RefQuant, quant_matmul, quantize_q8_1,
                                         quantize_q8_blocks, quantize_q8_k)
from llamacmp.backends.base import StepBatch
from llamacmp.fixtures.quant_blocks import QUANTIZABLE, quantize, random_blocks
from llamacmp.gguf_file import GRID_TYPES, QUANT_BLOCKS, GGUFFile
from llamacmp.models.qwen35 import Qwen35Model
from llamacmp.weights import load_weights
from llamacmp.config import ModelConfig

BE = NumpyBackend()


def test_q8_0_rounds_half_to_even_with_the_127_over_amax_multiplier():
    # amax 127 -> multiplier exactly 1: the .5 cases show the rounding (roundf, the _ref version, would give 3, -3).
    x = np.zeros((1, 32), np.float32)
    x[0, :3] = [127.0, 2.5, -2.5]
    q, d = quantize_q8_blocks(x)
    assert list(q[0, 0, :3]) == [127, 2, -2] and d[0, 0] == 1.0


def test_q8_1_sum_is_f16_of_the_unrounded_scale_times_the_quant_sum():
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    q, d, s = quantize_q8_1(x)
    q0, d0 = quantize_q8_blocks(x)
    assert np.array_equal(q, q0) and np.array_equal(d, d0)
    d32 = np.abs(x.reshape(3, 2, 32)).max(-1) / np.float32(127)
    want = (d32 * q.sum(-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    assert np.array_equal(s, want)
    assert not np.array_equal(s, (d * q.sum(-1)).astype(np.float16).astype(np.float32))   # the f16 d differs


def test_q8_k_scales_by_minus_127_over_the_signed_max():
    x = np.zeros((2, 256), np.float32)
    x[0, :4] = [-127 / 64, 1.0, 2.5 / 64, 3.5 / 64]      # the max is negative: iscale = -127/max = +64 exactly
    q, d = quantize_q8_k(x)
    assert d[0, 0] == np.float32(1 / 64)
    assert list(q[0, 0, :4]) == [-127, 64, 2, 4]          # 2.5 -> 2 and 3.5 -> 4: half to even
    x[0, 0] = 127 / 64                                    # positive max: iscale = -64, the signs flip
    q, d = quantize_q8_k(x)
    assert d[0, 0] == np.float32(-1 / 64) and list(q[0, 0, :4]) == [-127, -64, -2, -4]
    assert d[1, 0] == 0 and not q[1].any()                                      # an all-zero block


def _operands(type_name: str, rows: int, cols: int, seed: int):
    rng = np.random.default_rng(seed)
    w = random_blocks(type_name, rows, cols, rng)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    return w, x


@pytest.mark.parametrize("type_name", list(QUANT_BLOCKS))
def test_scale_and_min_parts_add_up_to_the_dequantized_weights(type_name):
    w, _ = _operands(type_name, 5, 512, 1)
    scaled, mins = RefQuant(w).parts()
    full = scaled.astype(np.float64)
    if mins is not None:
        full += np.repeat(mins.astype(np.float64), 512 // mins.shape[1], axis=1)
    # Each part is exact in float32, so their exact sum rounded once is gguf.quants' float32 value.
    assert np.array_equal(full.astype(np.float32), w.dequantize())


@pytest.mark.parametrize("type_name", list(QUANT_BLOCKS))
def test_matmul_is_the_exact_dot_of_the_vec_dot_type_activations(type_name):
    w, x = _operands(type_name, 7, 512, 2)
    out = BE.matmuls(x, [BE.upload_matrix(w)])[0]
    act = ACTIVATION_TYPE[type_name]
    if act == "Q8_K":
        q, d = quantize_q8_k(x)
    else:
        q, d = quantize_q8_blocks(x)
    xd = (q.astype(np.float64) * d[..., None]).reshape(x.shape)
    want = xd @ w.dequantize().T.astype(np.float64)
    if act == "Q8_1":      # llama.cpp adds m * s with s = f16(d * sum q): not the exact block sum
        _, _, s = quantize_q8_1(x)
        m = np.ascontiguousarray(w.blocks[:, :, 2:4]).view(np.float16)[..., 0].astype(np.float64)
        want += (s.astype(np.float64) - xd.reshape(3, -1, 32).sum(-1)) @ m.T
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # and the activation type is what makes the difference from a plain f32 product
    exact = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
    assert not np.allclose(out, exact, rtol=1e-6, atol=0)
    assert np.abs(out - exact).max() < 0.05 * np.abs(exact).max()


def test_q8_0_matmul_dots_are_the_float64_ones():
    """numpy_ref._q8_matmul takes the integer block dots in float32 (exact below 2^24): the same bits as float64
    dots, here with the extreme quants (every weight -128 or 127 against activations of 127) and random ones."""
    from llamacmp.backends.numpy_ref import RefQ8, _q8_matmul
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, (300, 8, 32)).astype(np.float32)
    q[0], q[1] = -128.0, 127.0
    d = (rng.random((300, 8)) * 0.02).astype(np.float16).astype(np.float32)
    qx = rng.integers(-127, 128, (5, 8, 32)).astype(np.float32)
    qx[0] = 127.0
    dx = rng.random((5, 8)).astype(np.float32)
    want = np.zeros((5, 300))
    for blk in range(8):
        want += (qx[:, blk].astype(np.float64) @ q[:, blk].T.astype(np.float64)) * dx[:, blk, None] * d[None, :, blk]
    assert np.array_equal(_q8_matmul((qx, dx), RefQ8(q, d)), want.astype(np.float32))
    assert (qx[0, 0] @ q[0, 0]) == -32 * 127 * 128


def test_k_quant_weights_see_q8_k_not_q8_0_activations():
    w, x = _operands("Q4_K", 4, 256, 3)
    out = quant_matmul(Activations(x), RefQuant(w))
    q, d = quantize_q8_blocks(x)
    via_q8_0 = (q * d[..., None]).reshape(x.shape).astype(np.float64) @ w.dequantize().T.astype(np.float64)
    assert np.abs(out - via_q8_0).max() > 1e-4 * np.abs(via_q8_0).max()


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "IQ4_NL", "Q5_1", *GRID_TYPES])
def test_embed_of_a_quantized_table_dequantizes_its_rows(type_name):
    t = random_blocks(type_name, 10, 256, np.random.default_rng(4))
    ids = np.array([3, 0, 3, 9], np.int32)
    got = BE.embed(BE.upload_matrix(t), ids)
    assert got.dtype == np.float32 and np.array_equal(got, t.dequantize()[ids])


@pytest.mark.parametrize("type_name", QUANTIZABLE)
def test_forward_with_quantized_matrices_stays_near_the_same_weights_in_f32(fixture_gguf, type_name):
    """A whole tiny qwen35 forward: every matrix gguf.quants-quantized to type_name, against the model whose
    matrices are those dequantized values in f32. Only the activation quantization separates them."""
    f = GGUFFile(fixture_gguf("tiny", "f32"))
    cfg = ModelConfig.from_metadata(f.metadata, len(f.metadata["tokenizer.ggml.tokens"]), not f.has("output.weight"))
    weights = load_weights(f, cfg)
    q_w = _map_matrices(weights, lambda m: quantize(m, type_name))
    f_w = _map_matrices(q_w, lambda m: m.dequantize())
    ids = list(np.random.default_rng(6).integers(0, cfg.n_vocab, 9))
    outs = []
    for w in (q_w, f_w):
        model = Qwen35Model(cfg, w, BE)
        outs.append(model.forward(StepBatch.build([(BE.new_state(cfg, 16), ids)], all_logits=True)))
    rel = np.linalg.norm(outs[0] - outs[1]) / np.linalg.norm(outs[1])
    assert 0 < rel < 0.05, rel


def _map_matrices(w, fn):
    def layer(lw):
        lw = replace(lw, ffn_gate=fn(lw.ffn_gate), ffn_up=fn(lw.ffn_up), ffn_down=fn(lw.ffn_down))
        if lw.attn is not None:
            a = lw.attn
            lw.attn = replace(a, attn_q=fn(a.attn_q), attn_k=fn(a.attn_k), attn_v=fn(a.attn_v),
                              attn_output=fn(a.attn_output))
        if lw.gdn is not None:
            g = lw.gdn
            lw.gdn = replace(g, attn_qkv=fn(g.attn_qkv), attn_gate=fn(g.attn_gate), ssm_beta=fn(g.ssm_beta),
                             ssm_alpha=fn(g.ssm_alpha), ssm_out=fn(g.ssm_out))
        return lw
    embd = fn(w.token_embd)
    return replace(w, token_embd=embd, output=embd if w.output is w.token_embd else fn(w.output),
                   layers=[layer(lw) for lw in w.layers])
