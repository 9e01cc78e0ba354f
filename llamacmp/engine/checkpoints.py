"""The prompt cache's state copies as the engine uses them: the backend's StateOps (backends/state_ops.py) and the
slot files of /slots/:id?action=save|restore.
"""
from __future__ import annotations

import os

import numpy as np

from ..backends.base import Backend, SeqState
from ..backends.state_ops import Checkpoint, HostState, NumpyStateOps, StateOps

__all__ = ["Checkpoint", "HostState", "NumpyStateOps", "StateOps", "state_ops_for", "write_host_state",
           "read_host_state"]


def state_ops_for(backend: Backend) -> StateOps:
    """The backend's StateOps (a capability of base.Backend; NotImplementedError names a backend without one)."""
    return backend.state_ops()


# -- slot files (/slots/:id?action=save|restore) ----------------------------------------------------------------

def write_host_state(path: str, host: HostState) -> int:
    """One .npz per slot (no pickles); checkpoints are not kept: a restored slot resumes from its end state."""
    arrays = {"tokens": np.asarray(host.tokens, np.int32)}
    host.ready()
    for name in ("k", "v", "conv", "ssm"):
        for i, a in enumerate(getattr(host, name)):
            arrays[f"{name}{i}"] = a
    if host.logits is not None:
        arrays["logits"] = host.logits
    try:
        with open(path, "wb") as f:
            np.savez(f, **arrays)
            return f.tell()
    except OSError:                      # disk full half way: leave no truncated slot file behind
        if os.path.isfile(path):
            os.remove(path)
        raise


def read_host_state(path: str, like: SeqState) -> tuple[HostState, int]:
    """Read a slot file written for a state shaped like `like`; ValueError if it does not fit."""
    with np.load(path, allow_pickle=False) as z:
        def group(name: str, refs: list) -> list[np.ndarray]:
            out = [z[f"{name}{i}"] for i in range(len(refs))]
            if f"{name}{len(refs)}" in z.files:
                raise ValueError(f"slot file has more '{name}' layers than the model")
            return out
        tokens = [int(t) for t in z["tokens"]]
        host = HostState(tokens, group("k", like.k), group("v", like.v), group("conv", like.conv),
                         group("ssm", like.ssm), z["logits"] if "logits" in z.files else None)
    if len(tokens) >= like.n_ctx or any(a.shape[0] != len(tokens) for a in host.k + host.v):
        raise ValueError("slot file does not fit this slot's context")
    for a, ref in zip(host.conv + host.ssm, like.conv + like.ssm):
        if tuple(a.shape) != tuple(ref.shape):
            raise ValueError("slot file was saved from a different model")
    return host, os.path.getsize(path)
