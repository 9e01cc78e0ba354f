"""Running one command for a tool, as server-tools.cpp's run_subprocess: raw output read as it comes (handed to
on_chunk), capped at max_output (the rest drained so the child never blocks on a full pipe), a time limit that
kills it, stdin written then closed."""
from __future__ import annotations

import codecs
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import Callable

TRUNCATED = "\n[output truncated]"


@dataclass
class ExecResult:
    output: str = ""
    exit_code: int = -1
    timed_out: bool = False
    raw: bytes = b""          # the output's bytes, as read (a file's content read in an isolate)


def _kill(proc: subprocess.Popen) -> None:
    # the whole process group: `sh -c` leaves its children behind when only the shell is killed
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_process(args: list[str], max_output: int, timeout_s: float, on_chunk: Callable[[str], bool] | None = None,
                combine_stderr: bool = True, cwd: str = "", stdin_data: bytes | None = None) -> ExecResult:
    """on_chunk(text) returning False (the client left) kills the process."""
    try:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL,
                                cwd=cwd or None, start_new_session=True)
    except OSError:
        return ExecResult(output="failed to spawn process")
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        _kill(proc)
    timer = threading.Timer(timeout_s, expire)
    timer.start()
    try:
        _feed_stdin(proc, stdin_data)
        out, truncated = _drain(proc, max_output, on_chunk)
        code = proc.wait()
    finally:
        timer.cancel()
    text = out.decode("utf-8", errors="replace") + (TRUNCATED if truncated else "")
    return ExecResult(output=text, exit_code=code, timed_out=timed_out.is_set(), raw=out)


def _feed_stdin(proc: subprocess.Popen, data: bytes | None) -> None:
    # always closed: a child that reads stdin would wait forever on an open pipe
    try:
        if data:
            proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _drain(proc: subprocess.Popen, max_output: int, on_chunk) -> tuple[bytes, bool]:
    out, truncated = bytearray(), False
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")   # a chunk may end inside a character
    fd = proc.stdout.fileno()
    while True:
        buf = os.read(fd, 4096)
        if not buf:
            break
        if truncated:
            continue
        room = max_output - len(out)
        piece = buf[:room]
        out += piece
        truncated = len(buf) > room
        if on_chunk is not None and piece and not on_chunk(decoder.decode(piece)) and not truncated:
            _kill(proc)
            break
    proc.stdout.close()
    return bytes(out), truncated
