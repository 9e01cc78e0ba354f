"""benchmarks/memory_fit.py: llama-quantize's type mixes for the real shapes, and the largest context that fits."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import memory_fit  # noqa: E402
from llamacmp import memplan
from llamacmp.fixtures.writer import shape_model  # noqa: E402


GOLDEN = json.loads(memory_fit.GOLDEN.read_text())


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_rule_gives_llama_quantize_s_type_to_every_tensor(case):
    """compat/goldens/quant_mix.json: llama-quantize b8462 --dry-run on header-only F16 files of the real shapes
    (benchmarks/memory_fit.py --check-quantize ... --save-golden)."""
    shape, preset = case.split(":")
    want = GOLDEN[case]
    assert len(set(want)) >= 2 and None not in want
    assert list(memory_fit.preset_types(shape, preset).values()) == want


def test_q4_k_m_mix_of_the_9b_shape():
    t = memory_fit.preset_types("9b", "Q4_K_M")
    assert (t["token_embd.weight"], t["output.weight"], t["output_norm.weight"]) == ("Q4_K", "Q6_K", "F32")
    more = [il for il in range(32) if t[f"blk.{il}.ffn_down.weight"] == "Q6_K"]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    # the attn_v-like tensor of each layer (GDN attn_qkv, attention attn_v) follows the same layers
    v_like = [il for il in range(32) if t.get(f"blk.{il}.attn_v.weight", t.get(f"blk.{il}.attn_qkv.weight")) == "Q6_K"]
    assert v_like == more
    assert {t[f"blk.0.{n}"] for n in ("attn_gate.weight", "ssm_alpha.weight", "ssm_out.weight", "ffn_up.weight")} \
        == {"Q4_K"}
    assert {t[f"blk.0.{n}"] for n in ("ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight")} == {"F32"}


def test_iq4_xs_mix_of_the_27b_shape():
    t = memory_fit.preset_types("27b", "IQ4_XS")
    assert (t["token_embd.weight"], t["output.weight"]) == ("IQ4_XS", "Q6_K")
    assert [il for il in range(64) if t[f"blk.{il}.ffn_down.weight"] == "Q5_K"] == list(range(8))
    assert t["blk.3.attn_v.weight"] == t["blk.0.attn_qkv.weight"] == "Q5_K"         # n_head / n_head_kv = 6
    assert t["blk.3.attn_k.weight"] == t["blk.40.ffn_gate.weight"] == "IQ4_XS"


def test_largest_context_is_the_edge_of_the_plan():
    tensors, cfg = shape_model("27b", memory_fit.N_VOCAB, types=memory_fit.preset_types("27b", "IQ4_XS"))
    cap = 16 * memplan.GIB - 512 * memplan.MIB
    for kv in memory_fit.KV:
        c = memory_fit.largest_ctx(tensors, cfg, kv, 1, cap, 512)
        assert 0 < c < cfg.n_ctx_train
        assert memory_fit.fits(tensors, cfg, c, kv, 1, cap, 512)
        assert not memory_fit.fits(tensors, cfg, c + 256, kv, 1, cap, 512)
    # two cards hold more than twice the context of one for the same KV format (the weights are split too)
    one, two = (memory_fit.largest_ctx(tensors, cfg, ("f16", "f16"), n, cap, 512) for n in (1, 2))
    assert two > 2 * one


def test_unknown_case_is_refused(capsys):
    with pytest.raises(SystemExit):
        memory_fit.main(["--case", "27b:IQ2_XXS"])
    assert "preset one of" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["Q4_K_M", "IQ4_XS"])
def test_speed_file_of_a_preset_holds_its_types_and_runs(tmp_path, preset):
    """bench_model.make_9b(preset=...) draws the mix's blocks directly: every tensor gets preset_types' type and its
    bytes, the file type says the preset, and the model loads and runs to finite logits (q256: every row 256 long)."""
    from bench_model import make_9b
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.gguf_file import GGUFFile
    from llamacmp.engine.sequence import Sequence
    from llamacmp.loader import load_model
    path = tmp_path / "m.gguf"
    make_9b(str(path), shape="q256", preset=preset, mtp=True)
    want = memory_fit.preset_types("q256", preset, mtp=True)
    f = GGUFFile(path)
    got = {name: f.info(name).type_name for name in want}
    assert got == want and f.metadata["general.file_type"] == memory_fit.FILE_TYPES[preset]
    assert {"Q6_K", "Q5_K"} & set(want.values())          # the mix, not one type
    logits = Sequence(load_model(path, NumpyBackend()), n_ctx=16).feed([1, 2, 3], all_logits=True)
    assert logits.shape[0] == 3 and np.isfinite(logits).all()
