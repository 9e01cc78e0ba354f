"""A tiny Chrome DevTools Protocol client over `--remote-debugging-pipe` (standard library only).

Chromium reads commands from its fd 3 and writes replies and events to its fd 4, each a JSON object ended by a NUL
byte; no port, no websocket. One page target, attached in flat mode: commands to it carry its sessionId.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, BINARIES) if path), None)


def _above_4(fd: int) -> int:
    """The same pipe end on a descriptor above 4, so that the child's dup2 onto 3 and 4 cannot overwrite it."""
    if fd > 4:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(fd)
    return high


class CdpError(RuntimeError):
    pass


class Browser:
    """A headless Chromium with one page. Use as a context manager; `evaluate` runs JS in the page."""

    def __init__(self, binary: str):
        self.profile = tempfile.mkdtemp(prefix="llamacmp-chromium-")
        to_child, self._write = os.pipe()           # we write commands; Chromium reads them as its fd 3
        self._read, from_child = os.pipe()          # Chromium writes replies as its fd 4; we read them
        to_child, from_child = _above_4(to_child), _above_4(from_child)
        flags = ["--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage",
                 f"--user-data-dir={self.profile}", "about:blank"]

        def wire_fds():                             # in the child: put the two pipe ends on fds 3 and 4
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)
        # pass_fds: the fds kept open once preexec_fn has run (Popen closes the others after it)
        self.proc = subprocess.Popen([binary, *flags], pass_fds=(3, 4), preexec_fn=wire_fds,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._next_id = 0
        self.session = ""
        self.events: list[dict] = []

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close", session=False, timeout=5)
        except (CdpError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- the wire ----------------------------------------------------------------------------------------------

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.time() > deadline:
                raise CdpError("no reply from Chromium in time")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise CdpError(f"Chromium closed the pipe (exit status {self.proc.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, session: bool = True, timeout: float = 30) -> dict:
        """Sends one command and returns its result; events that arrive meanwhile are kept in self.events."""
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._write, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") != self._next_id:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise CdpError(f"{method}: {reply['error']}")
            return reply["result"]

    # -- what a test does with a page -----------------------------------------------------------------------------

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.call("Page.enable")
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && !!document.getElementById('send')", timeout=30)

    def evaluate(self, expression: str):
        """The value of a JS expression in the page (promises awaited); a thrown exception raises CdpError."""
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise CdpError(f"{expression!r} threw: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30, poll: float = 0.05):
        deadline = time.time() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.time() > deadline:
                raise CdpError(f"timed out waiting for {expression!r}")
            time.sleep(poll)

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the element."""
        x, y = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                             ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def type_into(self, selector: str, text: str) -> None:
        """Focus the field, select what is there, and type `text` as keyboard input (input events fire)."""
        self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); "
                      "e.select(); })()")
        self.call("Input.insertText", {"text": text})
