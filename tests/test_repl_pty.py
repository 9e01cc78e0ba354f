"""llamacmp-cli's interactive REPL (prompt_toolkit + rich) driven through a pseudo-terminal with pexpect:
history file, Ctrl-C during generation, /regen, /clear, /exit, Ctrl-D, multiline input."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

# the [test] extra (pyproject.toml) has pexpect and CI installs it, so this module runs in CI; a machine without
# it (the GPU box) skips this module rather than failing the whole session's collection
pexpect = pytest.importorskip("pexpect", reason="pexpect is not installed (pip install -e '.[test]')")

TIMEOUT = 120
PROMPT = r"\x1b\[0m>"                 # prompt_toolkit draws '>' then moves the cursor instead of a space
TIMINGS = r"\[ Prompt: [\d.]+ t/s \| Generation: [\d.]+ t/s \]"
# rich styles each line of the (dim) verbose prompt separately, so a newline comes wrapped in SGR codes
NL = r"(?:\x1b\[[0-9;]*m)*\r\n(?:\x1b\[[0-9;]*m)*"


@pytest.fixture(scope="module")
def model(fixture_gguf):
    return str(fixture_gguf("tiny", "f32"))


def spawn(model: str, *args: str, history) -> pexpect.spawn:
    exe = shutil.which("llamacmp-cli")
    cmd, argv = (exe, []) if exe else (sys.executable, ["-m", "llamacmp.cli.chat"])
    # no CPR: pexpect's terminal never answers cursor-position requests, and prompt_toolkit would wait for one
    env = {**os.environ, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1", "LLAMACMP_HISTORY_FILE": str(history)}
    child = pexpect.spawn(cmd, argv + ["-m", model, "--temp", "0", *args], env=env, encoding="utf-8",
                          timeout=TIMEOUT, dimensions=(50, 250))
    child.expect("add a text file")
    child.expect(PROMPT)
    return child


def send_and_wait_reply(child: pexpect.spawn, text: str) -> None:
    child.sendline(text)
    child.expect(TIMINGS)
    child.expect(PROMPT)


def finish(child: pexpect.spawn, submit: str = "\r") -> None:
    child.send("/exit" + submit)
    child.expect("Exiting...")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_interrupts_generation_and_keeps_the_session(model, tmp_path):
    child = spawn(model, "-n", "-1", "--ignore-eos", history=tmp_path / "h")
    child.sendline("tell me everything")
    child.expect(r"\[Start thinking\]")
    child.expect(r"\S")                     # tokens are streaming
    child.sendintr()
    child.expect(TIMINGS)                  # the reply ends with its timings line, no exit
    child.expect(PROMPT)
    child.sendline("second question")      # the session still answers
    child.expect(r"\[Start thinking\]")
    child.sendintr()
    child.expect(TIMINGS)
    child.expect(PROMPT)
    finish(child)


def test_history_file_is_written_and_recalled(model, tmp_path):
    history = tmp_path / "history"
    child = spawn(model, "-n", "2", history=history)
    send_and_wait_reply(child, "remember this line")
    child.sendeof()                         # leave with Ctrl-D so that the message is the newest entry
    child.expect(pexpect.EOF)
    assert "remember this line" in history.read_text()
    child = spawn(model, "-n", "2", "--verbose-prompt", history=history)
    child.send("\x1b[A")                    # Up: the previous session's line comes back
    child.expect("remember this line")
    child.send("\r")
    child.expect(r"<\|im_start\|>user" + NL + r"remember this line<\|im_end\|>")
    child.expect(TIMINGS)
    child.expect(PROMPT)
    finish(child)


def test_regen_clear_and_exit(model, tmp_path):
    child = spawn(model, "-n", "3", "--verbose-prompt", history=tmp_path / "h")
    send_and_wait_reply(child, "first")
    child.sendline("/regen")
    # the regenerated prompt ends with the same user turn, not with a second copy of it
    child.expect(r"user" + NL + r"first<\|im_end\|>" + NL + r"<\|im_start\|>assistant")
    child.expect(TIMINGS)
    child.expect(PROMPT)
    child.sendline("/clear")
    child.expect("Chat history cleared.")
    child.expect(PROMPT)
    child.sendline("/regen")
    child.expect("No message to regenerate.")
    child.expect(PROMPT)
    send_and_wait_reply(child, "after clear")
    assert "first" not in child.before
    finish(child)


def test_multiline_input_with_mli(model, tmp_path):
    child = spawn(model, "-n", "2", "-mli", "--verbose-prompt", history=tmp_path / "h")
    child.send("line one\r")               # Enter adds a line in -mli mode
    child.send("line two")
    child.send("\x1b\r")                   # Esc-Enter submits
    child.expect(r"user" + NL + "line one" + NL + r"line two<\|im_end\|>")
    child.expect(TIMINGS)
    child.expect(PROMPT)
    finish(child, submit="\x1b\r")


def test_ctrl_d_exits(model, tmp_path):
    child = spawn(model, "-n", "2", history=tmp_path / "h")
    child.sendeof()
    child.expect("Exiting...")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_output_is_styled_on_a_terminal(model, tmp_path):
    child = spawn(model, "-n", "3", history=tmp_path / "h")
    child.sendline("hi")
    child.expect(r"\x1b\[2m\[Start thinking\]")    # reasoning shown dim
    child.expect(TIMINGS)
    child.expect(PROMPT)
    finish(child)
