"""Our numpy vision path against llama.cpp's mtmd goldens (compat/gen_vision_goldens.py): the same fixtures
(same writers and seeds), the same images; image embeddings within 1e-3 (max abs difference relative to the
largest golden value), the prompt split into the same chunks and tokens, the same position after the prompt, and
the same 32 greedy tokens."""
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

from llamacmp.backends.base import StepBatch  # noqa: E402
from llamacmp.backends.numpy_ref import NumpyBackend  # noqa: E402
from llamacmp.loader import load_model  # noqa: E402
from llamacmp.vision.config import load_mmproj  # noqa: E402
from llamacmp.vision.encoder import ImageEmbedding, VisionEncoder  # noqa: E402
from llamacmp.vision.preprocess import decode_image, prepare  # noqa: E402
from llamacmp.vision.prompt import eval_chunks, split_prompt  # noqa: E402

GOLDENS = Path(__file__).parent.parent / "compat" / "goldens" / "vision"
CASES = sorted(p.stem for p in GOLDENS.glob("*.json"))
EMBD_REL_TOL = 1e-3


def _fixtures(case: dict, folder: Path):
    from llamacmp.fixtures.mmproj_writer import VISION_SHAPES, write_mmproj, write_text_model
    mm = folder / f"mmproj-{case['dtype']}-{case['seed']}.gguf"
    text = folder / f"text-{case['seed']}.gguf"
    if not mm.exists():
        write_mmproj(mm, VISION_SHAPES["tiny"], case["dtype"], case["seed"])
    if not text.exists():
        write_text_model(text, "tiny", "f32", case["seed"])
    return text, mm


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("vision-fixtures")


def test_goldens_present():
    assert len(CASES) >= 3, "compat/goldens/vision is missing: run compat/gen_vision_goldens.py"


@pytest.mark.parametrize("name", CASES)
def test_matches_llamacpp(name, fixture_dir):
    case = json.loads((GOLDENS / f"{name}.json").read_text())
    text_path, mm_path = _fixtures(case, fixture_dir)
    be = NumpyBackend()
    lm = load_model(text_path, be)
    cfg, weights = load_mmproj(mm_path, lm.cfg.n_embd)
    img = decode_image((GOLDENS / f"{case['image']}.png").read_bytes())
    emb = VisionEncoder(cfg, weights, be).encode(prepare(img, cfg))

    gold_img = next(c["image"] for c in case["chunks"] if "image" in c)
    assert (emb.nx, emb.ny) == (gold_img["nx"], gold_img["ny"])
    ref = np.load(GOLDENS / f"{name}.embd.npy")
    rel = np.abs(emb.embeddings - ref).max() / np.abs(ref).max()
    assert rel <= EMBD_REL_TOL, f"embeddings differ by {rel:.2e} (relative to max |ref|)"

    chunks = split_prompt(case["prompt"], [emb], lambda s: lm.tokenizer.encode(s, parse_special=True))
    ours = [{"text": c} if not isinstance(c, ImageEmbedding) else "image" for c in chunks]
    assert ours == [c if "text" in c else "image" for c in case["chunks"]]

    state = be.new_state(lm.cfg, 256, "f32")
    logits = be.to_host(eval_chunks(lm.model, state, chunks))[-1]
    assert state.n_past + state.rope_shift == case["n_past"]
    assert int(np.argmax(logits)) == case["top_ids"][0]
    greedy, tok = [], int(np.argmax(logits))
    for _ in range(len(case["greedy"])):
        greedy.append(tok)
        tok = int(np.argmax(be.to_host(lm.model.forward(StepBatch.build([(state, [tok])])))[-1]))
    assert greedy == case["greedy"]
