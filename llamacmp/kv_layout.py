"""Byte layout of one KV-cache row (one token, one kv head) on the CUDA device, as numpy encode/decode.

The numerics are kv_quant.py's (the specification); this module only fixes where the bytes go, so that the host
can read a quantized device cache (state_to_host) and tests can compare the CUDA KV write byte for byte. Mirrors
cuda_src/attention_kv.cuh:
  f32 / f16  the values
  q8_0       int8 q[Dh], then f16 d[Dh/32]                          34 bytes per 32 values (llama.cpp's)
  q4_0       uint8 [Dh/2]: value 2i in the low nibble of byte i, 2i+1 in the high one, stored as q + 8 (0..15);
             then f16 d[Dh/32]                                      18 bytes per 32 values (llama.cpp's)
  tq3        per 32 values 3 little-endian bit-plane words (bit i of word p = bit p of the code of value i), then
             f16 s[Dh/B] (B = min(128, Dh)): the block scale |x| / |levels|   50 bytes per 128 values
Scales follow the quants so that the quants start aligned for wide loads.
"""
from __future__ import annotations

import numpy as np

from . import kv_quant

ELEMENT_TYPES = {"f32": np.float32, "f16": np.float16}


def row_bytes(kv_type: str, head_dim: int) -> int:
    """Bytes of one row; ValueError for a type that cannot hold this head dim."""
    Dh = head_dim
    if Dh <= 0 or Dh % 32:
        raise ValueError(f"KV cache head dim {Dh} is not a multiple of 32")
    if kv_type == "f32":
        return 4 * Dh
    if kv_type == "f16":
        return 2 * Dh
    if kv_type == "q8_0":
        return Dh + Dh // 16
    if kv_type == "q4_0":
        return Dh // 2 + Dh // 16
    if kv_type == "tq3":
        B = min(kv_quant.TQ3_BLOCK, Dh)
        if B not in (32, 64, 128) or Dh % B:
            raise ValueError(f"tq3 KV cache needs a head dim of 32, 64 or a multiple of 128 (got {Dh})")
        return Dh * 3 // 8 + 2 * (Dh // B)
    raise ValueError(f"unknown KV cache type '{kv_type}' (supported: {', '.join(kv_quant.KV_TYPES)})")


def head_dim_of(kv_type: str, nbytes: int) -> int:
    """The head dim whose rows of this type take nbytes (the inverse of row_bytes)."""
    for Dh in range(32, 8 * nbytes + 1, 32):
        try:
            if row_bytes(kv_type, Dh) == nbytes:
                return Dh
        except ValueError:
            continue
    raise ValueError(f"no head dim gives {kv_type} rows of {nbytes} bytes")


def encode(x: np.ndarray, kv_type: str) -> np.ndarray:
    """x [..., Dh] float -> uint8 [..., row_bytes] (f32/f16: the element array itself)."""
    Dh = x.shape[-1]
    nb = row_bytes(kv_type, Dh)
    if kv_type in ELEMENT_TYPES:
        return np.ascontiguousarray(x, ELEMENT_TYPES[kv_type])
    lead = x.shape[:-1]
    out = np.zeros(lead + (nb,), np.uint8)
    if kv_type in ("q8_0", "q4_0"):
        q, d = _q_blocks(x, kv_type)
        if kv_type == "q8_0":
            out[..., :Dh] = q.reshape(lead + (Dh,)).astype(np.int8).view(np.uint8)
            out[..., Dh:] = d.astype(np.float16).view(np.uint8).reshape(lead + (Dh // 16,))
        else:
            n = q.reshape(lead + (Dh,)).astype(np.uint8)
            out[..., :Dh // 2] = n[..., 0::2] | (n[..., 1::2] << 4)
            out[..., Dh // 2:] = d.astype(np.float16).view(np.uint8).reshape(lead + (Dh // 16,))
        return out
    codes, scales = kv_quant.tq3_codes(x)                          # [..., nb, B], [..., nb]
    c = codes.reshape(lead + (Dh // 32, 32))
    planes = np.stack([np.packbits(((c >> p) & 1).astype(np.uint8), axis=-1, bitorder="little")
                       for p in range(3)], axis=-2)                # [..., Dh/32, 3, 4]
    out[..., :Dh * 3 // 8] = planes.reshape(lead + (Dh * 3 // 8,))
    out[..., Dh * 3 // 8:] = scales.astype(np.float16).view(np.uint8).reshape(lead + (-1,))
    return out


def decode(raw: np.ndarray, kv_type: str, head_dim: int) -> np.ndarray:
    """uint8 [..., row_bytes] (or the f32/f16 element array) -> float32 [..., Dh]: what attention reads
    (equal to kv_quant.roundtrip of the original values)."""
    Dh = head_dim
    if kv_type in ELEMENT_TYPES:
        return np.asarray(raw).astype(np.float32)
    raw = np.asarray(raw, np.uint8)
    lead = raw.shape[:-1]
    if kv_type == "q8_0":
        q = raw[..., :Dh].view(np.int8).astype(np.float32).reshape(lead + (Dh // 32, 32))
        d = raw[..., Dh:].copy().view(np.float16).astype(np.float32)
        return (q * d[..., None]).reshape(lead + (Dh,))
    if kv_type == "q4_0":
        b = raw[..., :Dh // 2]
        n = np.empty(lead + (Dh,), np.float32)
        n[..., 0::2], n[..., 1::2] = b & 15, b >> 4
        d = raw[..., Dh // 2:].copy().view(np.float16).astype(np.float32)
        return ((n - 8.0).reshape(lead + (Dh // 32, 32)) * d[..., None]).reshape(lead + (Dh,))
    if kv_type == "tq3":
        B = min(kv_quant.TQ3_BLOCK, Dh)
        planes = raw[..., :Dh * 3 // 8].reshape(lead + (Dh // 32, 3, 4))
        bits = np.unpackbits(planes, axis=-1, bitorder="little")   # [..., Dh/32, 3, 32]
        codes = (bits[..., 0, :] | (bits[..., 1, :] << 1) | (bits[..., 2, :] << 2)).reshape(lead + (Dh // B, B))
        scales = raw[..., Dh * 3 // 8:].copy().view(np.float16).astype(np.float32)
        return kv_quant.tq3_decode(codes, scales, Dh)
    raise ValueError(f"unknown KV cache type '{kv_type}'")


def _q_blocks(x: np.ndarray, kv_type: str) -> tuple[np.ndarray, np.ndarray]:
    """kv_quant's q8_0 / q4_0 rules, keeping the codes: -> (q [..., nb, 32] as stored, d [..., nb] float32)."""
    b = kv_quant._blocks(x, 32)
    if kv_type == "q8_0":
        d = np.abs(b).max(-1, keepdims=True) / np.float32(127.0)
        inv = np.divide(np.float32(1.0), d, out=np.zeros_like(d), where=d > 0)
        q = np.sign(b * inv) * np.floor(np.abs(b * inv) + np.float32(0.5))
    else:
        idx = np.abs(b).argmax(-1)[..., None]
        d = np.take_along_axis(b, idx, -1) / np.float32(-8.0)
        inv = np.divide(np.float32(1.0), d, out=np.zeros_like(d), where=d != 0)
        q = np.minimum(15, np.trunc(b * inv + np.float32(8.5)))
    return q, d[..., 0]
