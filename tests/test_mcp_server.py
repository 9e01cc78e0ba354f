"""MCP servers through a real llamacmp-server process (`python -m llamacmp.server.app`): their tools on GET/POST
/tools in router mode (no -m) and with a model, the CORS default they bring, and shutdown at SIGTERM ending a call
in flight and every child process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from server_harness import free_port, write_tiny_model
from test_mcp import SERVER, gone

ROOT = str(Path(__file__).resolve().parent.parent)


def mcp_json(**servers) -> str:
    return json.dumps({"mcpServers": {name: {"command": sys.executable, "args": [SERVER, *flags], **extra}
                                      for name, (flags, extra) in servers.items()}})


class Server:
    def __init__(self, tmp_path: Path, *flags: str):
        self.port = free_port()
        self.log = tmp_path / f"server-{self.port}.log"
        argv = [sys.executable, "-m", "llamacmp.server.app", "--port", str(self.port), *flags]
        self.out = open(self.log, "w")
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": ROOT})
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)
        deadline = time.time() + 90
        while True:
            try:
                if self.http.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start:\n{self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> float:
        t0 = time.monotonic()
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.out.close()
        self.http.close()
        return time.monotonic() - t0


@pytest.fixture
def started(tmp_path):
    servers = []

    def start(*flags):
        servers.append(Server(tmp_path, *flags))
        return servers[-1]
    yield start
    for s in servers:
        if s.proc.poll() is None:
            s.stop()


def call(s: Server, tool: str, **params) -> httpx.Response:
    return s.http.post("/tools", json={"tool": tool, "params": params})


def test_router_mode_lists_and_calls_mcp_tools(started):
    s = started("--mcp-servers-json", mcp_json(echo=([], {}), slow=([], {"timeout_ms": 300}),
                                               bad=([], {"command": "this_executable_does_not_exist_12345"})))
    tools = s.http.get("/tools").json()
    names = [t["tool"] for t in tools]
    assert "echo_echo" in names and "slow_sleep" in names and not any(n.startswith("bad_") for n in names)
    echo = next(t for t in tools if t["tool"] == "echo_echo")
    assert echo["type"] == "mcp" and echo["permissions"] == {"write": False} and echo["uses_cwd"] is False
    assert echo["definition"]["function"]["parameters"]["properties"] == {"message": {"type": "string"}}
    r = call(s, "echo_echo", message="hello world")
    assert r.status_code == 200 and r.json() == {"plain_text_response": "echo: hello world"}
    assert call(s, "slow_sleep", seconds=3).json() == {"error": "request timed out"}
    assert call(s, "bad_x").status_code == 404          # never listed: not a tool
    with ThreadPoolExecutor(8) as ex:
        out = list(ex.map(lambda i: call(s, "echo_echo", message=str(i)).json(), range(16)))
    assert out == [{"plain_text_response": f"echo: {i}"} for i in range(16)]
    r = s.http.post("/tools", json={"tool": "echo_echo", "stream": True, "params": {}})
    assert r.status_code == 404                          # MCP tools do not stream, as in llama-server


def test_mcp_brings_the_localhost_cors_default_and_the_proxy_shows(started):
    s = started("--mcp-servers-json", mcp_json(e=([], {})), "--webui-mcp-proxy")
    assert s.http.get("/props").json()["cors_proxy_enabled"] is True
    assert "access-control-allow-origin" not in s.http.get("/health", headers={"Origin": "http://evil.test"}).headers
    r = s.http.get("/health", headers={"Origin": "http://localhost:5173"})
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert s.http.get("/cors-proxy", params={"url": f"http://127.0.0.1:{s.port}/health"}).json() == {"status": "ok"}


def test_an_mcp_config_with_no_tools_still_serves_tools(started, tmp_path):
    s = started("--mcp-servers-json", mcp_json(n=(["--no-tools-list"], {})))
    assert s.http.get("/tools").json() == []
    assert s.http.get("/props").json()["cors_proxy_enabled"] is False


def test_with_a_model_too(started, tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf")
    cfg = tmp_path / "mcp.json"
    cfg.write_text(mcp_json(f=([], {})))
    s = started("-m", str(model), "-c", "256", "-np", "1", "--mcp-servers-config", str(cfg))
    assert call(s, "f_add", a=2, b=40).json() == {"plain_text_response": "42"}


def test_sigterm_ends_a_call_in_flight_and_every_child(started):
    s = started("--mcp-servers-json", mcp_json(g=([], {"timeout_ms": 60000})))
    child = int(call(s, "g_pid").json()["plain_text_response"])
    grandchild = int(call(s, "g_spawn").json()["plain_text_response"])
    with ThreadPoolExecutor(1) as ex:
        pending = ex.submit(call, s, "g_sleep", seconds=30)
        time.sleep(1)
        assert s.stop() < 3
        try:
            assert pending.result(timeout=5).json() == {"error": "cancelled"}
        except httpx.TransportError:
            pass                        # the connection closed before the answer: also a prompt end
    assert s.proc.returncode == -signal.SIGTERM or s.proc.returncode == 0
    assert gone(child) and gone(grandchild)
