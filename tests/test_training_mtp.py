"""training/from_gguf.py, mtp.py, train_mtp.py and export.write_with_mtp (issue 19): a GGUF read back into
transformers gives the model that was exported, the MTP head computes what llama.cpp 0c1e570's graph_mtp computes
from the exported tensors, and the exported file keeps every trunk byte and metadata value."""
from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # training/ is a folder of the repo, not installed

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5")
gguf = pytest.importorskip("gguf")

from training import corpus, export, from_gguf, tokenizer, train_mtp  # noqa: E402
from training.model import SIZES, build_model  # noqa: E402
from training.mtp import MTPModel  # noqa: E402

SAMPLE = ("def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n"
          "class Point:\n    \"\"\"A point.\"\"\"\n    def __init__(self, x=0, y=0):\n        self.x, self.y = x, y\n")


@pytest.fixture(scope="module")
def tok():
    return tokenizer.train_tokenizer([SAMPLE * 3, corpus.retrieval_doc(random.Random(0), 200).text], vocab_size=384)


def perturbed_model(tok, seed: int, tied: bool = False):
    vocab = tokenizer.gguf_vocab(tok)
    model = build_model(replace(SIZES["test"], tied=tied), len(vocab.tokens), vocab.eos_id, vocab.pad_id).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():     # norms, A_log, dt_bias too: no default init hides a transform
            p.add_(0.1 * torch.randn(p.shape, generator=g))
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2)
    return model, vocab


@pytest.fixture(scope="module")
def trunk_file(tmp_path_factory, tok):
    model, vocab = perturbed_model(tok, seed=3)
    path = export.write_gguf(tmp_path_factory.mktemp("trunk") / "trunk-f32.gguf", model, vocab, "f32")
    return path, model


def test_hf_tensors_inverts_gguf_tensors(tok):
    model, _ = perturbed_model(tok, seed=1)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    back = export.hf_tensors(export.gguf_tensors(sd, model.config), model.config)
    assert set(back) == set(sd)
    for k, v in sd.items():
        np.testing.assert_allclose(back[k].reshape(v.shape), v, rtol=1e-6, atol=1e-6, err_msg=k)
    # the permutations alone are exact
    assert all(np.array_equal(back[k], sd[k]) for k in sd if "proj" in k or "embed" in k)


@pytest.mark.parametrize("tied", [False, True])
def test_load_trunk_gives_the_exported_model(tmp_path, tok, tied):
    model, vocab = perturbed_model(tok, seed=2, tied=tied)
    path = export.write_gguf(tmp_path / "m.gguf", model, vocab, "f32")
    back, back_vocab = from_gguf.load_trunk(from_gguf.read(path))
    assert back.config.tie_word_embeddings == tied and back_vocab.tokens == vocab.tokens
    ids = torch.tensor([tok.encode(SAMPLE).ids[:40]])
    with torch.no_grad():
        want, got = model(ids).logits, back(ids).logits
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_load_trunk_refuses_what_it_cannot_express(trunk_file):
    g = from_gguf.read(trunk_file[0])
    with pytest.raises(ValueError, match="rope.dimension_count"):
        from_gguf.model_size(replace(g, kv={**g.kv, "qwen35.rope.dimension_count": 7}))
    with pytest.raises(ValueError, match="already has an MTP block"):
        from_gguf.model_size(replace(g, kv={**g.kv, "qwen35.nextn_predict_layers": 1}))


def test_tokenizer_from_gguf_vocab_matches_the_trained_one(tok):
    back = tokenizer.from_vocab(tokenizer.gguf_vocab(tok))
    text = SAMPLE + "<|im_start|>user\nünïcödé <think>x</think><|im_end|>"
    assert back.encode(text).ids == tok.encode(text).ids
    assert back.decode(back.encode(text).ids, skip_special_tokens=False) == text


def head_model(trunk, seed: int = 5) -> MTPModel:
    m = MTPModel(trunk)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.head.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m.eval()


def test_mtp_head_is_causal_and_trains_only_the_head(trunk_file, tok):
    m = head_model(trunk_file[1])
    ids = torch.tensor([tok.encode(SAMPLE).ids[:32]])
    h = m.hidden(ids)
    with torch.no_grad():
        a = m.mtp_logits(h, ids)
        ids2 = ids.clone()
        ids2[0, 20:] = (ids2[0, 20:] + 7) % 300
        b = m.mtp_logits(m.hidden(ids2), ids2)
    # row t reads h_t and x_{t+1}: rows before 19 cannot see position 20 and later
    assert torch.equal(a[0, :19], b[0, :19]) and not torch.allclose(a[0, 19:], b[0, 19:])
    loss = m.loss(h, ids)
    loss.backward()
    assert all(p.grad is None for p in m.trunk.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.head.parameters())


def test_chained_second_step_is_what_a_kv_cache_would_see(trunk_file, tok):
    """Draft step 2 at position j + 2 (llama.cpp: the head's own step-1 output as h) must equal a plain causal run
    over what the MTP KV cache holds then: the step-1 inputs of positions 1..j + 1, then the chained input."""
    m = head_model(trunk_file[1])
    ids = torch.tensor([tok.encode(SAMPLE).ids[:20]])
    with torch.no_grad():
        h = m.hidden(ids)
        first, second = m.chained_logits(h, ids)
        torch.testing.assert_close(first, m.mtp_logits(h, ids), rtol=1e-5, atol=1e-5)
        emb = m.trunk.model.embed_tokens(ids)
        a = m.head.inputs(h[:, :-1], emb[:, 1:])
        o = m.head.block(a, m.rope(a, torch.arange(1, 20)[None]))
        for j in (0, 7, 17):
            b = m.head.inputs(o[:, j:j + 1], emb[:, j + 2:j + 3])
            x = torch.cat([a[:, :j + 1], b], 1)
            pos = torch.cat([torch.arange(1, j + 2), torch.tensor([j + 2])])[None]
            want = m.trunk.lm_head(m.head.block(x, m.rope(x, pos)))[:, -1]
            torch.testing.assert_close(second[:, j], want, rtol=1e-5, atol=1e-5)
    loss = m.loss(h, ids, chain_weight=0.5)
    assert loss > m.loss(h, ids)


def rms(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def graph_mtp(t: dict[str, np.ndarray], il: int, h: np.ndarray, ids: np.ndarray, n_head: int, n_head_kv: int,
              n_rot: int, base: float) -> np.ndarray:
    """llama.cpp 0c1e570 qwen35.cpp `graph_mtp` in numpy, from GGUF tensors alone (norms stored as 1 + w).
    h [T, D] trunk output-normed hidden at t, ids [T] the tokens x_{t+1}; returns logits [T, V]."""
    b, T = f"blk.{il}.", len(ids)
    mm = lambda x, name: x @ t[b + name + ".weight"].T          # noqa: E731
    e = rms(t["token_embd.weight"][ids], t[b + "nextn.enorm.weight"])
    x = mm(np.concatenate([e, rms(h, t[b + "nextn.hnorm.weight"])], -1), "nextn.eh_proj")
    cur = rms(x, t[b + "attn_norm.weight"])
    qf = mm(cur, "attn_q").reshape(T, n_head, -1)
    Dh = qf.shape[-1] // 2
    q, gate = rms(qf[..., :Dh], t[b + "attn_q_norm.weight"]), qf[..., Dh:].reshape(T, -1)
    k = rms(mm(cur, "attn_k").reshape(T, n_head_kv, Dh), t[b + "attn_k_norm.weight"])
    v = mm(cur, "attn_v").reshape(T, n_head_kv, Dh)
    pos = np.arange(1, T + 1)[:, None] * base ** (-np.arange(0, n_rot, 2) / n_rot)     # NEOX rope, first n_rot

    def rope(z):
        c, s = np.cos(pos)[:, None], np.sin(pos)[:, None]
        z1, z2, rest = z[..., :n_rot // 2], z[..., n_rot // 2:n_rot], z[..., n_rot:]
        return np.concatenate([z1 * c - z2 * s, z2 * c + z1 * s, rest], -1)
    q, k = rope(q), rope(k)
    rep = n_head // n_head_kv
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(Dh) + np.triu(np.full((T, T), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    att = np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), v).reshape(T, -1)
    x = x + mm(att * (1 / (1 + np.exp(-gate))), "attn_output")
    f = rms(x, t[b + "post_attention_norm.weight"])
    g = mm(f, "ffn_gate")
    x = x + (g / (1 + np.exp(-g)) * mm(f, "ffn_up")) @ t[b + "ffn_down.weight"].T
    return rms(x, t[b + "nextn.shared_head_norm.weight"]) @ t["output.weight"].T


def test_exported_mtp_file_keeps_the_trunk_and_computes_graph_mtp(tmp_path, trunk_file, tok):
    src_path, trunk = trunk_file
    m = head_model(trunk)
    head_sd = {k: v.detach().numpy() for k, v in m.head.state_dict().items()}
    src = from_gguf.read(src_path)
    out = export.write_with_mtp(src, head_sd, tmp_path / "mtp.gguf")
    dst = from_gguf.read(out)
    n = int(src.kv["qwen35.block_count"])
    # metadata: everything as it was, but block_count + 1 and nextn_predict_layers = 1
    assert dst.kv["qwen35.block_count"] == n + 1 and dst.kv["qwen35.nextn_predict_layers"] == 1
    assert {k: v for k, v in dst.kv.items() if k not in ("qwen35.block_count", "qwen35.nextn_predict_layers")} \
        == {k: v for k, v in src.kv.items() if k != "qwen35.block_count"}
    # the trunk's bytes and types unchanged, in the same order, before the MTP block
    assert list(dst.raw)[:len(src.raw)] == list(src.raw)
    for name, (data, qtype) in src.raw.items():
        assert dst.raw[name][1] == qtype and np.array_equal(dst.raw[name][0], data), name
    # the MTP block: the names and shapes llama.cpp 0c1e570 loads (load_block_mtp; numpy order = reversed ne)
    D, V = trunk.config.hidden_size, trunk.config.vocab_size
    new = {k: dst.tensors[k].shape for k in dst.raw if k not in src.raw}
    b = f"blk.{n}."
    H, Hkv, Dh, F = (trunk.config.num_attention_heads, trunk.config.num_key_value_heads, trunk.config.head_dim,
                     trunk.config.intermediate_size)
    assert new == {b + "attn_norm.weight": (D,), b + "post_attention_norm.weight": (D,),
                   b + "attn_q.weight": (2 * H * Dh, D), b + "attn_k.weight": (Hkv * Dh, D),
                   b + "attn_v.weight": (Hkv * Dh, D), b + "attn_output.weight": (D, H * Dh),
                   b + "attn_q_norm.weight": (Dh,), b + "attn_k_norm.weight": (Dh,),
                   b + "ffn_gate.weight": (F, D), b + "ffn_up.weight": (F, D), b + "ffn_down.weight": (D, F),
                   b + "nextn.eh_proj.weight": (D, 2 * D), b + "nextn.enorm.weight": (D,),
                   b + "nextn.hnorm.weight": (D,), b + "nextn.shared_head_norm.weight": (D,)}
    # and from those tensors alone, llama.cpp's graph gives the head's logits
    ids = torch.tensor([tok.encode(SAMPLE).ids[:24]])
    with torch.no_grad():
        h = m.hidden(ids)
        want = m.mtp_logits(h, ids)[0].double().numpy()
    t = {k: v.astype(np.float64) for k, v in dst.tensors.items()}
    got = graph_mtp(t, n, h[0, :-1].double().numpy(), ids[0, 1:].numpy(), H, Hkv, Dh // 4,
                    float(src.kv["qwen35.rope.freq_base"]))
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_q8_0_export_quantizes_the_mtp_matrices(tmp_path, tok):
    model, vocab = perturbed_model(tok, seed=4)
    src = from_gguf.read(export.write_gguf(tmp_path / "t-q8.gguf", model, vocab, "q8_0"))
    m = head_model(from_gguf.load_trunk(src)[0])
    dst = from_gguf.read(export.write_with_mtp(src, {k: v.detach().numpy() for k, v in m.head.state_dict().items()},
                                               tmp_path / "mtp.gguf"))
    types = {k: q.name for k, (_, q) in dst.raw.items() if k.startswith("blk.4.")}
    assert types["blk.4.nextn.eh_proj.weight"] == "Q8_0" and types["blk.4.attn_q.weight"] == "Q8_0"
    assert types["blk.4.nextn.enorm.weight"] == "F32" and types["blk.4.attn_norm.weight"] == "F32"
    with pytest.raises(ValueError, match="already has an MTP block"):
        export.write_with_mtp(dst, {}, tmp_path / "again.gguf")


def test_train_mtp_end_to_end_lowers_the_loss(tmp_path, trunk_file, tok):
    """The test preset on the tiny trunk: states, steps, evaluation, save, export; the held-out loss falls."""
    p = replace(train_mtp.PRESETS["test"], corpus_chars=6000, seq_len=32, steps=40, eval_every=40, lr=5e-3,
                heldout_tokens=256, chain_weight=0.5)
    head = train_mtp.train(p, trunk_file[0], "t", tmp_path, "cpu", export=True, log_dir=tmp_path)
    log = (tmp_path / "t.log").read_text()
    first = float(log.split("eval step 0: loss ")[1].split()[0])
    last = float(log.split("eval step 40: loss ")[1].split()[0])
    assert last < first - 0.5, log
    assert head.exists() and (tmp_path / "trunk-f32-mtp.gguf").exists()
