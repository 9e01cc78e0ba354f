"""The MCP client (llamacmp/server/agent/mcp*.py) against real stdio MCP server processes (tests/data/mcp_server.py):
config parsing, warm-up, calls, timeouts, respawn, shutdown, and no child outliving its server."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from llamacmp.server.agent import mcp as mcp_mod
from llamacmp.server.agent.mcp import McpManager
from llamacmp.server.agent.mcp_config import McpConfigError, McpServerConfig, McpConfig, merge, parse_mcp_text
from llamacmp.server.agent.mcp_stdio import StdioTransport

SERVER = str(Path(__file__).parent / "data" / "mcp_server.py")
ROOT = str(Path(__file__).resolve().parent.parent)


def cfg(name="t", *flags, **kw) -> McpServerConfig:
    return McpServerConfig(name, sys.executable, (SERVER, *flags), **kw)


def manager(*cfgs: McpServerConfig) -> McpManager:
    m = McpManager(McpConfig(tuple(cfgs)))
    m.start()
    return m


def gone(pid: int, within: float = 3.0) -> bool:
    """True once the process has exited (a zombie counts as exited)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


# -- config ---------------------------------------------------------------------------------------------------------

def test_config_parsing():
    c = parse_mcp_text(json.dumps({"mcpServers": {
        "a": {"command": "x", "args": ["1", "2"], "env": {"K": "V"}, "cwd": "/tmp", "timeout_ms": 50},
        "nocmd": {"args": []}}}), "--mcp-servers-json")
    assert c.servers == (McpServerConfig("a", "x", ("1", "2"), (("K", "V"),), "/tmp", 50),)
    assert c.skipped == ("MCP server 'nocmd' has no command, skipping",)
    assert parse_mcp_text("{}", "s").servers == () and "no servers found" in parse_mcp_text("[]", "s").skipped[0]
    with pytest.raises(McpConfigError, match="failed to parse MCP config JSON"):
        parse_mcp_text("not valid json", "--mcp-servers-json")
    for bad, where in (({"a": 1}, "mcpServers.a"), ({"a": {"command": 1}}, "mcpServers.a.command"),
                       ({"a": {"command": "x", "args": [1]}}, "mcpServers.a.args"),
                       ({"a": {"command": "x", "env": {"K": 1}}}, "mcpServers.a.env"),
                       ({"a": {"command": "x", "timeout_ms": "9"}}, "mcpServers.a.timeout_ms")):
        with pytest.raises(McpConfigError, match=where.replace(".", r"\.")):
            parse_mcp_text(json.dumps({"mcpServers": bad}), "f")
    m = merge(parse_mcp_text('{"mcpServers": {"a": {"command": "file"}}}', "file"),
              parse_mcp_text('{"mcpServers": {"a": {"command": "json"}, "b": {"command": "y"}}}', "json"))
    assert [(s.name, s.command) for s in m.servers] == [("a", "file"), ("b", "y")]
    assert m.skipped == ("MCP config: duplicate server name 'a', skipping",)


def test_options_parse_the_config(tmp_path):
    from llamacmp.args import parse_args
    f = tmp_path / "mcp.json"
    f.write_text('{"mcpServers": {"a": {"command": "x"}}}')
    p = parse_args("server", ["-m", "m.gguf", "--mcp-servers-config", str(f),
                              "--mcp-servers-json", '{"mcpServers": {"b": {"command": "y"}}}']).params
    assert [s.name for s in McpManager.from_params(p.server).configs.values()] == ["a", "b"]
    assert parse_args("server", ["-m", "m.gguf", "--webui-mcp-proxy"]).params.server.ui_mcp_proxy is True
    assert parse_args("server", ["-m", "m.gguf"]).params.server.ui_mcp_proxy is False


def test_agent_flags_and_the_cors_default():
    from llamacmp.args import parse_args

    def server(*argv, env=None):
        return parse_args("server", ["-m", "m.gguf", *argv], env or {}).params.server
    s = server("-ag")
    assert s.tools == ["all"] and s.ui_mcp_proxy is True and s.cors_origins == "localhost"
    s = server("-ag", "-no-ag")
    assert s.tools == [] and s.ui_mcp_proxy is False
    assert server(env={"LLAMA_ARG_AGENT": "0"}).ui_mcp_proxy is False
    assert server(env={"LLAMA_ARG_AGENT": "1"}).ui_mcp_proxy is True
    # an MCP flag narrows the CORS default even when it names no server; --cors-origins wins
    assert server("--mcp-servers-json", "{}").cors_origins == "localhost"
    assert server("--mcp-servers-json", "{}", "--cors-origins", "*").cors_origins == "*"
    assert server("--webui-mcp-proxy").cors_origins == "*"       # the proxy alone does not (llama-server)


def test_start_tools_appends_mcp_tools_after_the_builtins():
    from llamacmp.args import parse_args
    from llamacmp.server.agent.setup import start_tools
    cfg = json.dumps({"mcpServers": {"get": {"command": sys.executable, "args": [SERVER]}}})
    opts = parse_args("server", ["-m", "m.gguf", "--tools", "get_info", "--mcp-servers-json", cfg], {}).params.server
    reg = start_tools(opts)
    try:
        names = [t.name for t in reg.tools]
        assert names[0] == "get_info" and reg.tools[0].type() != "mcp"
        assert names.count("get_info") == 1 and "get_echo" in names     # the MCP get_info collided: skipped
        assert all(t.type() == "mcp" for t in reg.tools[1:])
    finally:
        reg.close()


@pytest.mark.parametrize("argv", [["--mcp-servers-json", "not valid json"],
                                  ["--mcp-servers-config", "/nonexistent/path.json"]])
def test_bad_config_refuses_to_start(argv):
    r = subprocess.run([sys.executable, "-m", "llamacmp.server.app", "-m", "m.gguf", *argv], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 1 and ("MCP config" in r.stderr or "path.json" in r.stderr), r.stderr


# -- warm-up and calls ----------------------------------------------------------------------------------------------

def test_warmup_lists_tools_and_calls_spawn_on_demand():
    m = manager(cfg("echo"), cfg("two"), McpServerConfig("bad", "this_executable_does_not_exist_12345"))
    try:
        names = [t.name for t in m.tools()]
        assert "echo_echo" in names and "echo_add" in names and "two_echo" in names
        assert not any(n.startswith("bad_") for n in names)
        assert m._transports == {}                  # warm-up closed its processes
        tool = next(t for t in m.tools() if t.name == "echo_echo")
        assert tool.type() == "mcp" and tool.display_name == "echo_echo" and not tool.permission_write
        assert tool.definition() == {"type": "function", "function": {
            "name": "echo_echo", "description": "Echo back the input message",
            "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}}
        assert next(t for t in m.tools() if t.name == "echo_pid").definition()["function"]["parameters"] == {}
        assert tool.invoke({"message": "hello world"}) == {"plain_text_response": "echo: hello world"}
        assert m.call_tool("echo", "add", {"a": 3, "b": 5}) == {"plain_text_response": "8"}
        assert m.call_tool("echo", "is_error", {}) == {"error": "bad input"}
        assert m.call_tool("echo", "nope", {}) == {"error": "'nope'"}
        assert m.call_tool("bad", "x", {}) == {"error": "MCP server unavailable: bad"}
        assert m.call_tool("unknown", "x", {}) == {"error": "MCP server unavailable: unknown"}
    finally:
        m.close()


def test_env_cwd_and_text_parts(tmp_path):
    m = manager(cfg("e", env=(("MCP_T", "value"),), cwd=str(tmp_path)))
    try:
        # only the text parts, joined by a newline (the image part is left out)
        assert m.call_tool("e", "env", {"name": "MCP_T"}) == {"plain_text_response": f"value\n{tmp_path}"}
        assert m.call_tool("e", "env", {"name": "PATH"})["plain_text_response"].startswith(os.environ["PATH"])
    finally:
        m.close()


def test_timeout_then_the_server_still_answers():
    m = manager(cfg("slow", timeout_ms=400))
    try:
        t0 = time.monotonic()
        assert m.call_tool("slow", "sleep", {"seconds": 1.5}) == {"error": "request timed out"}
        assert time.monotonic() - t0 < 1.2
        time.sleep(1.3)                 # the late reply arrives and is dropped by its id
        assert m.call_tool("slow", "echo", {"message": "x"}) == {"plain_text_response": "echo: x"}
    finally:
        m.close()


def test_respawn_after_crash_and_fail_once():
    m = manager(cfg("c"))
    try:
        pid = int(m.call_tool("c", "pid", {})["plain_text_response"])
        assert m.call_tool("c", "crash", {}) == {"error": "transport closed"}
        assert gone(pid)
        pid2 = int(m.call_tool("c", "pid", {})["plain_text_response"])
        assert pid2 != pid
        assert m.call_tool("c", "fail_once", {}) == {"error": "transient error"}
        assert m.call_tool("c", "fail_once", {}) == {"plain_text_response": "ok"}
    finally:
        m.close()


def test_notifications_and_noise_are_skipped():
    m = manager(cfg("n", "--noise"))
    try:
        assert len(m.tools()) == 11
        assert m.call_tool("n", "notify", {"message": "burst"}) == {"plain_text_response": "echo: burst"}
        for i in range(20):
            assert m.call_tool("n", "echo", {"message": f"m{i}"}) == {"plain_text_response": f"echo: m{i}"}
        assert "noise on stderr" in m._transports["n"].diagnostics()
    finally:
        m.close()


def test_concurrent_calls_get_their_own_replies():
    m = manager(cfg("p"))
    try:
        with ThreadPoolExecutor(10) as ex:
            out = list(ex.map(lambda i: m.call_tool("p", "echo", {"message": str(i)}), range(30)))
        assert out == [{"plain_text_response": f"echo: {i}"} for i in range(30)]
    finally:
        m.close()


def test_failed_listing_and_hung_init_give_no_tools(monkeypatch):
    monkeypatch.setattr(mcp_mod, "WARMUP_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    m = manager(cfg("nolist", "--no-tools-list"), cfg("hang", "--hang-init"), cfg("ok"))
    try:
        assert time.monotonic() - t0 < 5
        assert {t.name.split("_")[0] for t in m.tools()} == {"ok"}
    finally:
        m.close()


def test_spawn_failure_cools_down(monkeypatch):
    m = manager(McpServerConfig("bad", "this_executable_does_not_exist_12345"))
    spawned = []
    real = StdioTransport.start
    monkeypatch.setattr(StdioTransport, "start", lambda self: spawned.append(1) or real(self))
    assert m.call_tool("bad", "x", {})["error"] == "MCP server unavailable: bad"
    assert m.call_tool("bad", "x", {})["error"] == "MCP server unavailable: bad"
    assert len(spawned) == 1            # the second call did not try again within the cool-down
    m.close()


# -- shutdown and child processes -----------------------------------------------------------------------------------

def test_shutdown_returns_calls_in_flight():
    m = manager(cfg("s", timeout_ms=30000))
    out = {}
    th = threading.Thread(target=lambda: out.update(r=m.call_tool("s", "sleep", {"seconds": 20})))
    th.start()
    time.sleep(0.5)
    pid = next(iter(m._transports.values()))._proc.pid
    t0 = time.monotonic()
    m.close()
    th.join(5)
    assert out["r"] == {"error": "cancelled"} and time.monotonic() - t0 < 2
    assert gone(pid)
    assert m.call_tool("s", "echo", {"message": "x"}) == {"error": "MCP server unavailable: s"}


def test_close_ends_grandchildren_holding_the_pipes():
    m = manager(cfg("g"))
    child = int(m.call_tool("g", "pid", {})["plain_text_response"])
    grandchild = int(m.call_tool("g", "spawn", {})["plain_text_response"])
    t0 = time.monotonic()
    m.close()
    assert time.monotonic() - t0 < 2
    assert gone(child) and gone(grandchild)


def test_children_die_with_a_killed_server(tmp_path):
    """A server process that dies without closing (SIGKILL, os._exit) takes its MCP children with it."""
    script = (f"import sys; sys.path.insert(0, {ROOT!r})\n"
              "from llamacmp.server.agent.mcp import McpManager\n"
              "from llamacmp.server.agent.mcp_config import McpConfig, McpServerConfig\n"
              f"m = McpManager(McpConfig((McpServerConfig('k', sys.executable, ({SERVER!r},)),)))\n"
              "print(m.call_tool('k', 'pid', {})['plain_text_response'], flush=True)\n"
              "import os; os._exit(0)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert gone(int(r.stdout.strip())), "the MCP child outlived its server"
