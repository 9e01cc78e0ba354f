"""llama-server's request log: `done request: METHOD PATH ADDR STATUS` for each answered request (but the polled
ones: /health, /models, /props, /metrics), and with -v the request body and the response (or each streamed chunk).

Pure ASGI, so that streaming and disconnects pass through untouched.
"""
from __future__ import annotations

import logging

from ..engine.slot_log import srv

log = logging.getLogger("llamacmp.server")

QUIET_PATHS = {"/health", "/v1/health", "/models", "/v1/models", "/props", "/metrics"}   # polled: log spam


class AccessLog:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in QUIET_PATHS:
            return await self.app(scope, receive, send)
        debug = log.isEnabledFor(logging.DEBUG)
        body, answer, state = bytearray(), bytearray(), {"status": 0, "stream": False}

        async def receive_logged():
            message = await receive()
            if debug and message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def send_logged(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                headers = dict(message.get("headers", []))
                state["stream"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and debug:
                chunk = message.get("body", b"")
                if state["stream"] and chunk:
                    log.debug("%s", srv("operator()", "http: streamed chunk: " + _text(chunk)))
                else:
                    answer.extend(chunk)
            await send(message)
        try:
            await self.app(scope, receive_logged if debug else receive, send_logged)
        finally:
            client = scope.get("client") or ("", 0)
            log.info("%s", srv("log_server_request", f"done request: {scope['method']} {scope['path']} "
                                                     f"{client[0]} {state['status']}"))
            if debug:
                log.debug("%s", srv("log_server_request", "request:  " + _text(body)))
                log.debug("%s", srv("log_server_request", "response: " + _text(answer)))


def _text(b: bytes) -> str:
    return bytes(b).decode("utf-8", "replace").rstrip("\n")
