"""vision/prompt.py and positions.py on their own: chunking around media markers, the placeholder ids that carry
an image's identity into caches, the M-RoPE position counting, and the CLI slot's prefix reuse across turns."""
import numpy as np
import pytest

from llamacmp.vision.encoder import ImageEmbedding
from llamacmp.vision.positions import encoder_positions, image_token_positions, merge_order
from llamacmp.vision.prompt import (IMAGE_BEGIN, IMAGE_END, MEDIA_MARKER, chunk_history, image_token_ids,
                                    split_prompt)


def emb(digest: str, nx: int = 3, ny: int = 2) -> ImageEmbedding:
    return ImageEmbedding(np.zeros((nx * ny, 4), np.float32), nx, ny, digest)


def test_split_prompt_wraps_images_like_mtmd():
    seen = []

    def tok(s):
        seen.append(s)
        return [len(s)]
    chunks = split_prompt(f"a{MEDIA_MARKER}b{MEDIA_MARKER}", [emb("x"), emb("y")], tok)
    assert seen == ["a" + IMAGE_BEGIN, IMAGE_END + "b" + IMAGE_BEGIN, IMAGE_END]
    assert [type(c).__name__ for c in chunks] == ["list", "ImageEmbedding", "list", "ImageEmbedding", "list"]
    with pytest.raises(ValueError, match="1 image markers"):
        split_prompt(f"a{MEDIA_MARKER}", [], tok)


def test_placeholders_name_the_image():
    a, b = image_token_ids("aa", 6), image_token_ids("bb", 6)
    assert a == image_token_ids("aa", 6) and a != b and all(t < 0 for t in a + b)
    h1 = chunk_history([[1, 2], emb("aa"), [3]])
    h2 = chunk_history([[1, 2], emb("bb"), [3]])
    assert h1[:2] == h2[:2] and h1[2] != h2[2] and len(h1) == 2 + 6 + 1


def test_positions():
    # merged tokens are 4 consecutive patches: (0,0) (0,1) (1,0) (1,1) of each 2x2 block, blocks in raster order
    assert merge_order(2, 4).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    assert encoder_positions(2, 4)[:, :2].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2],
                                                       [1, 3]]
    p = image_token_positions(10, 3, 2)
    assert p.tolist() == [[10, 10, 10, 0], [10, 10, 11, 0], [10, 10, 12, 0], [10, 11, 10, 0], [10, 11, 11, 0],
                          [10, 11, 12, 0]]


def test_cli_client_reuses_the_prefix_across_turns(tmp_path):
    """llama-cli with an image: each turn is one task over the whole conversation (prompt_images: placeholder ids
    and their positions); the second turn resumes after the image and the first turn's tokens and draws what a
    fresh slot draws."""
    pytest.importorskip("PIL")
    from pathlib import Path

    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.engine.client import SlotClient
    from llamacmp.engine.tasks import GenParams
    from llamacmp.fixtures.mmproj_writer import VISION_SHAPES, write_mmproj, write_text_model
    from llamacmp.loader import load_model
    from llamacmp.run_plan import RunPlan
    from llamacmp.sampling import SamplingParams
    from llamacmp.vision.projector import VisionProjector
    from llamacmp.vision.prompt import prompt_images
    be = NumpyBackend()
    lm = load_model(write_text_model(tmp_path / "t.gguf", "tiny", "f32", 4), be)
    proj = VisionProjector(str(write_mmproj(tmp_path / "m.gguf", VISION_SHAPES["tiny"], "f32", 4)), lm)
    img = proj.encode_bytes((Path(__file__).parent.parent / "compat/goldens/vision/wide.png").read_bytes())
    tok = lambda s: lm.tokenizer.encode(s, parse_special=True)          # noqa: E731
    turn1 = split_prompt(f"user: {MEDIA_MARKER} what is it?", [img], tok)
    turn2 = split_prompt(f"user: {MEDIA_MARKER} what is it? assistant: a fox. user: sure?", [img], tok)
    plan, greedy = RunPlan(256, 1, "f32", "f32", 2048, 512), GenParams(SamplingParams(temp=0, ignore_eos=True), 3)

    def turn(client, chunks):
        client.history, images = prompt_images(chunks)
        assert list(images) == [len(chunks[0])] and client.history == chunk_history(chunks)
        return client.generate(greedy, images=images).tokens
    c = SlotClient(lm, plan)
    turn(c, turn1)
    n1 = c.perf.n_p_eval
    assert c.engine.slots[0].state.rope_shift == max(img.nx, img.ny) - img.n_tokens
    got = turn(c, turn2)
    assert c.perf.n_p_eval - n1 == len(chunk_history(turn2)) - len(chunk_history(turn1))   # only the new text
    assert got == turn(SlotClient(lm, plan), turn2) and len(got) == 3
