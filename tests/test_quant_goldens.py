"""gguf.quants' dequantization and the reference's activation quantizers, bit for bit against ggml's own
(llama.cpp's CPU build, x86-64, of both oracles: compat/goldens/quant_blocks.npz for b8462 and
compat/goldens/0c1e570/quant_blocks.npz, made by compat/gen_quant_goldens.py [--oracle 0c1e570]). The two equal each
other but for vec_dot_Q6_K (0c1e570's float32 sums differ by up to 1.5e-5), within the matmul test's tolerance.
A type one oracle's golden lacks must be named in compat/oracles.py NOT_RECORDED_CASES (it then skips with the
reason there; none does today)."""
from __future__ import annotations

import functools

import numpy as np
import oracle_goldens
import pytest

from llamacmp.backends.quant_ref import quantize_q8_1, quantize_q8_blocks, quantize_q8_k
from llamacmp.gguf_file import QUANT_BLOCKS, Q8Tensor, QuantTensor



@functools.lru_cache(maxsize=None)
def _load(label: str, path) -> dict:
    with np.load(path) as f:
        return {**f, "_label": label}


@pytest.fixture(params=[pytest.param(p.values, id=p.id, marks=p.marks)
                        for p in oracle_goldens.per_oracle("quant_blocks.npz")])
def GOLDEN(request) -> dict:
    """One oracle's goldens, and its label under "_label" (the params carry the oracle and its path, and its skip
    with the reason where it has none)."""
    oracle, path = request.param
    return _load(oracle.label, path)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)      # -0.0 and NaN payloads count too


def _typed(GOLDEN, type_name: str) -> dict[str, np.ndarray]:
    """The golden, after checking it has this type: where it lacks it, compat/oracles.py must say why (skip with
    that reason); a type missing without a reason fails."""
    if f"blocks_{type_name}" not in GOLDEN:
        why = oracle_goldens.oracles.missing_case(GOLDEN["_label"], "quant_blocks.npz", type_name)
        assert why, f"{GOLDEN['_label']} quant_blocks.npz has no {type_name} and compat/oracles.py gives no reason"
        pytest.skip(f"no {type_name} in {GOLDEN['_label']} quant_blocks.npz: {why}")
    return GOLDEN


@pytest.mark.parametrize("type_name", [*QUANT_BLOCKS, "Q8_0"])
def test_gguf_quants_dequantizes_like_ggml(GOLDEN, type_name):
    blocks = _typed(GOLDEN, type_name)[f"blocks_{type_name}"]
    t = Q8Tensor(blocks) if type_name == "Q8_0" else QuantTensor(type_name, blocks)
    want = GOLDEN[f"dequant_{type_name}"]
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    assert np.array_equal(_bits(t.dequantize()), _bits(want))


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def test_q8_0_activations_match_ggml(GOLDEN):
    x = GOLDEN["activations"]
    raw = GOLDEN["quant_Q8_0"].reshape(len(x), -1, 34)
    q, d = quantize_q8_blocks(x)
    assert np.array_equal(q, raw[..., 2:].view(np.int8).astype(np.float32))
    assert np.array_equal(d, _f16(raw[..., :2]))
    # the golden has the ties where the portable quantize_row_q8_0_ref (roundf of x / d) rounds differently
    xb = x.reshape(q.shape)
    v = xb / np.where(d > 0, np.abs(xb).max(-1) / np.float32(127), 1)[..., None]
    assert not np.array_equal(q, np.sign(v) * np.floor(np.abs(v) + 0.5))


def test_q8_1_activations_match_ggml(GOLDEN):
    x = GOLDEN["activations"]
    raw = GOLDEN["quant_Q8_1"].reshape(len(x), -1, 36)            # d f16, s f16, 32 int8
    q, d, s = quantize_q8_1(x)
    assert np.array_equal(q, raw[..., 4:].view(np.int8).astype(np.float32))
    assert np.array_equal(d, _f16(raw[..., :2]))
    assert np.array_equal(s, _f16(raw[..., 2:4]))


def test_q8_k_activations_match_ggml(GOLDEN):
    x = GOLDEN["activations"]
    raw = GOLDEN["quant_Q8_K"].reshape(len(x), -1, 292)           # d f32, 256 int8, 16 int16 bsums
    q, d = quantize_q8_k(x)
    assert np.array_equal(_bits(d), np.ascontiguousarray(raw[..., :4]).view(np.float32)[..., 0].view(np.uint32))
    want_q = raw[..., 4:260].view(np.int8)
    assert np.array_equal(q, want_q.astype(np.float32))
    bsums = np.ascontiguousarray(raw[..., 260:]).view(np.int16)
    assert np.array_equal(bsums, want_q.reshape(len(x), -1, 16, 16).astype(np.int16).sum(-1))


@pytest.mark.parametrize("type_name", [*QUANT_BLOCKS, "Q8_0"])
def test_reference_matmul_matches_ggml_vec_dot(GOLDEN, type_name):
    """The numpy reference's matmul against ggml's vec_dot on the same blocks and rows: equal up to ggml's float32
    accumulation (the activation quantization is the same, so nothing else may differ)."""
    from llamacmp.backends.numpy_ref import NumpyBackend
    be = NumpyBackend()
    blocks = _typed(GOLDEN, type_name)[f"blocks_{type_name}"][:2]
    w = Q8Tensor(blocks) if type_name == "Q8_0" else QuantTensor(type_name, blocks)
    x = GOLDEN["activations"]
    got = be.matmuls(x, [be.upload_matrix(w)])[0].astype(np.float64)
    want = GOLDEN[f"vec_dot_{type_name}"].astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).T.astype(np.float64)   # sum of |terms|
    assert np.all(np.abs(got - want) <= 1e-6 * scale), np.abs(got - want).max() / scale.max()
