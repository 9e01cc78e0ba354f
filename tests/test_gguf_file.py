"""GGUF loading: types, metadata validation, and a fuzz test that bad files give a clear GGUFError."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.config import ModelConfig
from llamacmp.gguf_file import GRID_TYPES, QUANT_BLOCKS, GGUFError, GGUFFile, Q8Tensor
from llamacmp.loader import load_model
from llamacmp.models import UnsupportedModel


def test_q8_quantize_matches_llama_quantize_rounding():
    # Values at exact .5 steps: llama.cpp's roundf rounds half away from zero (numpy's round would not).
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 0.5, -0.5, 2.5]
    t = Q8Tensor.quantize(x)
    assert t.d[0, 0] == pytest.approx(1.0)
    assert list(t.qs[0, :4]) == [127, 1, -1, 3]
    np.testing.assert_allclose(t.dequantize(), np.round(x + 1e-9 * np.sign(x)) * 0 + t.qs * t.d[0, 0])


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
def test_fixture_loads_with_its_config(fixture_gguf, dtype):
    f = GGUFFile(fixture_gguf("tiny", dtype))
    cfg = ModelConfig.from_metadata(f.metadata, len(f.metadata["tokenizer.ggml.tokens"]), False)
    assert f.architecture == "qwen35"
    assert cfg.attn_layers == (3,) and cfg.gdn_layers == (0, 1, 2)
    assert cfg.conv_channels == 2 * 2 * 16 + 4 * 16
    kind = f.info("blk.0.ffn_up.weight").type_name
    assert kind == {"f32": "F32", "f16": "F16", "q8_0": "Q8_0"}[dtype]
    # Norms and GDN parameters stay F32 in every file type, as llama.cpp's converter writes them.
    assert f.info("blk.0.ssm_a").type_name == "F32"


def _rewrite_arch(src, dst, arch: str):
    data = bytearray(src.read_bytes())
    i = data.index(b"qwen35")
    # Same length keeps every offset valid: 'qwen3x' stands for an unknown architecture.
    data[i:i + 6] = arch.encode()
    dst.write_bytes(bytes(data))


def test_unknown_architecture_is_named(fixture_gguf, tmp_path):
    bad = tmp_path / "arch.gguf"
    _rewrite_arch(fixture_gguf("tiny", "f32"), bad, "llamax")
    with pytest.raises(UnsupportedModel, match="llamax"):
        load_model(bad, NumpyBackend())


def test_moe_is_refused_clearly():
    from llamacmp.models import model_class
    with pytest.raises(UnsupportedModel, match="qwen35moe.*dense"):
        model_class("qwen35moe")


def _one_tensor_file(path, qtype, raw: np.ndarray):
    import gguf
    w = gguf.GGUFWriter(str(path), "qwen35")
    w.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=qtype)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path


def test_unsupported_tensor_type_is_named(tmp_path):
    import gguf
    path = _one_tensor_file(tmp_path / "tq1.gguf", gguf.GGMLQuantizationType.TQ1_0, np.zeros((4, 54), np.uint8))
    with pytest.raises(GGUFError, match=r"tq1.gguf.*blk.0.ffn_up.weight.*TQ1_0.*supported: .*Q4_K.*IQ4_XS.*IQ1_M"):
        GGUFFile(path)


@pytest.mark.parametrize("qtype,ne0", [("MXFP4", 32), ("TQ2_0", 256)])
def test_other_refused_types_stay_refused(tmp_path, qtype, ne0):
    import gguf
    t = gguf.GGMLQuantizationType[qtype]
    values, nbytes = gguf.GGML_QUANT_SIZES[t]
    path = _one_tensor_file(tmp_path / "x.gguf", t, np.zeros((2, ne0 // values * nbytes), np.uint8))
    with pytest.raises(GGUFError, match=rf"blk.0.ffn_up.weight.*has type {qtype}, which llamacmp does not load"):
        GGUFFile(path)


@pytest.mark.parametrize("qtype", GRID_TYPES)
def test_grid_type_tensor_loads_as_blocks(tmp_path, qtype):
    """The IQ1-3 types load memory-mapped like the other block types: [rows, blocks, bytes] over the file."""
    import gguf
    values, nbytes = QUANT_BLOCKS[qtype]
    assert (values, nbytes) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = np.arange(3 * 2 * nbytes, dtype=np.uint32).astype(np.uint8).reshape(3, 2 * nbytes)
    f = GGUFFile(_one_tensor_file(tmp_path / "g.gguf", gguf.GGMLQuantizationType[qtype], raw))
    t = f.tensor("blk.0.ffn_up.weight")
    assert (t.type_name, t.shape, t.blocks.shape) == (qtype, (3, 512), (3, 2, nbytes))
    assert not t.blocks.flags.owndata                     # a view of the mapped file, not a copy
    assert np.array_equal(t.blocks.reshape(3, -1), raw)


def test_k_quant_tensor_loads_as_blocks(tmp_path):
    import gguf
    raw = np.zeros((4, 144), np.uint8)          # 4 rows of one Q4_K block (256 values)
    f = GGUFFile(_one_tensor_file(tmp_path / "q4k.gguf", gguf.GGMLQuantizationType.Q4_K, raw))
    t = f.tensor("blk.0.ffn_up.weight")
    assert (t.type_name, t.shape, t.blocks.shape) == ("Q4_K", (4, 256), (4, 1, 144))
    assert f.info("blk.0.ffn_up.weight").type_name == "Q4_K"


def test_missing_key_is_named(fixture_gguf, tmp_path):
    src = fixture_gguf("tiny", "f32").read_bytes()
    key = b"qwen35.ssm.conv_kernel"
    bad = tmp_path / "nokey.gguf"
    bad.write_bytes(src.replace(key, b"qwen35.ssm.conv_kernex"))
    with pytest.raises(GGUFError, match="ssm.conv_kernel"):
        load_model(bad, NumpyBackend())


def test_not_a_file_and_bad_magic(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "absent.gguf")
    p = tmp_path / "text.gguf"
    p.write_text("hello, this is not a model file at all")
    with pytest.raises(GGUFError, match="not a GGUF"):
        GGUFFile(p)


def test_fuzz_mutated_and_truncated_files(fixture_gguf, tmp_path):
    """>= 200 corrupted copies: each either loads (a harmless byte flip) or raises a clear GGUFError-family
    error; never another exception, a crash or a hang."""
    src = fixture_gguf("tiny", "q8_0").read_bytes()
    rng = np.random.default_rng(1234)
    header_end = src.index(b"blk.0.attn_norm.weight") + 256          # most structure lives up front
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(240):
        data = bytearray(src)
        kind = case % 4
        if kind == 0:                                                 # truncate anywhere
            data = data[: int(rng.integers(0, len(src)))]
        elif kind == 1:                                               # flip bytes in the header
            for pos in rng.integers(0, header_end, int(rng.integers(1, 8))):
                data[pos] = int(rng.integers(0, 256))
        elif kind == 2:                                               # overwrite a little-endian u64 count/offset
            pos = int(rng.integers(4, header_end - 8))
            data[pos:pos + 8] = int(rng.choice([2**63 - 1, 2**40, 0xFFFFFFFF, 0])).to_bytes(8, "little")
        else:                                                         # flip bytes anywhere
            for pos in rng.integers(0, len(src), int(rng.integers(1, 32))):
                data[pos] ^= 0xFF
        path = tmp_path / f"fuzz{case}.gguf"
        path.write_bytes(bytes(data))
        try:
            load_model(path, NumpyBackend())
            outcomes["loaded"] += 1
        except (GGUFError, UnsupportedModel) as e:
            assert str(path) in str(e) or "architecture" in str(e), f"error does not name the file: {e}"
            outcomes["refused"] += 1
    assert outcomes["refused"] >= 120, outcomes
