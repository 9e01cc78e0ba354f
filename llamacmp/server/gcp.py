"""Vertex AI (Google Cloud) prediction protocol, as llama-server 0c1e570 serves it when its container is started with
AIP_MODE=PREDICTION: it listens on AIP_HTTP_PORT (default 8080, over --port), answers GET AIP_HEALTH_ROUTE as
/health, and POST AIP_PREDICT_ROUTE (default /predict) takes {"instances": [...]}, each an ordinary request body
plus "@requestFormat" (a route, or its camelCase name: "chatCompletions" for /v1/chat/completions), runs them
concurrently through the app's own routes, streaming off, and answers {"predictions": [each route's JSON body]};
an instance's error is its prediction, the answer stays 200."""
from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.requests import Request

from .errors import ApiError, bad_request

log = logging.getLogger("llamacmp.server")
MAX_INSTANCES = 128                     # llama-server's limit


@dataclass(frozen=True)
class GcpEnv:
    health_route: str                   # "" = no extra health route
    predict_route: str
    port: int


def gcp_env(environ=os.environ) -> GcpEnv | None:
    """The AIP_* variables Vertex AI sets in a custom container; None unless AIP_MODE=PREDICTION."""
    if environ.get("AIP_MODE", "") != "PREDICTION":
        return None

    def route(name: str, default: str) -> str:
        v = environ.get(name) or default
        return v if not v or v.startswith("/") else "/" + v
    return GcpEnv(route("AIP_HEALTH_ROUTE", ""), route("AIP_PREDICT_ROUTE", "/predict"),
                  int(environ.get("AIP_HTTP_PORT") or 8080))


def request_format(path: str) -> str:
    """A route's camelCase @requestFormat name: /v1/chat/completions -> chatCompletions, /apply-template ->
    applyTemplate, /slots/{id_slot} -> slots (llama-server's path_to_gcp_format)."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s[1:] if s.startswith("/") else s
    out, cap = "", False
    for c in s:
        if c in ":{":
            break
        if c in "/-_":
            cap = True
        else:
            out, cap = out + (c.upper() if cap else c), False
    return out


def add_gcp_routes(app: FastAPI, env: GcpEnv, health, read_body) -> None:
    """Call after every other route: the names map to the routes registered so far, the first one winning a
    shared name ("completions": /completions, llama.cpp's own shape, before /v1/completions). health: the /health
    handler; read_body: app.py's body reader (its size limit), passed in so that this module does not import app."""
    routes: dict[str, tuple[str, str]] = {}          # name or path -> (path, method)
    for r in app.routes:
        methods = getattr(r, "methods", None)
        if not methods:
            continue
        method = "POST" if "POST" in methods else sorted(methods)[0]
        routes.setdefault(r.path, (r.path, method))
        routes.setdefault(request_format(r.path), (r.path, method))
    if env.predict_route in {r.path for r in app.routes}:
        raise ValueError(f"AIP_PREDICT_ROUTE={env.predict_route} conflicts with an existing llama-server route")
    if env.health_route:
        app.add_api_route(env.health_route, health, methods=["GET"], include_in_schema=False)

    async def predict(request: Request):
        data = await read_body(request)
        if not isinstance(data, dict):
            raise bad_request("request body must be a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, list):
            raise bad_request("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise bad_request(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        answers = await asyncio.gather(*(_one(request, routes, i) for i in instances))
        return {"predictions": list(answers)}
    app.add_api_route(env.predict_route, predict, methods=["POST"], include_in_schema=False)


async def _one(request: Request, routes: dict, instance):
    if not isinstance(instance, dict):
        return bad_request("each instance must be a JSON object").to_json()
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return bad_request("each instance must include a string @requestFormat").to_json()
    if fmt not in routes:
        return bad_request(f"no handler registered for @requestFormat: {fmt}").to_json()
    body = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in body:
        log.warning("ignoring client-provided stream field in instance, streaming is not supported in predict route")
        body["stream"] = False
    path, method = routes[fmt]
    try:
        raw = await _call(request, path, method, json.dumps(body).encode())
    except Exception as e:              # noqa: BLE001 - the instance's answer, as llama-server's catch-all
        return ApiError(str(e) or type(e).__name__, "server_error").to_json()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


async def _call(request: Request, path: str, method: str, body: bytes) -> bytes:
    """Run one request through the app in-process (its gate, its route), with the caller's headers (API key);
    its body, whatever its status (llama-server passes an error's JSON on as the prediction)."""
    headers = [(k, v) for k, v in request.scope.get("headers", []) if k not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {**request.scope, "method": method, "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": headers}
    scope.pop("route", None)
    scope.pop("endpoint", None)
    scope.pop("path_params", None)
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()    # the instance's handler waits for the whole answer: no disconnect
    chunks = []

    async def send(message):
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
    await request.app(scope, receive, send)
    return b"".join(chunks)
