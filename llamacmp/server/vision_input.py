"""Images in server requests, with llama-server's rules (tools/server/server-common.cpp: handle_media and the
chat-message parser; the --media-path flag):

- chat `content` parts {"type": "image_url", "image_url": {"url": ...}} become the media marker in the text and
  their bytes are collected in order; `url` is a `data:image/...;base64,...` URL, or `file://RELATIVE/PATH` only
  when the server runs with --media-path (resolved under it, no absolute paths, no '..'). http(s) URLs are
  refused: llamacmp never reaches the network at run time.
- /completion's prompt {"prompt_string": ..., "multimodal_data": [base64, ...]} (one marker per image).

Every problem (no projector, bad URL, bad base64, oversized, corrupt or non-image data) is a 400 with a message
that names it. The images of a request live in that request's task only."""
from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

from ..vision.preprocess import ImageError
from ..vision.prompt import MEDIA_MARKER, prompt_images, split_prompt
from .errors import bad_request
from .prep_cancel import step

MAX_IMAGE_BYTES = 20 * 1024 * 1024         # per image, after base64 decoding
NO_PROJECTOR = ("image input is not supported - hint: if this is unexpected, you may need to provide the mmproj")


def _b64(data: str) -> bytes:
    if len(data) * 3 // 4 > MAX_IMAGE_BYTES:
        raise bad_request(f"image is too large (more than {MAX_IMAGE_BYTES} bytes)")
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        raise bad_request("image data is not valid base64") from None


def image_url_bytes(url: str, media_path: str) -> bytes:
    """One image_url's bytes, or a 400."""
    if not isinstance(url, str) or not url:
        raise bad_request("image_url.url is required")
    if url.startswith("http"):
        raise bad_request("remote image URLs are not supported by llamacmp (it never downloads): send the image as "
                          "a data: URL, or as file:// with --media-path")
    if url.startswith("file://"):
        if not media_path:
            raise bad_request("file:// URLs are not allowed unless --media-path is specified")
        rel = url[len("file://"):]
        parts = Path(rel).parts
        if not rel or rel.startswith(("/", "\\")) or ".." in parts or any(":" in p or "\0" in p for p in parts):
            raise bad_request(f"file path is not allowed: {rel}")
        root = os.path.realpath(media_path)
        full = os.path.realpath(os.path.join(root, rel))
        if not full.startswith(root + os.sep):
            raise bad_request(f"file path is not allowed: {rel}")
        try:
            st = os.stat(full)
            if not stat.S_ISREG(st.st_mode):     # a FIFO or a device would block the prep thread for ever
                raise bad_request(f"file path is not a regular file: {rel}")
            if st.st_size > MAX_IMAGE_BYTES:
                raise bad_request(f"image is too large (more than {MAX_IMAGE_BYTES} bytes)")
            return Path(full).read_bytes()
        except OSError:
            raise bad_request(f"file does not exist or cannot be opened: {rel}") from None
    head, sep, data = url.partition(",")
    if not sep or "," in data:
        raise bad_request("Invalid url value")
    if not head.startswith("data:image/"):
        raise bad_request(f"Invalid url format: {head}")
    if not head.endswith("base64"):
        raise bad_request("url must be base64 encoded")
    return _b64(data)


def content_part_marker(part: dict, media: list | None, media_path: str) -> str:
    """An image_url content part -> the media marker, its bytes appended to `media` (None: no projector)."""
    if media is None:             # llama-server answers 500; it is the client's input: 400 (compat/DIFFERENCES.md)
        raise bad_request(NO_PROJECTOR)
    obj = part.get("image_url")
    url = obj.get("url") if isinstance(obj, dict) else obj if isinstance(obj, str) else None
    media.append(image_url_bytes(url, media_path))
    return MEDIA_MARKER


def multimodal_data(items, vision) -> list[bytes]:
    """/completion's multimodal_data: a list of base64 strings."""
    if vision is None:
        raise bad_request(NO_PROJECTOR)
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise bad_request("multimodal_data must be an array of base64 strings")
    return [_b64(x) for x in items]


def encode_prompt(vision, tokenizer, text: str, media: list[bytes]) -> tuple[list[int], dict]:
    """Rendered text with one marker per image -> (token ids with image placeholder ids, {start: ImageEmbedding}).
    Tokens are parsed with special tokens and the tokenizer's add_special, as the text-only path does."""
    embs = []
    for i, data in enumerate(media):
        step()                          # decoding and resizing an image is the slow part: stop between them
        try:
            embs.append(vision.prepare_bytes(data))     # encoded later, on the engine thread (Slot.prefill)
        except ImageError as e:
            raise bad_request(f"image {i}: {e}") from None
    first = [True]

    def tok(s: str) -> list[int]:
        add = first[0]
        first[0] = False
        return tokenizer.encode(s, parse_special=True, add_special=add)
    try:
        chunks = split_prompt(text, embs, tok)
    except ValueError as e:
        raise bad_request(str(e)) from None
    return prompt_images(chunks)
