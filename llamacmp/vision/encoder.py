"""The qwen3vl_merger vision encoder written once against the backend ops (llama.cpp: tools/mtmd/models/qwen3vl.cpp).

image [h, w, 3] -> patches (2 temporal conv kernels on the same frame, summed, + bias) -> + learned position
embedding (antialiased bilinear resize of the table to the patch grid) -> ViT blocks (LayerNorm, fused QKV,
2-D rotary, full attention, LayerNorm, GELU MLP) -> post LayerNorm -> 2x2 merge -> MLP merger (GELU) ->
embeddings [n_tokens, n_out] in raster order of the merged grid.

Host-side steps (cheap, per image size): patch extraction (im2col), the position-table resize, the patch order."""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..backends.base import Backend
from .config import VisionConfig, VisionWeights
from .positions import encoder_positions, merge_order
from .preprocess import PreparedImage


@dataclass(slots=True)
class ImageEmbedding:
    embeddings: np.ndarray | None   # [ny * nx, n_out] float32, merged tokens in raster order (None: not yet run)
    nx: int                     # merged tokens per row
    ny: int                     # rows of merged tokens
    digest: str                 # the image's identity (sha256 of its bytes)
    # An image may be prepared (decoded, resized: its token grid known) before it is encoded: the server prepares
    # on its request thread and encodes on the engine thread, which owns the device. `encode` then fills
    # `embeddings` on first use (VisionProjector.prepare_bytes sets it).
    encode: Callable[["ImageEmbedding"], np.ndarray] | None = None

    @property
    def n_tokens(self) -> int:
        return self.nx * self.ny

    def ready(self) -> np.ndarray:
        """The embeddings, running the encoder now if the image was only prepared."""
        if self.embeddings is None:
            if self.encode is None:
                raise ValueError("image embedding has neither embeddings nor an encoder")
            self.embeddings = self.encode(self)
        return self.embeddings


def patchify(pixels: np.ndarray, patch: int) -> np.ndarray:
    """[h, w, 3] -> [(h/p) * (w/p), 3*p*p] raster patches, each flattened (c, ky, kx) as the conv kernel is."""
    h, w, _ = pixels.shape
    ph, pw = h // patch, w // patch
    x = pixels.reshape(ph, patch, pw, patch, 3).transpose(0, 2, 4, 1, 3)     # [ph, pw, c, ky, kx]
    return np.ascontiguousarray(x.reshape(ph * pw, 3 * patch * patch), np.float32)


def resize_pos_embd(table: np.ndarray, ph: int, pw: int) -> np.ndarray:
    """[n*n, E] (row y*n + x) -> [ph * pw, E] raster: ggml_interpolate with BILINEAR | ANTIALIAS (triangle filter
    of support max(1, 1/scale), pixel centres at +0.5, weights renormalised), as clip.cpp's
    resize_position_embeddings; returned unchanged when the grid already is n x n."""
    n = int(round(math.sqrt(table.shape[0])))
    if ph == n and pw == n:
        return np.asarray(table, np.float32)
    E = table.shape[1]
    grid = table.reshape(n, n * E).astype(np.float64)                    # [y, x*E]
    wy = _aa_weights(n, ph)                                               # [ph, n]
    wx = _aa_weights(n, pw)                                               # [pw, n]
    # The separable filter as two matmuls (rows, then columns): a three-operand einsum loops over every
    # (a, b, y, x, e) -- 2e9 multiply-adds for a 448x448 image at width 1152, seconds per image on the host.
    # (A broadcast np.matmul(wx, rows) would loop outside BLAS: tensordot makes it one GEMM.)
    rows = (wy @ grid).reshape(ph, n, E)                                  # [ph, x, E]
    out = np.tensordot(wx, rows, axes=([1], [1]))                         # [pw, ph, E]
    return out.transpose(1, 0, 2).reshape(ph * pw, E).astype(np.float32)


def _aa_weights(n_in: int, n_out: int) -> np.ndarray:
    """Normalised 1-D triangle-filter weights [n_out, n_in] of ggml's antialiased bilinear upscale. The 2-D
    filter is separable: ggml normalises by the sum of products, which is the product of the sums."""
    sf = n_out / n_in
    support = max(1.0, 1.0 / sf)
    inv = 1.0 / support
    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        c = (i + 0.5) / sf
        lo, hi = max(int(c - support + 0.5), 0), min(int(c + support + 0.5), n_in)
        for s in range(lo, hi):
            w[i, s] = max(1.0 - abs((s - c + 0.5) * inv), 0.0)
    return w / w.sum(axis=1, keepdims=True)


class VisionEncoder:
    def __init__(self, cfg: VisionConfig, weights: VisionWeights, backend: Backend):
        self.cfg, self.be = cfg, backend
        m, v = backend.upload_matrix, backend.upload_vector
        self.patch_w = [m(weights.patch_w0), m(weights.patch_w1)]
        self.patch_b = v(weights.patch_b)
        self.pos_table = weights.pos_embd                      # host: resized per image grid
        # (ph, pw) -> the table resized to that grid, in merge order [ph * pw, E]: images of one size (a chat
        # re-sending photos of one camera, the server's clients) skip the resize. A few grids, host memory only.
        self._pos_resized: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self.pre_ln = tuple(v(a) for a in weights.pre_ln) if weights.pre_ln else None
        self.post_ln = tuple(v(a) for a in weights.post_ln) if weights.post_ln else None
        E = cfg.n_embd
        # The fused QKV projection is uploaded as its three row blocks: one matmuls call yields q, k, v as separate
        # tensors (each output element is the same dot product), so nothing has to be split on the host.
        self.layers = [dict(ln1=(v(l.ln1_w), v(l.ln1_b)),
                            qkv=[m(np.ascontiguousarray(l.qkv_w[i * E:(i + 1) * E])) for i in range(3)],
                            qkv_b=[v(l.qkv_b[i * E:(i + 1) * E]) for i in range(3)], o=m(l.o_w),
                            o_b=v(l.o_b), ln2=(v(l.ln2_w), v(l.ln2_b)), up=m(l.up_w), up_b=v(l.up_b),
                            down=m(l.down_w), down_b=v(l.down_b)) for l in weights.layers]
        self.mm0, self.mm0_b = m(weights.mm0_w), v(weights.mm0_b)
        self.mm2, self.mm2_b = m(weights.mm2_w), v(weights.mm2_b)

    POS_CACHE_GRIDS = 4

    def _pos_embd(self, ph: int, pw: int, order: np.ndarray) -> np.ndarray:
        """The learned position embedding for a ph x pw patch grid, in merge order [ph * pw, E] float32."""
        key = (ph, pw)
        table = self._pos_resized.get(key)
        if table is None:
            table = self._pos_resized[key] = np.ascontiguousarray(resize_pos_embd(self.pos_table, ph, pw)[order])
            while len(self._pos_resized) > self.POS_CACHE_GRIDS:
                self._pos_resized.popitem(last=False)
        self._pos_resized.move_to_end(key)
        return table

    def encode(self, img: PreparedImage) -> ImageEmbedding:
        cfg, be = self.cfg, self.be
        p, E, H, Dh = cfg.patch_size, cfg.n_embd, cfg.n_head, cfg.head_dim
        h, w, _ = img.pixels.shape
        if h % cfg.align or w % cfg.align:
            raise ValueError(f"image {w}x{h} is not a multiple of {cfg.align} (preprocess first)")
        ph, pw = h // p, w // p
        order = merge_order(ph, pw, cfg.merge)
        patches = patchify(img.pixels, p)[order]                                 # [T, 3p^2] merge order
        # Patch embedding: Conv3D over two identical frames = two conv2d kernels on the one image.
        a, b = be.matmuls(be.upload_vector(patches), self.patch_w)
        x = be.bias_add(be.add(a, b), self.patch_b)
        x = be.add(x, be.upload_vector(self._pos_embd(ph, pw, order)))
        pos = be.rope_positions(encoder_positions(ph, pw, cfg.merge))      # on the device once per image
        if self.pre_ln:
            x = be.layernorm(x, *self.pre_ln, cfg.eps)
        sections = (Dh // 4,) * 4
        scale = 1.0 / math.sqrt(Dh)
        for L in self.layers:
            hcur = be.layernorm(x, *L["ln1"], cfg.eps)
            q, k, vv = (be.bias_add(t, bias) for t, bias in zip(be.matmuls(hcur, L["qkv"]), L["qkv_b"]))
            q = be.rope_vision(q, pos, H, Dh, sections, 10000.0)
            k = be.rope_vision(k, pos, H, Dh, sections, 10000.0)
            o = be.attention_full(q, k, vv, H, Dh, scale)
            x = be.add(x, be.bias_add(be.matmuls(o, [L["o"]])[0], L["o_b"]))
            hcur = be.layernorm(x, *L["ln2"], cfg.eps)
            up = be.gelu(be.bias_add(be.matmuls(hcur, [L["up"]])[0], L["up_b"]))
            x = be.add(x, be.bias_add(be.matmuls(up, [L["down"]])[0], L["down_b"]))
        if self.post_ln:
            x = be.layernorm(x, *self.post_ln, cfg.eps)
        T = ph * pw
        merged = be.reshape(x, (T // (cfg.merge ** 2), E * cfg.merge ** 2))    # 2x2 blocks are 4 adjacent rows
        y = be.gelu(be.bias_add(be.matmuls(merged, [self.mm0])[0], self.mm0_b))
        y = be.bias_add(be.matmuls(y, [self.mm2])[0], self.mm2_b)
        return ImageEmbedding(be.to_host(y), pw // cfg.merge, ph // cfg.merge, img.digest)
