"""/v1/messages and /v1/messages/count_tokens (Anthropic): converted to a chat request, answered in Anthropic's
shapes (content blocks thinking -> text -> tool_use; named SSE events), as llama-server does."""
from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..engine.tasks import FinalResult, PartialResult
from . import sse
from .chat_api import DeltaTracker, build_prompt, parse_reply, prepare_chat
from .completions import raise_first_error, start_stream
from .context import ServerContext, random_id
from .errors import bad_request
from .schemas import Fields


def to_chat_body(body: dict) -> dict:
    """llama.cpp's convert_anthropic_to_oai."""
    f = Fields(body)
    messages: list[dict] = []
    system = body.get("system")
    if isinstance(system, str):
        messages.append({"role": "system", "content": system})
    elif isinstance(system, list):
        text = "".join(_text(b, f"system[{i}]") for i, b in enumerate(system)
                       if isinstance(b, dict) and b.get("type") == "text")
        messages.append({"role": "system", "content": text})
    if "messages" not in body:
        raise bad_request("'messages' is required")
    for i, msg in enumerate(f.list("messages")):
        messages.extend(_convert_message(msg, f"messages[{i}]"))
    out: dict = {"messages": messages, "max_tokens": body.get("max_tokens", 4096)}
    tools = [t for t in f.list("tools") if isinstance(t, dict)]
    if tools:
        out["tools"] = [{"type": "function", "function": {"name": Fields(t).str("name"),
                                                          "description": Fields(t).str("description"),
                                                          "parameters": Fields(t).dict("input_schema")}}
                        for t in tools]
    tc = Fields(Fields(body).dict("tool_choice")).str("type")
    if tc in ("auto", "none"):
        out["tool_choice"] = tc
    elif tc in ("any", "tool"):
        out["tool_choice"] = "required"
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    for key in ("temperature", "top_p", "top_k", "stream"):
        if key in body:
            out[key] = body[key]
    thinking = Fields(Fields(body).dict("thinking"))
    if thinking.str("type") == "enabled":
        out["thinking_budget_tokens"] = thinking.int("budget_tokens", 10000)
    if thinking.str("type") in ("enabled", "disabled"):    # per-request switch (llama.cpp PR #21470)
        out["chat_template_kwargs"] = {"enable_thinking": thinking.str("type") == "enabled"}
    return out


def _text(block: dict, where: str) -> str:
    """A text block's text; another type there is the client's 400, not a crash or a silent ''."""
    t = block.get("text", "")
    if not isinstance(t, str):
        raise bad_request(f"'{where}.text' must be a string")
    return t


def _convert_message(msg, where: str) -> list[dict]:
    if not isinstance(msg, dict):
        return []
    content = msg.get("content")
    if not isinstance(content, list):
        return [] if content is None and msg.get("role") == "assistant" else [msg]
    texts, calls, results, reasoning = [], [], [], ""
    for j, block in enumerate(content):
        b = Fields(block)
        kind = b.str("type")
        if kind == "text":
            texts.append({"type": "text", "text": _text(b.body, f"{where}.content[{j}]")})
        elif kind == "thinking":
            reasoning += b.str("thinking")
        elif kind == "tool_use":
            if not isinstance(b.body.get("input", {}), dict):
                raise bad_request(f"'{where}.content[{j}].input' must be an object")
            calls.append({"id": b.str("id"), "type": "function",
                          "function": {"name": b.str("name"), "arguments": json.dumps(b.dict("input"))}})
        elif kind == "tool_result":
            results.append({"role": "tool", "tool_call_id": b.str("tool_use_id"),
                            "content": _result_text(b, f"{where}.content[{j}]")})
        elif kind == "image":
            texts.append({"type": "image_url"})      # refused later with llama.cpp's "image input" message
    out = []
    if texts or calls or reasoning:
        m: dict = {"role": msg.get("role"), "content": texts if texts else ""}
        if calls:
            m["tool_calls"] = calls
        if reasoning:
            m["reasoning_content"] = reasoning
        out.append(m)
    return out + results


def _result_text(b: Fields, where: str) -> str:
    c = b.raw("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(_text(x, f"{where}.content[{k}]") for k, x in enumerate(c)
                       if isinstance(x, dict) and x.get("type") == "text")
    return ""


def stop_reason(r: FinalResult, has_calls: bool) -> str:
    if r.stop_type in ("word", "eos"):
        return "tool_use" if has_calls else "end_turn"
    return "max_tokens"


def _usage(r, output_tokens: int) -> dict:
    return {"cache_read_input_tokens": r.n_cached if isinstance(r, FinalResult) else 0,
            "input_tokens": r.n_prompt - (r.n_cached if isinstance(r, FinalResult) else 0),
            "output_tokens": output_tokens}


async def handle_messages(ctx: ServerContext, request: Request, body: dict) -> Response:
    chat = to_chat_body(body)
    cp, params, tasks = await ctx.prep(prepare_chat, ctx, chat, request=request)
    mid = "msg_" + random_id()
    if params.stream:
        return await start_stream(ctx, tasks, _Events(ctx, cp, mid), done=False, error_event="error", request=request)
    results = await ctx.bridge.collect(tasks, request)
    raise_first_error(results)
    r = results[0]
    msg = parse_reply(cp, r.text)
    blocks: list[dict] = []
    if msg.reasoning_content:
        blocks.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
    if msg.content:
        blocks.append({"type": "text", "text": msg.content})
    for c in msg.tool_calls:
        blocks.append({"type": "tool_use", "id": random_id(), "name": c.name, "input": json.loads(c.arguments)})
    return JSONResponse({"id": mid, "type": "message", "role": "assistant", "content": blocks,
                         "model": ctx.model_name, "stop_reason": stop_reason(r, bool(msg.tool_calls)),
                         "stop_sequence": r.stopping_word or None, "usage": _usage(r, r.n_predicted)})


class _Events:
    """Streamed results -> Anthropic events; block indices: thinking 0, text next, then one per tool call."""

    def __init__(self, ctx: ServerContext, cp, mid: str):
        self.ctx, self.mid, self.tracker = ctx, mid, DeltaTracker(cp)
        self.open: dict[str, int] = {}      # block kind ("thinking", "text", "tool0", ...) -> index

    def __call__(self, r) -> list[str]:
        if isinstance(r, PartialResult) and r.progress is not None:
            return []                    # these APIs have no prompt-progress event
        out = []
        if isinstance(r, PartialResult) and r.n_predicted == 1:
            out.append(sse.event("message_start", {"type": "message_start", "message": {
                "id": self.mid, "type": "message", "role": "assistant", "content": [], "model": self.ctx.model_name,
                "stop_reason": None, "stop_sequence": None, "usage": _usage(r, 0)}}))
        final = isinstance(r, FinalResult)
        for delta in self.tracker.push("" if final else r.text, final=final):
            out += self._delta(delta)
        if final:
            out += self._close(r)
        return out

    def _start(self, kind: str, block: dict) -> list[str]:
        if kind in self.open:
            return []
        self.open[kind] = len(self.open)
        return [sse.event("content_block_start", {"type": "content_block_start", "index": self.open[kind],
                                                  "content_block": block})]

    def _block_delta(self, kind: str, delta: dict) -> str:
        return sse.event("content_block_delta", {"type": "content_block_delta", "index": self.open[kind],
                                                 "delta": delta})

    def _delta(self, d: dict) -> list[str]:
        if "reasoning_content" in d:
            return self._start("thinking", {"type": "thinking", "thinking": ""}) + \
                [self._block_delta("thinking", {"type": "thinking_delta", "thinking": d["reasoning_content"]})]
        if "content" in d:
            return self._start("text", {"type": "text", "text": ""}) + \
                [self._block_delta("text", {"type": "text_delta", "text": d["content"]})]
        out = []
        for call in d.get("tool_calls", []):
            kind = f"tool{call['index']}"
            out += self._start(kind, {"type": "tool_use", "id": call["id"], "name": call["function"]["name"]})
            out.append(self._block_delta(kind, {"type": "input_json_delta",
                                                "partial_json": call["function"]["arguments"]}))
        return out

    def _close(self, r: FinalResult) -> list[str]:
        out = []
        for kind, index in self.open.items():
            if kind == "thinking":
                out.append(self._block_delta(kind, {"type": "signature_delta", "signature": ""}))
            out.append(sse.event("content_block_stop", {"type": "content_block_stop", "index": index}))
        has_calls = any(k.startswith("tool") for k in self.open)
        out.append(sse.event("message_delta", {"type": "message_delta", "delta": {
            "stop_reason": stop_reason(r, has_calls), "stop_sequence": r.stopping_word or None},
            "usage": {"output_tokens": r.n_predicted}}))
        out.append(sse.event("message_stop", {"type": "message_stop"}))
        return out


async def handle_count_tokens(ctx: ServerContext, body: dict) -> Response:
    cp = await ctx.prep(build_prompt, ctx, to_chat_body(body))
    return JSONResponse({"input_tokens": len(cp.tokens)})
