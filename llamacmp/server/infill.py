"""/infill: fill-in-the-middle with Qwen's FIM tokens, in llama.cpp's repo-level layout
[<|repo_name|>myproject\\n (<|file_sep|>name\\n text)* <|file_sep|>filename\\n] <|fim_prefix|>prefix prompt
<|fim_suffix|>suffix <|fim_middle|>, trimmed to fit a batch (prefix:suffix = 3:1) as format_prompt_infill does."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from .completions import handle_native
from .context import ServerContext
from .errors import ApiError, bad_request

FIM = {"pre": "<|fim_prefix|>", "suf": "<|fim_suffix|>", "mid": "<|fim_middle|>", "rep": "<|repo_name|>",
       "sep": "<|file_sep|>"}


def _fim_ids(ctx: ServerContext) -> dict[str, int]:
    index = {t: i for i, t in enumerate(ctx.tokenizer.tokens) if t in FIM.values()}
    ids = {k: index.get(v, -1) for k, v in FIM.items()}
    missing = [FIM[k] for k in ("pre", "suf", "mid") if ids[k] < 0]
    if missing:
        raise ApiError(f"Infill is not supported by this model: {', '.join(missing)} token missing",
                       "not_supported_error")
    return ids


def _check(body: dict) -> list[dict]:
    if "prompt" in body and not isinstance(body["prompt"], str):
        raise bad_request('"prompt" must be a string')
    for key in ("input_prefix", "input_suffix"):
        if key not in body:
            raise bad_request(f'"{key}" is required')
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise bad_request('"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise bad_request('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise bad_request('extra_context chunk\'s "filename" field must be a string')
    return extra


def infill_tokens(ctx: ServerContext, body: dict) -> list[int]:
    ids, extra_chunks = _fim_ids(ctx), _check(body)
    enc = ctx.tokenizer.encode
    text = lambda v: v if isinstance(v, str) else ""            # noqa: E731 - llama.cpp's lenient read
    prefix, suffix = enc(text(body["input_prefix"])), enc(text(body["input_suffix"]))
    prompt = enc(body.get("prompt", ""), parse_special=True)
    extra: list[int] = [ids["rep"]] + enc("myproject\n") if ids["rep"] >= 0 else []
    for chunk in extra_chunks:
        extra += ([ids["sep"]] + enc(chunk.get("filename", "tmp") + "\n")) if ids["sep"] >= 0 else \
            enc("\n\n--- snippet ---\n\n")
        extra += enc(chunk["text"])
    if ids["sep"] >= 0:
        extra += [ids["sep"]] + enc("filename\n")
    n_batch, n_predict = ctx.params.n_batch, max(ctx.defaults.n_predict, 0)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)):]
    suffix = suffix[:min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))]
    n_extra = min(max(0, ctx.n_ctx_slot - n_batch - 2 * n_predict), len(extra))
    return extra[len(extra) - n_extra:] + [ids["pre"]] + prefix + prompt + [ids["suf"]] + suffix + [ids["mid"]]


async def handle_infill(ctx: ServerContext, request: Request, body: dict) -> Response:
    prompt = await ctx.prep(infill_tokens, ctx, body, request=request)
    return await handle_native(ctx, request, {**body, "prompt": prompt})
