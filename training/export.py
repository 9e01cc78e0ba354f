"""Export a trained Qwen3_5ForCausalLM (HF checkpoint folder + tokenizer.json) to a `qwen35` GGUF (F32 / Q8_0).

    python -m training.export CHECKPOINT_DIR OUT.gguf --type q8_0

The transforms are those of llama.cpp's convert_hf_to_gguf for Qwen3.5 (the inverse of
compat/check_transformers.py): RMSNorm weights stored as 1 + w (except the GDN output norm), ssm_a = -exp(A_log),
V heads reordered grouped -> tiled, the conv1d kernel squeezed to [channels, kernel]. The metadata keys and
tensor order come from our fixture writer, so files match what our loader and llama.cpp expect.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from llamacmp.fixtures.writer import TEMPLATE_PATH, Shape, _write_metadata, ggml_type, layout, tensor_specs
from llamacmp.gguf_file import Q8Tensor


def grouped_to_tiled(n_v: int, n_k: int) -> np.ndarray:
    """idx[i] = HF V head that becomes GGUF head i. HF head j uses K head j // (V/K); GGUF head i uses i % K."""
    r = n_v // n_k
    return np.array([(i % n_k) * r + i // n_k for i in range(n_v)])


def shape_of(cfg, n_ctx_train: int) -> Shape:
    n_rot = int(cfg.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.25))
    half = n_rot // 2       # text-only: the sections just have to cover n_rot / 2 pairs, in Qwen3.5's proportions
    sections = (half - 2 * (half // 3), half // 3, half // 3, 0)
    return Shape(n_layer=cfg.num_hidden_layers, n_embd=cfg.hidden_size, n_ff=cfg.intermediate_size,
                 n_head=cfg.num_attention_heads, n_head_kv=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                 ssm_k_heads=cfg.linear_num_key_heads, ssm_v_heads=cfg.linear_num_value_heads,
                 ssm_head_dim=cfg.linear_value_head_dim, conv_kernel=cfg.linear_conv_kernel_dim,
                 full_attention_interval=4, rope_base=float(cfg.rope_parameters["rope_theta"]),
                 rope_sections=sections, tied=bool(cfg.tie_word_embeddings), n_ctx_train=n_ctx_train)


def check_supported(cfg) -> None:
    """The GGUF carries one ssm head size and a fixed 3:1 layer pattern; refuse what it cannot express."""
    if cfg.linear_key_head_dim != cfg.linear_value_head_dim:
        raise ValueError("linear_key_head_dim must equal linear_value_head_dim")
    expected = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(cfg.num_hidden_layers)]
    if list(cfg.layer_types) != expected:
        raise ValueError(f"layer_types must be 3 linear : 1 full, got {cfg.layer_types}")


def gguf_tensors(sd: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """HF state dict (float32 numpy) -> GGUF tensor name -> float32 array in GGUF numpy order."""
    V, K, Dv = cfg.linear_num_value_heads, cfg.linear_num_key_heads, cfg.linear_value_head_dim
    idx = grouped_to_tiled(V, K)
    rows = lambda x: x.reshape(V, Dv, *x.shape[1:])[idx].reshape(x.shape)     # noqa: E731
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": 1 + sd["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    for il in range(cfg.num_hidden_layers):
        b, h = f"blk.{il}.", f"model.layers.{il}."
        if cfg.layer_types[il] == "full_attention":
            out.update(attention_block(sd, h, b))
            continue
        out[b + "attn_norm.weight"] = 1 + sd[h + "input_layernorm.weight"]
        out[b + "post_attention_norm.weight"] = 1 + sd[h + "post_attention_layernorm.weight"]
        for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            out[b + ours + ".weight"] = sd[h + f"mlp.{theirs}.weight"]
        la = h + "linear_attn."
        qk = 2 * K * cfg.linear_key_head_dim
        qkv, conv = sd[la + "in_proj_qkv.weight"], sd[la + "conv1d.weight"][:, 0, :]
        out[b + "attn_qkv.weight"] = np.concatenate([qkv[:qk], rows(qkv[qk:])])
        out[b + "attn_gate.weight"] = rows(sd[la + "in_proj_z.weight"])
        out[b + "ssm_beta.weight"] = sd[la + "in_proj_b.weight"][idx]
        out[b + "ssm_alpha.weight"] = sd[la + "in_proj_a.weight"][idx]
        out[b + "ssm_conv1d.weight"] = np.concatenate([conv[:qk], rows(conv[qk:])])
        out[b + "ssm_dt.bias"] = sd[la + "dt_bias"][idx]
        out[b + "ssm_a"] = -np.exp(sd[la + "A_log"])[idx]
        out[b + "ssm_norm.weight"] = sd[la + "norm.weight"]          # no 1 + w: a plain RMSNorm in HF too
        o = sd[la + "out_proj.weight"]
        out[b + "ssm_out.weight"] = o.reshape(-1, V, Dv)[:, idx].reshape(o.shape)
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def attention_block(sd: dict[str, np.ndarray], h: str, b: str) -> dict[str, np.ndarray]:
    """One full-attention decoder block, HF prefix `h` (e.g. "model.layers.3.") -> GGUF prefix `b` ("blk.3.")."""
    out = {b + "attn_norm.weight": 1 + sd[h + "input_layernorm.weight"],
           b + "post_attention_norm.weight": 1 + sd[h + "post_attention_layernorm.weight"]}
    for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
        out[b + ours + ".weight"] = sd[h + f"mlp.{theirs}.weight"]
    for ours, theirs in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
        out[b + ours + ".weight"] = sd[h + f"self_attn.{theirs}.weight"]
    out[b + "attn_q_norm.weight"] = 1 + sd[h + "self_attn.q_norm.weight"]
    out[b + "attn_k_norm.weight"] = 1 + sd[h + "self_attn.k_norm.weight"]
    return out


# llama.cpp 0c1e570 conversion/qwen.py `_QwenMtpMixin.filter_tensors`: mtp.layers.0.* becomes blk.N.* (N = the
# trunk's layer count), these four become blk.N.nextn.*; modify_tensors then adds 1 to every `norm.weight`
# (enorm, hnorm and shared_head_norm included: they are Qwen3.5 (1 + w) RMSNorms too).
MTP_NEXTN = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
             "norm": "shared_head_norm"}


def mtp_tensors(head_sd: dict[str, np.ndarray], il: int) -> dict[str, np.ndarray]:
    """MTPHead state dict (HF `mtp.*` names without the prefix, float32) -> blk.{il}.* GGUF tensors."""
    b = f"blk.{il}."
    out = attention_block(head_sd, "layers.0.", b)
    for theirs, ours in MTP_NEXTN.items():
        w = head_sd[theirs + ".weight"]
        out[f"{b}nextn.{ours}.weight"] = w if theirs == "fc" else 1 + w
    unused = set(head_sd) - {k for k in head_sd if k.startswith("layers.0.")} - {k + ".weight" for k in MTP_NEXTN}
    if unused:
        raise ValueError(f"MTP head tensors with no GGUF name: {sorted(unused)}")
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def hf_tensors(t: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """The inverse of gguf_tensors: GGUF tensor name -> float32 array (GGUF numpy order) back to the HF state dict.

    Used to load a GGUF whose HF checkpoint is gone (the bundled demo model) into Qwen3_5ForCausalLM. Exact for
    every permutation; `1 + w` and `-exp(A_log)` round-trip to float32 rounding."""
    V, K, Dv = cfg.linear_num_value_heads, cfg.linear_num_key_heads, cfg.linear_value_head_dim
    inv = np.argsort(grouped_to_tiled(V, K))                     # GGUF (tiled) head -> HF (grouped) order
    rows = lambda x: x.reshape(V, Dv, *x.shape[1:])[inv].reshape(x.shape)     # noqa: E731
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"] - 1}
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = t["output.weight"]
    for il in range(cfg.num_hidden_layers):
        b, h = f"blk.{il}.", f"model.layers.{il}."
        sd[h + "input_layernorm.weight"] = t[b + "attn_norm.weight"] - 1
        sd[h + "post_attention_layernorm.weight"] = t[b + "post_attention_norm.weight"] - 1
        for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            sd[h + f"mlp.{theirs}.weight"] = t[b + ours + ".weight"]
        if cfg.layer_types[il] == "full_attention":
            for ours, theirs in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"),
                                 ("attn_output", "o_proj")):
                sd[h + f"self_attn.{theirs}.weight"] = t[b + ours + ".weight"]
            sd[h + "self_attn.q_norm.weight"] = t[b + "attn_q_norm.weight"] - 1
            sd[h + "self_attn.k_norm.weight"] = t[b + "attn_k_norm.weight"] - 1
            continue
        la = h + "linear_attn."
        qk = 2 * K * cfg.linear_key_head_dim
        qkv, conv = t[b + "attn_qkv.weight"], t[b + "ssm_conv1d.weight"]
        sd[la + "in_proj_qkv.weight"] = np.concatenate([qkv[:qk], rows(qkv[qk:])])
        sd[la + "in_proj_z.weight"] = rows(t[b + "attn_gate.weight"])
        sd[la + "in_proj_b.weight"] = t[b + "ssm_beta.weight"][inv]
        sd[la + "in_proj_a.weight"] = t[b + "ssm_alpha.weight"][inv]
        sd[la + "conv1d.weight"] = np.concatenate([conv[:qk], rows(conv[qk:])])[:, None, :]
        sd[la + "dt_bias"] = t[b + "ssm_dt.bias"][inv]
        sd[la + "A_log"] = np.log(-t[b + "ssm_a"])[inv]
        sd[la + "norm.weight"] = t[b + "ssm_norm.weight"]
        o = t[b + "ssm_out.weight"]
        sd[la + "out_proj.weight"] = o.reshape(-1, V, Dv)[:, inv].reshape(o.shape)
    return {k: np.ascontiguousarray(v, np.float32) for k, v in sd.items()}


def encode(values: np.ndarray, qtype: str) -> np.ndarray:
    if qtype == "Q8_0":
        return Q8Tensor.quantize(values).blocks.reshape(values.shape[0], -1)
    return values.astype(np.float16) if qtype == "F16" else values


def write_gguf(path: str | Path, model, vocab, dtype: str = "f32", name: str = "llamacmp-qwen35-tiny",
               n_ctx_train: int = 65536) -> Path:
    """Write `model` (a Qwen3_5ForCausalLM) with `vocab` (a qwen_vocab.Vocab) in our writer's layout."""
    import gguf
    cfg = model.config
    check_supported(cfg)
    shape = shape_of(cfg, n_ctx_train)
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    tensors = gguf_tensors(sd, cfg)
    specs = list(tensor_specs(shape, len(vocab.tokens)))
    if {s.name for s in specs} != set(tensors):
        raise ValueError(f"tensor set mismatch: {sorted({s.name for s in specs} ^ set(tensors))}")
    path = Path(path)
    w = gguf.GGUFWriter(str(path), "qwen35")
    _write_metadata(w, shape, dtype, vocab, name, TEMPLATE_PATH.read_text())
    for spec in specs:
        if tensors[spec.name].shape != spec.shape:
            raise ValueError(f"{spec.name}: shape {tensors[spec.name].shape}, expected {spec.shape}")
        arr_shape, np_dtype, nbytes = layout(spec, dtype)
        w.add_tensor_info(spec.name, arr_shape, np_dtype, nbytes, raw_dtype=ggml_type(spec, dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for spec in specs:       # one tensor at a time: the quantized copy never coexists with the whole model
        w.write_tensor_data(encode(tensors[spec.name], ggml_type(spec, dtype).name))
    w.close()
    return path


MTP_ORDER = ("attn_norm", "post_attention_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
             "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down", "nextn.eh_proj", "nextn.enorm", "nextn.hnorm",
             "nextn.shared_head_norm")
FILE_TYPE_QTYPE = {0: "F32", 1: "F16", 7: "Q8_0"}      # general.file_type -> the type of the MTP block's matrices


def write_with_mtp(src, head_sd: dict[str, np.ndarray], path: str | Path) -> Path:
    """`src` (a from_gguf.GGUFModel) plus the MTP block, as llama.cpp 0c1e570's converter lays it out: block_count
    + 1, `qwen35.nextn_predict_layers = 1`, blk.N.* and blk.N.nextn.* (N = the trunk's block count). Every
    metadata value and every trunk tensor is copied as stored (the trunk's bytes do not change); the MTP
    matrices take the file's type (Q8_0 as `Q8Tensor.quantize` = llama-quantize), its vectors stay F32."""
    import gguf
    kv = src.kv
    if kv.get("qwen35.nextn_predict_layers", 0):
        raise ValueError(f"{src.path} already has an MTP block")
    file_type = int(kv.get("general.file_type", 0))
    if file_type not in FILE_TYPE_QTYPE:
        raise ValueError(f"{src.path}: general.file_type {file_type} is not one of {sorted(FILE_TYPE_QTYPE)}")
    n_layer = int(kv["qwen35.block_count"])
    mtp = mtp_tensors(head_sd, n_layer)
    if {f"blk.{n_layer}.{part}.weight" for part in MTP_ORDER} != set(mtp):
        raise ValueError(f"MTP tensor set {sorted(mtp)} is not MTP_ORDER")
    w = gguf.GGUFWriter(str(path), "qwen35")
    for key, value in kv.items():
        if key == "general.architecture":       # GGUFWriter writes it
            continue
        types = src.kv_types[key]
        value = n_layer + 1 if key == "qwen35.block_count" else value
        w.add_key_value(key, value, types[0], types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None)
        if key == "qwen35.block_count":
            w.add_uint32("qwen35.nextn_predict_layers", 1)
    for name, (data, qtype) in src.raw.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    for part in MTP_ORDER:
        name = f"blk.{n_layer}.{part}.weight"
        qtype = FILE_TYPE_QTYPE[file_type] if mtp[name].ndim == 2 else "F32"
        w.add_tensor(name, encode(mtp[name], qtype), raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def load_checkpoint(folder: str | Path):
    """(model, vocab) from a folder written by training/train.py (save_pretrained + tokenizer.json)."""
    from transformers import Qwen3_5ForCausalLM
    from .tokenizer import gguf_vocab, load
    model = Qwen3_5ForCausalLM.from_pretrained(str(folder), dtype="float32").eval()
    return model, gguf_vocab(load(Path(folder) / "tokenizer.json"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--type", choices=("f32", "f16", "q8_0"), default="q8_0")
    p.add_argument("--name", default="llamacmp-qwen35-tiny")
    p.add_argument("--ctx-train", type=int, default=65536, help="context_length written to the GGUF")
    args = p.parse_args(argv)
    model, vocab = load_checkpoint(args.checkpoint)
    out = write_gguf(args.out, model, vocab, args.type, args.name, args.ctx_train)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
