"""/completion (native), /v1/completions (OpenAI) and /infill: request -> tasks -> JSON or SSE."""
from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..engine.tasks import CompletionTask, ErrorResult, FinalResult, GenParams, PartialResult, TokenProb
from . import sse
from .context import ServerContext, random_id
from .errors import ApiError, bad_request
from .prep_cancel import step
from .schemas import Fields, gen_params, oai_stop, tokenize_prompts
from .validate import MAX_GRAMMAR_BYTES, MAX_N_PROBS

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# -- building tasks -------------------------------------------------------------------------------------------

def check_context(ctx: ServerContext, prompt: list[int]) -> None:
    if len(prompt) >= ctx.n_ctx_slot:
        raise ApiError(f"request ({len(prompt)} tokens) exceeds the available context size ({ctx.n_ctx_slot} "
                       "tokens), try increasing it", "exceed_context_size_error",
                       {"n_prompt_tokens": len(prompt), "n_ctx": ctx.n_ctx_slot})
    if not prompt:
        raise bad_request("empty prompt")


def make_tasks(ctx: ServerContext, prompts: list[list[int]], params: GenParams, body: dict,
               hints: tuple[int, ...] = ()) -> list[CompletionTask]:
    """One task per prompt and per completion (n_cmpl / n), each with its own sampler seed stream."""
    f = Fields(body)
    n_cmpl = f.int("n_cmpl", f.int("n", 1))
    if n_cmpl < 1 or n_cmpl > ctx.n_slots:
        raise bad_request(f"n_cmpl must be between 1 and the number of slots ({ctx.n_slots})")
    tasks = []
    for i, prompt in enumerate(prompts):
        check_context(ctx, prompt)
        for j in range(n_cmpl):
            p = params if n_cmpl == 1 else replace(params, sampling=replace(
                params.sampling, seed=params.sampling.seed + j if params.sampling.seed >= 0 else -1))
            tasks.append(CompletionTask(prompt, p, sink=None, index=i * n_cmpl + j, checkpoint_hints=hints))
    return tasks


# -- JSON pieces ------------------------------------------------------------------------------------------------

def probs_json(ctx: ServerContext, probs: list[TokenProb], post_sampling: bool) -> list[dict]:
    tok = ctx.tokenizer

    def entry(tid: int, logprob: float) -> dict:
        piece = tok.token_to_piece(tid, True)
        text = piece.decode("utf-8", errors="ignore")
        key, value = ("prob", _exp(logprob)) if post_sampling else ("logprob", logprob)
        return {"id": tid, "token": text, "bytes": list(piece), key: value}
    out = []
    for p in probs:
        e = entry(p.id, p.logprob)
        e["top_probs" if post_sampling else "top_logprobs"] = [entry(t, lp) for t, lp in p.top]
        out.append(e)
    return out


def _exp(x: float) -> float:
    import math
    return math.exp(x)


def logit_bias_json(biases: dict[int, float], banned: frozenset[int] | tuple = ()) -> list[dict]:
    """As llama-server lists the biases in effect: {"bias", "token"} objects, -inf written as null (nlohmann::json
    writes non-finite numbers so); `banned` (with ignore_eos: every end-of-generation token) follows at -inf, as
    llama-server appends those to the request's own."""
    pairs = list(biases.items()) + [(t, float("-inf")) for t in sorted(banned)]
    return [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in pairs]


def generation_settings(ctx: ServerContext, p: GenParams) -> dict:
    s, sp = p.sampling, ctx.spec        # b8462's speculative.* fields, with the --spec-* values when drafting
    return {"seed": s.seed if s.seed >= 0 else 4294967295, "temperature": s.temp, "top_k": s.top_k,
            "top_p": s.top_p, "min_p": s.min_p, "typical_p": s.typ_p, "repeat_last_n": s.penalty_last_n,
            "repeat_penalty": s.penalty_repeat, "presence_penalty": s.penalty_present,
            "frequency_penalty": s.penalty_freq, "min_keep": s.min_keep, "n_predict": p.n_predict,
            "n_keep": p.n_keep, "n_probs": p.n_probs, "stream": p.stream, "ignore_eos": s.ignore_eos,
            "logit_bias": logit_bias_json(s.logit_bias, ctx.tokenizer.eog_ids if s.ignore_eos else ()),
            "stop": p.stop, "samplers": list(s.samplers), "post_sampling_probs": p.post_sampling_probs,
            "timings_per_token": p.timings_per_token, "n_ctx": ctx.n_ctx_slot, "model": ctx.model_name,
            "speculative.n_max": sp.n_max if sp.enabled else 0, "speculative.n_min": sp.n_min if sp.enabled else 0,
            "chat_format": "Content-only",
            "reasoning_format": ctx.params.reasoning_format,
            # dry_penalty_last_n -1 (the command line's default) reads as the slot's context, as a request's does
            "dynatemp_range": s.dynatemp_range, "dynatemp_exponent": s.dynatemp_exponent,
            "top_n_sigma": s.top_n_sigma, "xtc_probability": s.xtc_probability, "xtc_threshold": s.xtc_threshold,
            "dry_multiplier": s.dry_multiplier, "dry_base": s.dry_base, "dry_allowed_length": s.dry_allowed_length,
            "dry_penalty_last_n": ctx.n_ctx_slot if s.dry_penalty_last_n == -1 else s.dry_penalty_last_n,
            "dry_sequence_breakers": list(s.dry_sequence_breakers), "mirostat": s.mirostat,
            "mirostat_tau": s.mirostat_tau, "mirostat_eta": s.mirostat_eta, "max_tokens": p.n_predict, "n_discard": 0,
            "grammar": "", "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": [],
            "reasoning_in_content": False, "generation_prompt": "",
            "speculative.p_min": sp.p_min if sp.enabled else 0.75, "speculative.type": sp.type, "speculative.ngram_size_n": 1024, "speculative.ngram_size_m": 1024,
            "speculative.ngram_m_hits": 1024, "backend_sampling": False, "lora": []}


def native_final(ctx: ServerContext, r: FinalResult, p: GenParams, response_fields: list[str]) -> dict:
    res = {"index": r.index, "content": "" if p.stream else r.text,
           "tokens": [] if p.stream or not p.return_tokens else r.tokens, "id_slot": r.id_slot, "stop": True,
           "model": ctx.model_name, "tokens_predicted": r.n_predicted, "tokens_evaluated": r.n_prompt,
           "generation_settings": generation_settings(ctx, p),
           "prompt": ctx.tokenizer.decode([t for t in r.prompt_tokens if t >= 0]), "has_new_line": "\n" in r.text,
           "truncated": r.truncated, "stop_type": r.stop_type, "stopping_word": r.stopping_word,
           "tokens_cached": r.n_prompt + max(0, r.n_predicted - 1), "timings": r.timings.to_json()}
    if not p.stream and r.probs:
        res["completion_probabilities"] = probs_json(ctx, r.probs, p.post_sampling_probs)
    return nested_fields(response_fields, res) if response_fields else res


def verbose_json(ctx: ServerContext, body: dict, r: FinalResult, p: GenParams) -> dict:
    """llama-server's "__verbose" debug field of a non-streamed OpenAI-shaped answer: the native /completion
    result (rendered prompt, settings, timings), when the request's "verbose" (0c1e570) or the server's -v asks."""
    if Fields(body).bool("verbose", ctx.params.verbosity > 9):
        return {"__verbose": native_final(ctx, r, p, [])}
    return {}


def native_partial(ctx: ServerContext, r: PartialResult, p: GenParams) -> dict:
    res = {"index": r.index, "content": r.text, "tokens": r.tokens, "stop": False, "id_slot": r.id_slot,
           "tokens_predicted": r.n_predicted, "tokens_evaluated": r.n_prompt}
    if r.timings is not None:
        res["timings"] = r.timings.to_json()
    if r.progress is not None:
        res["prompt_progress"] = r.progress
    if r.probs:
        res["completion_probabilities"] = probs_json(ctx, r.probs, p.post_sampling_probs)
    return res


def nested_fields(paths: list[str], js: dict) -> dict:
    """response_fields: keep only the listed paths ("a/b" reaches into objects); keys are the paths."""
    out = {}
    for path in paths:
        cur, ok = js, True
        for k in path.split("/"):
            if ok and isinstance(cur, dict) and k in cur:
                cur = cur[k]
            else:
                ok = False
        if ok:
            out[path] = cur
    return out


def usage_json(r: FinalResult) -> dict:
    return {"completion_tokens": r.n_predicted, "prompt_tokens": r.n_prompt,
            "total_tokens": r.n_predicted + r.n_prompt, "prompt_tokens_details": {"cached_tokens": r.n_cached}}


def finish_reason(r: FinalResult) -> str:
    return "stop" if r.stop_type in ("word", "eos") else "length"


def error_json(r: ErrorResult) -> dict:
    return ApiError(r.message, r.type, r.extra).to_json()


def raise_first_error(results: list) -> None:
    for r in results:
        if isinstance(r, ErrorResult):
            raise ApiError(r.message, r.type, r.extra)


def attach_grammar(ctx: ServerContext, body: dict, params: GenParams, after_think: bool = False) -> GenParams:
    """`grammar` (GBNF) or `json_schema` -> a compiled llguidance grammar; a bad one is the client's 400."""
    from ..engine.grammar import GrammarError
    f = Fields(body)
    grammar, schema = f.str("grammar"), f.raw("json_schema")
    schema = schema if isinstance(schema, dict) else None
    if grammar and schema is not None:
        raise bad_request("Cannot use both json_schema and grammar")
    if len(grammar.encode()) > MAX_GRAMMAR_BYTES or schema is not None and \
            len(json.dumps(schema).encode()) > MAX_GRAMMAR_BYTES:
        raise bad_request(f"'{'grammar' if grammar else 'json_schema'}' is larger than {MAX_GRAMMAR_BYTES} bytes")
    if not grammar and schema is None:
        return params
    step()                              # before compiling, the slowest step of a prep job
    try:
        return replace(params, grammar=ctx.engine.grammars.compile(grammar, schema, after_think))
    except GrammarError as e:
        raise bad_request(str(e)) from None


def _prepare(ctx: ServerContext, body: dict) -> tuple[GenParams, list[CompletionTask]]:
    params = attach_grammar(ctx, body, gen_params(body, ctx.defaults, ctx.tokenizer, ctx.n_vocab))
    prompt = body["prompt"]
    if isinstance(prompt, dict) and prompt.get("multimodal_data") and getattr(ctx, "vision", None) is not None:
        # {"prompt_string": "... <__media__> ...", "multimodal_data": [base64, ...]}: one marker per image
        from .vision_input import encode_prompt, multimodal_data
        if not isinstance(prompt.get("prompt_string"), str):
            raise bad_request('"prompt_string" must be a string')
        media = multimodal_data(prompt["multimodal_data"], ctx.vision)
        tokens, images = encode_prompt(ctx.vision, ctx.tokenizer, prompt["prompt_string"], media)
        tasks = make_tasks(ctx, [tokens], params, body)
        for t in tasks:
            t.images = images
        return params, tasks
    return params, make_tasks(ctx, tokenize_prompts(prompt, ctx.tokenizer, ctx.n_vocab), params, body)


# -- handlers ------------------------------------------------------------------------------------------------------

async def handle_native(ctx: ServerContext, request: Request, body: dict) -> Response:
    if "prompt" not in body:
        raise bad_request('"prompt" must be provided')
    params, tasks = await ctx.prep(_prepare, ctx, body, request=request)
    fields = [x for x in Fields(body).list("response_fields") if isinstance(x, str)]
    if params.stream:
        return await start_stream(ctx, tasks, lambda r: _native_chunks(ctx, r, params, fields), done=False,
                                  request=request)
    results = await ctx.bridge.collect(tasks, request)
    raise_first_error(results)
    out = [native_final(ctx, r, params, fields) for r in results]
    return JSONResponse(out[0] if len(out) == 1 else out)


def _native_chunks(ctx, r, params, fields) -> list[dict]:
    if isinstance(r, PartialResult):
        return [native_partial(ctx, r, params)]
    return [native_final(ctx, r, params, fields)]


async def handle_oai_completion(ctx: ServerContext, request: Request, body: dict) -> Response:
    if "prompt" not in body:
        raise bad_request('"prompt" is required')
    body = oai_stop(body)
    f = Fields(body)
    if f.bool("echo", False):
        raise bad_request("Only no echo is supported")
    for key in ("best_of", "suffix"):
        if key in body:
            raise bad_request(f"Unsupported param: {key}")
    if f.has("logprobs") and not f.has("n_probs"):
        body = {**body, "n_probs": f.int("logprobs", 0, hi=MAX_N_PROBS)}
    params, tasks = await ctx.prep(_prepare, ctx, body, request=request)
    cid, created = "cmpl-" + random_id(), int(time.time())
    if params.stream:
        return await start_stream(ctx, tasks, lambda r: [_oai_cmpl_chunk(ctx, r, params, cid, created)], done=True,
                                  request=request)
    results = await ctx.bridge.collect(tasks, request)
    raise_first_error(results)
    choices = [{"text": r.text, "index": r.index,
                "logprobs": {"content": probs_json(ctx, r.probs, params.post_sampling_probs)} if r.probs else None,
                "finish_reason": finish_reason(r)} for r in results]
    usage = _sum_usage(results)
    return JSONResponse({"choices": choices, "created": created, "model": ctx.model_name,
                         "system_fingerprint": ctx.build_info, "object": "text_completion", "usage": usage,
                         "id": cid, "timings": results[-1].timings.to_json(),
                         **verbose_json(ctx, body, results[0], params)})


def _oai_cmpl_chunk(ctx, r, params: GenParams, cid: str, created: int) -> dict:
    final = isinstance(r, FinalResult)
    probs = r.probs if not final else []
    chunk = {"choices": [{"text": "" if final else r.text, "index": r.index,
                          "logprobs": {"content": probs_json(ctx, probs, params.post_sampling_probs)} if probs
                          else None, "finish_reason": finish_reason(r) if final else None}],
             "created": created, "model": ctx.model_name, "system_fingerprint": ctx.build_info,
             "object": "text_completion", "id": cid}
    if final:
        chunk["usage"] = usage_json(r)      # llama.cpp's last /v1/completions chunk always carries usage
        chunk["timings"] = r.timings.to_json()
    elif r.progress is not None:
        if r.timings is not None:
            chunk["timings"] = r.timings.to_json()
        chunk["prompt_progress"] = r.progress
    return chunk


def _sum_usage(results: list[FinalResult]) -> dict:
    u = usage_json(results[0])
    for r in results[1:]:
        extra = usage_json(r)
        for k in ("completion_tokens", "prompt_tokens", "total_tokens"):
            u[k] += extra[k]
        u["prompt_tokens_details"]["cached_tokens"] += r.n_cached
    return u


# -- streaming ------------------------------------------------------------------------------------------------------

async def start_stream(ctx: ServerContext, tasks: list[CompletionTask], to_chunks, done: bool,
                       error_event: str = "", request: Request | None = None) -> Response:
    """Start the tasks; an error before the first result is an ordinary error response (llama.cpp does the same),
    later errors go into the stream as a data line (Anthropic: an `event: error`)."""
    results = ctx.bridge.results(tasks)
    first = await ctx.bridge.first(results, request)     # a client gone while queued frees its slot now
    if isinstance(first, ErrorResult):
        await results.aclose()
        raise ApiError(first.message, first.type, first.extra)

    async def body() -> AsyncIterator[str]:
        try:
            r = first
            while r is not None:
                if isinstance(r, ErrorResult):
                    yield sse.event(error_event, error_json(r)) if error_event else sse.error_data(error_json(r))
                    return
                for chunk in to_chunks(r):
                    yield sse.data(chunk) if not isinstance(chunk, str) else chunk
                r = await _next(results)
            if done:
                yield sse.DONE
        finally:
            await results.aclose()
    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)


async def _next(it):
    try:
        return await it.__anext__()
    except StopAsyncIteration:
        return None
