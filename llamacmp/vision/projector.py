"""A loaded vision projector: the mmproj config, its encoder on the text model's backend, and a small cache of
encoded images keyed by the image bytes' digest (a chat re-sends its images every turn; llama.cpp's server also
reuses an image's chunk while its id matches)."""
from __future__ import annotations

import threading
from collections import OrderedDict

from .config import VisionConfig, load_mmproj
from .encoder import ImageEmbedding, VisionEncoder
from .preprocess import decode_image, prepare


class VisionProjector:
    def __init__(self, path: str, lm, cache_images: int = 16):
        """lm: the loaded text model (its hidden size is checked against the projector; its backend runs the
        encoder)."""
        self.path = path
        self.cfg: VisionConfig
        self.cfg, weights = load_mmproj(path, lm.cfg.n_embd)
        self.encoder = VisionEncoder(self.cfg, weights, lm.backend)
        self._cache: OrderedDict[str, ImageEmbedding] = OrderedDict()
        self._cap = cache_images
        self._lock = threading.Lock()      # the server encodes on its worker thread; callers may share us

    def encode_bytes(self, data: bytes) -> ImageEmbedding:
        """Encoded image bytes (PNG/JPEG/WebP/GIF) -> embeddings; raises preprocess.ImageError for bad data."""
        img = decode_image(data)
        with self._lock:
            hit = self._cache.get(img.digest)
            if hit is not None:
                self._cache.move_to_end(img.digest)
                return hit
            emb = self.encoder.encode(prepare(img, self.cfg))
            self._cache[img.digest] = emb
            while len(self._cache) > self._cap:
                self._cache.popitem(last=False)
            return emb
