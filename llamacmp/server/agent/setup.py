"""The /tools registry a server starts with: the built-ins --tools names, run where --tools-runtime says."""
from __future__ import annotations

import logging

from ...params import ServerParams
from .builtin import build_tools
from .mcp import McpManager
from .registry import ToolRegistry
from .runtime import make_runtime

log = logging.getLogger("llamacmp.server")


def start_tools(opts: ServerParams) -> ToolRegistry:
    """Raises RuntimeError when the --tools-runtime container cannot be started. The MCP servers' tools follow the
    built-ins (mcp.py; their warm-up runs here, before the server listens, as in llama-server)."""
    tools = build_tools(opts.tools)
    if opts.tools_runtime and not tools:
        log.warning("--tools-runtime %s changes nothing without --tools", opts.tools_runtime)
    runtime = make_runtime(opts.tools_runtime) if tools else None
    mcp = McpManager.from_params(opts)
    mcp.start()
    tools += _mcp_tools(mcp, {t.name for t in tools})
    features = [name for name, on in (("server tools (experimental)", bool(opts.tools)),
                                      ("tools runtime (experimental)", runtime is not None),
                                      ("MCP proxy (experimental)", opts.ui_mcp_proxy),
                                      ("MCP servers (experimental)", not mcp.empty)) if on]
    if features:
        log.warning("security: %s enabled - do not expose to untrusted environments", ", ".join(features))
    return ToolRegistry(tools, runtime, mcp=mcp)


def _mcp_tools(mcp: McpManager, taken: set[str]) -> list:
    """llama-server skips an MCP tool whose <server>_<tool> name a built-in or an earlier MCP tool has."""
    out = []
    for t in mcp.tools():
        if t.name in taken:
            log.warning("MCP tool \"%s\" from server \"%s\" collides with an existing tool, skipping", t.name,
                        t.d.server)
            continue
        taken.add(t.name)
        out.append(t)
    if out:
        log.info("Added %d MCP tools", len(out))
    return out
