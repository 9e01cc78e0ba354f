"""schemathesis against the server's own OpenAPI document: no generated request may get a 5xx answer."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from server_harness import LiveServer, write_tiny_model

pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("schemathesis") is None, reason="schemathesis is not installed")
def test_no_server_errors(tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf")
    # -c 512 bounds every generation (the numpy backend is slow); --props/--metrics make those routes real
    with LiveServer(model, "-c", "512", "-np", "2", "-n", "8", "--metrics", "--props") as s:
        run = subprocess.run(["schemathesis", "run", s.url + "/openapi.json", "--checks", "not_a_server_error",
                              "--max-examples", "10", "--request-timeout", "30", "--seed", "1"],
                             capture_output=True, text=True, timeout=600)
    tail = run.stdout[-4000:]
    assert run.returncode == 0, tail
    assert "Server error" not in run.stdout, tail
