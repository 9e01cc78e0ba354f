"""/v1/responses (OpenAI Responses API): converted to a chat request; output items reasoning -> message ->
function_call, and the response.* event stream, as llama-server writes them."""
from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..engine.tasks import FinalResult, PartialResult
from . import sse
from .chat_api import DeltaTracker, parse_reply, prepare_chat
from .completions import raise_first_error, start_stream
from .context import ServerContext, random_id
from .errors import bad_request
from .schemas import Fields


def to_chat_body(body: dict) -> dict:
    """llama.cpp's convert_responses_to_chatcmpl, for text, messages, function calls and their outputs."""
    if "input" not in body:
        raise bad_request("'input' is required")
    if Fields(body).str("previous_response_id"):
        raise bad_request("llama.cpp does not support 'previous_response_id'.")
    messages: list[dict] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": Fields(body).str("instructions")})
    items = body["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            _add_item(messages, item)
    else:
        raise bad_request("'input' must be a string or an array of items")
    out = {k: v for k, v in body.items() if k not in ("input", "instructions", "max_output_tokens", "tools")}
    out["messages"] = messages
    if "max_output_tokens" in body:
        out["max_tokens"] = body["max_output_tokens"]
    tools = [t for t in Fields(body).list("tools") if isinstance(t, dict) and t.get("type") == "function"]
    if tools:
        out["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                          if k in t}} for t in tools]
    return out


def _add_item(messages: list[dict], item) -> None:
    if not isinstance(item, dict):
        raise bad_request("each 'input' item must be an object")
    kind = item.get("type", "message")
    if kind == "function_call":
        call = {"id": Fields(item).str("call_id"), "type": "function",
                "function": {"name": Fields(item).str("name"), "arguments": Fields(item).str("arguments", "{}")}}
        if messages and messages[-1].get("role") == "assistant":
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": Fields(item).str("call_id"),
                         "content": Fields(item).str("output")})
    elif kind == "message":
        messages.append({"role": Fields(item).str("role", "user"), "content": _text(item.get("content"))})
    else:
        raise bad_request(f"unsupported input item type '{kind}'")


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("message 'content' must be a string or an array")
    parts = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind not in ("input_text", "output_text"):
            raise bad_request("'type' must be one of 'input_text', 'input_image', or 'input_file'")
        parts.append(Fields(p).str("text"))
    return "".join(parts)


def output_items(msg, ids: dict) -> list[dict]:
    out = []
    if msg.reasoning_content:
        out.append({"id": ids["reasoning"], "summary": [], "type": "reasoning", "encrypted_content": "",
                    "content": [{"text": msg.reasoning_content, "type": "reasoning_text"}], "status": "completed"})
    if msg.content:
        out.append({"content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": msg.content}],
                    "id": ids["message"], "role": "assistant", "status": "completed", "type": "message"})
    for c in msg.tool_calls:
        out.append({"type": "function_call", "status": "completed", "arguments": c.arguments,
                    "call_id": "fc_" + random_id(), "name": c.name})
    return out


def response_json(ctx: ServerContext, rid: str, r: FinalResult, output: list[dict]) -> dict:
    t = int(time.time())
    return {"completed_at": t, "created_at": t, "id": rid, "model": ctx.model_name, "object": "response",
            "output": output, "status": "completed",
            "usage": {"input_tokens": r.n_prompt, "output_tokens": r.n_predicted,
                      "total_tokens": r.n_prompt + r.n_predicted,
                      "input_tokens_details": {"cached_tokens": r.n_cached}}}


async def handle_responses(ctx: ServerContext, request: Request, body: dict) -> Response:
    cp, params, tasks = await ctx.prep(prepare_chat, ctx, to_chat_body(body), request=request)
    ids = {"response": "resp_" + random_id(), "reasoning": "rs_" + random_id(), "message": "msg_" + random_id()}
    if params.stream:
        return await start_stream(ctx, tasks, _Events(ctx, cp, ids), done=False, request=request)
    results = await ctx.bridge.collect(tasks, request)
    raise_first_error(results)
    r = results[0]
    return JSONResponse(response_json(ctx, ids["response"], r, output_items(parse_reply(cp, r.text), ids)))


class _Events:
    """The response.* events of one streamed answer. As llama-server 0c1e570: the response is created at the first
    prompt-progress update (return_progress) or the first token; a progress update is a response.in_progress event
    carrying `prompt_progress`; the last event of each update carries `timings` with timings_per_token, and
    response.completed always does."""

    def __init__(self, ctx: ServerContext, cp, ids: dict):
        self.ctx, self.cp, self.ids, self.tracker = ctx, cp, ids, DeltaTracker(cp)
        self.started: set[str] = set()
        self.created = False

    def __call__(self, r) -> list[str]:
        partial = isinstance(r, PartialResult)
        progress = r.progress if partial else None
        out = []
        if partial and not self.created and (progress is not None or r.n_predicted == 1):
            self.created = True
            head = {"id": self.ids["response"], "object": "response", "created_at": int(time.time()),
                    "status": "in_progress", "model": self.ctx.model_name, "output": []}
            out += [("response.created", {"type": "response.created", "response": head}),
                    ("response.in_progress", {"type": "response.in_progress", "response": head})]
        elif progress is not None:
            out.append(("response.in_progress", {"type": "response.in_progress", "response": {
                "id": self.ids["response"], "object": "response", "status": "in_progress"}}))
        final = not partial
        if progress is None:
            for d in self.tracker.push("" if final else r.text, final=final):
                out += self._delta(d)
        if final:
            out += self._done(r)
        if out and r.timings is not None:
            out[-1][1]["timings"] = r.timings.to_json()
        if out and progress is not None:
            out[-1][1]["prompt_progress"] = progress
        return [sse.event(name, data) for name, data in out]

    def _delta(self, d: dict) -> list[tuple[str, dict]]:
        out = []
        if "reasoning_content" in d:
            if "reasoning" not in self.started:
                self.started.add("reasoning")
                out.append(("response.output_item.added", {"type": "response.output_item.added", "item": {
                    "id": self.ids["reasoning"], "summary": [], "type": "reasoning", "content": [],
                    "encrypted_content": "", "status": "in_progress"}}))
            out.append(("response.reasoning_text.delta", {"type": "response.reasoning_text.delta",
                                                          "item_id": self.ids["reasoning"],
                                                          "delta": d["reasoning_content"]}))
        if "content" in d:
            if "message" not in self.started:
                self.started.add("message")
                out.append(("response.output_item.added", {"type": "response.output_item.added", "item": {
                    "content": [], "id": self.ids["message"], "role": "assistant", "status": "in_progress",
                    "type": "message"}}))
                out.append(("response.content_part.added", {
                    "type": "response.content_part.added", "item_id": self.ids["message"],
                    "part": {"type": "output_text", "text": ""}}))
            out.append(("response.output_text.delta", {"type": "response.output_text.delta",
                                                       "item_id": self.ids["message"], "delta": d["content"]}))
        for call in d.get("tool_calls", []):
            item = {"type": "function_call", "status": "in_progress", "arguments": "", "call_id": "fc_" + call["id"],
                    "name": call["function"]["name"]}
            out.append(("response.output_item.added", {"type": "response.output_item.added", "item": item}))
            out.append(("response.function_call_arguments.delta", {
                "type": "response.function_call_arguments.delta", "item_id": item["call_id"],
                "delta": call["function"]["arguments"]}))
        return out

    def _done(self, r: FinalResult) -> list[tuple[str, dict]]:
        items = output_items(parse_reply(self.cp, self.tracker.text), self.ids)
        out = [("response.output_item.done", {"type": "response.output_item.done", "item": it}) for it in items]
        resp = response_json(self.ctx, self.ids["response"], r, items)
        return out + [("response.completed", {"type": "response.completed", "response": resp})]
