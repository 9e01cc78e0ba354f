"""llama.cpp's plain (non-TTY) line input: a trailing '\\' flips "more lines follow", a trailing '/' always ends
the message, and -mli makes "more lines follow" the default (common/console.cpp, readline_simple)."""
from __future__ import annotations

from typing import TextIO


def read_line_simple(stream: TextIO, multiline: bool) -> tuple[str, bool]:
    """One physical line -> (text with its newline, whether another line belongs to this message).
    At end of input: ("", False)."""
    line = stream.readline()
    if not line:
        return "", False
    line = line.rstrip("\n").rstrip("\r")
    if line.endswith("/"):
        return line[:-1], False
    if line.endswith("\\"):
        line, multiline = line[:-1], not multiline
    return line + "\n", multiline


def read_message_simple(stream: TextIO, multiline: bool) -> str | None:
    """A whole message (ending newline removed); None when the input ended before anything was typed."""
    buffer, more = "", True
    while more:
        line, more = read_line_simple(stream, multiline)
        buffer += line
        if not line and not more:
            break
    if not buffer:
        return None
    return buffer[:-1] if buffer.endswith("\n") else buffer
