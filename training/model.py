"""Qwen3.5 hybrid model configs (transformers' Qwen3_5ForCausalLM) sized for training from scratch.

Every matrix dimension is a multiple of 32 so Q8_0 (32-value blocks) quantizes every weight matrix; layers come in
groups of 3 Gated DeltaNet + 1 full attention, as in Qwen3.5.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    layers: int             # a multiple of 4 (3 GDN : 1 attention)
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_k_heads: int
    linear_v_heads: int     # a multiple of linear_k_heads
    linear_head_dim: int
    tied: bool = False
    rope_theta: float = 1e7
    max_positions: int = 65536


SIZES = {
    "test": ModelSize(hidden=64, layers=4, ffn=128, heads=4, kv_heads=2, head_dim=32,
                      linear_k_heads=2, linear_v_heads=4, linear_head_dim=32),
    "smoke": ModelSize(hidden=128, layers=4, ffn=384, heads=4, kv_heads=2, head_dim=32,
                       linear_k_heads=2, linear_v_heads=4, linear_head_dim=32, max_positions=4096),
    # ~21.6M parameters with an 8K vocabulary: the Q8_0 file is ~23 MB (issue 9 asks <= 25 MB).
    "full": ModelSize(hidden=384, layers=8, ffn=1024, heads=6, kv_heads=2, head_dim=64,
                      linear_k_heads=4, linear_v_heads=8, linear_head_dim=64),
}


def check_size(s: ModelSize) -> None:
    dims = (s.hidden, s.ffn, s.head_dim, s.linear_head_dim, s.heads * s.head_dim)
    if any(d % 32 for d in dims):
        raise ValueError(f"every matrix dimension must be a multiple of 32 for Q8_0: {dims}")
    if s.layers % 4 or s.linear_v_heads % s.linear_k_heads or s.heads % s.kv_heads:
        raise ValueError("layers must be a multiple of 4 and head counts must divide evenly")


def hf_config(s: ModelSize, vocab_size: int, eos_id: int, pad_id: int):
    from transformers import Qwen3_5TextConfig
    check_size(s)
    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
        linear_num_key_heads=s.linear_k_heads, linear_num_value_heads=s.linear_v_heads,
        linear_key_head_dim=s.linear_head_dim, linear_value_head_dim=s.linear_head_dim,
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=s.tied,
        max_position_embeddings=s.max_positions, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None,
        # text-only positions: the multimodal rope sections collapse to plain partial rope (1/4 of head_dim)
        rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta, "partial_rotary_factor": 0.25},
    )


def build_model(s: ModelSize, vocab_size: int, eos_id: int, pad_id: int, seed: int = 0):
    import torch
    from transformers import Qwen3_5ForCausalLM
    torch.manual_seed(seed)
    return Qwen3_5ForCausalLM(hf_config(s, vocab_size, eos_id, pad_id))


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def size_dict(s: ModelSize) -> dict:
    return asdict(s)


# --- the Gated DeltaNet kernel ---------------------------------------------------------------------------------
# transformers' Qwen3.5 calls the module-level `torch_chunk_gated_delta_rule` for every full-sequence forward: its
# reference is a Python loop over 64-token chunks (~18 K tok/s for the full model on an H200). fla's
# `chunk_gated_delta_rule` (flash-linear-attention / fla-core, Triton) computes the same thing in fused kernels.
# transformers 5.17 binds fla by itself only when fla is importable at its import time (and it would then also do so
# silently); `gdn_kernel` makes the choice explicit and logged whatever was importable.

GDN_KERNELS = ("auto", "fla", "torch")


def fla_chunk_rule():
    """fla's chunked gated delta rule, or None when fla cannot be imported."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


def resolve_gdn_kernel(choice: str, device: str) -> str:
    """"torch" or "fla" for --gdn-kernel `choice`: auto is fla on CUDA when importable (Triton needs a GPU)."""
    if choice not in GDN_KERNELS:
        raise ValueError(f"--gdn-kernel must be one of {GDN_KERNELS}, got {choice!r}")
    if choice == "torch":
        return "torch"
    usable = device == "cuda" and fla_chunk_rule() is not None
    if choice == "fla" and not usable:
        raise RuntimeError(f"--gdn-kernel fla needs CUDA and an importable `fla` (device {device}; "
                           f"fla importable: {fla_chunk_rule() is not None}); install fla-core or use auto/torch")
    return "fla" if usable else "torch"


def fla_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, cu_seqlens=None, **_):
    """transformers' torch_chunk_gated_delta_rule computed by fla, same arguments and results.

    query, key: [B, T, Hk, Dk]; value: [B, T, Hv, Dv]; g (log decay, <= 0), beta: [B, T, Hv];
    initial_state: [B, Hv, Dk, Dv] or None; returns (out [B, T, Hv, Dv] in query's dtype, final state or None).
    Both use the [B, T, H, D] layout, scale 1/sqrt(Dk), L2 norm of q and k (eps 1e-6) inside the kernel, and
    grouped value heads (v head i reads q/k head i // (Hv / Hk), as repeat_interleave does); transformers 5.17
    repeats q/k itself before the call, 5.24 inside its reference: fla takes either."""
    chunk = fla_chunk_rule()
    out, state = chunk(query, key, value, g=g, beta=beta, scale=key.shape[-1] ** -0.5,
                       initial_state=initial_state, output_final_state=output_final_state,
                       use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)
    return out.to(query.dtype), state


@contextlib.contextmanager
def gdn_kernel(name: str):
    """Route transformers' Qwen3.5 chunked gated delta rule to `name` ("torch": transformers' own reference,
    "fla") while the block runs; restored after."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    bound = mq.torch_chunk_gated_delta_rule
    reference = inspect.unwrap(bound)      # under the hub/fla fallback wrappers transformers may have put on it
    if reference.__module__ != mq.__name__:
        raise RuntimeError(f"cannot find transformers' reference gated delta rule (got {reference!r})")
    mq.torch_chunk_gated_delta_rule = {"torch": reference, "fla": fla_gated_delta_rule}[name]
    try:
        yield
    finally:
        mq.torch_chunk_gated_delta_rule = bound
