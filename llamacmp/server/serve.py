"""uvicorn's Server, with the /tools registry's lifetime tied to it (llamacmp-server and its router mode).

At SIGTERM / Ctrl-C, MCP tool calls in flight return at once (so that uvicorn's wait for requests in flight is
short); once uvicorn has stopped, the registry closes (MCP child processes, a spawned tools container). That
happens inside capture_signals because uvicorn then raises the captured signal again, which ends the process
before anything after Server.run() would run."""
from __future__ import annotations

import contextlib

import uvicorn


class ToolServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, tools):
        super().__init__(config)
        self.tools = tools              # agent.registry.ToolRegistry

    def handle_exit(self, sig, frame) -> None:
        self.tools.shutdown()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            try:
                yield
            finally:
                self.tools.close()
