"""--mcp-servers-json / --mcp-servers-config: the Cursor-style `{"mcpServers": {name: {...}}}` document, parsed
into typed server entries as llama-server 0c1e570 reads it (tools/server/server-mcp.cpp)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT_MS = 30000              # llama-server's per-call timeout when an entry names none


class McpConfigError(ValueError):
    """The document is not JSON or an entry has a value of the wrong type: the server refuses to start."""


@dataclass(frozen=True)
class McpServerConfig:
    name: str                           # the key under "mcpServers"; tools are listed as <name>_<tool>
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()   # set over the server's own environment
    cwd: str = ""                       # "" = the server's working directory
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True)
class McpConfig:
    servers: tuple[McpServerConfig, ...] = ()
    skipped: tuple[str, ...] = ()       # why entries were left out (no command, a duplicate name): logged at start


def parse_mcp_text(text: str, source: str) -> McpConfig:
    """One document. Like llama-server: no "mcpServers" object gives no servers, an entry without a command is
    skipped, and anything else of the wrong type is an error naming the entry."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise McpConfigError(f"failed to parse MCP config JSON ({source}): {e}") from None
    servers = doc.get("mcpServers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        return McpConfig(skipped=(f"{source}: no servers found in JSON",))
    out, skipped = [], []
    for name, entry in servers.items():
        cfg = _entry(name, entry, source)
        if cfg.command:
            out.append(cfg)
        else:
            skipped.append(f"MCP server '{name}' has no command, skipping")
    return McpConfig(tuple(out), tuple(skipped))


def merge(*configs: McpConfig) -> McpConfig:
    """The file's servers first, then the inline JSON's; a name already taken is skipped (tools are keyed on it)."""
    seen: dict[str, McpServerConfig] = {}
    skipped: list[str] = []
    for c in configs:
        skipped += c.skipped
        for s in c.servers:
            if s.name in seen:
                skipped.append(f"MCP config: duplicate server name '{s.name}', skipping")
            else:
                seen[s.name] = s
    return McpConfig(tuple(seen.values()), tuple(skipped))


def _entry(name: str, entry: Any, source: str) -> McpServerConfig:
    where = f"{source}: mcpServers.{name}"
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: expected an object, got {type(entry).__name__}")
    command = _typed(entry, "command", str, "", where)
    cwd = _typed(entry, "cwd", str, "", where)
    timeout = _typed(entry, "timeout_ms", int, DEFAULT_TIMEOUT_MS, where)
    if isinstance(timeout, bool) or timeout <= 0:
        raise McpConfigError(f"{where}.timeout_ms: expected a positive number of milliseconds, got {timeout!r}")
    args = entry.get("args")
    args = args if isinstance(args, list) else []      # llama-server ignores an "args" that is not a list
    if not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}.args: every argument must be a string")
    env = entry.get("env")
    env = env if isinstance(env, dict) else {}
    if not all(isinstance(v, str) for v in env.values()):
        raise McpConfigError(f"{where}.env: every value must be a string")
    return McpServerConfig(name, command, tuple(args), tuple(env.items()), cwd, timeout)


def _typed(entry: dict, key: str, kind: type, default: Any, where: str) -> Any:
    value = entry.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise McpConfigError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value
