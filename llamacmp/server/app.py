"""llamacmp-server: routes and main() (the request gate, shared with the router, is gate.py).

Handlers parse, template and tokenize on the event loop; the engine thread does the model work (worker.py).
"""
from __future__ import annotations

import logging
import os
import sys
import threading

from fastapi import FastAPI
from starlette.requests import Request

from . import anthropic, chat_api, completions, infill, misc, responses
from ..engine import slot_log
from .access_log import AccessLog
from .agent.builtin import build_tools
from .agent.registry import ToolRegistry
from .agent.setup import start_tools
from .context import ServerContext
from .cors_proxy import add_route as add_cors_proxy_route
from .embeddings import handle_embeddings
from .errors import ApiError, not_supported
from .gate import Gate, install_error_handlers, read_body
from .gcp import add_gcp_routes, gcp_env
from .openapi_bodies import body_doc, slot_action_query
from .webui import StaticPathError, add_page_routes

log = logging.getLogger("llamacmp.server")

def create_app(ctx: ServerContext, tools: ToolRegistry | None = None) -> FastAPI:
    """tools: the /tools registry (agent/setup.py's start_tools); None: --tools' built-ins with no runtime."""
    app = FastAPI(title="llamacmp-server", version=ctx.build_info, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    (tools or ToolRegistry(build_tools(ctx.opts.tools))).add_routes(app)
    _add_routes(app, ctx)
    app.add_middleware(Gate, ctx=ctx)
    app.add_middleware(AccessLog)       # outermost: it sees every answer, the gate's early ones too
    return app


def _post(app: FastAPI, paths: list[str], handler, doc: str, listed: bool = True, query: list | None = None) -> None:
    """listed=False: the route answers (llama.cpp's 501 for a feature that is off) but is not in the OpenAPI
    document, which describes what this server actually serves."""
    for p in paths:
        app.add_api_route(p, handler, methods=["POST"], openapi_extra=body_doc(doc, query), include_in_schema=listed)


def _add_routes(app: FastAPI, ctx: ServerContext) -> None:
    async def health():
        if ctx.engine.failed:            # the engine thread stopped for good: the process is on its way out
            raise ApiError(f"the engine has stopped: {ctx.engine.failed}", "unavailable_error")
        if ctx.engine.wake_error:        # asleep and the model could not be loaded again (the next request retries)
            raise ApiError(ctx.engine.wake_error, "unavailable_error")
        return {"status": "ok"}

    async def models():
        return misc.models_json(ctx)

    async def completion(request: Request):
        return await completions.handle_native(ctx, request, await read_body(request))

    async def oai_completion(request: Request):
        return await completions.handle_oai_completion(ctx, request, await read_body(request))

    async def chat(request: Request):
        return await chat_api.handle_chat(ctx, request, await read_body(request))

    async def messages(request: Request):
        return await anthropic.handle_messages(ctx, request, await read_body(request))

    async def count_tokens(request: Request):
        return await anthropic.handle_count_tokens(ctx, await read_body(request))

    async def chat_input_tokens(request: Request):
        return await chat_api.handle_input_tokens(ctx, await read_body(request))

    async def responses_input_tokens(request: Request):
        return await chat_api.handle_input_tokens(ctx, responses.to_chat_body(await read_body(request)))

    async def oai_responses(request: Request):
        return await responses.handle_responses(ctx, request, await read_body(request))

    async def fim(request: Request):
        return await infill.handle_infill(ctx, request, await read_body(request))

    async def apply_template(request: Request):
        return await chat_api.handle_apply_template(ctx, await read_body(request))

    async def tokenize(request: Request):
        return await ctx.prep(misc.tokenize, ctx, await read_body(request), request=request)

    async def detokenize(request: Request):
        return await ctx.prep(misc.detokenize, ctx, await read_body(request), request=request)

    async def props():
        return misc.props_json(ctx)

    async def set_props(request: Request):
        if not ctx.opts.endpoint_props:
            raise not_supported("This server does not support changing global properties. Start it with `--props`")
        await read_body(request)
        return {"success": True}

    async def slots(request: Request):
        return await misc.slots(ctx, request.query_params.get("fail_on_no_slot", "") in ("1", "true"))

    async def slot_action(id_slot: str, request: Request):
        return await misc.slot_action(ctx, id_slot, request.query_params.get("action", ""), await read_body(request))

    async def metrics():
        return await misc.metrics(ctx)

    async def embeddings(request: Request):
        oai = request.url.path.startswith("/v1/")        # /embedding, /embeddings: llama.cpp's own shape
        return await handle_embeddings(ctx, await read_body(request), oai)

    async def rerank(request: Request):
        raise not_supported("This server does not support reranking. Start it with `--reranking`")

    for p in ("/health", "/v1/health"):
        app.add_api_route(p, health, methods=["GET"])
    for p in ("/models", "/v1/models"):
        app.add_api_route(p, models, methods=["GET"])
    _post(app, ["/completion", "/completions"], completion, "completion")
    _post(app, ["/v1/completions"], oai_completion, "completion")
    _post(app, ["/chat/completions", "/v1/chat/completions"], chat, "chat")
    _post(app, ["/v1/messages"], messages, "object")
    _post(app, ["/v1/messages/count_tokens"], count_tokens, "object")
    _post(app, ["/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"], chat_input_tokens, "chat")
    _post(app, ["/v1/responses", "/responses"], oai_responses, "object")
    _post(app, ["/responses/input_tokens", "/v1/responses/input_tokens"], responses_input_tokens, "object")
    _post(app, ["/infill"], fim, "object")
    _post(app, ["/apply-template"], apply_template, "chat")
    _post(app, ["/tokenize"], tokenize, "tokenize")
    _post(app, ["/detokenize"], detokenize, "detokenize")
    app.add_api_route("/props", props, methods=["GET"])
    _post(app, ["/props"], set_props, "object", listed=ctx.opts.endpoint_props)
    app.add_api_route("/slots", slots, methods=["GET"], include_in_schema=ctx.opts.endpoint_slots)
    _post(app, ["/slots/{id_slot}"], slot_action, "slot_action", query=slot_action_query(bool(ctx.opts.slot_save_path)))
    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=ctx.opts.endpoint_metrics)
    _post(app, ["/embedding", "/embeddings", "/v1/embeddings"], embeddings, "object", listed=ctx.opts.embedding)
    _post(app, ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"], rerank, "object", listed=False)
    add_cors_proxy_route(app, ctx.opts)
    add_page_routes(app, ctx.opts)
    env = gcp_env()
    if env is not None:                 # last: its names map to every route above
        add_gcp_routes(app, env, health, read_body)


# -- main ------------------------------------------------------------------------------------------------------------

def _load_in_background(ctx: ServerContext, address: str) -> None:
    def run() -> None:
        try:
            from ..backends.select import select_backends
            log.info("main: loading model")
            ctx.load(*select_backends(ctx.params, sys.stderr))
        except Exception as e:           # keep answering 503 and say why; a bad model file is not a crash
            ctx.load_error = str(e)
            log.error("failed to load model: %s", e)
            os._exit(1)
        log.info("main: model loaded")
        log.info("main: server is listening on %s", address)
        log.info("main: starting the main loop...")
        slot_log.all_idle()
    threading.Thread(target=run, name="llamacmp-loader", daemon=True).start()


def _gcp_port(params) -> None:
    """Vertex AI tells the container its port in AIP_HTTP_PORT: it wins over --port, as in llama-server."""
    env = gcp_env()
    if env is None:
        return
    log.info("Google Cloud Platform compat: health route = %s, predict route = %s, port = %d",
             env.health_route, env.predict_route, env.port)
    if params.server.port != env.port:
        log.warning("Google Cloud Platform compat: overriding server port %d with AIP_HTTP_PORT %d",
                    params.server.port, env.port)
    params.server.port = env.port


def main(argv: list[str] | None = None) -> None:
    import uvicorn
    from .listen import listen_sockets, listening_address, uvicorn_kwargs, with_prefix
    from .serve import ToolServer
    from ..args import parse_or_exit
    from ..args import version_text
    from ..log import setup_python_logging
    params = parse_or_exit("server", argv)
    setup_python_logging(params)
    number, built = version_text().splitlines()
    log.info("build: %s %s", number.removeprefix("version: "), built.removeprefix("built "))   # llama.cpp's line
    if not params.model:
        from .router import main as router_main      # no -m: llama-server's router mode (router.py)
        return router_main(params)
    _gcp_port(params)
    try:
        kw = uvicorn_kwargs(params)
        sockets = listen_sockets(params)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(1) from None
    if params.n_parallel < 0:
        log.info("main: n_parallel is set to auto, using n_parallel = 4 and kv_unified = true")
    ctx = ServerContext(params)
    try:
        tools = start_tools(params.server)
        app = with_prefix(create_app(ctx, tools), params.server.api_prefix)
    except (StaticPathError, ValueError, RuntimeError) as e:   # ValueError: AIP_PREDICT_ROUTE names our route
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(1) from None
    # SIGTERM / Ctrl-C: stop accepting, give requests in flight up to --timeout seconds, then cancel them
    server = ToolServer(uvicorn.Config(app, log_level="warning", timeout_keep_alive=params.server.timeout,
                                       timeout_graceful_shutdown=params.server.timeout, **kw), tools)

    def engine_failed(reason: str) -> None:
        sys.stderr.write(f"error: the engine has stopped: {reason}\n")
        server.should_exit = True
    ctx.on_fatal = engine_failed
    _load_in_background(ctx, listening_address(params))
    try:
        server.run(sockets=sockets)
    finally:
        tools.close()
    if ctx.engine is not None:
        ctx.engine.stop()
        if ctx.engine.failed:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
