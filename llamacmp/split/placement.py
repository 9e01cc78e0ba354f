"""Where the layers of a split go: contiguous ranges sized by the split ratios over the weights' bytes.

What we chose, after llama.cpp's llama_model::load_tensors: the ratios (-ts, default each device's free memory,
equal for numpy) are applied to the bytes of the repeating layers plus the token embedding on the first part and
the output head on the last part (llama.cpp keeps the embedding on the host and counts the output layer as one more
layer on the last device; we have no CPU layers, so the embedding goes to the first GPU). Cuts fall between layers
where the running byte total crosses each ratio's share. memplan.py plans each device with the same cuts.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..weights import ModelWeights


def _nbytes(w) -> int:
    if w is None:
        return 0
    if isinstance(w, np.ndarray):
        return w.nbytes
    blocks = getattr(w, "blocks", None)          # Q8Tensor: the file's bytes
    if blocks is not None:
        return blocks.nbytes
    if hasattr(w, "__slots__") or hasattr(w, "__dataclass_fields__"):
        names = getattr(w, "__slots__", None) or w.__dataclass_fields__
        return sum(_nbytes(getattr(w, n)) for n in names)
    return int(np.asarray(w).nbytes)


def weight_bytes(weights: ModelWeights) -> tuple[list[int], int, int]:
    """-> (bytes of each layer, of the token embedding, of the head: output norm + output unless tied)."""
    layers = [_nbytes(lw) for lw in weights.layers]
    embd = _nbytes(weights.token_embd)
    head = _nbytes(weights.output_norm) + (0 if weights.output is weights.token_embd else _nbytes(weights.output))
    return layers, embd, head


def assign_layers(layer_bytes: Sequence[int], ratios: Sequence[float], first_extra: int = 0,
                  last_extra: int = 0) -> list[range]:
    """Contiguous layer ranges, one per ratio, sized so each part's bytes (the first part also `first_extra`, the last
    `last_extra`) follow the ratios. Every part gets at least one layer. ratios: positive, one per part."""
    n, P = len(layer_bytes), len(ratios)
    if P < 1 or any(r <= 0 for r in ratios):
        raise ValueError(f"split ratios must be positive, got {list(ratios)}")
    if n < P:
        raise ValueError(f"cannot split {n} layers over {P} devices")
    total = first_extra + sum(layer_bytes) + last_extra
    share = np.cumsum(np.asarray(ratios, np.float64)) / float(sum(ratios)) * total
    cuts, acc, il = [0], float(first_extra), 0
    for p in range(P - 1):
        # take layers while the part's running total stays nearer its target with the layer than without it;
        # leave at least one layer for each later part, and take at least one
        while il < n - (P - 1 - p) and (il == cuts[-1] or acc + layer_bytes[il] / 2 <= share[p]):
            acc += layer_bytes[il]
            il += 1
        cuts.append(il)
    cuts.append(n)
    return [range(cuts[p], cuts[p + 1]) for p in range(P)]
