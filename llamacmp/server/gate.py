"""The HTTP plumbing both server apps share (the one-model app, app.py, and the router, router.py): the request
gate (CORS, OPTIONS, loading, API keys, body limit, waking a sleeping engine), the body reader and the error
handlers in llama-server's shapes."""
from __future__ import annotations

import hmac
import logging

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .cors import CorsPolicy
from .errors import ApiError, error_response
from .schemas import parse_json_body
from .webui import PAGE_PATHS
from .worker import ClientGone

log = logging.getLogger("llamacmp.server")

# what answers without the API key: llama-server 0c1e570's list (b8462 also let the model lists through)
PUBLIC_PATHS = {"/health", "/v1/health", *PAGE_PATHS}
# what a sleeping server (--sleep-idle-seconds) answers without loading its model, as llama-server 0c1e570's
# create_response(true) routes (GET /props, the web page); every other route waits for the model to be back
SLEEP_PATHS = {"/health", "/v1/health", "/metrics", "/models", "/v1/models", *PAGE_PATHS}
LOADING = ApiError("Loading model", "unavailable_error")
INVALID_KEY = ApiError("Invalid API Key", "authentication_error")
MAX_BODY = 32 * 1024 * 1024              # bytes; a larger request gets 413 before it is read


def _llama_case(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    """Starlette lowercases header names; llama-server writes its own (CORS, /metrics' Process-Start-Time-Unix)
    capitalized, and clients that read headers into a plain dict (llama.cpp's own test harness) look them up so."""
    if name.startswith(b"access-control-") or name == b"process-start-time-unix":
        name = b"-".join(w.capitalize() for w in name.split(b"-"))
    return name, value


class Gate:
    """Pure ASGI middleware, in llama.cpp's order: CORS header, OPTIONS answered blank, 503 while loading,
    API key check, then the body size limit. (Pure ASGI so that streaming and disconnects pass through.)"""

    def __init__(self, app, ctx):
        """ctx: a ServerContext, or the router's (router.py: no engine, always ready)."""
        self.app, self.ctx = app, ctx
        self.cors = CorsPolicy.from_opts(ctx.opts)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        allow = self.cors.allow_origin(headers.get("origin", ""))

        async def send_cors(message):
            if message["type"] == "http.response.start":
                extra = [] if allow is None else [(b"Access-Control-Allow-Origin", allow.encode("latin-1"))]
                message = {**message, "headers": [_llama_case(k, v) for k, v in message.get("headers", [])] + extra}
            await send(message)
        early = self._early_response(scope, headers)
        if early is None:
            early = await self._wake(scope)
        if early is not None:
            return await early(scope, receive, send_cors)
        await self.app(scope, receive, send_cors)

    async def _wake(self, scope) -> Response | None:
        """A route that needs the model waits while a sleeping engine loads it again; a failed load is a 503
        naming the cause."""
        path = scope["path"]
        if (self.ctx.engine is None or not self.ctx.engine.sleeping or path in SLEEP_PATHS
                or (path == "/props" and scope["method"] == "GET")):
            return None
        r = await self.ctx.bridge.wake()
        return None if r is None else error_response(ApiError(r.message, "unavailable_error"))

    def _early_response(self, scope, headers: dict) -> Response | None:
        if scope["method"] == "OPTIONS":
            return Response("", media_type="text/html", headers=self.cors.preflight_headers())
        if not self.ctx.ready:
            return error_response(LOADING)
        path = scope["path"]
        keys = self.ctx.opts.api_keys
        if keys and path not in PUBLIC_PATHS:
            given = headers.get("authorization") or headers.get("x-api-key", "")
            if given.startswith("Bearer "):
                given = given[len("Bearer "):]
            if not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):   # constant time
                return error_response(INVALID_KEY)
        length = headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > MAX_BODY:
            return JSONResponse({"error": {"code": 413, "message": "request body too large",
                                           "type": "invalid_request_error"}}, status_code=413)
        return None


async def read_body(request: Request) -> dict:
    """The JSON body; one over MAX_BODY (a chunked one has no Content-Length for the Gate) is refused with 413 as
    soon as the limit is crossed, not after buffering it whole."""
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > MAX_BODY:
            raise ApiError("request body too large", "invalid_request_error", status=413)
        chunks.append(chunk)
    return parse_json_body(b"".join(chunks))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        if err.status_code in (404, 405):
            return error_response(ApiError("File Not Found", "not_found_error"))
        return error_response(ApiError(str(err.detail), "invalid_request_error"))

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, err: ClientGone):
        log.info("%s %s: %s", request.method, request.url.path, err)
        return Response(status_code=499)          # nobody reads it; nginx's "client closed request"

    @app.exception_handler(Exception)
    async def any_error(request: Request, err: Exception):
        log.exception("request failed")
        return error_response(ApiError(str(err) or type(err).__name__, "server_error"))
