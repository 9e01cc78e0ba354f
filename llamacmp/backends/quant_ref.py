"""The numpy reference for block-quantized weights: the activation quantizers of llama.cpp's CPU backend and
the matmul of a QuantTensor against them.

ggml's CPU mul_mat first converts the activations to the weight type's `vec_dot_type` (ggml-cpu.c,
type_traits_cpu, b8462): Q8_0 for Q8_0/Q4_0/Q5_0/IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, IQ4_XS and
the grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M).
On x86-64 those conversions are the AVX versions of quantize_row_q8_0/q8_1 (arch/x86/quants.c) and of the
repacked gemm paths (arch/x86/repack.cpp, ggml_quantize_mat_q8_*_4x8), which round differently from the
portable `_ref` functions: they multiply by 127/amax (not by 1/d) and round half to even (`_ref` Q8_0/Q8_1 use
roundf). Q8_K has no x86 version; its `_ref` (nearest_int, also half to even) scales by -127/max of the signed
element of largest magnitude and keeps d = 1/iscale as a float32. The reference reproduces those exactly.

The dot products are then exact in float64 over the dequantized operands, split as llama.cpp's vec_dot splits
them: a scale part (d * sub-scale * quant, exact in float32 for every type) dotted with the dequantized
activations, plus, for types with per-block minimums (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), the minimums dotted with
the activation sums of their sub-blocks. For Q8_1 that sum is the block's stored f16 `s` (= f16(d * sum q) with
the unrounded d), as in ggml_vec_dot_q4_1_q8_1; for Q8_K it is d * bsums, exact.

The grid types fit the scale part alone: a value is d (f16) * an odd sub-scale of at most 5 bits (IQ2/IQ3_XXS's
(0.5 + s) / 4 or / 2, IQ3_S's 1 + 2s, IQ1's 2s + 1) * a grid integer of at most 6 bits * a sign: at most 22
significant bits, exact in float32 as gguf.quants and ggml's to_float compute it, and ggml's vec_dot sums the
same products in integers per block (ggml-cpu/quants.c, ggml_vec_dot_iq2_xxs_q8_K etc.). IQ1_S / IQ1_M add a
delta of +-IQ1S_DELTA (0.125) to every grid value of a group of 8 (IQ1_S) or 16 (IQ1_M); ggml_vec_dot_iq1_s_q8_K
and _iq1_m_ add it as `IQ1S_DELTA * sumi1` with sumi1 = sub-scale * (+-1) * the group's sum of q8 (bsums for
IQ1_S), times d * y.d: exactly d * sub-scale * (grid + delta) dotted with the dequantized q8, i.e. the delta is
part of the dequantized value (gguf.quants' dl * (grid + delta); (grid + delta) has at most 4 bits, so the value
stays exact). No separate minimum term, then: these types dot their dequantized values alone.
"""
from __future__ import annotations

import numpy as np

from ..gguf_file import QuantTensor

Q8_0_VALUES = 32
Q8_K_VALUES = 256

# type_traits_cpu[type].vec_dot_type in ggml-cpu.c (b8462).
ACTIVATION_TYPE = {"Q8_0": "Q8_0", "Q4_0": "Q8_0", "Q5_0": "Q8_0", "IQ4_NL": "Q8_0", "Q4_1": "Q8_1",
                   "Q5_1": "Q8_1", "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
                   "IQ4_XS": "Q8_K", "IQ2_XXS": "Q8_K", "IQ2_XS": "Q8_K", "IQ3_XXS": "Q8_K", "IQ1_S": "Q8_K",
                   "IQ3_S": "Q8_K", "IQ2_S": "Q8_K", "IQ1_M": "Q8_K"}

# Types with per-block minimums: (byte offset of the f16 scale, of the f16 min, values per min). Dequantizing a
# copy with the min field zeroed gives the scale part alone, with the scale zeroed the (negated) minimums alone.
_MIN_FIELDS = {"Q4_1": (0, 2, 32), "Q5_1": (0, 2, 32), "Q2_K": (80, 82, 16), "Q4_K": (0, 2, 32),
               "Q5_K": (0, 2, 32)}


# -- activation quantizers ---------------------------------------------------------------------------------

def _q8_32(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [T, n] -> q [T, n/32, 32] (float32 holding int8 values), d [T, n/32] float32 before its f16 rounding."""
    T, n = x.shape
    xb = x.reshape(T, n // Q8_0_VALUES, Q8_0_VALUES).astype(np.float32)
    amax = np.abs(xb).max(axis=-1)
    inv = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0)
    return np.rint(xb * inv[..., None]), amax / np.float32(127.0)


def quantize_q8_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0: x [T, n] -> q [T, n/32, 32] (float32 holding int8 values), d [T, n/32].

    q = round-half-even(x * 127/amax); the scale d = amax/127 is stored as f16, so the dot products use the
    f16-rounded scale."""
    q, d = _q8_32(x)
    return q, d.astype(np.float16).astype(np.float32)


def quantize_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_1: Q8_0's q and f16 d, plus s [T, n/32] = f16(d * sum(q)) computed in float32 with d before rounding."""
    q, d32 = _q8_32(x)
    s = (d32 * q.sum(axis=-1, dtype=np.float32)).astype(np.float16).astype(np.float32)
    return q, d32.astype(np.float16).astype(np.float32), s


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_K: x [T, n] -> q [T, n/256, 256] (float32 holding int8 values), d [T, n/256] float32.

    iscale = -127/max with max the signed value of largest magnitude, q = min(127, round-half-even(iscale * x)),
    d = 1/iscale; an all-zero block has d = 0."""
    T, n = x.shape
    xb = x.reshape(T, n // Q8_K_VALUES, Q8_K_VALUES).astype(np.float32)
    mx = np.take_along_axis(xb, np.abs(xb).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    iscale = np.divide(np.float32(-127.0), mx, out=np.zeros_like(mx), where=mx != 0)
    d = np.divide(np.float32(1.0), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return np.minimum(np.float32(127.0), np.rint(xb * iscale[..., None])), d


# -- weights --------------------------------------------------------------------------------------------------

class RefQuant:
    """A QuantTensor prepared for the reference. The float32 parts are made on first use and kept (a table used
    only by embed never needs them): `scaled` [out, in] (the scale part of every value) and, for types with
    minimums, `mins` [out, in/g] (the offset added to every value of each g-value sub-block: m, or -dmin * m)."""

    def __init__(self, t: QuantTensor):
        if t.type_name not in ACTIVATION_TYPE:
            raise ValueError(f"no reference matmul for weight type {t.type_name}")
        self.tensor = t
        self.activation_type = ACTIVATION_TYPE[t.type_name]
        self._parts: tuple[np.ndarray, np.ndarray | None] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.tensor.shape

    def parts(self) -> tuple[np.ndarray, np.ndarray | None]:
        if self._parts is None:
            self._parts = _split_parts(self.tensor)
        return self._parts

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids), in] float32: the rows dequantized whole, as ggml's get_rows (the type's to_float) does."""
        return self.tensor.dequantize(rows=np.asarray(ids))


def _split_parts(t: QuantTensor) -> tuple[np.ndarray, np.ndarray | None]:
    if t.type_name not in _MIN_FIELDS:
        return t.dequantize(), None
    scale_at, min_at, group = _MIN_FIELDS[t.type_name]
    scaled, mins = np.array(t.blocks), np.array(t.blocks)
    scaled[:, :, min_at:min_at + 2] = 0
    mins[:, :, scale_at:scale_at + 2] = 0
    return QuantTensor(t.type_name, scaled).dequantize(), QuantTensor(t.type_name, mins).dequantize()[:, ::group]


# -- the matmul -------------------------------------------------------------------------------------------

class Activations:
    """One x [T, n] quantized on demand to each vec_dot_type asked for (once per type, as ggml converts src1 once
    per mul_mat and llamacmp shares one conversion across the matmuls of one input)."""

    def __init__(self, x: np.ndarray):
        self.x = x
        self._cache: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}

    def get(self, act: str) -> tuple[np.ndarray, np.ndarray | None]:
        """-> (dequantized values [T, n] float64, sums [T, n/32] of Q8_1 blocks or None)."""
        if act not in self._cache:
            T, n = self.x.shape
            if act == "Q8_1":
                q, d, s = quantize_q8_1(self.x)
                self._cache[act] = ((q * d[..., None]).reshape(T, n).astype(np.float64), s.astype(np.float64))
            else:
                q, d = quantize_q8_k(self.x) if act == "Q8_K" else quantize_q8_blocks(self.x)
                self._cache[act] = (q.astype(np.float64) * d.astype(np.float64)[..., None]).reshape(T, n), None
        return self._cache[act]


def quant_matmul(acts: Activations, w: RefQuant) -> np.ndarray:
    """acts of x [T, in], w [out, in] -> [T, out] float32."""
    xd, s = acts.get(w.activation_type)
    scaled, mins = w.parts()
    out = xd @ scaled.T.astype(np.float64)
    if mins is not None:
        T, n = xd.shape
        group = n // mins.shape[1]
        sums = s if s is not None else xd.reshape(T, n // group, group).sum(axis=-1)
        out += sums @ mins.T.astype(np.float64)
    return out.astype(np.float32)
