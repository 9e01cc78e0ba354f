"""Chat templates (jinja2 sandbox, as llama.cpp renders the GGUF's template) and the Qwen3.5 output parser.

Independent of any CLI or server: both take `ChatTemplate.render(...)` and `parse_output(...)` /
`ReasoningSplitter` from here.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import jinja2

from . import chat_builtin
# the sandbox and TemplateError: jinja_env.py (shared with template_caps.py without an import cycle)
from .jinja_env import TemplateError, _date_context, make_environment  # noqa: F401 (TemplateError: chat's API)

THINK_START, THINK_END = "<think>", "</think>"
C_SPACE = " \t\n\v\f\r"     # C's isspace(), which llama.cpp's parsers skip (str.strip() also takes Unicode spaces)
TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"

# The template llama.cpp falls back to when a model has none (chatml).
CHATML_TEMPLATE = ("{%- for message in messages -%}{{- '<|im_start|>' + message.role + '\n' + message.content + "
                   "'<|im_end|>\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
                   "{%- endif -%}")


# the variables render() passes besides messages & co (chat_template_kwargs may not replace them either)
RENDER_NAMES = ("tools", "add_generation_prompt", "bos_token", "eos_token", "messages")


# -- messages and rendering ------------------------------------------------------------------------------------------

def normalize_messages(messages: list[dict], typed_content: bool = False) -> list[dict]:
    """llama.cpp's rewrites before rendering: developer -> system, null content -> "", tool-call arguments given
    as JSON strings -> objects (the Qwen3.5 template iterates them with |items). A list of text parts reaches a
    template that reads typed content as it is (current llama.cpp, 0c1e570, and transformers: the Qwen3.5 template
    concatenates the parts); any other template gets them joined with newlines (llama.cpp b8462 did that always)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "developer":
            m["role"] = "system"
        if m.get("content") is None:
            m["content"] = ""
        elif (isinstance(m["content"], list) and all(p.get("type") == "text" for p in m["content"])
              and not typed_content):
            m["content"] = "\n".join(p.get("text", "") for p in m["content"])
        if m.get("tool_calls"):
            m["tool_calls"] = [_with_object_arguments(tc) for tc in m["tool_calls"]]
        out.append(m)
    return out


def _with_object_arguments(tc: dict) -> dict:
    tc = json.loads(json.dumps(tc))
    fn = tc.get("function", tc)
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            pass
    return tc


@dataclass
class ChatTemplate:
    """A jinja chat template (the GGUF's, or --chat-template text)."""
    source: str
    bos_token: str = ""
    eos_token: str = ""
    builtin = None              # no built-in format: tools, thinking and output parsing as the template says

    def __post_init__(self) -> None:
        try:
            self._template = make_environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template syntax error (line {e.lineno}): {e.message}") from None

    @classmethod
    def from_metadata(cls, metadata: dict, tokens: list[str] | None = None, override: str = "") -> "ChatTemplate":
        source = override or metadata.get("tokenizer.chat_template") or CHATML_TEMPLATE

        def tok(key: str) -> str:
            i = metadata.get(key)
            return tokens[i] if tokens is not None and i is not None and 0 <= i < len(tokens) else ""
        return cls(source, tok("tokenizer.ggml.bos_token_id"), tok("tokenizer.ggml.eos_token_id"))

    @functools.cached_property
    def tool_format(self) -> "ToolFormat":
        return tool_format_of(self.source)

    @functools.cached_property
    def typed_content(self) -> bool:
        """Whether text parts reach the template unjoined: llama.cpp 0c1e570 joins them only for a template that
        takes string content and does not read a content list (its caps)."""
        from .server.template_caps import template_caps      # lazy: the probes render the template a few times
        caps = template_caps(self.source)
        return caps["supports_typed_content"] or not caps["supports_string_content"]

    @property
    def supports_thinking(self) -> bool:
        """Detected the way llama.cpp does it in spirit: does enable_thinking change the rendering?"""
        probe = [{"role": "user", "content": "x"}]
        try:
            return self.render(probe, enable_thinking=True) != self.render(probe, enable_thinking=False)
        except TemplateError:
            return False

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
               enable_thinking: bool = True, extra: dict | None = None) -> str:
        ctx = {"messages": normalize_messages(messages, self.typed_content),
               "add_generation_prompt": add_generation_prompt, "bos_token": self.bos_token, "eos_token": self.eos_token, "enable_thinking": enable_thinking}
        # extra (chat_template_kwargs) adds variables; it may not replace the template's inputs or its helpers
        taken = [k for k in extra or {} if k != "enable_thinking" and (k in ctx or k in RENDER_NAMES
                                                                       or k in self._template.globals)]
        if taken:
            raise TemplateError(f"chat_template_kwargs.{taken[0]} may not override the template's own "
                                f"'{taken[0]}'")
        # kwargs may set date_string / datetime (and the format's inputs, FireFunction's functions)
        ctx = {**_date_context(), **self.tool_format.context(tools), **(extra or {}), **ctx}
        if tools:
            ctx["tools"] = tools
        try:
            return self._template.render(**ctx)
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed to render: {e}") from None
        except RecursionError:
            raise TemplateError("chat template failed to render: recursion too deep") from None
        except Exception as e:           # the template ran on client data (|items of a string, ...): the client's
            raise TemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from None


@dataclass
class BuiltinTemplate:
    """One of llama.cpp's built-in formats (chat_builtin.py): only role and text reach it, so there are no tools
    and no thinking switch, and the reply is plain content. `source` is what /props reports (the name or the
    GGUF's text it was recognised in)."""
    builtin: str
    source: str
    supports_thinking = False

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
               enable_thinking: bool = True, extra: dict | None = None) -> str:
        chat = [(str(m.get("role", "")), m["content"] if isinstance(m["content"], str) else str(m["content"]))
                for m in normalize_messages(messages)]
        return chat_builtin.render(self.builtin, chat, add_generation_prompt)


def select_template(metadata: dict, tokens: list[str] | None, override: str, use_jinja: bool):
    """The template llama.cpp would use. With jinja: the override or the GGUF's template as jinja, except that
    a built-in format's name selects that format (llama.cpp renders such a name as literal jinja text, which
    no one means; `chatml` it maps to its chatml jinja, as here). Without jinja (--no-jinja): the built-in format
    named or recognised in the override or the GGUF's template, chatml when there is none."""
    name = override if override in chat_builtin.BUILTIN_NAMES else None
    if use_jinja and name not in (None, "chatml"):
        return BuiltinTemplate(name, override)
    if use_jinja:
        return ChatTemplate.from_metadata(metadata, tokens, override=CHATML_TEMPLATE if name else override)
    source = override or metadata.get("tokenizer.chat_template") or "chatml"
    name = chat_builtin.detect(source)
    if name is None:
        raise TemplateError("this custom template is not supported, try using --jinja")
    return BuiltinTemplate(name, source)


def check_override(template: str, use_jinja: bool) -> None:
    """llama.cpp's start-up check of --chat-template / --chat-template-file: it must render a one-message chat."""
    try:
        select_template({}, None, template, use_jinja).render([{"role": "user", "content": "test"}])
    except TemplateError:
        note = "" if use_jinja else ("\nnote: llama.cpp was started without --jinja, we only support commonly "
                                     "used templates")
        raise TemplateError(f"error: the supplied chat template is not supported: {template}{note}") from None


def reply_start(template: ChatTemplate, encode, messages: list[dict], n_prompt: int, **render) -> int:
    """Where the history ends and the generation prompt starts, in tokens of the prompt (0: unknown). A checkpoint
    there is what the next turn, which re-renders this reply differently (e.g. without its reasoning), can resume
    from. encode: text -> ids as the prompt was encoded; render: ChatTemplate.render's other arguments."""
    try:
        head = template.render(messages, add_generation_prompt=False, **render)
    except TemplateError:
        return 0
    n = len(encode(head))
    return n if 0 < n < n_prompt else 0


def thinking_switch(text: str) -> bool | None:
    """Qwen3's soft switches: the last of /think or /no_think in a user message decides that turn (None: neither).
    llama.cpp ignores them; we honour them for users of Qwen3-era prompts (issue 4)."""
    found = re.findall(r"/(no_think|think)\b", text)
    return None if not found else found[-1] == "think"


# -- output parsing -------------------------------------------------------------------------------------------------

@dataclass
class ToolCall:
    name: str
    arguments: str               # a JSON object as a string, as OpenAI returns it
    id: str = ""


@dataclass
class ParsedMessage:
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


GENERATION_PROMPT_NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
GENERATION_PROMPT = "<|im_start|>assistant\n<think>\n"     # Qwen3.5's, thinking on


def reasoning_open(generation_prompt: str) -> bool:
    """Whether the generation prompt ends inside an open <think> (Qwen3.5's with thinking on: "<think>\n")."""
    start = generation_prompt.rfind(THINK_START)
    return start >= 0 and generation_prompt.find(THINK_END, start) < 0


def split_reasoning(text: str, reasoning_format: str = "auto", thinking_open: bool = True,
                    generation_prompt: str | None = None, partial: bool = False) -> tuple[str, str]:
    """(reasoning, content) as llama.cpp's Qwen3.5 parser returns them. llama.cpp parses generation prompt + output:
    reasoning is what lies between the tags with its leading whitespace dropped (the template's newline after
    <think> and any the model writes; 0c1e570, current llama.cpp: b8462 kept it all) and content is what follows
    </think> with its leading whitespace dropped. When the prompt already closed an empty think block
    (thinking disabled), the whole output is content, leading whitespace dropped likewise. `thinking_open` picks
    Qwen3.5's prompt ("<think>\n" open, or closed when False); a given generation_prompt decides instead.
    `partial` (output still streaming): a tail that may become </think> is held back, as llama.cpp does. `none` keeps everything in content; deepseek-legacy keeps the tags in content as well as filling reasoning."""
    if reasoning_format == "none":
        return "", text
    if generation_prompt is None:
        generation_prompt = GENERATION_PROMPT if thinking_open else GENERATION_PROMPT_NO_THINK
    if generation_prompt.rstrip().endswith(THINK_END):
        return "", text.lstrip()
    body = text
    if not reasoning_open(generation_prompt):
        if not body.startswith(THINK_START):
            return "", text
        body = body[len(THINK_START):]
    if THINK_END not in body:
        if partial:
            body = body[:len(body) - _partial_suffix(body, THINK_END)]
        reasoning, content = body, ""        # still thinking when generation stopped
    else:
        reasoning, content = body.split(THINK_END, 1)
        content = content.lstrip()
    reasoning = reasoning.lstrip(C_SPACE)
    if not reasoning.strip():
        reasoning = ""          # an empty think block (budget 0, thinking closed at once) is no reasoning at all
    if reasoning_format == "deepseek-legacy":
        return reasoning, text
    return reasoning, content


_FUNC_RE = re.compile(r"<function=([^>\n]+)>\n?(.*?)</function>", re.S)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _param_types(tools: list[dict] | None) -> dict[str, dict[str, Any]]:
    """tool name -> {argument name -> JSON-schema type}."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {k: (v or {}).get("type", "string") for k, v in props.items()}
    return out


def _json_value_text(raw: str, schema_type: Any) -> str:
    """The argument as JSON text: a `string` parameter is the raw text JSON-quoted; any other type keeps the
    model's own JSON text verbatim when it parses (llama.cpp splices it in unchanged, spaces included), and
    falls back to a quoted string when it does not."""
    is_string = schema_type == "string" or (isinstance(schema_type, list) and "string" in schema_type
                                            and not raw.lstrip().startswith(("{", "[")))
    if not is_string:
        try:
            json.loads(raw)
            return raw.strip()
        except json.JSONDecodeError:
            pass
    return json.dumps(raw, ensure_ascii=False)


def parse_tool_calls(text: str, tools: list[dict] | None = None) -> tuple[str, list[ToolCall]]:
    """Cut `<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>` blocks out of the
    content; returns (content before the first call, kept as written, and the calls)."""
    first = text.find(TOOL_START)
    if first < 0:
        return text, []
    types = _param_types(tools)
    calls = []
    for block in re.findall(re.escape(TOOL_START) + r"(.*?)(?:" + re.escape(TOOL_END) + r"|$)", text[first:], re.S):
        for name, body in _FUNC_RE.findall(block):
            name = name.strip()
            schema = types.get(name, {})
            fields = [json.dumps(k.strip(), ensure_ascii=False) + ":" + _json_value_text(v, schema.get(k.strip()))
                      for k, v in _PARAM_RE.findall(body)]
            calls.append(ToolCall(name, "{" + ",".join(fields) + "}"))
    return text[:first], calls


FUNCTOOLS = "functools["


def parse_functools(text: str, partial: bool = False) -> tuple[str, list[ToolCall]]:
    """FireFunction v2's calls: `CONTENT functools[{"name": N, "arguments": {...}}, ...]`, the whole rest of the
    reply one JSON array (the template writes past calls so; there is no closing marker). Returns (content before
    the marker, calls). Output that is not such an array after the marker (bad JSON, an entry without a string
    name, text after the `]`) is no call: the whole reply stays content. While streaming (`partial`), an
    unfinished array is held back rather than shown as content."""
    at = text.find(FUNCTOOLS)
    if at < 0:
        return text, []
    try:
        items, end = json.JSONDecoder().raw_decode(text, at + len(FUNCTOOLS) - 1)
    except json.JSONDecodeError:
        return (text[:at].rstrip(), []) if partial else (text, [])
    if text[end:].strip() or not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return text, []
    return text[:at].rstrip(), [ToolCall(i["name"], _arguments_text(i.get("arguments", {}))) for i in items]


def _arguments_text(arguments: Any) -> str:
    """OpenAI's arguments string: a model that wrote them as a JSON string already has it."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ToolFormat:
    """How a template's model writes tool calls: chosen from the template text (tool_format_of), it supplies the
    template's extra inputs and parses the reply. `marker` starts the calls (a reply tail that may become it is
    held back while streaming)."""
    name: str
    marker: str
    parse: Callable[[str, list[dict], bool], tuple[str, list[ToolCall]]]
    context: Callable[[list[dict] | None], dict]


QWEN_XML = ToolFormat("qwen3.5-xml", TOOL_START, lambda text, tools, partial: parse_tool_calls(text, tools),
                      lambda tools: {})
# the template reads `functions` (the tool specs, as JSON) and says so: "Available functions as JSON spec:"
FIREFUNCTION_V2 = ToolFormat("firefunction-v2", " " + FUNCTOOLS,
                             lambda text, tools, partial: parse_functools(text, partial),
                             lambda tools: {"functions": json.dumps(tools, ensure_ascii=False, indent=2)
                                            if tools else ""})


def tool_format_of(source: str) -> ToolFormat:
    """FireFunction v2's template writes past calls as ` functools[...]`; every other template is read as
    Qwen3.5's XML (the models llamacmp runs)."""
    return FIREFUNCTION_V2 if "' functools['" in source else QWEN_XML


def parse_output(text: str, reasoning_format: str = "auto", thinking_open: bool = True,
                 tools: list[dict] | None = None, generation_prompt: str | None = None,
                 partial: bool = False, tool_format: ToolFormat = QWEN_XML) -> ParsedMessage:
    """Model output (after the generation prompt) -> reasoning_content, content and typed tool calls.
    `partial`: the output is still streaming (a tool call is only returned once it is closed)."""
    reasoning, content = split_reasoning(text, reasoning_format, thinking_open, generation_prompt, partial)
    calls: list[ToolCall] = []
    if tools:
        content, calls = tool_format.parse(content, tools, partial)
        if partial and not calls:           # a tail that may become the call marker is held back, as llama.cpp does
            content = content[:len(content) - _partial_suffix(content, tool_format.marker)]
    return ParsedMessage(content, reasoning, calls)


class ReasoningSplitter:
    """Streaming form of split_reasoning: push text deltas, get ("reasoning"|"content", text) pieces. A partial
    `</think>` at the end of a delta is held back until the next one decides it."""

    def __init__(self, thinking_open: bool, reasoning_format: str = "auto"):
        self.in_reasoning = thinking_open and reasoning_format != "none"
        self.watch_start = not thinking_open and reasoning_format != "none"
        self.buf = ""
        self.at_start = True
        self.content_start = False       # right after </think>: drop the blank lines the template puts there

    def push(self, delta: str) -> Iterator[tuple[str, str]]:
        self.buf += delta
        while self.buf:
            if self.watch_start:
                if THINK_START.startswith(self.buf.lstrip()) and self.buf.strip():
                    return                      # might still become <think>
                self.watch_start = False
                if self.buf.lstrip().startswith(THINK_START):
                    self.buf = self.buf.lstrip()[len(THINK_START):]
                    self.in_reasoning = True
                continue
            if not self.in_reasoning:
                if self.content_start:
                    self.buf = self.buf.lstrip("\n")
                    if not self.buf:
                        return
                    self.content_start = False
                out, self.buf = self.buf, ""
                yield "content", out
                return
            if self.at_start:              # reasoning starts at its first non-space, as in split_reasoning
                stripped = self.buf.lstrip(C_SPACE)
                if not stripped:
                    self.buf = ""
                    return
                self.buf, self.at_start = stripped, False
            idx = self.buf.find(THINK_END)
            if idx >= 0:
                if idx:
                    yield "reasoning", self.buf[:idx].rstrip("\n")
                self.buf = self.buf[idx + len(THINK_END):]
                self.in_reasoning, self.content_start = False, True
                continue
            # hold back a possible partial </think> and the newlines before it (they belong to neither part)
            keep = _partial_suffix(self.buf, THINK_END)
            rest = self.buf[:len(self.buf) - keep]
            keep += len(rest) - len(rest.rstrip("\n"))
            out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
            if out:
                yield "reasoning", out
            return

    def flush(self) -> Iterator[tuple[str, str]]:
        if self.buf:
            yield ("reasoning" if self.in_reasoning else "content"), self.buf
        self.buf = ""


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
