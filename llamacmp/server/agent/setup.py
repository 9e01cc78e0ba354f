"""The /tools registry a server starts with: the built-ins --tools names, run where --tools-runtime says."""
from __future__ import annotations

import logging

from ...params import ServerParams
from .builtin import build_tools
from .registry import ToolRegistry
from .runtime import make_runtime

log = logging.getLogger("llamacmp.server")


def start_tools(opts: ServerParams) -> ToolRegistry:
    """Raises RuntimeError when the --tools-runtime container cannot be started."""
    tools = build_tools(opts.tools)
    if opts.tools_runtime and not tools:
        log.warning("--tools-runtime %s changes nothing without --tools", opts.tools_runtime)
    runtime = make_runtime(opts.tools_runtime) if tools else None
    if tools:
        log.warning("security: server tools (experimental)%s enabled - do not expose to untrusted environments",
                    ", tools runtime (experimental)" if runtime is not None else "")
    return ToolRegistry(tools, runtime)
