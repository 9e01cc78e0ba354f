"""Positions for images: the encoder's 2-D rotary ids per patch, the merge-block patch order, and the text model's
IMROPE positions for image tokens (llama.cpp: clip.cpp's qwen3vl `positions` input; mtmd-helper.cpp's
set_position_mrope_2d; mtmd_image_tokens_get_n_pos)."""
from __future__ import annotations

import numpy as np


def merge_order(ph: int, pw: int, merge: int = 2) -> np.ndarray:
    """Raster patch indices (y * pw + x) in the order the encoder holds patches: merge blocks in raster order,
    and inside each block its merge x merge patches in raster order -> [ph * pw] int64.
    This is the order qwen3vl.cpp's permutes of the conv output produce, so that merged tokens are 4 adjacent rows."""
    y = np.arange(ph).reshape(ph // merge, merge, 1, 1)
    x = np.arange(pw).reshape(1, 1, pw // merge, merge)
    idx = y * pw + x                                          # [yb, dy, xb, dx]
    return idx.transpose(0, 2, 1, 3).reshape(-1)              # -> [yb, xb, dy, dx]


def encoder_positions(ph: int, pw: int, merge: int = 2) -> np.ndarray:
    """[ph * pw, 4] int32 rotary ids (y, x, y, x) per patch, in merge order."""
    order = merge_order(ph, pw, merge)
    y, x = order // pw, order % pw
    return np.stack([y, x, y, x], axis=1).astype(np.int32)


def image_token_positions(p0: int, nx: int, ny: int) -> np.ndarray:
    """[ny * nx, 4] int32 (t, h, w, e) = (p0, p0 + y, p0 + x, 0) for the merged image tokens in raster order."""
    y, x = np.divmod(np.arange(ny * nx), nx)
    return np.stack([np.full_like(y, p0), p0 + y, p0 + x, np.zeros_like(y)], axis=1).astype(np.int32)


def image_n_pos(nx: int, ny: int) -> int:
    """Text positions an image takes: the next token after it sits at p0 + max(nx, ny)."""
    return max(nx, ny)


def text_positions(p0: int, n: int) -> np.ndarray:
    """[n, 4] int32: text tokens carry the same position on every axis."""
    p = np.arange(p0, p0 + n, dtype=np.int32)
    return np.stack([p, p, p, p], axis=1)
