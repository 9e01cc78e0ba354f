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
        out[b + "attn_norm.weight"] = 1 + sd[h + "input_layernorm.weight"]
        out[b + "post_attention_norm.weight"] = 1 + sd[h + "post_attention_layernorm.weight"]
        for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            out[b + ours + ".weight"] = sd[h + f"mlp.{theirs}.weight"]
        if cfg.layer_types[il] == "full_attention":
            for ours, theirs in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"),
                                 ("attn_output", "o_proj")):
                out[b + ours + ".weight"] = sd[h + f"self_attn.{theirs}.weight"]
            out[b + "attn_q_norm.weight"] = 1 + sd[h + "self_attn.q_norm.weight"]
            out[b + "attn_k_norm.weight"] = 1 + sd[h + "self_attn.k_norm.weight"]
            continue
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
