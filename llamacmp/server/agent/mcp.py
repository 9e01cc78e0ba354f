"""The MCP servers of --mcp-servers-json / --mcp-servers-config, as llama-server 0c1e570 runs them
(tools/server/server-mcp.cpp): at start each server is spawned once to list its tools and closed again; a tool
call spawns its server on first use and keeps it; a server that died is spawned again by the next call; one that
fails to spawn is left alone for 5 s. Each tool is offered on /tools as `<server>_<tool>`.

Calls block: the /tools route runs them in a worker thread. shutdown() makes calls in flight return at once
(within one 50 ms poll); close() ends every child process.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .mcp_config import McpConfig, McpServerConfig, merge
from .mcp_stdio import StdioTransport

log = logging.getLogger("llamacmp.server.mcp")

COOLDOWN_S = 5                          # after a failed spawn, before the next try
WARMUP_TIMEOUT_S = 10                   # per server, for the tool listing at start


@dataclass(frozen=True)
class McpToolDef:
    server: str
    name: str                           # the server's own name for it
    description: str
    input_schema: dict | None


class McpManager:
    def __init__(self, config: McpConfig):
        self.configs: dict[str, McpServerConfig] = {c.name: c for c in config.servers}
        self.skipped = config.skipped
        self._lock = threading.Lock()   # guards the three below
        self._transports: dict[str, StdioTransport] = {}
        self._dead_until: dict[str, float] = {}
        self._defs: list[McpToolDef] = []
        self._stopping = threading.Event()

    @classmethod
    def from_params(cls, server_params) -> "McpManager":
        """--mcp-servers-config's servers, then --mcp-servers-json's (as llama-server reads them)."""
        return cls(merge(server_params.mcp_file, server_params.mcp_json))

    @property
    def empty(self) -> bool:
        return not self.configs

    def start(self) -> None:
        """Warm-up: list every server's tools (a server that fails is logged and contributes none)."""
        for why in self.skipped:
            log.warning("%s", why)
        found: list[McpToolDef] = []
        for cfg in self.configs.values():
            t = StdioTransport(cfg)
            if not t.start():
                log.warning("MCP warmup: failed to spawn '%s': %s", cfg.name, t.diagnostics())
                continue
            deadline = time.monotonic() + WARMUP_TIMEOUT_S
            tools = t.list_tools(lambda: self._stopping.is_set() or time.monotonic() >= deadline)
            t.close()
            if t.last_error:
                log.warning("MCP warmup: '%s': %s", cfg.name, t.diagnostics())
            log.info("MCP warmup: '%s' discovered %d tools", cfg.name, len(tools))
            found += [_tool_def(cfg.name, d) for d in tools]
        with self._lock:
            self._defs = found

    def tool_defs(self) -> list[McpToolDef]:
        with self._lock:
            return list(self._defs)

    def tools(self) -> list["McpTool"]:
        """The tools in the /tools registry's protocol (llamacmp/server/agent/registry.py)."""
        return [McpTool(d, self) for d in self.tool_defs()]

    def call_tool(self, server: str, tool: str, arguments: dict,
                  should_stop: Callable[[], bool] | None = None) -> dict:
        t = self._get_or_spawn(server)
        if t is None:
            return {"error": f"MCP server unavailable: {server}"}
        return t.call_tool(tool, arguments, lambda: self._stopping.is_set() or bool(should_stop and should_stop()))

    def shutdown(self) -> None:
        """Calls in flight return ("cancelled") and no server is spawned any more. Does not block."""
        self._stopping.set()

    def close(self) -> None:
        """shutdown(), then end every child process."""
        self.shutdown()
        with self._lock:
            live, self._transports = list(self._transports.values()), {}
        for t in live:
            t.close()

    def _get_or_spawn(self, name: str) -> StdioTransport | None:
        stale: list[StdioTransport] = []
        try:
            with self._lock:
                if self._stopping.is_set() or name not in self.configs:
                    return None
                if time.monotonic() < self._dead_until.get(name, 0):
                    return None
                t = self._transports.get(name)
                if t is not None and t.alive:
                    return t
                if t is not None:
                    log.warning("MCP '%s' is no longer alive: %s", name, t.diagnostics())
                    stale.append(self._transports.pop(name))
                fresh = StdioTransport(self.configs[name])
                if fresh.start() and fresh.alive:
                    self._transports[name] = fresh
                    return fresh
                log.warning("MCP '%s': failed to start: %s", name, fresh.diagnostics())
                stale.append(fresh)
                self._dead_until[name] = time.monotonic() + COOLDOWN_S
                return None
        finally:
            for s in stale:             # outside the lock: closing waits for the child
                s.close()


def _tool_def(server: str, d: dict) -> McpToolDef:
    schema = d.get("inputSchema")
    return McpToolDef(server, str(d.get("name", "")), str(d.get("description", "")),
                      schema if isinstance(schema, dict) else None)


class McpTool:
    """One MCP tool in the /tools registry's protocol: `<server>_<tool>`, read-only, not streamed."""

    permission_write = False
    support_stream = False
    uses_cwd = False

    def __init__(self, d: McpToolDef, manager: McpManager):
        self.d, self.manager = d, manager
        self.name = self.display_name = f"{d.server}_{d.name}"

    def type(self) -> str:
        return "mcp"

    def definition(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.d.description,
                                                 "parameters": self.d.input_schema or {}}}

    def invoke(self, params: dict, stream: Callable[[str], bool] | None = None) -> dict[str, Any]:
        return self.manager.call_tool(self.d.server, self.d.name, params)
