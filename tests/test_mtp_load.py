"""Loading of the MTP (nextn) block: config split of block_count, the weights and llama.cpp's fallbacks."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from llamacmp.config import ConfigError, ModelConfig
from llamacmp.fixtures.writer import SHAPES, shape_model, write_model
from llamacmp.loader import open_model
from llamacmp.weights import load_weights


@pytest.fixture(scope="module")
def mtp_files(tmp_path_factory, tiny_vocab):
    d = tmp_path_factory.mktemp("mtp")
    return {own: write_model(d / f"own{own}.gguf", replace(SHAPES["tiny"], mtp=True, mtp_own=own), "q8_0", tiny_vocab)
            for own in (False, True)}


def test_block_count_splits_into_main_and_mtp_layers(mtp_files):
    mf = open_model(mtp_files[False])
    cfg = mf.cfg
    assert mf.gguf.metadata["qwen35.block_count"] == 5
    assert (cfg.n_layer, cfg.n_nextn, cfg.block_count) == (4, 1, 5)
    assert cfg.attn_layers == (3,) and cfg.gdn_layers == (0, 1, 2)     # over the main layers only


def test_mtp_weights_and_fallbacks(mtp_files):
    mf = open_model(mtp_files[False])
    w = load_weights(mf.gguf, mf.cfg)
    D = mf.cfg.n_embd
    assert w.mtp is not None and w.mtp.block.attn is not None and w.mtp.block.gdn is None
    assert w.mtp.eh_proj.shape == (D, 2 * D)
    # no nextn.embed_tokens / shared_head_head in this file: llama.cpp takes token_embd / output
    assert w.mtp.embed is w.token_embd and w.mtp.head is w.output
    assert not np.array_equal(w.mtp.head_norm, w.output_norm)       # the file's own shared_head_norm
    mf2 = open_model(mtp_files[True])
    w2 = load_weights(mf2.gguf, mf2.cfg)
    assert w2.mtp.embed is not w2.token_embd and w2.mtp.head is not w2.output
    assert w2.mtp.embed.shape == (mf2.cfg.n_vocab, D)


def test_file_without_mtp_is_unchanged(fixture_gguf):
    mf = open_model(fixture_gguf("tiny", "q8_0"))
    assert (mf.cfg.n_layer, mf.cfg.n_nextn) == (4, 0)
    assert load_weights(mf.gguf, mf.cfg).mtp is None


def _kv(**over):
    kv = {"general.architecture": "qwen35", "qwen35.block_count": 5, "qwen35.embedding_length": 64,
          "qwen35.feed_forward_length": 128, "qwen35.attention.head_count": 4, "qwen35.attention.head_count_kv": 2,
          "qwen35.attention.key_length": 32, "qwen35.attention.layer_norm_rms_epsilon": 1e-6,
          "qwen35.ssm.conv_kernel": 4, "qwen35.ssm.state_size": 16, "qwen35.ssm.group_count": 2,
          "qwen35.ssm.time_step_rank": 4, "qwen35.ssm.inner_size": 64}
    kv.update(over)
    return kv


def test_bad_nextn_counts_are_refused():
    assert ModelConfig.from_metadata(_kv(**{"qwen35.nextn_predict_layers": 1}), 10, False).n_layer == 4
    with pytest.raises(ConfigError, match="nextn_predict_layers 2 is not supported"):
        ModelConfig.from_metadata(_kv(**{"qwen35.nextn_predict_layers": 2}), 10, False)
    with pytest.raises(ConfigError, match="leaves no main layers"):
        ModelConfig.from_metadata(_kv(**{"qwen35.nextn_predict_layers": 5}), 10, False)


def test_shape_model_plans_the_mtp_tensors():
    tensors, cfg = shape_model("tiny", 100, mtp=True)
    names = {t.name for t in tensors}
    assert cfg.n_nextn == 1 and "blk.4.nextn.eh_proj.weight" in names and "blk.4.attn_q.weight" in names
    assert not any(n.startswith("blk.4.") for n in (t.name for t in shape_model("tiny", 100)[0]))


def test_memory_plan_counts_the_mtp_block_only_when_it_runs():
    """Without --spec-type draft-mtp the MTP block is neither uploaded nor planned; with it, its weights, its KV
    layer, the verification states (n_max + 1 tokens per slot) and the hidden rows that feed the head are."""
    from llamacmp import memplan
    tensors, cfg = shape_model("9b", 248320, mtp=True)
    plain_tensors, _ = shape_model("9b", 248320)
    off = memplan.plan(tensors, cfg, 4096, 2)
    assert off.item("weights").nbytes == memplan.plan(plain_tensors, cfg, 4096, 2).item("weights").nbytes
    on = memplan.plan(tensors, cfg, 4096, 2, spec_n_max=3)
    mtp_w = sum(memplan.tensor_bytes(t) for t in tensors if t.name.startswith("blk.32."))
    assert on.item("weights").nbytes - off.item("weights").nbytes == mtp_w > 0
    kv_layer = memplan.kv_bytes(cfg, 4096, "f16", "f16", 1) * 2
    assert on.item("KV cache").nbytes - off.item("KV cache").nbytes == kv_layer
    steps = memplan.spec_steps_bytes(cfg, 3) * 2
    rows = memplan.spec_rows_bytes(cfg, 3) * 2
    assert on.item("scratch").nbytes - off.item("scratch").nbytes == steps + rows
    assert rows >= 2 * (256 + 8 * 4) * 4096 * 4               # 2 slots x (the plain steps' queue + the ring) x 16 KB
    assert steps >= 2 * 24 * 3 * 32 * 128 * 128 * 4          # 2 slots x 24 GDN layers x 3 states of 2 MiB
    assert on.item("logits").nbytes >= 2 * 4 * 248320 * 4 > off.item("logits").nbytes   # 1 + 3 rows per slot


def test_loading_without_mtp_leaves_the_block_on_disk(mtp_files):
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.loader import load_model
    assert load_model(mtp_files[False], NumpyBackend()).model.mtp is not None
    assert load_model(mtp_files[False], NumpyBackend(), mtp=False).model.mtp is None
