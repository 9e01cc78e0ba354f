"""GGUF tensor names -> typed weight slots of a qwen35 model, with load-time checks of every shape.

Weights stay as the file stores them (numpy views / Q8Tensor / QuantTensor); a backend uploads them in its own layout.
The converter already baked the Qwen3.5 (1+w) offset into every RMSNorm weight except ssm_norm, and
already re-ordered V heads so that V head h uses K head h % K: nothing here adds or undoes either.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Union

import numpy as np

from .config import ModelConfig
from .gguf_file import GGUFError, GGUFFile, Q8Tensor, QuantTensor

Matrix = Union[np.ndarray, Q8Tensor, QuantTensor]    # [out, in]


@dataclass(slots=True)
class AttentionWeights:
    attn_q: Matrix          # [2*Hq*Dh, D]  per head [q(Dh) | gate(Dh)]
    attn_k: Matrix          # [Hk*Dh, D]
    attn_v: Matrix          # [Hk*Dh, D]
    attn_output: Matrix     # [D, Hq*Dh]
    attn_q_norm: np.ndarray  # [Dh]
    attn_k_norm: np.ndarray  # [Dh]


@dataclass(slots=True)
class GDNWeights:
    attn_qkv: Matrix        # [C, D]  rows [q(K*Dk) | k(K*Dk) | v(V*Dv)]
    attn_gate: Matrix       # [V*Dv, D]  z
    ssm_beta: Matrix        # [V, D]
    ssm_alpha: Matrix       # [V, D]
    ssm_conv1d: np.ndarray  # [C, kernel]
    ssm_dt_bias: np.ndarray  # [V]
    ssm_a: np.ndarray       # [V]  = -exp(A_log)
    ssm_norm: np.ndarray    # [Dv]  no +1 offset
    ssm_out: Matrix         # [D, V*Dv]


@dataclass(slots=True)
class LayerWeights:
    attn_norm: np.ndarray            # [D]
    post_attention_norm: np.ndarray  # [D]
    ffn_gate: Matrix                 # [F, D]
    ffn_up: Matrix                   # [F, D]
    ffn_down: Matrix                 # [D, F]
    attn: AttentionWeights | None = None
    gdn: GDNWeights | None = None


@dataclass(slots=True)
class MtpWeights:
    """The MTP (nextn) block blk.{n_layer}: a full-attention decoder block plus the nextn tensors (llama.cpp
    0c1e570 qwen35.cpp load_block_mtp). embed / head / head_norm are the model's token_embd / output / output_norm
    when the file has no nextn.embed_tokens / shared_head_head / shared_head_norm (llama.cpp's fallbacks)."""
    block: LayerWeights          # attn set, gdn None
    eh_proj: Matrix              # [D, 2*D]  input [enorm(embed(token)) | hnorm(h)]
    enorm: np.ndarray            # [D]
    hnorm: np.ndarray            # [D]
    head_norm: np.ndarray        # [D]
    embed: Matrix                # [n_vocab, D]
    head: Matrix                 # [n_vocab, D]


@dataclass(slots=True)
class ModelWeights:
    token_embd: Matrix           # [n_vocab, D]
    output_norm: np.ndarray      # [D]
    output: Matrix               # [n_vocab, D]  (token_embd when tied)
    layers: list[LayerWeights]
    mtp: MtpWeights | None = None   # files with qwen35.nextn_predict_layers = 1


def load_weights(f: GGUFFile, cfg: ModelConfig) -> ModelWeights:
    D = cfg.n_embd
    get = _Getter(f)
    tied = not f.has("output.weight")
    layers = []
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        layer = _block(get, cfg, b)
        if cfg.is_attention(il):
            layer.attn = _attention(get, cfg, b)
        else:
            V = cfg.ssm_v_heads
            layer.gdn = GDNWeights(
                attn_qkv=get.mat(b + "attn_qkv.weight", cfg.conv_channels, D),
                attn_gate=get.mat(b + "attn_gate.weight", cfg.ssm_inner, D),
                ssm_beta=get.mat(b + "ssm_beta.weight", V, D),
                ssm_alpha=get.mat(b + "ssm_alpha.weight", V, D),
                ssm_conv1d=get.dense(b + "ssm_conv1d.weight", (cfg.conv_channels, cfg.conv_kernel)),
                ssm_dt_bias=get.vec(b + "ssm_dt.bias", V),
                ssm_a=get.vec(b + "ssm_a", V),
                ssm_norm=get.vec(b + "ssm_norm.weight", cfg.ssm_head_dim),
                ssm_out=get.mat(b + "ssm_out.weight", D, cfg.ssm_inner),
            )
        layers.append(layer)
    token_embd = get.mat("token_embd.weight", cfg.n_vocab, D)
    w = ModelWeights(
        token_embd=token_embd,
        output_norm=get.vec("output_norm.weight", D),
        output=token_embd if tied else get.mat("output.weight", cfg.n_vocab, D),
        layers=layers,
    )
    if cfg.n_nextn:
        w.mtp = _mtp(f, get, cfg, w)
    return w


def _block(get: "_Getter", cfg: ModelConfig, b: str) -> LayerWeights:
    D, F = cfg.n_embd, cfg.n_ff
    return LayerWeights(
        attn_norm=get.vec(b + "attn_norm.weight", D),
        post_attention_norm=get.vec(b + "post_attention_norm.weight", D),
        ffn_gate=get.mat(b + "ffn_gate.weight", F, D),
        ffn_up=get.mat(b + "ffn_up.weight", F, D),
        ffn_down=get.mat(b + "ffn_down.weight", D, F),
    )


def _attention(get: "_Getter", cfg: ModelConfig, b: str) -> AttentionWeights:
    D, Dh = cfg.n_embd, cfg.head_dim
    return AttentionWeights(
        attn_q=get.mat(b + "attn_q.weight", 2 * cfg.n_head * Dh, D),
        attn_k=get.mat(b + "attn_k.weight", cfg.n_head_kv * Dh, D),
        attn_v=get.mat(b + "attn_v.weight", cfg.n_head_kv * Dh, D),
        attn_output=get.mat(b + "attn_output.weight", D, cfg.n_head * Dh),
        attn_q_norm=get.vec(b + "attn_q_norm.weight", Dh),
        attn_k_norm=get.vec(b + "attn_k_norm.weight", Dh),
    )


def _mtp(f: GGUFFile, get: "_Getter", cfg: ModelConfig, w: ModelWeights) -> MtpWeights:
    D, b = cfg.n_embd, f"blk.{cfg.n_layer}."
    n = b + "nextn."
    block = _block(get, cfg, b)
    block.attn = _attention(get, cfg, b)
    return MtpWeights(
        block=block,
        eh_proj=get.mat(n + "eh_proj.weight", D, 2 * D),
        enorm=get.vec(n + "enorm.weight", D),
        hnorm=get.vec(n + "hnorm.weight", D),
        head_norm=get.vec(n + "shared_head_norm.weight", D) if f.has(n + "shared_head_norm.weight") else w.output_norm,
        embed=get.mat(n + "embed_tokens.weight", cfg.n_vocab, D) if f.has(n + "embed_tokens.weight") else w.token_embd,
        head=get.mat(n + "shared_head_head.weight", cfg.n_vocab, D) if f.has(n + "shared_head_head.weight")
        else w.output,
    )


class _Getter:
    """Fetch a tensor and check its shape, naming the tensor when it is wrong."""

    def __init__(self, f: GGUFFile):
        self.f = f

    def _shape_error(self, name: str, got, want) -> GGUFError:
        return GGUFError(f"{self.f.path}: tensor '{name}' has shape {tuple(got)}, expected {tuple(want)}")

    def mat(self, name: str, rows: int, cols: int) -> Matrix:
        t = self.f.tensor(name)
        if tuple(t.shape) != (rows, cols):
            raise self._shape_error(name, t.shape, (rows, cols))
        return t

    def dense(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        t = self.f.tensor(name)
        if isinstance(t, (Q8Tensor, QuantTensor)):
            t = t.dequantize()
        if tuple(t.shape) != shape:
            raise self._shape_error(name, t.shape, shape)
        return t

    def vec(self, name: str, n: int) -> np.ndarray:
        return self.dense(name, (n,))


def matrix_fields(w: object) -> list[str]:
    return [f.name for f in fields(w)]
