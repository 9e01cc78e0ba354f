"""GET /tools and POST /tools, as llama-server 0c1e570 serves them (tools/server/server-tools.cpp).

The tool protocol. A tool is any object with
    name: str               what POST /tools {"tool": name} calls, and the function name in its definition
    display_name: str       a label for the web page
    permission_write: bool  whether it can change anything (files, processes)
    support_stream: bool    whether POST /tools {"stream": true} may call it
    uses_cwd: bool          whether it resolves paths / runs against the x-tool-cwd directory
    definition() -> dict    its OpenAI function definition: {"type": "function", "function": {...}}
    type() -> str           "server" for the built-ins (builtin.py), "mcp" for a tool of an MCP server
    invoke(params: dict, stream: Callable[[str], bool] | None) -> dict
        runs the call, blocking (the registry calls it off the event loop, on a worker thread). `params` is the
        request's "params" object, where the registry has replaced the keys "cwd", "runtime" and "resp_type" by
        the x-tool-cwd / x-tool-runtime (else --tools-runtime) / x-resp-type headers, or removed them.
        Without `stream` it returns the result object (a failure the caller should see is {"error": text},
        still a 200, as llama-server). With `stream` (only when support_stream) it calls stream(chunk) with each
        piece of output and returns when done (its return value is then unused); stream returns False once the
        client has left, and the tool should stop.
        It raises ToolParamError for a missing or mistyped parameter (400), anything else for a failure of the
        call itself (500, e.g. an unknown runtime); while streaming, a raised error ends the stream as
        {"done": true, "error": text}.

Wire format (llama-server's): GET answers the list of {"display_name", "tool", "type", "permissions": {"write"},
"uses_cwd", "definition"}; POST answers the tool's result object, or, with "stream": true, server-sent events
`data: {"chunk": text}` and a last `data: {"done": true}` (plus "error" when the call failed). Errors of the
request itself are a bare {"code", "message", "type"} object (not wrapped in "error", as server-tools.cpp writes
them): 400 bad JSON / parameters, 404 unknown tool or one that cannot stream, 500 a failed call. With no tool
enabled both routes answer 403 "this feature is disabled", as llama-server without --tools.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Callable, Protocol

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..sse import data as sse_data
from ..sse import dumps

log = logging.getLogger("llamacmp.server")
HEADER_PARAMS = (("x-tool-cwd", "cwd"), ("x-tool-runtime", "runtime"), ("x-resp-type", "resp_type"))
DISABLED = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}


class Tool(Protocol):
    name: str
    display_name: str
    permission_write: bool
    support_stream: bool
    uses_cwd: bool

    def definition(self) -> dict: ...

    def type(self) -> str: ...

    def invoke(self, params: dict, stream: Callable[[str], bool] | None) -> dict: ...


class ToolParamError(ValueError):
    """A parameter is missing or has the wrong type: 400, as llama-server's JSON errors."""


class _NotFound(ValueError):
    """404: no such tool, or it cannot stream."""


def tool_json(tool: Tool) -> dict:
    return {"display_name": tool.display_name, "tool": tool.name, "type": tool.type(),
            "permissions": {"write": tool.permission_write}, "uses_cwd": tool.uses_cwd,
            "definition": tool.definition()}


def _json(obj, status: int = 200) -> Response:
    return Response(dumps(obj), status_code=status, media_type="application/json; charset=utf-8")


def _error(message: str, type_: str, status: int) -> Response:
    return _json({"code": status, "message": message, "type": type_}, status)


class ToolRegistry:
    """The enabled tools, in order. `runtime` (runtime.py; None without --tools-runtime): its spec() names the
    isolate a call runs in when the request names none (asked once per call: a spawned container may have been
    replaced); close() at shutdown releases it."""

    def __init__(self, tools: list, runtime=None, mcp=None):
        self.tools = list(tools)
        self.runtime = runtime
        self.mcp = mcp                  # mcp.McpManager: its child processes end with close()
        # llama-server serves /tools when --tools or an MCP config is given, even if no MCP server listed a tool
        self.enabled = bool(self.tools) or (mcp is not None and not mcp.empty)

    def shutdown(self) -> None:
        """At the exit signal, before requests in flight are waited for: MCP calls in flight return now."""
        if self.mcp is not None:
            self.mcp.shutdown()

    def close(self) -> None:
        if self.mcp is not None:
            self.mcp.close()
        if self.runtime is not None:
            self.runtime.close()

    def add_routes(self, app) -> None:
        app.add_api_route("/tools", self.handle_get, methods=["GET"], include_in_schema=self.enabled)
        app.add_api_route("/tools", self.handle_post, methods=["POST"], include_in_schema=self.enabled)

    async def handle_get(self) -> Response:
        if not self.enabled:
            return _json(DISABLED, 403)
        return _json([tool_json(t) for t in self.tools])

    async def handle_post(self, request: Request) -> Response:
        if not self.enabled:
            return _json(DISABLED, 403)
        try:
            tool, params, stream = self._parse(await request.body(), request.headers)
            if stream:
                return self._stream(tool, params)
            return _json(await asyncio.to_thread(tool.invoke, params, None))
        except (ToolParamError, json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(str(e), "invalid_request_error", 400)
        except _NotFound as e:
            return _error(str(e), "invalid_request_error", 404)
        except Exception as e:           # the call itself failed (llama-server's std::exception branch)
            log.error("got exception: %s", e)
            return _error(str(e) or type(e).__name__, "server_error", 500)

    def _parse(self, raw: bytes, headers) -> tuple[Tool, dict, bool]:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ToolParamError("the request body must be a JSON object")
        name, stream = body.get("tool"), body.get("stream", False)
        if not isinstance(name, str):
            raise ToolParamError("\"tool\" must be a string naming the tool" if "tool" in body
                                 else "key 'tool' not found")
        if not isinstance(stream, bool):
            raise ToolParamError("\"stream\" must be a boolean")
        params = body.get("params", {})
        if not isinstance(params, dict):
            raise ToolParamError("\"params\" must be an object")
        params = dict(params)
        for header, key in HEADER_PARAMS:         # the model cannot set these: only the client's headers do
            params.pop(key, None)
            if headers.get(header):
                params[key] = headers[header]
        if "runtime" not in params and self.runtime is not None:
            params["runtime"] = self.runtime.spec()
        return self._find(name, stream), params, stream

    def _find(self, name: str, stream: bool) -> Tool:
        for t in self.tools:
            if t.name == name:
                if stream and not t.support_stream:
                    raise _NotFound(f"tool \"{name}\" does not support stream = true")
                return t
        raise _NotFound(f"unknown tool \"{name}\"")

    def _stream(self, tool: Tool, params: dict) -> StreamingResponse:
        """The tool runs on its own thread and hands chunks to the event loop; leaving the response (the client
        went away) makes its stream callback answer False."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        alive = threading.Event()
        alive.set()

        def hand_over(item: dict) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:          # the event loop is closed: the server is stopping
                alive.clear()

        def push(chunk: str) -> bool:
            if chunk and alive.is_set():
                hand_over({"chunk": chunk})
            return alive.is_set()

        def run() -> None:
            done = {"done": True}
            try:
                tool.invoke(params, push)
            except Exception as e:
                done["error"] = str(e) or type(e).__name__
            hand_over(done)

        async def events():
            try:
                while True:
                    item = await queue.get()
                    yield sse_data(item)
                    if item.get("done"):
                        return
            finally:
                alive.clear()

        threading.Thread(target=run, name=f"tool-{tool.name}", daemon=True).start()
        return StreamingResponse(events(), media_type="text/event-stream")
