"""llama.cpp's log switches for every tool: --log-file (a copy of everything written to stderr), --log-timestamps,
--log-prefix, --log-colors, --log-disable. stderr is wrapped once at startup, so the tools keep writing plain lines.

A line's level comes from its first word as llama.cpp's tools write them ("error:" E, "warn"/"warning:" W, else I).
"""
from __future__ import annotations

import io
import logging
import sys
import time
from typing import TextIO

from .params import Params

COLORS = {"E": "\033[31m", "W": "\033[33m"}       # llama.cpp's log.cpp: errors red, warnings yellow
RESET = "\033[0m"


def _level(line: str) -> str:
    head = line.lstrip().lower()
    if head.startswith(("error", "e ")):
        return "E"
    if head.startswith(("warn", "w ")):
        return "W"
    return "I"


class LogStream(io.TextIOBase):
    """A text stream that puts llama.cpp's line heads (timestamp, level letter, colour) on stderr's lines and copies
    them, without colour, to the log file."""

    def __init__(self, out: TextIO | None, file: TextIO | None, timestamps: bool, prefix: bool, colors: bool):
        self.out, self.file = out, file
        self.timestamps, self.prefix, self.colors = timestamps, prefix, colors
        self.t0 = time.monotonic()
        self.at_line_start, self.level = True, "I"

    def _head(self, level: str) -> str:
        head = ""
        if self.timestamps:                # llama.cpp: minutes.seconds.milliseconds.microseconds since start
            us = int((time.monotonic() - self.t0) * 1e6)
            head += f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d} "
        if self.prefix:
            head += f"{level} "
        return head

    def write(self, text: str) -> int:
        """Passes text through at once (no line buffering: prompts and progress dots show as written); a line's
        head goes in front of its first character."""
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                self.level = _level(piece)
                self._put(self._head(self.level), COLORS.get(self.level))
            body = piece[:-1] if piece.endswith("\n") else piece
            self._put(body, COLORS.get(self.level))
            self.at_line_start = piece.endswith("\n")
            if self.at_line_start:
                self._put("\n", None)
        return len(text)

    def _put(self, text: str, color: str | None) -> None:
        if not text:
            return
        if self.out is not None:
            self.out.write(f"{color}{text}{RESET}" if color and self.colors else text)
        if self.file is not None:
            self.file.write(text)

    def flush(self) -> None:
        for f in (self.out, self.file):
            if f is not None:
                f.flush()

    def isatty(self) -> bool:
        return bool(self.out is not None and self.out.isatty())


def setup(p: Params, stream: TextIO | None = None) -> TextIO:
    """Installs the log stream as sys.stderr when any switch asks for it; returns the stream now in use."""
    stream = stream or sys.stderr
    colors = p.log_colors == "on" or (p.log_colors == "auto" and stream.isatty())
    if p.log_disable:                      # the tools' own quiet paths read p.log_disable; logging goes silent too
        logging.disable(logging.CRITICAL)
    if not (p.log_file or p.log_timestamps or p.log_prefix or colors):
        return stream
    try:
        file = open(p.log_file, "w", encoding="utf-8") if p.log_file else None
    except OSError as e:
        raise SystemExit(f"error: --log-file {p.log_file}: {e.strerror}") from None
    wrapped = LogStream(stream, file, p.log_timestamps, p.log_prefix, colors)
    sys.stderr = wrapped
    return wrapped


def python_level(verbosity: int) -> int:
    """-lv N / -v as a logging level: llama.cpp shows a message when its level (DEBUG 4, INFO 3, WARN 2,
    ERROR 1) is at most the threshold (default 3; -v: all)."""
    if verbosity >= 4:
        return logging.DEBUG
    return {3: logging.INFO, 2: logging.WARNING, 1: logging.ERROR}.get(verbosity, logging.CRITICAL)


def setup_python_logging(p: Params) -> None:
    """llamacmp's loggers write bare lines (they carry llama.cpp's own heads, 'srv  ...', 'slot ...') to the
    stderr in use now (the LogStream when a switch asked for one), at the level -lv / -v ask for."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("llamacmp")
    root.handlers[:] = [handler]
    root.setLevel(python_level(p.verbosity))
    root.propagate = False


class LineLogger(io.TextIOBase):
    """A text stream for code that writes its report lines to a file object (memplan, the layer split): each
    complete line goes to `logger` at INFO."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.pending = logger, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.logger.info("%s", line)
        return len(text)
