"""Image bytes -> the normalised float image the encoder sees, with llama.cpp's rules for qwen3vl_merger
(tools/mtmd/clip.cpp: clip_image_preprocess, img_tool::calc_size_preserved_ratio ("smart resize"),
img_tool::resize_bilinear, normalize_image_u8_to_f32).

Decoding is Pillow's (llama.cpp uses stb_image): PNG, GIF (first frame) and lossless WebP decode to the same
pixels; JPEG decoders may differ by a level here and there. Alpha is dropped, not composited, as stb_image does
when asked for 3 channels."""
from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass

import numpy as np

from .config import VisionConfig

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# Decoded-size ceiling (pixels) so a tiny compressed file cannot demand gigabytes: 16k x 16k.
MAX_DECODED_PIXELS = 16384 * 16384


class ImageError(ValueError):
    """Bytes that are not a supported, decodable, reasonably sized image; the message says which."""


@dataclass(frozen=True, slots=True)
class DecodedImage:
    rgb: np.ndarray             # [H, W, 3] uint8
    digest: str                 # sha256 hex of the encoded bytes: the image's identity in caches

    @property
    def width(self) -> int:
        return self.rgb.shape[1]

    @property
    def height(self) -> int:
        return self.rgb.shape[0]


def decode_image(data: bytes, max_pixels: int = MAX_DECODED_PIXELS) -> DecodedImage:
    """PNG / JPEG / WebP / GIF (first frame) bytes -> RGB uint8."""
    from PIL import Image, UnidentifiedImageError
    if not data:
        raise ImageError("empty image data")
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format not in ALLOWED_FORMATS:
                raise ImageError(f"unsupported image format {im.format} (supported: PNG, JPEG, WebP, GIF)")
            w, h = im.size
            if w <= 0 or h <= 0:
                raise ImageError(f"image has no pixels ({w}x{h})")
            if w * h > max_pixels:
                raise ImageError(f"image is {w}x{h} = {w * h} pixels, more than the {max_pixels} allowed")
            im.seek(0)
            rgb = np.asarray(_to_rgb(im), np.uint8)
    except ImageError:
        raise
    except UnidentifiedImageError as e:
        raise ImageError("data is not a recognised image (PNG, JPEG, WebP or GIF)") from e
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ImageError(f"corrupt or truncated image: {e}") from e
    return DecodedImage(np.ascontiguousarray(rgb), hashlib.sha256(data).hexdigest())


def _to_rgb(im):
    """Drop alpha without compositing (stb_image with 3 requested channels); grey and palette expand to RGB."""
    if im.mode in ("RGBA", "LA", "PA"):
        im = im.convert("RGBA") if im.mode != "RGBA" else im
        return im.convert("RGB")
    if im.mode == "P" and "transparency" in im.info:
        return im.convert("RGBA").convert("RGB")
    return im.convert("RGB")


def smart_resize(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) -> (w, h): multiples of `align`, aspect kept, min_pixels <= w*h <= max_pixels, computed in
    float32 as clip.cpp's calc_size_preserved_ratio does (std::round: half away from zero)."""
    f32, fa = np.float32, np.float32(align)

    def round_by(x) -> int:
        q = f32(x) / fa
        return int(math.floor(abs(float(q)) + 0.5) * (1 if q >= 0 else -1)) * align

    def ceil_by(x) -> int:
        return int(math.ceil(float(f32(x) / fa))) * align

    def floor_by(x) -> int:
        return int(math.floor(float(f32(x) / fa))) * align

    h_bar = max(align, round_by(f32(height)))
    w_bar = max(align, round_by(f32(width)))
    if h_bar * w_bar > max_pixels:
        beta = np.sqrt(f32(f32(height * width) / f32(max_pixels)), dtype=f32)
        h_bar = max(align, floor_by(f32(f32(height) / beta)))
        w_bar = max(align, floor_by(f32(f32(width) / beta)))
    elif h_bar * w_bar < min_pixels:
        beta = np.sqrt(f32(f32(min_pixels) / f32(height * width)), dtype=f32)
        h_bar = ceil_by(f32(f32(height) * beta))
        w_bar = ceil_by(f32(f32(width) * beta))
    return w_bar, h_bar


def resize_bilinear(src: np.ndarray, width: int, height: int) -> np.ndarray:
    """[H, W, 3] uint8 -> [height, width, 3] uint8 with clip.cpp's bilinear: source step (W-1)/width (so the
    last source row/column is approached, never sampled past), float32 lerps, truncation to uint8."""
    H, W = src.shape[:2]
    if (W, H) == (width, height):
        return src.copy()
    f32 = np.float32
    x_ratio, y_ratio = f32(W - 1) / f32(width), f32(H - 1) / f32(height)
    px = x_ratio * np.arange(width, dtype=f32)
    py = y_ratio * np.arange(height, dtype=f32)
    x0, y0 = px.astype(np.int64), py.astype(np.int64)
    xl, yl = (px - x0.astype(f32))[None, :, None], (py - y0.astype(f32))[:, None, None]
    x1, y1 = np.minimum(x0 + 1, W - 1), np.minimum(y0 + 1, H - 1)
    s = src.astype(f32)
    a, b = s[y0][:, x0], s[y0][:, x1]
    c, d = s[y1][:, x0], s[y1][:, x1]
    top = a + (b - a) * xl
    bottom = c + (d - c) * xl
    return (top + (bottom - top) * yl).astype(np.uint8)


def normalize(rgb: np.ndarray, mean, std) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 (v/255 - mean[c]) / std[c], in float32 like normalize_image_u8_to_f32."""
    f32 = np.float32
    x = rgb.astype(f32) / f32(255.0)
    return ((x - np.asarray(mean, f32)) / np.asarray(std, f32)).astype(f32)


@dataclass(frozen=True, slots=True)
class PreparedImage:
    pixels: np.ndarray          # [h, w, 3] float32 normalised, h and w multiples of 2 * patch
    digest: str

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, cols) of patches."""
        return self.pixels.shape[0], self.pixels.shape[1]


def prepare(img: DecodedImage, cfg: VisionConfig) -> PreparedImage:
    w, h = smart_resize(img.width, img.height, cfg.align, cfg.min_pixels, cfg.max_pixels)
    return PreparedImage(normalize(resize_bilinear(img.rgb, w, h), cfg.image_mean, cfg.image_std), img.digest)
