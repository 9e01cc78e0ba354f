"""llamacmp-cli with a vision projector, as a subprocess on the tiny random-weight fixtures (numpy backend):
--image with -p, the errors for a missing / mismatched projector and for a file that is not an image, and the
mmproj loader's own checks. The expected reply comes from driving the same engine in-process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

from llamacmp.backends.base import StepBatch  # noqa: E402
from llamacmp.backends.numpy_ref import NumpyBackend  # noqa: E402
from llamacmp.chat import ChatTemplate  # noqa: E402
from llamacmp.fixtures.mmproj_writer import VISION_SHAPES, write_mmproj, write_text_model  # noqa: E402
from llamacmp.loader import load_model  # noqa: E402
from llamacmp.vision.config import MmprojError, load_mmproj  # noqa: E402
from llamacmp.vision.projector import VisionProjector  # noqa: E402
from llamacmp.vision.prompt import MEDIA_MARKER, eval_chunks, split_prompt  # noqa: E402

IMAGE = Path(__file__).parent.parent / "compat" / "goldens" / "vision" / "wide.png"
REPO = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision-cli")
    text = write_text_model(d / "text.gguf", "tiny", "f32", 3)
    mm = write_mmproj(d / "mmproj.gguf", VISION_SHAPES["tiny"], "f32", 3)
    wrong = write_mmproj(d / "mmproj-wide.gguf", VISION_SHAPES["small"], "f32", 3)     # outputs 256 wide
    bad = d / "not-an-image.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    return {"text": str(text), "mm": str(mm), "wrong": str(wrong), "bad": str(bad), "dir": d}


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "llamacmp.cli.chat", *args], capture_output=True, timeout=180,
                          env=env, cwd=REPO)


def expected_reply(files, question: str, n: int) -> str:
    """The greedy reply the engine gives in-process for the rendered chat with the image."""
    be = NumpyBackend()
    lm = load_model(files["text"], be)
    proj = VisionProjector(files["mm"], lm)
    emb = proj.encode_bytes(IMAGE.read_bytes())
    tmpl = ChatTemplate.from_metadata(lm.metadata, lm.tokenizer.tokens)
    prompt = tmpl.render([{"role": "user", "content": MEDIA_MARKER + question}], True, enable_thinking=False)
    chunks = split_prompt(prompt, [emb], lambda s: lm.tokenizer.encode(s, parse_special=True))
    state = be.new_state(lm.cfg, 512, "f16")
    tok = int(np.argmax(be.to_host(eval_chunks(lm.model, state, chunks))[-1]))
    out = []
    for _ in range(n):
        out.append(tok)
        tok = int(np.argmax(be.to_host(lm.model.forward(StepBatch.build([(state, [tok])])))[-1]))
    return lm.tokenizer.decode(out)


def test_cli_image_reply_matches_engine(files):
    r = cli("-m", files["text"], "-mm", files["mm"], "--image", str(IMAGE), "-p", "What is in this picture?",
            "-n", "8", "--temp", "0", "-st", "-dev", "none", "--reasoning", "off", "--ignore-eos")
    out = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 0, r.stderr.decode()
    assert "modalities : text, vision" in out and f"Loaded media from '{IMAGE}'" in out
    want = expected_reply(files, "What is in this picture?", 8)
    assert want and want.encode("utf-8", "replace").decode("utf-8", "replace") in out


def test_cli_image_errors(files):
    r = cli("-m", files["text"], "-mm", files["wrong"], "-p", "hi", "-n", "1", "-st", "-dev", "none")
    assert r.returncode == 1 and b"hidden size is 64" in r.stderr
    r = cli("-m", files["text"], "-mm", files["mm"], "--image", files["bad"], "-p", "hi", "-n", "1", "-st",
            "-dev", "none")
    assert b"failed to load image" in r.stderr and b"not a recognised image" in r.stderr
    r = cli("-m", files["text"], "--image", str(IMAGE), "-p", "hi", "-n", "1", "-st", "-dev", "none")
    assert b"needs a multimodal projector" in r.stderr
    r = cli("-m", files["text"], "-mm", files["mm"], "--no-mmproj", "--image", str(IMAGE), "-p", "hi", "-n", "1",
            "-st", "-dev", "none")
    assert b"needs a multimodal projector" in r.stderr


def test_loader_errors(files, tmp_path):
    with pytest.raises(MmprojError, match="not found"):
        load_mmproj(tmp_path / "nope.gguf")
    with pytest.raises(MmprojError, match="not an mmproj file"):
        load_mmproj(files["text"])
    other = write_mmproj(tmp_path / "other.gguf", VISION_SHAPES["tiny"], "f32", 1, projector="gemma3")
    with pytest.raises(MmprojError, match="projector type 'gemma3' is not supported"):
        load_mmproj(other)
    with pytest.raises(MmprojError, match="another model"):
        load_mmproj(files["wrong"], 64)
