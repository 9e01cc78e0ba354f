"""/embedding (llama.cpp's own shape) and /v1/embeddings (OpenAI's), as llama-server answers them with
--embeddings: the input checks, the response shapes, base64 encoding. The vectors are embedding.py's, computed on
the engine thread."""
from __future__ import annotations

import base64

import numpy as np
from starlette.responses import JSONResponse, Response

from ..engine.tasks import ErrorResult
from .context import ServerContext
from .errors import ApiError, bad_request, not_supported
from .schemas import tokenize_prompts


async def handle_embeddings(ctx: ServerContext, body: dict, oai: bool) -> Response:
    opts = ctx.opts
    if not opts.embedding:
        raise not_supported("This server does not support embeddings. Start it with `--embeddings`")
    if oai and opts.pooling == "none":
        raise bad_request("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    if "input" in body:
        prompt = body["input"]
    elif "content" in body:
        prompt, oai = body["content"], False        # "content" is not OpenAI's field: llama.cpp's shape
    else:
        raise bad_request('"input" or "content" must be provided')
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request("The format to return the embeddings in. Can be either float or base64")
    prompt = [_content_text(p) for p in prompt] if isinstance(prompt, list) else _content_text(prompt)
    prompts = await ctx.prep(tokenize_prompts, prompt, ctx.tokenizer, ctx.n_vocab)
    if any(not p for p in prompts):
        raise bad_request("Input content cannot be empty")
    norm = body.get("embd_normalize", opts.embd_normalize)
    if isinstance(norm, bool) or not isinstance(norm, int):
        raise bad_request("embd_normalize must be an integer")
    for p in prompts:
        _check_context(ctx, len(p), opts.pooling)
    result = await ctx.bridge.embed(prompts, opts.pooling, norm)
    if isinstance(result, ErrorResult):
        raise ApiError(result.message, result.type)
    if not oai:
        return JSONResponse([{"index": i, "embedding": e} for i, e in enumerate(result)])
    data = [{"embedding": _encoded(e[0]) if fmt == "base64" else e[0], "index": i, "object": "embedding",
             **({"encoding_format": "base64"} if fmt == "base64" else {})} for i, e in enumerate(result)]
    n = sum(len(p) for p in prompts)
    return JSONResponse({"model": ctx.model_name, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n},
                         "data": data})


_MEDIA = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}


def _content_text(entry):
    """An input entry as llama-server 0c1e570 reads it: {"content": [OpenAI content parts]} is the text of its parts
    joined with nothing (tokenized as a string prompt); anything else is left to tokenize_prompts. This server
    embeds no media (llama-server's words when it has no projector)."""
    if not (isinstance(entry, dict) and "content" in entry):
        return entry
    parts = entry["content"]
    if not isinstance(parts, list):
        raise bad_request('"content" must be an array')
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _MEDIA:
            raise bad_request(f"{_MEDIA[kind]} input is not supported - hint: if this is unexpected, you may need "
                              "to provide the mmproj")
        if kind != "text":
            raise bad_request("unsupported content[].type")
    return "".join(p.get("text") if isinstance(p.get("text"), str) else "" for p in parts)


def _check_context(ctx: ServerContext, n: int, pooling: str) -> None:
    """Each input must fit one slot's context, as llama-server checks it per input (the message depends on whether
    its pooling lets the input be split into batches: only 'last' does). llamacmp has no per-ubatch limit: it
    runs a long input in ubatch chunks."""
    if pooling == "last" and n >= ctx.n_ctx_slot:
        message = f"request ({n} tokens) exceeds the available context size ({ctx.n_ctx_slot} tokens), try increasing it"
    elif pooling != "last" and n > ctx.n_ctx_slot:
        message = f"input ({n} tokens) is larger than the max context size ({ctx.n_ctx_slot} tokens). skipping"
    else:
        return
    raise ApiError(message, "exceed_context_size_error", {"n_prompt_tokens": n, "n_ctx": ctx.n_ctx_slot})


def _encoded(v: list[float]) -> str:
    return base64.b64encode(np.asarray(v, np.float32).tobytes()).decode()
