"""Bad command lines and hostile standard streams: a clean error on stderr (no traceback) and the right exit
status, for every tool (issue 22: 15 of 106 cases gave tracebacks, three were accepted that should not be)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from server_harness import write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


PY = f"exec {sys.executable} -m"
C = f"{PY} llamacmp.cli.completion -m $M -no-cnv"

# (id, shell command: $M is the model, status, a piece of stderr)
CASES = [
    ("stdin closed", f"{C} -p hi -n 2 <&-", 0, ""),
    ("stdout closed", f"{C} -p hi -n 2 >&-", 1, "error: standard output is closed"),
    ("stdout /dev/full", f"{C} -p hi -n 2 > /dev/full", 1, "error: No space left on device"),
    ("perplexity -c 0", f"{PY} llamacmp.cli.perplexity -m $M -c 0 -f $T", 0, "with a context of 262144"),
    ("-c 1000000000 on numpy", f"{C} -p hi -n 2 -c 1000000000", 1, "lower -c"),
    ("--port 99999", f"{PY} llamacmp.server.app -m $M --port 99999", 1, "port must be 0-65535, got 99999"),
    ("raising --chat-template", f"{PY} llamacmp.cli.completion -m $M -p hi -n 2 -cnv --jinja "
     "--chat-template \"{{ raise_exception('boom') }}\" < /dev/null", 1, "error: the supplied chat template is not supported"),
    ("-f /dev/zero", f"{C} -f /dev/zero -n 2", 1, "'/dev/zero' gives more than 64 MiB"),
    ("server -c -5", f"{PY} llamacmp.server.app -m $M -c -5", 1, "must be >= 0, got -5"),
    ("-n 99999999999999999999", f"{C} -p hi -n 99999999999999999999", 1, "stoi: out of range"),
    ("-s 4294967295 is a seed", f"{C} -p hi -n 1 -s 4294967295", 0, ""),
    ("-s 4294967296", f"{C} -p hi -n 1 -s 4294967296", 1, "stoul: out of range"),
    ("--image missing.png", f"{PY} llamacmp.cli.chat -m $M --image missing.png -p hi -st -n 2", 1,
     "error: cannot use --image 'missing.png'"),
    ("template renders nothing (cli)", f"{PY} llamacmp.cli.chat -m $M --jinja --chat-template '{{# x #}}' -p hi -st "
     "-n 2", 1, "error: input is empty"),
    ("template renders nothing (completion)", f"{PY} llamacmp.cli.completion -m $M --jinja --chat-template "
     "'{# x #}' -p hi -n 2 -cnv < /dev/null", 1, "error: input is empty"),
    ("-m missing", f"{C} -m /nonexistent.gguf -p hi", 1, "error"),
]


@pytest.mark.parametrize("name,cmd,status,piece", CASES, ids=[c[0] for c in CASES])
def test_bad_input(model, name, cmd, status, piece):
    # 4 GB of address space at most: a regression (reading /dev/zero whole) fails here, not the machine
    text = model.parent / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    r = subprocess.run(["bash", "-c", f"ulimit -v 4000000; {cmd}"], env={**_env(), "M": str(model), "T": str(text)},
                       capture_output=True, text=True, errors="replace", timeout=120,
                       stdin=subprocess.DEVNULL)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == status, (r.returncode, r.stderr[-1000:])
    assert piece in r.stderr, r.stderr[-1000:]


def test_ctrl_c_while_importing_exits_130_quietly(model, tmp_path):
    """A console script (argv[0] llamacmp-*) interrupted before its main() runs."""
    script = tmp_path / "llamacmp-completion"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom llamacmp.cli.completion import main\nsys.exit(main())\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), "-m", str(model), "-p", "hi", "-no-cnv"], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.15)                             # numpy & co are still importing
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err[-2000:])
