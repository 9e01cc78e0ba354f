"""Read a `qwen35` GGUF back into transformers' Qwen3_5ForCausalLM: the inverse of export.py.

The bundled demo model's HF checkpoint is gone (training/README.md, "The second run"), so its MTP head
(training/mtp.py) trains on top of the GGUF's own weights: Q8_0 dequantized, i.e. exactly the numbers llama.cpp
and llamacmp run. The tokenizer comes from the file's `tokenizer.ggml.*` arrays.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamacmp.fixtures.qwen_vocab import Vocab

from .export import hf_tensors
from .model import ModelSize, hf_config

ARCH = "qwen35."


@dataclass(frozen=True)
class GGUFModel:
    path: Path
    kv: dict[str, object]                 # metadata key -> parsed value
    kv_types: dict[str, list]             # metadata key -> its GGUFValueType list (array: [ARRAY, element type])
    tensors: dict[str, np.ndarray]        # name -> float32 values in GGUF numpy order ([out, in] for matrices)
    raw: dict[str, tuple[np.ndarray, object]]  # name -> (the stored bytes as the reader maps them, GGML type)


def read(path: str | Path) -> GGUFModel:
    import gguf
    from gguf.quants import dequantize
    reader = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    kv = {k: f.contents() for k, f in fields.items()}
    if kv.get("general.architecture") != "qwen35":
        raise ValueError(f"{path}: general.architecture is {kv.get('general.architecture')!r}, expected 'qwen35'")
    tensors, raw = {}, {}
    for t in reader.tensors:
        tensors[t.name] = np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(
            tuple(int(n) for n in reversed(t.shape)))
        raw[t.name] = (t.data, t.tensor_type)
    return GGUFModel(Path(path), kv, {k: list(f.types) for k, f in fields.items()}, tensors, raw)


def model_size(g: GGUFModel) -> ModelSize:
    """The training ModelSize of a GGUF; refuses what transformers' config (as training/model.py builds it)
    cannot express, naming the key."""
    kv = g.kv
    if kv.get(ARCH + "nextn_predict_layers", 0):
        raise ValueError(f"{g.path}: already has an MTP block ({ARCH}nextn_predict_layers = "
                         f"{kv[ARCH + 'nextn_predict_layers']}); start from the file without it")
    head_dim = int(kv[ARCH + "attention.key_length"])
    checks = {"attention.value_length": head_dim, "rope.dimension_count": head_dim // 4,   # partial rotary 0.25
              "ssm.conv_kernel": 4, "full_attention_interval": 4}
    for key, want in checks.items():
        if kv.get(ARCH + key, want) != want:
            raise ValueError(f"{g.path}: {ARCH}{key} = {kv[ARCH + key]}, training/model.py builds {want}")
    if abs(float(kv[ARCH + "attention.layer_norm_rms_epsilon"]) - 1e-6) > 1e-12:
        raise ValueError(f"{g.path}: {ARCH}attention.layer_norm_rms_epsilon must be 1e-6")
    if kv[ARCH + "ssm.inner_size"] != kv[ARCH + "ssm.time_step_rank"] * kv[ARCH + "ssm.state_size"]:
        raise ValueError(f"{g.path}: {ARCH}ssm.inner_size != time_step_rank * state_size")
    # rope.dimension_sections is not checked: with text positions (the same position in every section) the
    # sections do not change the rotation, which is why export.py may derive them freely.
    return ModelSize(hidden=int(kv[ARCH + "embedding_length"]), layers=int(kv[ARCH + "block_count"]),
                     ffn=int(kv[ARCH + "feed_forward_length"]), heads=int(kv[ARCH + "attention.head_count"]),
                     kv_heads=int(kv[ARCH + "attention.head_count_kv"]), head_dim=head_dim,
                     linear_k_heads=int(kv[ARCH + "ssm.group_count"]),
                     linear_v_heads=int(kv[ARCH + "ssm.time_step_rank"]),
                     linear_head_dim=int(kv[ARCH + "ssm.state_size"]), tied="output.weight" not in g.tensors,
                     rope_theta=float(kv[ARCH + "rope.freq_base"]),
                     max_positions=int(kv[ARCH + "context_length"]))


def vocab(g: GGUFModel) -> Vocab:
    kv = g.kv
    return Vocab(tokens=list(kv["tokenizer.ggml.tokens"]), merges=list(kv["tokenizer.ggml.merges"]),
                 token_types=list(kv["tokenizer.ggml.token_type"]), eos_id=int(kv["tokenizer.ggml.eos_token_id"]),
                 pad_id=kv.get("tokenizer.ggml.padding_token_id"))


def load_trunk(g: GGUFModel):
    """(Qwen3_5ForCausalLM in float32 with the file's weights, Vocab)."""
    import torch
    from transformers import Qwen3_5ForCausalLM
    v = vocab(g)
    cfg = hf_config(model_size(g), len(v.tokens), v.eos_id, v.pad_id if v.pad_id is not None else v.eos_id)
    model = Qwen3_5ForCausalLM(cfg)
    sd = {k: torch.tensor(a) for k, a in hf_tensors(g.tensors, cfg).items()}       # a copy: the file is mapped read-only
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"{g.path}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval(), v
