"""/v1/chat/completions: messages -> template -> tokens -> engine -> reasoning_content / content / tool_calls.

Templating and output parsing are chat.py's; this file checks the request as llama.cpp does, decides the
template inputs (tools, enable_thinking, kwargs, assistant prefill) and turns the model's text into OpenAI JSON,
whole or as streamed deltas.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..chat import (QWEN_XML, THINK_END, ParsedMessage, TemplateError, ToolFormat, parse_output, reply_start,
                    thinking_switch)
from ..engine.tasks import FinalResult, GenParams, PartialResult
from .completions import (attach_grammar, finish_reason, make_tasks, probs_json, raise_first_error, start_stream,
                          usage_json, verbose_json)
from .context import ServerContext, random_id
from .errors import bad_request
from .prep_cancel import step
from .schemas import Fields, gen_params, oai_stop
from .validate import MAX_N_PROBS

REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")


@dataclass
class ChatPrompt:
    """The rendered prompt and how to read the model's reply."""
    text: str
    tokens: list[int]
    reply_start: int                     # token position where the reply begins (a checkpoint hint)
    tools: list[dict]
    parse_tools: bool
    reasoning_format: str
    thinking_open: bool                  # the prompt ends inside <think>: the reply starts as reasoning
    tool_choice: str = "auto"
    images: dict = field(default_factory=dict)   # prompt position -> vision ImageEmbedding (this request's own)
    tool_format: ToolFormat = QWEN_XML   # how the template's model writes calls (chat.tool_format_of)


# -- request -> prompt ---------------------------------------------------------------------------------------------

def check_messages(body: dict, media: list | None = None, media_path: str = "") -> list[dict]:
    """`media`: a list to collect image_url bytes into (their parts become media markers); None when the server
    has no projector (an image part is then refused as llama-server does)."""
    if "messages" not in body:
        raise bad_request("'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad_request("Expected 'messages' to be an array")
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise bad_request("Expected each message to be an object")
        where = f"messages[{len(out)}]"
        if "role" in m and not isinstance(m["role"], str):
            raise bad_request(f"'{where}.role' must be a string")
        role = m.get("role", "")
        if m.get("tool_calls") is not None:
            _check_tool_calls(m["tool_calls"], f"{where}.tool_calls")
        if role != "assistant" and "content" not in m:
            raise bad_request("All non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in m and "tool_calls" not in m:
            raise bad_request("Assistant message must contain either 'content' or 'tool_calls'!")
        out.append({**m, "content": _text_content(m.get("content"), media, media_path, f"{where}.content")})
    return out


def _check_tool_calls(calls, where: str) -> None:
    """An assistant's tool calls as templates read them (the Qwen3.5 one iterates arguments with |items): agents
    echo a model's malformed call back, which is the client's 400, named, not a template crash."""
    if not isinstance(calls, list):
        raise bad_request(f"'{where}' must be an array")
    for i, tc in enumerate(calls):
        w = f"{where}[{i}]"
        if not isinstance(tc, dict):
            raise bad_request(f"'{w}' must be an object")
        fn = tc.get("function", tc)
        if not isinstance(fn, dict):
            raise bad_request(f"'{w}.function' must be an object")
        if not isinstance(fn.get("name", ""), str):
            raise bad_request(f"'{w}.function.name' must be a string")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except (ValueError, RecursionError):
                raise bad_request(f"'{w}.function.arguments' is not valid JSON") from None
        if not isinstance(args, dict):
            raise bad_request(f"'{w}.function.arguments' must be a JSON object (or a string holding one)")


def _check_tools(tools) -> list[dict]:
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array")
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("function", {}), dict):
            raise bad_request(f"'tools[{i}]{'' if not isinstance(t, dict) else '.function'}' must be an object")
    return tools


def _text_content(content, media: list | None = None, media_path: str = "", where: str = "content"):
    """A message's content, checked: a string, a list of text parts (the template decides how to join them:
    chat.normalize_messages), or, with images, one string as llama.cpp 0c1e570 builds it: text parts joined with
    newlines, none around the media markers."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("Expected 'content' to be a string or an array")
    parts, texts = [], []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "image_url":
            from .vision_input import content_part_marker
            parts.append((True, content_part_marker(p, media, media_path)))
            continue
        if kind == "input_audio":
            raise bad_request("audio input is not supported - hint: if this is unexpected, you may need to provide "
                              "the mmproj")        # llama-server: 500; the client's input: 400
        if kind != "text":
            raise bad_request("unsupported content[].type")
        if not isinstance(p.get("text", ""), str):
            raise bad_request(f"'{where}[{j}].text' must be a string")
        parts.append((False, p.get("text", "")))
        texts.append({"type": "text", "text": p.get("text", "")})
    if len(texts) == len(parts):
        return texts
    out, after_marker = "", False
    for is_marker, text in parts:
        if not is_marker and out and not after_marker:
            out += "\n"
        out, after_marker = out + text, is_marker
    return out


def content_text(content) -> str:
    """The text of a checked content (_text_content), its parts concatenated."""
    return content if isinstance(content, str) else "".join(p["text"] for p in content or [])


def _prefill_text(content) -> str:
    """The assistant prefill's text as llama.cpp 0c1e570 continues it (common_chat_msg::render_content): text
    parts joined with a blank line, none before the first non-empty text (b8462 concatenated them)."""
    if content is None or isinstance(content, str):
        return content or ""
    text = ""
    for p in content:
        text += ("\n\n" if text else "") + p["text"]
    return text


def _tool_choice(body: dict) -> str:
    v = body.get("tool_choice", "auto")
    if not isinstance(v, str):
        return "auto"                   # the object form falls back to auto, as in llama.cpp
    if v not in ("auto", "none", "required"):
        raise bad_request(f"Invalid tool_choice: {v}")
    return v


def _check_builtin(ctx: ServerContext, tools: list[dict], body: dict) -> None:
    """A built-in format renders role and text only: tools are refused as llama-server refuses them without jinja."""
    if not ctx.template.builtin:
        return
    why = ("--jinja flag" if not ctx.params.use_jinja
           else f"a jinja chat template (built-in format '{ctx.template.builtin}' has none)")
    if tools:
        raise bad_request(f"tools param requires {why}")
    if body.get("tool_choice", "auto") != "auto":
        raise bad_request(f"tool_choice param requires {why}")


def _enable_thinking(ctx: ServerContext, kwargs: dict, messages: list[dict]) -> bool:
    if "enable_thinking" in kwargs:
        v = kwargs["enable_thinking"]
        if isinstance(v, str):
            raise bad_request('invalid type for "enable_thinking" (expected boolean, got string)')
        return bool(v)
    users = [m for m in messages if m.get("role") == "user" and m.get("content") is not None]
    switch = thinking_switch(content_text(users[-1]["content"])) if users else None
    if switch is not None and ctx.params.reasoning == "auto":
        return switch
    return ctx.params.enable_thinking and ctx.template.supports_thinking


def build_prompt(ctx: ServerContext, body: dict) -> ChatPrompt:
    f = Fields(body)
    vision = getattr(ctx, "vision", None)
    media: list | None = [] if vision is not None else None
    messages = check_messages(body, media, ctx.opts.media_path)
    tools = _check_tools(body["tools"]) if body.get("tools") is not None else []
    choice = _tool_choice(body)
    _check_builtin(ctx, tools, body)
    if tools and choice != "none" and "grammar" in body:
        raise bad_request("Cannot use custom grammar constraints with tools.")
    kwargs = {**ctx.params.chat_template_kwargs, **f.dict("chat_template_kwargs")}
    thinking = _enable_thinking(ctx, kwargs, messages)
    fmt = f.str("reasoning_format", ctx.params.reasoning_format)
    if fmt not in REASONING_FORMATS:
        raise bad_request(f"Unknown reasoning format: {fmt}")
    if ctx.template.builtin:
        fmt = "none"            # llama.cpp's non-jinja path parses the reply as plain content
    prefill = ""
    continuation = _continuation(body)
    if messages and messages[-1].get("role") == "assistant" and (
            continuation or getattr(ctx.params, "prefill_assistant", True)):
        if messages[-1].get("tool_calls"):
            raise bad_request("Cannot continue an assistant message that contains tool calls.")
        last = messages.pop()
        if messages and messages[-1].get("role") == "assistant":
            raise bad_request("Cannot have 2 or more assistant messages at the end of the list.")
        if thinking:
            raise bad_request("Assistant response prefill is incompatible with enable_thinking.")
        prefill, fmt = _prefill_text(last.get("content")), "none"
    add_gen = f.bool("add_generation_prompt", True) or bool(prefill)
    text = _render(ctx, messages, add_gen, tools if choice != "none" else None, thinking, kwargs) + prefill
    step()                              # rendering a long chat took a while: the client may have left
    if media:
        from .vision_input import encode_prompt
        tokens, images = encode_prompt(vision, ctx.tokenizer, text, media)
        return ChatPrompt(text, tokens, 0, tools, bool(tools) and choice != "none", fmt,
                          text.rstrip().endswith("<think>"), choice, images, _tool_format(ctx))
    tokens = ctx.tokenizer.encode(text, parse_special=True, add_special=True)
    return ChatPrompt(text, tokens, _reply_start(ctx, messages, tools, thinking, kwargs, tokens), tools,
                      bool(tools) and choice != "none", fmt, text.rstrip().endswith("<think>"), choice,
                      tool_format=_tool_format(ctx))


def _tool_format(ctx: ServerContext) -> ToolFormat:
    """A built-in (non-jinja) template takes no tools, so its replies are never parsed for calls."""
    return QWEN_XML if ctx.template.builtin else ctx.template.tool_format


def _continuation(body: dict) -> bool:
    """continue_final_message (0c1e570; vLLM's name for the assistant prefill): true or "content" continue the
    last assistant message's content, which then must not come with add_generation_prompt (true by default)."""
    value = body.get("continue_final_message")
    if not (value is None or isinstance(value, bool) or value in ("content", "reasoning_content")):
        raise bad_request('continue_final_message must be a boolean, "content" or "reasoning_content"')
    if value == "reasoning_content":
        raise bad_request("continue_final_message \"reasoning_content\" is not supported by llamacmp: "
                          "only the content of the last assistant message can be continued")
    on = value is True or value == "content"
    if on and Fields(body).bool("add_generation_prompt", True):
        raise bad_request("Cannot set both add_generation_prompt and continue_final_message to true.")
    return on


def _render(ctx, messages, add_gen, tools, thinking, kwargs) -> str:
    try:
        return ctx.template.render(messages, add_generation_prompt=add_gen, tools=tools or None,
                                   enable_thinking=thinking, extra=kwargs)
    except TemplateError as e:
        raise bad_request(str(e)) from None


def _reply_start(ctx, messages, tools, thinking, kwargs, tokens: list[int]) -> int:
    return reply_start(ctx.template, lambda s: ctx.tokenizer.encode(s, parse_special=True, add_special=True),
                       messages, len(tokens), tools=tools or None, enable_thinking=thinking, extra=kwargs)


def chat_gen_params(ctx: ServerContext, body: dict, stream: bool, has_tools: bool) -> GenParams:
    body = oai_stop(body)
    f = Fields(body)
    if f.bool("logprobs", False):
        if has_tools and stream:
            raise bad_request("logprobs is not supported with tools + stream")
        body = {**body, "n_probs": f.int("top_logprobs", 20, hi=MAX_N_PROBS)}
    elif f.has("top_logprobs"):
        raise bad_request("top_logprobs requires logprobs to be set to true")
    return gen_params(body, ctx.defaults, ctx.tokenizer, ctx.n_vocab)


# -- reply -> message ------------------------------------------------------------------------------------------------

def parse_reply(cp: ChatPrompt, text: str, partial: bool = False) -> ParsedMessage:
    return parse_output(text, cp.reasoning_format, cp.thinking_open, cp.tools if cp.parse_tools else None,
                        partial=partial, tool_format=cp.tool_format)


def message_json(msg: ParsedMessage, ids: list[str]) -> dict:
    out: dict = {"role": "assistant", "content": msg.content if (msg.content or not msg.tool_calls) else None}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        out["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments},
                              "id": ids[i]} for i, c in enumerate(msg.tool_calls)]
    return out


def chat_finish_reason(r: FinalResult, msg: ParsedMessage) -> str:
    reason = finish_reason(r)
    return "tool_calls" if reason == "stop" and msg.tool_calls else reason


@dataclass
class DeltaTracker:
    """Turns the growing reply text into OpenAI deltas: parse everything so far, send what is new. Text that may
    still turn into a tag (`</think>`, `<tool_call>`) is held back; tool calls go out whole once closed."""
    cp: ChatPrompt
    text: str = ""
    sent: ParsedMessage = field(default_factory=ParsedMessage)
    ids: list[str] = field(default_factory=list)

    def push(self, delta: str, final: bool = False) -> list[dict]:
        self.text += delta
        msg = parse_reply(self.cp, self.text, partial=not final)
        out = []
        for key in ("reasoning_content", "content"):
            new, old = getattr(msg, key), getattr(self.sent, key)
            if len(new) > len(old) and new.startswith(old):
                out.append({key: new[len(old):]})
                setattr(self.sent, key, new)
        for i in range(len(self.sent.tool_calls), len(msg.tool_calls)):
            c = msg.tool_calls[i]
            self.ids.append(random_id())
            out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                        "function": {"name": c.name, "arguments": c.arguments}}]})
            self.sent.tool_calls.append(c)
        return out


# -- handler -------------------------------------------------------------------------------------------------------------

def with_response_format(body: dict) -> dict:
    """response_format json_object / json_schema -> the native json_schema field (llama.cpp's mapping)."""
    if "response_format" not in body:
        return body
    rf = Fields(Fields(body).dict("response_format"))
    kind = rf.str("type")
    if kind == "json_object":
        return {**body, "json_schema": _schema(rf, "schema", {"type": "object"})}
    if kind == "json_schema":
        return {**body, "json_schema": _schema(Fields(rf.dict("json_schema")), "schema", {})}
    if kind and kind != "text":
        raise bad_request(f'response_format type must be one of "text" or "json_object", but got: {kind}')
    return body


def _schema(f: Fields, key: str, default: dict) -> dict:
    """A response_format schema must be a JSON object (llama.cpp fails to build its grammar from anything else)."""
    value = f.raw(key, default)
    if not isinstance(value, dict):
        raise bad_request(f"response_format {key} must be a JSON object, got: {json.dumps(value)}")
    return value


def with_reasoning_budget(ctx: ServerContext, body: dict, cp: ChatPrompt, params: GenParams) -> GenParams:
    """--reasoning-budget, or the request's thinking_budget_tokens when the server's is -1 (unlimited)."""
    budget = ctx.params.reasoning_budget
    if budget == -1:
        budget = Fields(body).int("thinking_budget_tokens", -1)
    if budget < 0 or not cp.thinking_open:
        return params
    end = ctx.tokenizer.encode(ctx.params.reasoning_budget_message + "\n" + THINK_END + "\n\n", parse_special=True)
    return replace(params, reasoning_budget=budget, reasoning_end=tuple(end))


def with_required_tool_call(ctx: ServerContext, body: dict, cp: ChatPrompt, params: GenParams) -> GenParams:
    """tool_choice "required": the answer (after any reasoning) must be tool calls, by grammar as in llama.cpp."""
    if params.grammar is not None:
        raise bad_request('tool_choice "required" cannot be combined with response_format or json_schema')
    from ..engine.grammar import GrammarError
    from .tool_grammar import REQUIRED_GRAMMARS
    grammar_of = REQUIRED_GRAMMARS[cp.tool_format.name]     # the calls as the template's model writes them
    parallel = Fields(body).bool("parallel_tool_calls", False)
    step()                              # before compiling, the slowest step of a prep job
    for typed in (True, False):         # a parameter schema llguidance cannot compile: free-text values, not a 400
        try:
            return replace(params, grammar=ctx.engine.grammars.compile(
                grammar_of(cp.tools, parallel, typed), after_think=cp.thinking_open, syntax="lark"))
        except GrammarError as e:
            error = e
    raise bad_request(str(error))


def prepare_chat(ctx: ServerContext, body: dict) -> tuple[ChatPrompt, GenParams, list]:
    """Shared by every chat-shaped route (chat completions, Anthropic messages, Responses)."""
    cp = build_prompt(ctx, body)
    params = chat_gen_params(ctx, body, Fields(body).bool("stream", False), bool(cp.tools))
    params = with_reasoning_budget(ctx, body, cp, params)
    params = attach_grammar(ctx, with_response_format(body), params, after_think=cp.thinking_open)
    if cp.parse_tools and cp.tool_choice == "required":
        params = with_required_tool_call(ctx, body, cp, params)
    hints = (cp.reply_start,) if cp.reply_start else ()
    tasks = make_tasks(ctx, [cp.tokens], params, body, hints)
    for t in tasks:
        t.images = cp.images
    return cp, params, tasks


async def handle_chat(ctx: ServerContext, request: Request, body: dict) -> Response:
    cp, params, tasks = await ctx.prep(prepare_chat, ctx, body, request=request)
    cid, created = "chatcmpl-" + random_id(), int(time.time())
    if params.stream:
        include_usage = Fields(Fields(body).dict("stream_options")).bool("include_usage", False)
        return await _stream_chat(ctx, request, tasks, cp, params, cid, created, include_usage)
    results = await ctx.bridge.collect(tasks, request)
    raise_first_error(results)
    choices = []
    for r in results:
        msg = parse_reply(cp, r.text)
        choice = {"finish_reason": chat_finish_reason(r, msg), "index": r.index,
                  "message": message_json(msg, [random_id() for _ in msg.tool_calls])}
        if r.probs:
            choice["logprobs"] = {"content": probs_json(ctx, r.probs, params.post_sampling_probs)}
        choices.append(choice)
    usage = usage_json(results[0]) if len(results) == 1 else _merged_usage(results)
    return JSONResponse({"choices": choices, "created": created, "model": ctx.model_name,
                         "system_fingerprint": ctx.build_info, "object": "chat.completion", "usage": usage,
                         "id": cid, "timings": results[-1].timings.to_json(),
                         **verbose_json(ctx, body, results[0], params)})


def _merged_usage(results: list[FinalResult]) -> dict:
    u = usage_json(results[0])
    u["completion_tokens"] = sum(r.n_predicted for r in results)
    u["total_tokens"] = u["completion_tokens"] + u["prompt_tokens"]
    return u


async def _stream_chat(ctx, request, tasks, cp: ChatPrompt, params: GenParams, cid: str, created: int,
                       include_usage: bool) -> Response:
    trackers = {t.index: DeltaTracker(cp) for t in tasks}
    finals: list[FinalResult] = []

    def chunk(index: int, delta: dict, reason=None) -> dict:
        return {"choices": [{"finish_reason": reason, "index": index, "delta": delta}], "created": created,
                "id": cid, "model": ctx.model_name, "system_fingerprint": ctx.build_info,
                "object": "chat.completion.chunk"}

    def to_chunks(r) -> list[dict]:
        tr = trackers[r.index]
        if isinstance(r, PartialResult) and r.progress is not None:
            timings = {"timings": r.timings.to_json()} if r.timings is not None else {}
            return [{**chunk(r.index, {"role": "assistant", "content": None}), **timings,
                     "prompt_progress": r.progress}]
        if isinstance(r, PartialResult):
            out = [chunk(r.index, {"role": "assistant", "content": None})] if r.n_predicted == 1 else []
            out += [chunk(r.index, d) for d in tr.push(r.text)]
            if out and r.probs:
                out[-1]["choices"][0]["logprobs"] = {"content": probs_json(ctx, r.probs, params.post_sampling_probs)}
            if out and r.timings is not None:
                out[-1]["timings"] = r.timings.to_json()
            return out
        finals.append(r)
        msg = parse_reply(cp, tr.text)
        out = [chunk(r.index, d) for d in tr.push("", final=True)]
        out.append(chunk(r.index, {}, chat_finish_reason(r, msg)))
        if include_usage and len(finals) == len(tasks):
            out.append({**chunk(r.index, {}), "choices": [], "usage": usage_json(r)})
        out[-1]["timings"] = r.timings.to_json()
        return out
    return await start_stream(ctx, tasks, to_chunks, done=True, request=request)


async def handle_input_tokens(ctx: ServerContext, body: dict) -> Response:
    """/chat/completions/input_tokens (0c1e570): the prompt's token count, nothing generated."""
    cp = await ctx.prep(build_prompt, ctx, body)
    return JSONResponse({"input_tokens": len(cp.tokens)})


async def handle_apply_template(ctx: ServerContext, body: dict) -> Response:
    return JSONResponse({"prompt": (await ctx.prep(build_prompt, ctx, body)).text})
