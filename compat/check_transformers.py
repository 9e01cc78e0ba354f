"""Cross-check the numpy reference forward against HF transformers' Qwen3.5 on the same weights.

Runs where torch and transformers (>= 5, with Qwen3_5ForCausalLM) are installed, e.g. the GPU machine:
    python3 compat/check_transformers.py [--shape small] [--tokens 48]
It writes an F32 fixture GGUF, maps its tensors back to HF names (undoing the converter's transforms: the
(1+w) norm offset, -exp(A_log), the grouped -> tiled V-head order), runs both models in float64 on the CPU
and prints the relative L2 and max-abs difference of the logits.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.fixtures.qwen_vocab import tiny_vocab
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.gguf_file import GGUFFile
from llamacmp.loader import load_model


def tiled_to_grouped(n_v: int, n_k: int) -> np.ndarray:
    """perm[j] = GGUF head feeding HF head j. GGUF head h uses K head h % K; HF head j uses K head j // (V/K)."""
    r = n_v // n_k
    return np.array([(j % r) * n_k + j // r for j in range(n_v)])


def hf_state_dict(f: GGUFFile, cfg) -> dict[str, np.ndarray]:
    t = lambda name: np.asarray(f.tensor(name), np.float64)     # noqa: E731 (F32 fixture: plain arrays)
    V, K, Dv = cfg.ssm_v_heads, cfg.ssm_k_heads, cfg.ssm_head_dim
    perm = tiled_to_grouped(V, K)
    rows = lambda x: x.reshape(V, Dv, *x.shape[1:])[perm].reshape(x.shape)            # noqa: E731
    sd = {"model.embed_tokens.weight": t("token_embd.weight"), "model.norm.weight": t("output_norm.weight") - 1}
    sd["lm_head.weight"] = t("output.weight") if f.has("output.weight") else t("token_embd.weight")
    for il in range(cfg.n_layer):
        b, h = f"blk.{il}.", f"model.layers.{il}."
        sd[h + "input_layernorm.weight"] = t(b + "attn_norm.weight") - 1
        sd[h + "post_attention_layernorm.weight"] = t(b + "post_attention_norm.weight") - 1
        for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            sd[h + f"mlp.{theirs}.weight"] = t(b + ours + ".weight")
        if cfg.is_attention(il):
            for ours, theirs in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"),
                                 ("attn_output", "o_proj")):
                sd[h + f"self_attn.{theirs}.weight"] = t(b + ours + ".weight")
            sd[h + "self_attn.q_norm.weight"] = t(b + "attn_q_norm.weight") - 1
            sd[h + "self_attn.k_norm.weight"] = t(b + "attn_k_norm.weight") - 1
            continue
        qk = 2 * K * Dv
        qkv, conv = t(b + "attn_qkv.weight"), t(b + "ssm_conv1d.weight")
        sd[h + "linear_attn.in_proj_qkv.weight"] = np.concatenate([qkv[:qk], rows(qkv[qk:])])
        sd[h + "linear_attn.conv1d.weight"] = np.concatenate([conv[:qk], rows(conv[qk:])])[:, None, :]
        sd[h + "linear_attn.in_proj_z.weight"] = rows(t(b + "attn_gate.weight"))
        sd[h + "linear_attn.in_proj_b.weight"] = t(b + "ssm_beta.weight")[perm]
        sd[h + "linear_attn.in_proj_a.weight"] = t(b + "ssm_alpha.weight")[perm]
        sd[h + "linear_attn.dt_bias"] = t(b + "ssm_dt.bias")[perm]
        sd[h + "linear_attn.A_log"] = np.log(-t(b + "ssm_a"))[perm]
        sd[h + "linear_attn.norm.weight"] = t(b + "ssm_norm.weight")
        out = t(b + "ssm_out.weight")
        sd[h + "linear_attn.out_proj.weight"] = out.reshape(-1, V, Dv)[:, perm].reshape(out.shape)
    return sd


def hf_model(cfg, sd):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    hc = Qwen3_5TextConfig(
        vocab_size=cfg.n_vocab, hidden_size=cfg.n_embd, intermediate_size=cfg.n_ff, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head_kv, head_dim=cfg.head_dim,
        linear_num_key_heads=cfg.ssm_k_heads, linear_num_value_heads=cfg.ssm_v_heads,
        linear_key_head_dim=cfg.ssm_head_dim, linear_value_head_dim=cfg.ssm_head_dim,
        linear_conv_kernel_dim=cfg.conv_kernel, rms_norm_eps=cfg.rms_eps, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base,
                         "partial_rotary_factor": cfg.n_rot / cfg.head_dim},
    )
    model = Qwen3_5ForCausalLM(hc).to(torch.float64).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="small", choices=sorted(SHAPES))
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args()
    import torch
    with tempfile.TemporaryDirectory() as d:
        path = write_model(Path(d) / "x.gguf", SHAPES[args.shape], "f32", tiny_vocab(), seed=3)
        lm = load_model(path, NumpyBackend())
        ids = np.random.default_rng(0).integers(0, lm.cfg.n_vocab, args.tokens)
        state = lm.backend.new_state(lm.cfg, args.tokens, "f32")
        ours = lm.model.forward(StepBatch.build([(state, list(ids))], all_logits=True)).astype(np.float64)
        model = hf_model(lm.cfg, hf_state_dict(lm.gguf, lm.cfg))
        with torch.no_grad():
            theirs = model(torch.from_numpy(ids[None].astype(np.int64))).logits[0].numpy()
    rel = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
    top1 = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    print(f"shape={args.shape} tokens={args.tokens}: logits rel L2 {rel:.3e}, max abs "
          f"{np.abs(ours - theirs).max():.3e}, top-1 agreement {top1:.0%}")


if __name__ == "__main__":
    main()
