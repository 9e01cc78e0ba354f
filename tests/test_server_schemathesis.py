"""schemathesis against the server's own OpenAPI document: no generated request may get a 5xx answer.

Two servers: the plain one (every route), and one with a vision projector, --slots, --slot-save-path and
--media-path, so that generated image parts, slot actions (save / restore / erase of generated file names) and
template inputs (tool calls, tools, chat_template_kwargs) reach their real code paths (issue 22)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from server_harness import LiveServer, write_tiny_model

pytestmark = pytest.mark.slow


def _schemathesis(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["schemathesis", "run", url + "/openapi.json", "--checks", "not_a_server_error",
                           "--max-examples", "10", "--request-timeout", "30", "--seed", "1", *extra],
                          capture_output=True, text=True, timeout=900)


def _check(run: subprocess.CompletedProcess) -> None:
    tail = run.stdout[-4000:]
    assert run.returncode == 0, tail
    assert "Server error" not in run.stdout, tail


@pytest.mark.skipif(shutil.which("schemathesis") is None, reason="schemathesis is not installed")
def test_no_server_errors(tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf")
    # -c 512 bounds every generation (the numpy backend is slow); --props/--metrics make those routes real
    with LiveServer(model, "-c", "512", "-np", "2", "-n", "8", "--metrics", "--props") as s:
        _check(_schemathesis(s.url))


@pytest.mark.skipif(shutil.which("schemathesis") is None, reason="schemathesis is not installed")
def test_no_server_errors_on_slot_vision_and_template_paths(tmp_path):
    from llamacmp.fixtures.mmproj_writer import VISION_SHAPES, write_mmproj, write_text_model
    media, slots = tmp_path / "media", tmp_path / "slots"
    media.mkdir()
    slots.mkdir()
    (media / "a.png").write_bytes(b"not really a png")
    text = write_text_model(tmp_path / "text.gguf", "tiny", "f32", 5)
    mm = write_mmproj(tmp_path / "mmproj.gguf", VISION_SHAPES["tiny"], "f32", 5)
    with LiveServer(text, "-mm", str(mm), "-c", "512", "-np", "2", "-n", "8", "--slots", "--slot-save-path",
                    str(slots), "--media-path", str(media), "--jinja") as s:
        run = _schemathesis(s.url, "--include-path-regex", "^/(slots|v1/chat/completions|apply-template|"
                                                           "v1/messages|v1/responses)")
    _check(run)
