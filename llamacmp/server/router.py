"""llama-server's router mode (started without -m), as far as llamacmp has it: the server starts with no model and
answers /health, /props (the router's own), /models (empty: llamacmp finds no models for it yet), /tools and the
web page; a request for a model gets llama-server's router errors ("model name is missing from the request",
"model 'X' not found"), since no model is ever listed.

Not done: the model sources (-hf cache, --models-dir, --models-preset), spawning a llamacmp-server per model and
proxying to it, /models/sse, loading and unloading. --models-max and --models-autoload are reported by /props."""
from __future__ import annotations

import logging
import sys

from fastapi import FastAPI
from starlette.requests import Request

from .. import BUILD_NUMBER
from ..params import Params, ServerParams
from .access_log import AccessLog
from .agent.registry import ToolRegistry
from .agent.setup import start_tools
from .gate import Gate, install_error_handlers, read_body
from .cors_proxy import add_route as add_cors_proxy_route
from .errors import ApiError, bad_request, not_supported
from .webui import StaticPathError, add_page_routes

log = logging.getLogger("llamacmp.server")

# the routes llama-server's router hands to a model's server (server.cpp's models_routes->proxy_post / proxy_get)
PROXY_POST = ("/props", "/completion", "/completions", "/v1/completions", "/chat/completions",
              "/v1/chat/completions", "/v1/chat/completions/control", "/v1/responses", "/responses",
              "/v1/audio/transcriptions", "/audio/transcriptions", "/v1/messages", "/v1/messages/count_tokens",
              "/infill", "/embedding", "/embeddings", "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank",
              "/v1/reranking", "/tokenize", "/detokenize", "/apply-template", "/chat/completions/input_tokens",
              "/v1/chat/completions/input_tokens", "/responses/input_tokens", "/v1/responses/input_tokens",
              "/lora-adapters", "/slots/{id_slot}")
PROXY_GET = ("/metrics", "/lora-adapters", "/slots")


class RouterContext:
    """What the request gate (app.Gate) needs: the options; no engine to wake, always ready."""
    engine = None
    ready = True

    def __init__(self, params: Params):
        self.params = params

    @property
    def opts(self) -> ServerParams:
        return self.params.server

    @property
    def build_info(self) -> str:
        return f"b{BUILD_NUMBER}-llamacmp"


def model_error(name: str) -> ApiError:
    """server-models.cpp's router_validate_model: llamacmp's router has no models, so every name is unknown."""
    if not name:
        return bad_request("model name is missing from the request")
    return bad_request(f"model '{name}' not found")


def props_json(ctx: RouterContext) -> dict:
    return {"role": "router", "max_instances": ctx.opts.models_max, "models_autoload": ctx.opts.models_autoload,
            # placeholders llama-server sends so that its web page does not break
            "model_alias": "llama-server", "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "ui_settings": {}, "build_info": ctx.build_info, "cors_proxy_enabled": ctx.opts.ui_mcp_proxy}


def create_router_app(ctx: RouterContext, tools: ToolRegistry) -> FastAPI:
    app = FastAPI(title="llamacmp-server (router)", version=ctx.build_info, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    tools.add_routes(app)
    _add_routes(app, ctx)
    add_cors_proxy_route(app, ctx.opts)
    add_page_routes(app, ctx.opts)
    app.add_middleware(Gate, ctx=ctx)
    app.add_middleware(AccessLog)
    return app


def _add_routes(app: FastAPI, ctx: RouterContext) -> None:
    async def health():
        return {"status": "ok"}

    async def props(request: Request):
        name = request.query_params.get("model", "")
        if name:
            raise model_error(name)
        return props_json(ctx)

    async def models():
        return {"data": [], "object": "list"}

    async def proxy_post(request: Request):
        body = await read_body(request)
        name = body.get("model", "")
        raise model_error(name if isinstance(name, str) else "")

    async def proxy_get(request: Request):
        raise model_error(request.query_params.get("model", ""))

    async def load(request: Request):
        await read_body(request)
        raise ApiError("model is not found", "not_found_error")

    async def unload(request: Request):
        await read_body(request)
        raise bad_request("model is not found")

    async def add_model(request: Request):
        await read_body(request)
        raise not_supported("llamacmp's router mode does not download models: start a server with -m")

    async def remove_model(request: Request):
        name = request.query_params.get("model", "")
        if not name:
            raise bad_request("model must be a non-empty string")
        raise ApiError(f"model name={name} is not found", "server_error")

    for p in ("/health", "/v1/health"):
        app.add_api_route(p, health, methods=["GET"])
    app.add_api_route("/props", props, methods=["GET"])
    for p in ("/models", "/v1/models"):
        app.add_api_route(p, models, methods=["GET"])
    for p in PROXY_POST:
        app.add_api_route(p, proxy_post, methods=["POST"])
    for p in PROXY_GET:
        app.add_api_route(p, proxy_get, methods=["GET"])
    app.add_api_route("/models/load", load, methods=["POST"])
    app.add_api_route("/models/unload", unload, methods=["POST"])
    app.add_api_route("/models", add_model, methods=["POST"])
    app.add_api_route("/models", remove_model, methods=["DELETE"])


def main(params: Params) -> None:
    import uvicorn
    from .listen import listen_sockets, listening_address, uvicorn_kwargs, with_prefix
    from .serve import ToolServer
    try:
        kw = uvicorn_kwargs(params)
        sockets = listen_sockets(params)
        tools = start_tools(params.server)
    except (ValueError, OSError, RuntimeError) as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(1) from None
    ctx = RouterContext(params)
    try:
        app = with_prefix(create_router_app(ctx, tools), params.server.api_prefix)
    except StaticPathError as e:
        tools.close()
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(1) from None
    log.warning("security: router mode enabled - do not expose to untrusted environments")
    log.info("main: starting server in router mode: llamacmp loads no model here (start one server per model "
             "with -m); listening on %s", listening_address(params))
    server = ToolServer(uvicorn.Config(app, log_level="warning", timeout_keep_alive=params.server.timeout,
                                       timeout_graceful_shutdown=params.server.timeout, **kw), tools)
    try:
        server.run(sockets=sockets)
    finally:
        tools.close()
