"""vision/preprocess.py: the formats llama.cpp's mtmd reads (PNG, JPEG, WebP, GIF first frame), alpha dropped as
stb_image does, clear errors for what is not an image, and clip.cpp's smart-resize rule on hand-worked sizes."""
import io

import numpy as np
import pytest

pytest.importorskip("PIL")

from PIL import Image  # noqa: E402

from llamacmp.vision.preprocess import ImageError, decode_image, resize_bilinear, smart_resize  # noqa: E402

RGB = np.random.default_rng(3).integers(0, 256, (20, 30, 3), dtype=np.uint8)


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def test_formats():
    im = Image.fromarray(RGB)
    assert np.array_equal(decode_image(encode(im, "PNG")).rgb, RGB)
    assert np.array_equal(decode_image(encode(im, "WEBP", lossless=True)).rgb, RGB)
    smooth = np.stack(list(np.meshgrid(np.arange(30) * 8, np.arange(20) * 12)) + [np.full((20, 30), 99)], -1)
    jpg = decode_image(encode(Image.fromarray(smooth.astype(np.uint8)), "JPEG", quality=95)).rgb
    assert jpg.shape == smooth.shape and np.abs(jpg.astype(int) - smooth).mean() < 4     # lossy, but that picture
    # GIF: the first frame, palette expanded to RGB
    frames = [Image.new("RGB", (8, 6), (255, 0, 0)), Image.new("RGB", (8, 6), (0, 0, 255))]
    gif = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    first = decode_image(gif).rgb
    assert first.shape == (6, 8, 3) and tuple(first[0, 0]) == (255, 0, 0)
    # alpha is dropped, not composited: a transparent pixel keeps its colour
    rgba = np.dstack([RGB, np.zeros(RGB.shape[:2], np.uint8)])
    assert np.array_equal(decode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG")).rgb, RGB)
    grey = decode_image(encode(Image.fromarray(RGB[..., 0], "L"), "PNG")).rgb
    assert np.array_equal(grey, np.repeat(RGB[..., :1], 3, axis=2))
    # same bytes -> same identity; other bytes -> another
    assert decode_image(encode(im, "PNG")).digest == decode_image(encode(im, "PNG")).digest
    assert decode_image(encode(im, "PNG")).digest != decode_image(encode(im, "WEBP", lossless=True)).digest


def test_errors():
    with pytest.raises(ImageError, match="empty"):
        decode_image(b"")
    with pytest.raises(ImageError, match="not a recognised image"):
        decode_image(b"hello, world")
    with pytest.raises(ImageError, match="unsupported image format BMP"):
        decode_image(encode(Image.fromarray(RGB), "BMP"))
    png = encode(Image.fromarray(RGB), "PNG")
    with pytest.raises(ImageError, match="corrupt or truncated"):
        decode_image(png[: len(png) // 2])
    with pytest.raises(ImageError, match="more than the 100 allowed"):
        decode_image(png, max_pixels=100)


def test_smart_resize_rules():
    # within limits: each side rounded to the nearest multiple of 32 (half away from zero)
    assert smart_resize(320, 240, 32, 8192, 4194304) == (320, 256)       # 240/32 = 7.5 -> 8
    assert smart_resize(336, 208, 32, 8192, 4194304) == (352, 224)       # 10.5 -> 11, 6.5 -> 7
    # too small: scaled up by sqrt(min/area), each side ceiled
    assert smart_resize(100, 60, 32, 8192, 4194304) == (128, 96)
    # too large: scaled down by sqrt(area/max), each side floored
    assert smart_resize(4000, 3000, 32, 8192, 4194304) == (2336, 1760)
    w, h = smart_resize(4000, 3000, 32, 8192, 4194304)
    assert w * h <= 4194304 and w % 32 == 0 and h % 32 == 0


def test_resize_bilinear_endpoints():
    src = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 10
    out = resize_bilinear(src, 6, 4)
    assert out.shape == (4, 6, 3)
    assert np.array_equal(out[0, 0], src[0, 0])             # x = y = 0 samples the first pixel exactly
    assert np.array_equal(resize_bilinear(src, 3, 2), src)   # same size: a copy


def test_image_token_limits(tmp_path):
    """--image-min-tokens / --image-max-tokens replace the 8 / 4096 merged-token limits (clip.cpp's
    set_limit_image_tokens with custom values)."""
    from llamacmp.args import parse_or_exit
    from llamacmp.fixtures.mmproj_writer import VISION_SHAPES, write_mmproj
    from llamacmp.vision.config import MmprojError, load_mmproj
    from llamacmp.vision.preprocess import prepare
    p = parse_or_exit("cli", ["-m", "x.gguf", "--image-min-tokens", "64", "--image-max-tokens", "100"])
    assert (p.image_min_tokens, p.image_max_tokens) == (64, 100)
    mm = write_mmproj(tmp_path / "mm.gguf", VISION_SHAPES["tiny"], "f32", 1)
    img = decode_image(encode(Image.fromarray(RGB), "PNG"))                       # 30 x 20
    cfg, _ = load_mmproj(mm)
    assert prepare(img, cfg).pixels.shape[:2] == (96, 128)                        # >= 8 tokens: 3 x 4
    cfg, _ = load_mmproj(mm, min_tokens=64)
    h, w = prepare(img, cfg).pixels.shape[:2]
    assert (h // 32) * (w // 32) >= 64 and (h, w) == (224, 320)       # 20x30 * sqrt(65536/600), ceiled
    with pytest.raises(MmprojError, match="above"):
        load_mmproj(mm, min_tokens=200, max_tokens=100)
