"""A loaded vision projector: the mmproj config, its encoder on the text model's backend, and a small cache of
encoded images keyed by the image bytes' digest (a chat re-sends its images every turn; llama.cpp's server also
reuses an image's chunk while its id matches)."""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .config import VisionConfig, load_mmproj
from .encoder import ImageEmbedding, VisionEncoder
from .preprocess import decode_image, prepare


class VisionProjector:
    def __init__(self, path: str, lm, cache_images: int = 16, min_tokens: int = 0, max_tokens: int = 0):
        """lm: the loaded text model (its hidden size is checked against the projector; its backend runs the
        encoder)."""
        self.path = path
        self.cfg: VisionConfig
        self.cfg, weights = load_mmproj(path, lm.cfg.n_embd, min_tokens, max_tokens)
        self.encoder = VisionEncoder(self.cfg, weights, lm.backend)
        self._cache: OrderedDict[str, ImageEmbedding] = OrderedDict()
        self._cap = cache_images
        self._lock = threading.Lock()      # the server encodes on its worker thread; callers may share us

    def encode_bytes(self, data: bytes) -> ImageEmbedding:
        """Encoded image bytes (PNG/JPEG/WebP/GIF) -> embeddings now; raises preprocess.ImageError for bad data."""
        img = self.prepare_bytes(data)
        img.ready()
        return img

    def prepare_bytes(self, data: bytes) -> ImageEmbedding:
        """Decode and preprocess now (bad data raises preprocess.ImageError here), encode on first ready(): the
        token grid is known at once, the encoder runs on whichever thread asks for the rows."""
        img = decode_image(data)
        with self._lock:
            hit = self._cache.get(img.digest)
            if hit is not None:
                self._cache.move_to_end(img.digest)
                return hit
        prepared = prepare(img, self.cfg)
        h, w, _ = prepared.pixels.shape
        step = self.cfg.patch_size * self.cfg.merge
        return ImageEmbedding(None, w // step, h // step, img.digest,
                              encode=lambda e, p=prepared: self._encode(e, p))

    def _encode(self, emb: ImageEmbedding, prepared) -> np.ndarray:
        with self._lock:
            hit = self._cache.get(emb.digest)
            if hit is not None and hit.embeddings is not None:
                return hit.embeddings
            out = self.encoder.encode(prepared)
            if (out.nx, out.ny) != (emb.nx, emb.ny):
                raise AssertionError(f"encoder grid {out.nx}x{out.ny} != prepared grid {emb.nx}x{emb.ny}")
            self._cache[emb.digest] = ImageEmbedding(out.embeddings, out.nx, out.ny, emb.digest)
            while len(self._cache) > self._cap:
                self._cache.popitem(last=False)
            return out.embeddings
