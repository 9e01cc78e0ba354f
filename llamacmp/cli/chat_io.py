"""Terminal I/O for llamacmp-cli: a prompt_toolkit + rich console on a TTY, plain text everywhere else.

Both classes offer the same few calls, so the chat loop never asks which one it has. The plain one writes no
control codes at all (scripts, pipes, --simple-io) and reads stdin line by line with llama.cpp's '\\' and '/'
line rules.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

from .lineinput import read_message_simple


def default_history_path() -> Path:
    """$LLAMACMP_HISTORY_FILE if set, else ~/.cache/llamacmp/cli_history."""
    env = os.environ.get("LLAMACMP_HISTORY_FILE")
    return Path(env) if env else Path.home() / ".cache" / "llamacmp" / "cli_history"


class PlainIO:
    def __init__(self, multiline: bool, out: TextIO | None = None, inp: TextIO | None = None):
        self.multiline = multiline
        self.out = out or sys.stdout
        self.inp = inp or sys.stdin

    def read_message(self) -> str | None:
        """The next user message; None at end of input (or Ctrl-D)."""
        self.write("\n> ")
        return read_message_simple(self.inp, self.multiline)

    def write(self, text: str, style: str = "") -> None:
        self.out.write(text)
        self.out.flush()

    def error(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()


class RichIO:
    """prompt_toolkit for input (history file, -mli multiline where Alt-Enter / Esc-Enter submits), rich for output."""

    STYLES = {"reasoning": "dim", "info": "dim", "prompt": "", "error": "bold red"}

    def __init__(self, multiline: bool, history_path: Path | None = None):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from rich.console import Console
        path = history_path or default_history_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            history = FileHistory(str(path))
        except OSError:
            history = InMemoryHistory()          # a read-only home must not stop the chat
        self.session = PromptSession(history=history, multiline=multiline)
        self.console = Console(highlight=False, soft_wrap=True)
        self.err_console = Console(stderr=True, highlight=False)

    def read_message(self) -> str | None:
        self.write("\n")
        try:
            text = self.session.prompt("> ")
        except EOFError:
            return None
        return text

    def write(self, text: str, style: str = "") -> None:
        self.console.print(text, end="", style=self.STYLES.get(style, ""), markup=False)

    def error(self, text: str) -> None:
        self.err_console.print(text, end="", style=self.STYLES["error"], markup=False)


def make_io(simple_io: bool, multiline: bool):
    """Rich only when both ends are terminals and --simple-io was not given."""
    if simple_io or not (sys.stdin.isatty() and sys.stdout.isatty()):
        return PlainIO(multiline)
    return RichIO(multiline)
