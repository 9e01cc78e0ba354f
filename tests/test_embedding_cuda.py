"""Embeddings on the CUDA backend against the numpy reference (same code path: embedding.py through the backend
interface). Tolerance as the F32 forward's (test_model_cuda.py: 1e-2 relative on logits)."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp import embedding
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.loader import load_model

pytestmark = pytest.mark.cuda

TOKENS = [5, 17, 42, 99, 3, 250, 7, 64, 11]


@pytest.mark.parametrize("pooling", ["none", "mean", "cls", "last"])
def test_cuda_matches_numpy(fixture_gguf, cuda_backend, pooling):
    path = fixture_gguf("tiny", "f32")
    ref = np.asarray(embedding.embed(load_model(path, NumpyBackend()).model, TOKENS, pooling))
    got = np.asarray(embedding.embed(load_model(path, cuda_backend).model, TOKENS, pooling))
    assert got.shape == ref.shape
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
