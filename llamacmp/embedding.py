"""Embeddings as llama.cpp makes them for a decoder model: the hidden state after output_norm (what llama.cpp's
graph calls result_norm), per token or pooled (mean, cls = first token, last), normalized as llama-server does.

Runs through the model's backend ops only (embed, run_layers, rmsnorm, to_host), so every backend computes it the
same way. The prompt goes through in chunks of `n_ubatch` on a fresh sequence state: attention is causal, so a
chunk sees the rows before it exactly as a single pass would.
"""
from __future__ import annotations

import numpy as np

from .backends.base import StepBatch

POOLINGS = ("none", "mean", "cls", "last")


def hidden_states(model, tokens: list[int], n_ubatch: int = 512) -> np.ndarray:
    """tokens -> [T, D] float32: every token's hidden state after the final norm."""
    be, cfg = model.be, model.cfg
    state = be.new_state(cfg, len(tokens))
    rows = []
    for start in range(0, len(tokens), max(1, n_ubatch)):
        chunk = tokens[start:start + n_ubatch]
        batch = StepBatch.build([(state, chunk)], all_logits=True)
        x = model.run_layers(model.embed(batch), batch, range(len(model.layers)))
        rows.append(be.to_host(be.rmsnorm(x, model.output_norm, cfg.rms_eps)).astype(np.float32))
        state.n_past += len(chunk)
    return np.concatenate(rows)


def pool(h: np.ndarray, pooling: str) -> np.ndarray:
    """[T, D] -> [T, D] (none) or [1, D]."""
    if pooling == "none":
        return h
    if pooling == "mean":
        return h.mean(axis=0, keepdims=True, dtype=np.float64).astype(np.float32)
    if pooling == "cls":
        return h[:1]
    if pooling == "last":
        return h[-1:]
    raise ValueError(f"unknown pooling type: {pooling}")


def normalize(v: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize: -1 none, 0 max-abs scaled to int16 range, 2 euclidean, p>2 p-norm."""
    x = v.astype(np.float64)
    if norm == -1:
        s = 1.0
    elif norm == 0:
        s = np.abs(x).max() / 32760.0
    elif norm == 2:
        s = np.sqrt((x * x).sum())
    else:
        s = (np.abs(x) ** norm).sum() ** (1.0 / norm)
    return (x * (1.0 / s if s > 0 else 0.0)).astype(np.float32)


def embed(model, tokens: list[int], pooling: str, norm: int = 2, n_ubatch: int = 512) -> list[list[float]]:
    """llama-server's `embedding` field: per-token rows as they are (pooling none), else the one pooled row,
    normalized."""
    vectors = pool(hidden_states(model, tokens, n_ubatch), pooling)
    if pooling != "none":
        vectors = normalize(vectors[0], norm)[None]
    return vectors.tolist()
