"""CQ2, the MTP draft's coarse head format (--spec-draft-coarse; cuda_src/coarse_head.cu): the specification of
cmp_quantize_cq2 (bit for bit) and cmp_cq2_gemv (to fp32 rounding).

Per block of 32 values of a row: a scale d (f16) and 32 2-bit codes c, value = (2c - 3) d, i.e. the uniform levels
{-3, -1, 1, 3} d, 0.3125 bytes a weight (Q4_0: 0.5625). Only the ranking of the coarse logits matters (the draft
rescores its k best ids with the exact head), so the levels minimise the squared error, the logit error's
variance for activations independent of the weights: d = 0.2 amax (outer level 0.6 amax, the largest values
clipped) is within 1-3% of the best such scale for Gaussian, Laplace and Student-t(5) blocks of 32, where the
amax-preserving d = amax / 3 has 1.75-2.2x that error. On the demo model's trained head (llamacmp/data/default.gguf,
8192 x 384, its hidden states over 768 tokens of README.md) the exact argmax is among the coarse top 1 / 2 / 4 / 16
in 74 / 90 / 98 / 100% of positions (amax / 3: 71 / 87 / 96 / 100%; a Q4_0 copy: 94 / 99.5 / 100 / 100%).
Uniform levels keep the GEMV an int8 dot: the codes times two are bytes (0, 2, 4, 6) the activations' Q8 codes dot
with, less 3 times the activations' block sum.

Layout (two planes per row, as cuda_src reads them): codes [N, n/4] u8, 8 bytes a block, two little-endian words;
word w holds the block's values 16w .. 16w + 15, value 16w + 4k + i (k, i < 4) in bits 8i + 2k, so (word >> 2k) &
0x03030303 is the codes of values 16w + 4k .. 16w + 4k + 3 in byte order (one int of the activations' codes);
scales [N, n/32] f16.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CQ2_VALUES = 32
CQ2_SCALE = np.float32(0.2)   # d = amax * CQ2_SCALE, rounded to f16 (cuda_src/coarse_head.cu CQ2_SCALE)
CQ2_BYTES_PER_VALUE = 10 / 32   # 8 code bytes + a 2-byte scale per 32 values
GEMV_CHUNK = 4096             # weight rows cq2_gemv unpacks at a time


@dataclass(frozen=True, slots=True)
class RefCQ2:
    """A CQ2 matrix [N, n] on the numpy backend: codes [N, n/4] u8, scales [N, n/32] f16."""
    codes: np.ndarray
    scales: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * 4

    def rows(self, ids) -> RefCQ2:
        return RefCQ2(self.codes[ids], self.scales[ids])


def quantize_cq2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [N, n] (n a multiple of 32) -> (codes [N, n/4] u8, scales [N, n/32] f16), each step a float32 operation
    rounded as IEEE does (the kernel's __fmul_rn etc.): amax = the largest |value| (NaN ignored, 0 for none), d =
    f16(amax * 0.2), c = min(3, max(0, floor(x * (1 / (2d)) + 2))) (the nearest level; 1 / (2d) = 0 where d is 0,
    and NaN codes 0, both as fmaxf)."""
    N, n = x.shape
    b = np.asarray(x, np.float32).reshape(N, n // CQ2_VALUES, CQ2_VALUES)
    amax = np.fmax.reduce(np.abs(b), axis=2, initial=np.float32(0))
    d = (amax * CQ2_SCALE).astype(np.float16)
    step = d.astype(np.float32) * np.float32(2)
    with np.errstate(divide="ignore"):
        inv = np.where(step != 0, np.float32(1) / step, np.float32(0)).astype(np.float32)
    with np.errstate(invalid="ignore"):
        t = np.floor(b * inv[..., None] + np.float32(2))
    c = np.fmin(np.fmax(t, np.float32(0)), np.float32(3)).astype(np.uint8)
    c = c.reshape(N, n // CQ2_VALUES, 2, 4, 4)                  # [.., word w, k, byte i]
    packed = c[:, :, :, 0] | c[:, :, :, 1] << 2 | c[:, :, :, 2] << 4 | c[:, :, :, 3] << 6
    return packed.reshape(N, n // 4), d


def cq2_levels(codes: np.ndarray) -> np.ndarray:
    """codes [N, n/4] u8 -> 2c - 3 [N, n/32, 32] float32 (the levels in units of d, value order)."""
    N = codes.shape[0]
    b = codes.reshape(N, -1, 2, 1, 4)
    c = (b >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3    # [.., w, k, i]: value 16w + 4k + i
    return (2 * c.reshape(N, -1, CQ2_VALUES).astype(np.float32) - 3)


def dequantize_cq2(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """-> the values [N, n] float32."""
    v = cq2_levels(codes) * scales.astype(np.float32)[..., None]
    return v.reshape(codes.shape[0], -1)


def cq2_gemv(xq: np.ndarray, xd: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Q8 activations xq [T, n] int8 (any integer or float array of their values), xd [T, n/32] f32 times the CQ2
    matrix (codes [N, n/4], scales [N, n/32]) -> y [T, N] float32: per block the exact integer dot of the levels
    with the codes, times d * xd, summed in float64 (cmp_cq2_gemv sums in fp32)."""
    T, n = xq.shape
    q = np.asarray(xq, np.float32).reshape(T, n // CQ2_VALUES, CQ2_VALUES)
    dx = np.asarray(xd, np.float64)
    y = np.empty((T, codes.shape[0]), np.float32)
    for r0 in range(0, codes.shape[0], GEMV_CHUNK):
        lv = cq2_levels(codes[r0:r0 + GEMV_CHUNK])               # [C, nb, 32]
        dots = np.einsum("tbv,cbv->tcb", q, lv)                   # exact: |sum| <= 32 * 3 * 127 < 2^24
        d = scales[r0:r0 + GEMV_CHUNK].astype(np.float64)         # [C, nb]
        y[:, r0:r0 + len(lv)] = np.einsum("tcb,cb,tb->tc", dots.astype(np.float64), d, dx)
    return y
