"""The 'Loading model... ' progress line (llamacmp/progress.py): a spinner on a terminal, a plain line elsewhere,
on stderr for llamacmp-completion / -cli (and the server: tests/test_server_log.py); --log-disable hides it."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time

import pytest

from llamacmp import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_line_when_not_a_terminal():
    err = io.StringIO()
    with progress.loading(err):
        assert err.getvalue() == "Loading model... "      # shown before the work, not after
    assert re.fullmatch(r"Loading model\.\.\. done \(\d+\.\d s\)\n", err.getvalue())


def test_spinner_on_a_terminal(monkeypatch):
    monkeypatch.setattr(progress, "FRAME_S", 0.01)
    err = Terminal()
    with progress.loading(err):
        time.sleep(0.1)
    out = err.getvalue()
    assert out.startswith("Loading model... |") and "\b/" in out and "\b-" in out
    assert re.search(r"\bdone \(\d+\.\d s\)\n$", out)


def test_failure_and_disabled():
    err = io.StringIO()
    with pytest.raises(ValueError), progress.loading(err):
        raise ValueError("bad file")
    assert err.getvalue() == "Loading model... failed\n"
    quiet = io.StringIO()
    with progress.loading(quiet, enabled=False):
        pass
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("tool", ["completion", "chat"])
def test_tools_show_it_unless_log_disable(fixture_gguf, tool):
    model = fixture_gguf("tiny", "f32")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, "-m", f"llamacmp.cli.{tool}", "-m", str(model), "-p", "Hi", "-n", "1", "--temp", "0"]
    args += ["-no-cnv"] if tool == "completion" else ["-st"]
    shown = subprocess.run(args, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"Loading model\.\.\. done \(\d+\.\d s\)\n", shown.stderr)
    assert "Loading model" not in shown.stdout
    hidden = subprocess.run(args + ["--log-disable"], env=env, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=120)
    assert hidden.returncode == 0 and "Loading model" not in hidden.stderr
