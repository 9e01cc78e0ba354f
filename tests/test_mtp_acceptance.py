"""compat/mtp_acceptance.py: held-out prompts, the server command for both engines, and the acceptance read from
the server's timings (a mock transport stands in for the server)."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "compat"))
sys.path.insert(1, str(ROOT))

import mtp_acceptance as ma  # noqa: E402
from training import corpus  # noqa: E402


def test_prompts_are_the_starts_of_heldout_files():
    prompts = ma.heldout_prompts(3, 400)
    starts = [t[:400] for t in corpus.corpus_texts("heldout")]
    assert len(prompts) == 3 and all(p.endswith("\n") and 200 <= len(p) <= 400 for p in prompts)
    assert all(any(s.startswith(p) for s in starts) for p in prompts)


@pytest.mark.parametrize("kind", ["llama.cpp", "llamacmp"])
def test_both_servers_get_the_same_spec_flags(kind):
    cmd = ma.server_command(kind, None, Path("m.gguf"), 8080, 2, 4096)
    i = cmd.index("--spec-type")
    assert cmd[i:i + 4] == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    assert cmd[0].endswith("llama-server" if kind == "llama.cpp" else "llamacmp-server")


def fake_server(timings: dict):
    def handle(request: httpx.Request) -> httpx.Response:
        body = __import__("json").loads(request.content)
        assert body["temperature"] == 0 and body["cache_prompt"] is False
        return httpx.Response(200, json={"content": "x = 1", "timings": timings})
    return httpx.Client(transport=httpx.MockTransport(handle))


def test_acceptance_comes_from_the_timings():
    t = {"prompt_n": 10, "predicted_n": 32, "predicted_per_second": 50.0, "draft_n": 30, "draft_n_accepted": 21}
    rows = ma.measure(fake_server(t), "http://x", ["a", "b"], 32)
    assert [r["acceptance"] for r in rows] == [0.7, 0.7]
    assert "| all | | 64 | 60 | 42 | 0.700 | |" in ma.report(rows)


def test_a_server_that_drafted_nothing_is_an_error():
    with pytest.raises(SystemExit, match="draft_n"):
        ma.measure(fake_server({"prompt_n": 1, "predicted_n": 4, "predicted_per_second": 1.0}), "http://x", ["a"], 4)
