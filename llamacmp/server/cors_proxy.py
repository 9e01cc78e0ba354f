"""/cors-proxy with --webui-mcp-proxy: fetch the URL a client names (GET or POST), as llama-server 0c1e570 does for
its web page's MCP client (tools/server/server-cors-proxy.h, server_http_proxy in server-models.cpp).

What it reaches and sends is llama-server's, no more:
- http:// and https:// URLs only; a URL carrying a password is refused; redirects are followed.
- Only the request headers the client names as `X-Llama-Server-Proxy-Header-<name>` go out (as `<name>`), minus
  Accept-Encoding, Transfer-Encoding and Content-Length. The client's own Authorization, Cookie, X-Api-Key, ...
  never do; neither do proxy settings, .netrc credentials or default headers of the HTTP library.
- The answer comes back as it is (status, body streamed), without its Server, Transfer-Encoding, Content-Length,
  Keep-Alive and Access-Control-* headers (this server sets its own CORS header).
An unreachable target is a 500 with the body `proxy error: <why>`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .errors import ApiError

log = logging.getLogger("llamacmp.server")

HEADER_PREFIX = "x-llama-server-proxy-header-"
NOT_FORWARDED = {"accept-encoding", "transfer-encoding", "content-length",
                 "host"}               # llama-server sets Host to the target's; httpx does so from the URL
NOT_RETURNED = {"server", "transfer-encoding", "content-length", "keep-alive"}
TIMEOUT_S = 600                         # llama-server's read/write/connect timeouts (10 minutes)
BODILESS = {204, 304}


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str                           # with the query string

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def add_route(app, opts) -> None:
    """GET and POST /cors-proxy; without --webui-mcp-proxy, llama-server's 403 feature_disabled."""
    async def cors_proxy(request: Request) -> Response:
        if opts.ui_mcp_proxy:
            return await handle(request)
        return JSONResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}},
                            status_code=403)
    app.add_api_route("/cors-proxy", cors_proxy, methods=["GET", "POST"], include_in_schema=False)


def parse_target(url: str) -> Target:
    """The `url` parameter, checked as llama-server checks it (a runtime error there: 500 server_error)."""
    if "://" not in url:
        raise ApiError("invalid URL: no scheme", "server_error")
    scheme = url.split("://", 1)[0]
    if scheme not in ("http", "https"):
        raise ApiError(f"unsupported URL scheme: {scheme}", "server_error")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as e:             # a port that is not a number, a bad IPv6 literal
        raise ApiError(f"invalid target URL: {e}", "invalid_request_error") from None
    if not parts.hostname:
        raise ApiError("invalid target URL: missing host", "server_error")
    if parts.password:
        raise ApiError("authentication in target URL is not supported", "server_error")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(scheme, parts.hostname, port, path)


def forwarded_headers(headers) -> dict[str, str]:
    out = {}
    for key, value in headers.items():
        name = key[len(HEADER_PREFIX):] if key.lower().startswith(HEADER_PREFIX) else ""
        if name and name.lower() not in NOT_FORWARDED:
            out[name] = value
    return out


async def handle(request: Request) -> Response:
    import httpx                        # only a server that proxies needs it
    target = parse_target(request.query_params.get("url", ""))
    log.info("proxying %s request to %s", request.method, target.url)
    body = await request.body() if request.method == "POST" else None
    # trust_env=False: no proxy variables, no .netrc credentials; headers={} drops httpx's defaults (its
    # Accept-Encoding would ask for compressed answers, which llama-server never does)
    client = httpx.AsyncClient(trust_env=False, follow_redirects=True, timeout=TIMEOUT_S)
    client.headers.clear()
    try:
        upstream = await client.send(client.build_request(request.method, target.url, content=body,
                                                          headers=forwarded_headers(request.headers)), stream=True)
    except httpx.HTTPError as e:
        await client.aclose()
        log.error("http client error: %s", e)
        return Response(f"proxy error: {e or type(e).__name__}", status_code=500, media_type="text/plain")
    # raw pairs, so that a repeated header (Set-Cookie) stays repeated
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in upstream.headers.multi_items()
               if k.lower() not in NOT_RETURNED and not k.lower().startswith("access-control-")]

    async def close() -> None:
        await upstream.aclose()
        await client.aclose()

    if upstream.status_code in BODILESS:
        await close()
        out: Response = Response(status_code=upstream.status_code)
    else:
        async def chunks():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await close()
        out = StreamingResponse(chunks(), status_code=upstream.status_code)
    out.raw_headers = [h for h in out.raw_headers if h[0] != b"content-length"] + headers
    return out
