"""--log-file, --log-timestamps, --log-prefix, --log-colors (llamacmp/log.py) as llama.cpp's common/log.cpp."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from llamacmp.args import parse_args
from llamacmp.log import LogStream, setup

ROOT = Path(__file__).resolve().parents[1]


def test_prefix_timestamps_and_colors():
    out = io.StringIO()
    s = LogStream(out, None, timestamps=True, prefix=True, colors=True)
    s.write("load: model ok\nerror: bad")
    s.write(" thing\nwarning: careful\n")
    lines = out.getvalue().split("\n")
    plain = [re.sub(r"\x1b\[\d+m", "", line) for line in lines]
    assert re.fullmatch(r"0\.00\.\d{3}\.\d{3} I load: model ok", lines[0])     # info lines: no colour
    assert re.fullmatch(r"0\.00\.\d{3}\.\d{3} E error: bad thing", plain[1]) and lines[1].startswith("\033[31m")
    assert re.fullmatch(r"0\.00\.\d{3}\.\d{3} W warning: careful", plain[2]) and lines[2].startswith("\033[33m")


def test_no_switch_leaves_stderr_alone():
    p = parse_args("server", [], {}).params
    stream = io.StringIO()
    assert setup(p, stream) is stream


def test_log_file_is_created_and_gets_every_line(tmp_path):
    log = tmp_path / "sub.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = ("import sys; from llamacmp.args import parse_or_exit; parse_or_exit('completion'); "
            "sys.stderr.write('hello from the tool\\n')")
    r = subprocess.run([sys.executable, "-c", code, "--log-file", str(log), "--log-prefix", "-t", "4"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = log.read_text()
    assert "I hello from the tool" in text and "-t changes nothing here" in text
    assert "I hello from the tool" in r.stderr
