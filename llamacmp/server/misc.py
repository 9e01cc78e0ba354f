"""The small endpoints: models, props, tokenize/detokenize, slots, metrics."""
from __future__ import annotations

import os
import time

from starlette.responses import JSONResponse, PlainTextResponse, Response

from ..engine.perf import STEP_PARTS
from ..engine.tasks import ErrorResult
from ..gguf_file import file_type_name
from ..vision.prompt import MEDIA_MARKER
from .completions import generation_settings
from .context import ServerContext
from .errors import ApiError, bad_request, not_supported
from .schemas import Fields
from .validate import ascii_int, json_type


def models_json(ctx: ServerContext) -> dict:
    name = ctx.model_name
    cfg, gguf = ctx.lm.cfg, ctx.lm.gguf
    meta = {"vocab_type": 2, "n_vocab": cfg.n_vocab, "n_ctx": ctx.n_ctx_slot, "n_ctx_train": cfg.n_ctx_train,
            "n_embd": cfg.n_embd, "n_params": _n_params(ctx), "size": _file_size(gguf),
            "ftype": file_type_name(gguf.metadata)}
    return {"models": [{"name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
                        "description": "", "tags": [""],
                        "capabilities": ["completion", "multimodal"] if ctx.vision is not None else ["completion"],
                        "parameters": "",
                        "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                                    "parameter_size": "", "quantization_level": ""}}],
            "object": "list",
            # 0c1e570: the aliases (a sorted set, args.py), the model's name when none was given; --tags as given
            "data": [{"id": name, "aliases": list(ctx.opts.aliases) or [name], "tags": list(ctx.opts.tags),
                      "object": "model",
                      "created": int(time.time()), "owned_by": "llamacpp", "meta": meta}]}


def _n_params(ctx: ServerContext) -> int:
    g = ctx.lm.gguf
    return sum(_prod(g.info(n).shape) for n in g.names())


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _file_size(gguf) -> int:
    import os
    try:
        return os.path.getsize(gguf.path)
    except OSError:
        return 0


def props_json(ctx: ServerContext) -> dict:
    from .completions import GenParams
    d = ctx.defaults
    params = generation_settings(ctx, GenParams(sampling=d.sampling, n_predict=d.n_predict, stop=list(d.stop)))
    tok = ctx.tokenizer
    eos = tok.tokens[tok.eos_id] if tok.eos_id is not None else ""
    bos = tok.tokens[tok.bos_id] if tok.bos_id is not None else ""
    return {"default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": ctx.n_ctx_slot, "speculative": ctx.spec.enabled,
                                            "is_processing": False, "params": params},
            "total_slots": ctx.n_slots, "model_alias": ctx.model_name,
            "model_ftype": file_type_name(ctx.lm.gguf.metadata), "model_path": ctx.params.model,
            "modalities": {"vision": ctx.vision is not None, "video": False, "audio": False},
            "media_marker": MEDIA_MARKER, "endpoint_slots": ctx.opts.endpoint_slots,
            "endpoint_props": ctx.opts.endpoint_props, "endpoint_metrics": ctx.opts.endpoint_metrics,
            "webui": ctx.opts.webui, "webui_settings": {},
            "ui": ctx.opts.webui, "ui_settings": {}, "chat_template": ctx.template.source,
            "chat_template_caps": _template_caps(ctx),
            "bos_token": bos, "eos_token": eos, "build_info": ctx.build_info, "is_sleeping": ctx.engine.sleeping,
            "cors_proxy_enabled": ctx.opts.ui_mcp_proxy}       # --webui-mcp-proxy


def _template_caps(ctx: ServerContext) -> dict:
    if ctx.template_caps is None:
        from .template_caps import template_caps
        ctx.template_caps = template_caps(ctx.template.source)
    return ctx.template_caps


def tokenize(ctx: ServerContext, body: dict) -> Response:
    f = Fields(body)
    tok = ctx.tokenizer
    content = f.raw("content")
    if content is None:
        return JSONResponse({"tokens": []})
    if not isinstance(content, str):
        raise bad_request('"content" must be a string')
    ids = tok.encode(content, parse_special=f.bool("parse_special", True), add_special=f.bool("add_special", False))
    if not f.bool("with_pieces", False):
        return JSONResponse({"tokens": ids})
    out = []
    for i in ids:
        piece = tok.token_to_piece(i, True)
        try:
            out.append({"id": i, "piece": piece.decode("utf-8")})
        except UnicodeDecodeError:
            out.append({"id": i, "piece": list(piece)})
    return JSONResponse({"tokens": out})


def detokenize(ctx: ServerContext, body: dict) -> Response:
    """As llama-server: no "tokens" gives empty content; numbers convert as it converts them (1.5 -> 1, true -> 1).
    A non-array, or an element that is not a number or a boolean, gets nlohmann::json's type_error text as
    llama-server sends it, but as a 400: it is the client's bad input, and a 5xx would tell load balancers and
    API fuzzers (issue 5: schemathesis, zero 5xx) that the server failed (llama-server answers 500). A token id
    outside the vocabulary answers 400 too (llama-server fails a range check: 500). compat/DIFFERENCES.md lists both."""
    if "tokens" not in body:
        return JSONResponse({"content": ""})
    toks = body["tokens"]
    if not isinstance(toks, list):
        raise bad_request(f"[json.exception.type_error.302] type must be array, but is {json_type(toks)}")
    ids = []
    for t in toks:
        if not isinstance(t, (bool, int, float)):
            raise bad_request(f"[json.exception.type_error.302] type must be number, but is {json_type(t)}")
        try:
            ids.append(int(t))
        except (OverflowError, ValueError):      # NaN / Infinity (Python's parser accepts them)
            raise bad_request(f"invalid token id {t}") from None
    bad = [t for t in ids if not 0 <= t < ctx.n_vocab]
    if bad:
        raise bad_request(f"invalid token id {bad[0]} (vocabulary has {ctx.n_vocab} tokens)")
    return JSONResponse({"content": ctx.tokenizer.decode(ids)})


async def slots(ctx: ServerContext, fail_on_no_slot: bool) -> Response:
    if not ctx.opts.endpoint_slots:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    data = await ctx.bridge.query("slots")
    if fail_on_no_slot and all(s["is_processing"] for s in data):
        raise ApiError("no slot available", "unavailable_error")
    return JSONResponse(data)


def _slot_file(ctx: ServerContext, filename: str) -> str:
    """llama.cpp's fs_validate_filename in spirit: a plain file name inside --slot-save-path, nothing else."""
    bad = (not filename or len(filename) > 255 or filename in (".", "..") or any(c in filename for c in "/\\\0")
           or filename != filename.strip())
    if bad:
        raise bad_request("Invalid filename")
    return os.path.join(ctx.opts.slot_save_path, filename)


async def slot_action(ctx: ServerContext, id_slot: str, action: str, body: dict) -> Response:
    if action not in ("save", "restore", "erase"):
        raise bad_request("Invalid action")
    if ascii_int(id_slot) is None or id_slot.startswith("-"):
        raise bad_request("Invalid slot ID")
    filename, path = Fields(body).str("filename"), ""
    if action in ("save", "restore"):
        if not ctx.opts.slot_save_path:
            raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")
        path = _slot_file(ctx, filename)
    r = await ctx.bridge.slot_action(action, int(id_slot), filename, path)
    if isinstance(r, ErrorResult):
        raise ApiError(r.message, r.type, r.extra)
    return JSONResponse(r)


METRICS = (  # (type, name, help, how to compute from the engine's snapshot): llama-server 0c1e570's list and order
    ("counter", "prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
     lambda m: m["n_prompt_tokens_processed_total"]),
    ("counter", "prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
     lambda m: m["n_prompt_tokens_cached_total"]),
    ("counter", "prompt_seconds_total", "Total time spent processing prompts",
     lambda m: m["t_prompt_processing_total"] / 1e3),
    ("counter", "tokens_predicted_total", "Number of generation tokens processed",
     lambda m: m["n_tokens_predicted_total"]),
    ("counter", "tokens_predicted_seconds_total", "Total time spent generating tokens",
     lambda m: m["t_tokens_generation_total"] / 1e3),
    ("counter", "n_decode_total",
     "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
     lambda m: m["n_decode_total"]),
    ("counter", "n_tokens_max", "Largest observed sequence length (prompt + generation)",
     lambda m: m["n_tokens_max"]),
    ("counter", "spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
     lambda m: m["n_draft_tokens_total"]),
    ("counter", "spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
     lambda m: m["n_draft_accepted_total"]),
    ("counter", "spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
     lambda m: m["n_draft_steps_total"]),
    # averaged over the window since the previous scrape, as 0c1e570 (b8462: since the server started)
    ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s",
     lambda m: 1e3 * m["window_n_prompt_tokens_processed_total"] / m["window_t_prompt_processing_total"]
     if m["window_t_prompt_processing_total"] else 0.0),
    ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s",
     lambda m: 1e3 * m["window_n_tokens_predicted_total"] / m["window_t_tokens_generation_total"]
     if m["window_t_tokens_generation_total"] else 0.0),
    ("gauge", "requests_processing", "Number of requests processing", lambda m: m["requests_processing"]),
    ("gauge", "requests_deferred", "Number of requests deferred", lambda m: m["requests_deferred"]),
    # b8462 listed it among the counters; an average is a gauge (0c1e570)
    ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
     lambda m: m["n_busy_slots_total"] / max(1, m["n_decode_total"])),
)


def spec_round_lines(counts: dict) -> list[str]:
    """llamacmp-only (compat/DIFFERENCES.md): the MTP draft policy's rounds per number of sequences S and kind
    (Speculator.round_counts), one sample each; nothing when no round has run with adaptive drafting."""
    if not counts:
        return []
    name = "llamacmp:spec_rounds_total"
    return ([f"# HELP {name} Speculative (llamacmp): rounds by number of sequences and the draft policy's decision",
             f"# TYPE {name} counter"]
            + [f'{name}{{seqs="{S}",kind="{kind}"}} {n}' for S, row in counts.items() for kind, n in row.items()])


def plain_step_lines(rows: dict) -> list[str]:
    """llamacmp-only: where the plain decode steps' wall time went, per number of rows S and part
    (engine/perf.py StepClock: between, launch, overlap, wait), and how many steps that covers; nothing before a
    run of two plain steps of the same rows."""
    if not rows:
        return []
    secs, steps = "llamacmp:plain_step_seconds_total", "llamacmp:plain_steps_total"
    return ([f"# HELP {secs} llamacmp: plain decode steps' wall time by rows and part (from the previous step's "
             "tokens to this step's)", f"# TYPE {secs} counter"]
            + [f'{secs}{{seqs="{S}",part="{part}"}} {row[part]:.6f}' for S, row in rows.items()
               for part in STEP_PARTS]
            + [f"# HELP {steps} llamacmp: plain decode steps timed in {secs}", f"# TYPE {steps} counter"]
            + [f'{steps}{{seqs="{S}"}} {row["steps"]}' for S, row in rows.items()])


def spec_vocab_lines(state: dict) -> list[str]:
    """llamacmp-only: the MTP draft's LM head rows now (--spec-draft-vocab; auto moves them), auto's switches and
    the rows it reads through its CQ2 coarse copy (--spec-draft-coarse) (Speculator.vocab_state); nothing without
    speculative decoding."""
    if not state:
        return []
    rows, switches = "llamacmp:spec_draft_vocab_rows", "llamacmp:spec_draft_vocab_switches_total"
    coarse = "llamacmp:spec_draft_coarse_rows"
    return [f"# HELP {rows} Speculative (llamacmp): LM head rows the MTP draft reads (--spec-draft-vocab)",
            f"# TYPE {rows} gauge", f"{rows} {state['rows']}",
            f"# HELP {switches} Speculative (llamacmp): --spec-draft-vocab auto's switches between the prefix "
            "and the whole vocabulary", f"# TYPE {switches} counter", f"{switches} {state['switches']}",
            f"# HELP {coarse} Speculative (llamacmp): of those rows, the ones the draft reads through a CQ2 copy, "
            "its best ids rescored by the exact head (--spec-draft-coarse; 0: the exact head)",
            f"# TYPE {coarse} gauge", f"{coarse} {state.get('coarse_rows', 0)}"]


async def metrics(ctx: ServerContext) -> Response:
    if not ctx.opts.endpoint_metrics:
        raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
    m = await ctx.bridge.query("metrics")
    lines = []
    for kind, name, help_text, value in METRICS:
        lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name} {value(m)}"]
    lines += spec_round_lines(m.get("spec_rounds") or {})
    lines += spec_vocab_lines(m.get("spec_vocab") or {})
    lines += plain_step_lines(m.get("plain_steps") or {})
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4",
                             headers={"Process-Start-Time-Unix": str(ctx.created)})
