"""One MCP server as a child process: newline-delimited JSON-RPC over its stdin/stdout (the MCP stdio transport),
its stderr drained into the debug log.

Blocking calls, meant for worker threads (never the event loop). Every pipe is read and written polled, 50 ms at a
time, so that nothing waits on an EOF a grandchild may keep from coming (it inherits the pipes); the child runs in
a session of its own and close() kills that whole process group, grandchildren included. The child also gets
SIGKILL if this server dies without closing it (PR_SET_PDEATHSIG, Linux).
"""
from __future__ import annotations

import collections
import ctypes
import functools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from .mcp_config import McpServerConfig

log = logging.getLogger("llamacmp.server.mcp")

PROTOCOL_VERSION = "2024-11-05"         # what llama-server 0c1e570 offers in initialize
POLL_S = 0.05
MAX_LINE = 8 * 1024 * 1024              # a longer line is dropped, so that a child without newlines stays bounded
MAX_QUEUED = 65536                      # unread replies and notifications kept (oldest dropped first)
ERR_TAIL = 4096                         # bytes of the child's last stderr kept for diagnostics
CLOSE_GRACE_S = 0.3                     # after SIGTERM, before SIGKILL

StopFn = Callable[[], bool]


class StdioTransport:
    def __init__(self, cfg: McpServerConfig):
        self.cfg = cfg
        self.name = cfg.name
        self._proc: subprocess.Popen | None = None
        self._running = False
        self._rpc = threading.Lock()    # one request at a time per server: held across the wait for its reply
        self._cond = threading.Condition()
        self._lines: collections.deque[str] = collections.deque(maxlen=MAX_QUEUED)
        self._threads: list[threading.Thread] = []
        self._next_id = 1
        self._initialized = False
        self._tools: list[dict] | None = None
        self.last_error = ""
        self._err_tail = ""

    # -- process ------------------------------------------------------------------------------------------------

    def start(self) -> bool:
        env = None
        if self.cfg.env:
            env = {**os.environ, **dict(self.cfg.env)}
        try:
            self._proc = _SPAWNER.submit(subprocess.Popen, [self.cfg.command, *self.cfg.args],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=env, cwd=self.cfg.cwd or None, start_new_session=True,
                                         preexec_fn=functools.partial(_die_with_parent, os.getpid())).result()
        except (OSError, subprocess.SubprocessError) as e:
            self.last_error = f"failed to spawn '{self.cfg.command}': {e}"
            log.warning("MCP '%s': %s", self.name, self.last_error)
            return False
        for fd in (self._proc.stdin.fileno(), self._proc.stdout.fileno(), self._proc.stderr.fileno()):
            os.set_blocking(fd, False)
        self._running = True
        out, err = self._proc.stdout.fileno(), self._proc.stderr.fileno()
        self._threads = [threading.Thread(target=self._read_stdout, args=(out,), name=f"mcp-{self.name}-out",
                                          daemon=True),
                         threading.Thread(target=self._read_stderr, args=(err,), name=f"mcp-{self.name}-err",
                                          daemon=True)]
        for t in self._threads:
            t.start()
        return True

    @property
    def alive(self) -> bool:
        return self._running

    def close(self) -> None:
        """Stop the pumps, end the child's process group (SIGTERM, then SIGKILL) and reap the child. Idempotent."""
        proc, self._proc = self._proc, None
        with self._cond:
            self._running = False
            self._cond.notify_all()
        if proc is None:
            return
        _kill_group(proc)
        for t in self._threads:
            t.join(timeout=1)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass

    def diagnostics(self) -> str:
        tail = self._err_tail.strip()
        return "; ".join(s for s in (self.last_error, f"last stderr: {tail}" if tail else "") if s)

    # -- MCP ----------------------------------------------------------------------------------------------------

    def list_tools(self, should_stop: StopFn) -> list[dict]:
        """The server's tools ({name, description, inputSchema}); [] when it fails (the reason in last_error)."""
        with self._rpc:
            if not self._ensure_init(should_stop):
                return []
            if self._tools is None:
                reply = self._request("tools/list", None, should_stop)
                if "result" not in reply:
                    self.last_error = "tools/list failed: " + _error_message(reply)
                    return []
                tools = reply["result"].get("tools") if isinstance(reply["result"], dict) else None
                self._tools = [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
            return self._tools

    def call_tool(self, tool: str, arguments: dict, should_stop: StopFn) -> dict:
        """tools/call, answered in /tools' shape: {"plain_text_response": text} or {"error": message}."""
        with self._rpc:
            if not self._ensure_init(should_stop):
                return {"error": self.last_error}
            reply = self._request("tools/call", {"name": tool, "arguments": arguments}, should_stop)
        if "error" in reply:
            return {"error": _error_message(reply)}
        if "result" in reply:
            return _result_to_response(reply["result"])
        return {"error": "invalid response from MCP server"}

    def _ensure_init(self, should_stop: StopFn) -> bool:
        if self._initialized:
            return True
        reply = self._request("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                             "clientInfo": {"name": "llamacmp", "version": "1.0"}}, should_stop)
        if "result" not in reply:
            self.last_error = "initialize failed: " + _error_message(reply)
            return False
        self._write({"jsonrpc": "2.0", "method": "notifications/initialized"}, should_stop)
        self._initialized = True
        return True

    def _request(self, method: str, params: dict | None, should_stop: StopFn) -> dict:
        """Send one request and wait for the reply with its id, until the server's timeout, should_stop, or the
        child's stdout closing. Notifications and stale replies (of requests that timed out) are skipped."""
        rid = self._next_id
        self._next_id += 1
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params is not None else {})}
        deadline = time.monotonic() + self.cfg.timeout_ms / 1000
        over = lambda: should_stop() or time.monotonic() >= deadline   # noqa: E731
        if not self._write(msg, over):
            return _rpc_error("cancelled" if should_stop() else "transport closed")
        while True:
            line = self._next_line(over)
            if line is None:
                break
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue                # not JSON: skipped, as llama-server does
            if isinstance(reply, dict) and reply.get("id") == rid and ("result" in reply or "error" in reply):
                return reply
        if should_stop():
            return _rpc_error("cancelled")
        if time.monotonic() >= deadline:
            return _rpc_error("request timed out")
        return _rpc_error("transport closed")

    # -- pipes --------------------------------------------------------------------------------------------------

    def _next_line(self, over: StopFn) -> str | None:
        with self._cond:
            while not self._lines:
                if not self._running or over():
                    return None
                self._cond.wait(POLL_S)
            return self._lines.popleft()

    def _write(self, msg: dict, over: StopFn) -> bool:
        proc = self._proc
        if proc is None or not self._running:
            return False
        data = (json.dumps(msg, ensure_ascii=False) + "\n").encode()
        fd = proc.stdin.fileno()
        while data:
            if not self._running or over():
                return False
            try:
                n = os.write(fd, data)
            except BlockingIOError:
                select.select([], [fd], [], POLL_S)
                continue
            except OSError:             # EPIPE: the child is gone
                return False
            data = data[n:]
        return True

    def _read_stdout(self, fd: int) -> None:
        try:
            for line in _lines_of(fd, lambda: self._running):
                with self._cond:
                    self._lines.append(line)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._running = False   # EOF: the child exited (or closed stdout); a later call respawns it
                self._cond.notify_all()

    def _read_stderr(self, fd: int) -> None:
        for line in _lines_of(fd, lambda: self._running):
            log.debug("MCP '%s' stderr: %s", self.name, line)
            self._err_tail = (self._err_tail + line + "\n")[-ERR_TAIL:]


def _lines_of(fd: int, running: Callable[[], bool]):
    """Lines of a non-blocking pipe, polled so that the loop ends when `running` turns false even if no EOF comes."""
    buf, skipping = b"", False
    while running():
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not chunk:
            return                      # EOF
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            if skipping:                # the rest of an over-long line
                skipping = False
                continue
            text = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if text:
                yield text
        if len(buf) > MAX_LINE:
            log.warning("MCP: dropping an over-long line (> %d bytes) from a child pipe", MAX_LINE)
            buf, skipping = b"", True


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group, a short grace, then SIGKILL to whatever of the group is left (the
    child, or grandchildren that hold the pipes). The child is reaped only after that, so its pid (the group's id)
    cannot have been reused when the group is signalled."""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + CLOSE_GRACE_S
    while time.monotonic() < deadline and not _exited(proc.pid):
        time.sleep(0.01)
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)            # the child leads its own session: its children are in the group too
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (WNOWAIT)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _rpc_error(message: str) -> dict:
    return {"error": {"code": -32603, "message": message}}


def _error_message(reply: dict) -> str:
    err = reply.get("error")
    if isinstance(err, dict):
        return str(err.get("message", "unknown error"))
    if isinstance(err, str):
        return err
    return "unknown error"


def _result_to_response(result) -> dict:
    """llama-server's /tools contract: the text parts of result.content joined by newlines; isError -> error."""
    parts = result.get("content") if isinstance(result, dict) else None
    texts = [p.get("text", "") for p in parts or [] if isinstance(p, dict) and p.get("type") == "text"]
    text = "\n".join(texts)
    if isinstance(result, dict) and result.get("isError") is True:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


# PR_SET_PDEATHSIG fires when the *thread* that forked exits, so every child is forked by this one thread, which
# lives as long as the process.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp-spawn")
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In the forked child, before exec. If the server already died between fork and prctl, the signal would never
    come: the child then sees another parent and exits."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
