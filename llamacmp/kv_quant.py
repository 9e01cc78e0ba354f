"""KV-cache block formats, as numpy references: quantize on write, dequantize on read.

q8_0 and q4_0 are llama.cpp's block formats (32 values per block along the head dimension, f16 scale).
tq3 is ours: per block of 128 values (the head dim if smaller), rotate by a fixed random-sign Walsh-Hadamard
transform so that the coordinates look Gaussian, code each with the 8-level Lloyd-Max quantizer of the unit
Gaussian (3 bits), and store one f16 scale s = |x| / |levels of the codes|, so that the read-back vector
s * R^T levels has the block's norm (to f16 precision) and a reader multiplies instead of re-normalising.
Bytes per value: f16 2, q8_0 34/32, q4_0 18/32, tq3 (2 + 48)/128 = 0.39 (0.195x f16).
"""
from __future__ import annotations

import numpy as np

KV_TYPES = ("f32", "f16", "q8_0", "q4_0", "tq3")
BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "tq3": 50 / 128}

# Lloyd-Max reconstruction levels for N(0, 1) with 8 levels (Max 1960); decision thresholds are the midpoints.
LLOYD_MAX_8 = np.array([-2.1520, -1.3439, -0.7560, -0.2451, 0.2451, 0.7560, 1.3439, 2.1520])
TQ3_BLOCK = 128
TQ3_SEED = 0x7133


def roundtrip(x: np.ndarray, kv_type: str) -> np.ndarray:
    """x [..., Dh] float -> what a cache of this type gives back on read (float32)."""
    if kv_type == "f32":
        return x.astype(np.float32)
    if kv_type == "f16":
        return x.astype(np.float16).astype(np.float32)
    if kv_type == "q8_0":
        return _q8_0(x)
    if kv_type == "q4_0":
        return _q4_0(x)
    if kv_type == "tq3":
        return _tq3(x)
    raise ValueError(f"unknown KV cache type '{kv_type}' (supported: {', '.join(KV_TYPES)})")


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    if x.shape[-1] % size:
        raise ValueError(f"head dim {x.shape[-1]} is not a multiple of the {size}-value block")
    return x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // size, size)


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).astype(np.float32)


def _q8_0(x: np.ndarray) -> np.ndarray:
    """llama.cpp quantize_row_q8_0_ref: d = amax/127 (f16), q = roundf(x/d)."""
    b = _blocks(x, 32)
    d = np.abs(b).max(-1, keepdims=True) / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.sign(b * inv) * np.floor(np.abs(b * inv) + 0.5)
    return (q * _f16(d)).reshape(x.shape)


def _q4_0(x: np.ndarray) -> np.ndarray:
    """llama.cpp quantize_row_q4_0_ref: d = (value of largest magnitude)/-8 (f16), q = min(15, int(x/d + 8.5))."""
    b = _blocks(x, 32)
    idx = np.abs(b).argmax(-1)[..., None]
    d = np.take_along_axis(b, idx, -1) / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.trunc(b * inv + 8.5))
    return ((q - 8.0) * _f16(d)).reshape(x.shape)


def hadamard(n: int) -> np.ndarray:
    """Orthonormal Walsh-Hadamard matrix of size n (a power of two)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def tq3_rotation(n: int) -> np.ndarray:
    """R = H · diag(signs): fixed per block size, so writer and reader agree without storing anything."""
    signs = np.random.default_rng(TQ3_SEED).choice([-1.0, 1.0], n)
    return hadamard(n) * signs[None, :]


def tq3_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., Dh] -> (codes [..., nb, block] uint8 in 0..7, scales [..., nb] f16-rounded: |x| / |levels|)."""
    size = min(TQ3_BLOCK, x.shape[-1])
    b = _blocks(x, size).astype(np.float64)
    norm = np.linalg.norm(b, axis=-1, keepdims=True)
    unit = b / np.where(norm > 0, norm, 1.0) * np.sqrt(size)          # coordinates ~ N(0, 1) after rotation
    y = unit @ tq3_rotation(size).T
    thresholds = (LLOYD_MAX_8[1:] + LLOYD_MAX_8[:-1]) / 2
    codes = np.searchsorted(thresholds, y).astype(np.uint8)
    lnorm = np.linalg.norm(LLOYD_MAX_8[codes], axis=-1)               # >= 0.2451 * sqrt(size) > 0
    return codes, _f16(norm[..., 0] / lnorm)


def tq3_decode(codes: np.ndarray, scales: np.ndarray, head_dim: int) -> np.ndarray:
    size = codes.shape[-1]
    r = (LLOYD_MAX_8[codes] @ tq3_rotation(size)) * scales[..., None]   # rotate back (R is orthogonal)
    return r.reshape(*codes.shape[:-2], head_dim).astype(np.float32)


def _tq3(x: np.ndarray) -> np.ndarray:
    codes, norms = tq3_codes(x)
    return tq3_decode(codes, norms, x.shape[-1])


def block_layout(kv_type: str, head_dim: int) -> tuple[int, int]:
    """(values per block, bytes per block) of a cache row of one head in this format."""
    if kv_type in ("f32", "f16"):
        return 1, int(BYTES_PER_VALUE[kv_type])
    if kv_type == "q8_0":
        return 32, 34
    if kv_type == "q4_0":
        return 32, 18
    if kv_type == "tq3":
        size = min(TQ3_BLOCK, head_dim)
        return size, 2 + 3 * size // 8
    raise ValueError(f"unknown KV cache type '{kv_type}' (supported: {', '.join(KV_TYPES)})")


def cache_bytes(kv_type: str, n_rows: int, n_heads: int, head_dim: int) -> int:
    """Bytes of one layer's K (or V) cache [n_rows, n_heads, head_dim] stored in this format."""
    values, nbytes = block_layout(kv_type, head_dim)
    if head_dim % values:
        raise ValueError(f"head dim {head_dim} is not a multiple of the {values}-value {kv_type} block")
    return n_rows * n_heads * (head_dim // values) * nbytes
