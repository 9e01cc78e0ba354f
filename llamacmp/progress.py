"""The 'Loading model... ' line the tools show while a model and its tokenizer load (llama-cli's words): on a
terminal followed by llama.cpp's spinner (| / - \\, one frame every 100 ms), elsewhere a plain line; both end with
how long it took. Written to stderr, so stdout stays the model's output."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import TextIO

FRAMES = "|/-\\"
FRAME_S = 0.1


@contextmanager
def loading(err: TextIO, enabled: bool = True, what: str = "Loading model"):
    if not enabled:
        yield
        return
    t0 = time.perf_counter()
    err.write(f"{what}... ")
    err.flush()
    stop = threading.Event()
    spinner = None
    if err.isatty():
        # frames go to the terminal itself, not to a --log-file copy (log.LogStream keeps the terminal as .out)
        tty = getattr(err, "out", None) or err

        def spin() -> None:
            i = 0
            tty.write(FRAMES[0])
            tty.flush()
            while not stop.wait(FRAME_S):
                i = (i + 1) % len(FRAMES)
                tty.write("\b" + FRAMES[i])
                tty.flush()
            tty.write("\b")
        spinner = threading.Thread(target=spin, name="llamacmp-spinner", daemon=True)
        spinner.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        if spinner is not None:
            spinner.join()
        err.write(f"done ({time.perf_counter() - t0:.1f} s)\n" if ok else "failed\n")
        err.flush()
