"""Multimodal prompts: text pieces and images in order, as llama.cpp's mtmd_tokenize splits them, and their
evaluation on one sequence (mtmd_helper_eval_chunks' rules).

A prompt is a list of chunks: a list of token ids (text) or an `ImageEmbedding`. The text around an image is the
caller's: mtmd wraps each image in <|vision_start|> ... <|vision_end|> (qwen3vl), which `split_prompt` does when
it replaces the media marker.

Positions (M-RoPE counting): text tokens advance the rotary position by one each; an image of nx x ny merged tokens
takes nx*ny cache rows at rotary positions (p0, p0 + y, p0 + x, 0) and advances the position by max(nx, ny).
The difference (position - cache row) is kept in SeqState.rope_shift for the text that follows.

Cache identity: an image's rows are represented in token histories by `image_token_ids(digest, n)`, negative ids
derived from the image's bytes, so that prompt caches and checkpoints never match across different images."""
from __future__ import annotations

import hashlib
from typing import Callable, Sequence, Union

import numpy as np

from ..backends.base import Segment, SeqState, StepBatch
from .encoder import ImageEmbedding
from .positions import image_n_pos, image_token_positions

MEDIA_MARKER = "<__media__>"                   # llama.cpp's mtmd_default_marker()
IMAGE_BEGIN, IMAGE_END = "<|vision_start|>", "<|vision_end|>"

Chunk = Union[list, ImageEmbedding]


def image_token_ids(digest: str, n: int) -> list[int]:
    """n placeholder ids (all equal, negative) naming the image whose sha256 hex digest is `digest`."""
    h = int(hashlib.sha256(("llamacmp-image:" + digest).encode()).hexdigest()[:15], 16)
    return [-(1 + h)] * n


def is_image_token(t: int) -> bool:
    return t < 0


def split_prompt(text: str, images: Sequence[ImageEmbedding], tokenize: Callable[[str], list[int]],
                 marker: str = MEDIA_MARKER) -> list[Chunk]:
    """Text with one `marker` per image -> chunks: text tokens (special tokens parsed by `tokenize`), each image
    wrapped in <|vision_start|> ... <|vision_end|> as mtmd does for qwen3vl."""
    parts = text.split(marker)
    if len(parts) - 1 != len(images):
        raise ValueError(f"the prompt has {len(parts) - 1} image markers ({marker}) but {len(images)} images were "
                         f"given")
    chunks: list[Chunk] = []
    for i, part in enumerate(parts):
        piece = part if i == 0 else IMAGE_END + part
        if i < len(images):
            piece += IMAGE_BEGIN
        toks = tokenize(piece) if piece else []
        if toks:
            chunks.append(list(toks))
        if i < len(images):
            chunks.append(images[i])
    return chunks


def chunk_history(chunks: Sequence[Chunk]) -> list[int]:
    """The token history the chunks leave (images as their placeholder ids)."""
    out: list[int] = []
    for c in chunks:
        out.extend(image_token_ids(c.digest, c.n_tokens) if isinstance(c, ImageEmbedding) else c)
    return out


def image_batch(state: SeqState, img: ImageEmbedding) -> StepBatch:
    """One batch holding the image's rows at the sequence's next cache rows, its IMROPE positions, logits for
    its last row."""
    n = img.n_tokens
    if state.n_past + n > state.n_ctx:
        raise ValueError(f"sequence needs {state.n_past + n} positions, its context is {state.n_ctx}")
    p0 = state.n_past + state.rope_shift
    batch = StepBatch(np.zeros(n, np.int32), np.arange(state.n_past, state.n_past + n, dtype=np.int32),
                      [Segment(0, n, state)], np.asarray([n - 1], np.int32))
    batch.rope_pos = image_token_positions(p0, img.nx, img.ny)
    batch.embeddings = np.ascontiguousarray(img.ready(), np.float32)
    return batch


def eval_image(model, state: SeqState, img: ImageEmbedding):
    """Run the image's rows through the text model; advances n_past by nx*ny and sets rope_shift so the next
    text token sits at p0 + max(nx, ny). Returns the backend's logits [1, N] of the image's last row."""
    p0 = state.n_past + state.rope_shift
    logits = model.forward(image_batch(state, img))
    state.rope_shift = p0 + image_n_pos(img.nx, img.ny) - state.n_past
    return logits


def eval_chunks(model, state: SeqState, chunks: Sequence[Chunk], n_batch: int = 512):
    """Evaluate every chunk in order on `state` (text in pieces of n_batch) -> the backend's logits [1, N] after
    the last chunk."""
    logits = None
    for c in chunks:
        if isinstance(c, ImageEmbedding):
            logits = eval_image(model, state, c)
            continue
        for s in range(0, len(c), n_batch):
            logits = model.forward(StepBatch.build([(state, list(c[s:s + n_batch]))]))
    if logits is None:
        raise ValueError("empty prompt")
    return logits


def prompt_images(chunks: Sequence[Chunk]) -> tuple[list[int], dict]:
    """A task's prompt (engine/tasks.py): the token history the chunks leave, and prompt position -> image."""
    images, pos = {}, 0
    for c in chunks:
        if isinstance(c, ImageEmbedding):
            images[pos] = c
            pos += c.n_tokens
        else:
            pos += len(c)
    return chunk_history(chunks), images
