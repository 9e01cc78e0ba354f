"""/props `chat_template_caps`: what the chat template does with each kind of message field, found as current
llama.cpp (0c1e570, common/jinja/caps.cpp) finds it: render fixed probe conversations and see which fields and
variables the template reads, and what it prints.

llama.cpp's jinja runtime counts a value as used when the template reads it; here the probe messages are dicts
that log each key read (item or attribute access, iteration over items, and everything `tojson` serializes), lists
that log iteration, strings that log index access (typed content), `is string` tests, and a context that logs
top-level variable lookups. The probes and the rules are caps.cpp's, one for one. Where b8462 answered otherwise
(typed content and preserved reasoning of the Qwen3.5 template; no reasoning_effort) the probes' comments say so.
"""
from __future__ import annotations

from typing import Any

import jinja2.runtime

from ..jinja_env import _tojson, make_environment

_TOOLS = [{"name": "tool", "type": "function",
           "function": {"name": "tool1", "description": "Tool description",
                        "parameters": {"type": "object",
                                       "properties": {"arg": {"type": "string", "description": "Arg description"}},
                                       "required": ["arg"]}}}]


def _tool_conversation(args: Any, n_calls: int) -> list[dict]:
    calls = [{"id": f"call0000{i + 1}", "type": "function", "function": {"name": "tool1", "arguments": args}}
             for i in range(n_calls)]
    return [{"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"}]


class _Log:
    def __init__(self):
        self.used: set[tuple] = set()
        self.array_access: set[tuple] = set()
        self.string_tests: set[tuple] = set()      # `x is string` asked of these
        self.variables: set[str] = set()           # top-level variables looked up


_LOG_KEY = "__caps_log"           # the render's _Log, for _ReadLoggingContext
# the variables llama.cpp sets to ask a template to keep earlier turns' reasoning (common/jinja/caps.cpp)
_PRESERVE = {"preserve_thinking": True, "clear_thinking": False, "truncate_history_thinking": False,
             "drop_thinking": False}


class _ReadLoggingContext(jinja2.runtime.Context):
    """Notes each top-level variable the template looks up (llama.cpp's `used` stat of a context value)."""

    def resolve_or_missing(self, key):
        if key != _LOG_KEY:
            log = super().resolve_or_missing(_LOG_KEY)
            if isinstance(log, _Log):
                log.variables.add(key)
        return super().resolve_or_missing(key)


class _List(list):
    """A probe list that notes iteration (a for loop: llama.cpp's array_access)."""
    log: _Log
    path: tuple

    def __iter__(self):
        self.log.array_access.add(self.path)
        return list.__iter__(self)


class _Str(str):
    """A probe string that notes index access (a template treating content as a list of parts)."""
    log: _Log
    path: tuple

    def __getitem__(self, i):
        self.log.array_access.add(self.path)
        return str.__getitem__(self, i)


class _Dict(dict):
    """A probe object that notes which of its keys the template reads."""
    log: _Log
    path: tuple

    def __getitem__(self, k):
        self.log.used.add(self.path + (k,))
        return dict.__getitem__(self, k)

    def get(self, k, default=None):
        if k in self:
            return self[k]
        return default

    def items(self):
        for k in dict.keys(self):
            self.log.used.add(self.path + (k,))
        return dict.items(self)

    def values(self):
        return [v for _, v in self.items()]


def _wrap(v: Any, log: _Log, path: tuple) -> Any:
    if isinstance(v, dict):
        d = _Dict({k: _wrap(x, log, path + (k,)) for k, x in v.items()})
        d.log, d.path = log, path
        return d
    if isinstance(v, list):
        out = _List(_wrap(x, log, path + (i,)) for i, x in enumerate(v))
        out.log, out.path = log, path
        return out
    if isinstance(v, str):
        s = _Str(v)
        s.log, s.path = log, path
        return s
    return v


def _mark_all(v: Any) -> None:
    """tojson reads everything it serializes."""
    if isinstance(v, _Dict):
        for x in v.values():
            _mark_all(x)
    elif isinstance(v, list):
        for x in v:
            _mark_all(x)


def template_caps(source: str) -> dict[str, bool]:
    """-> llama.cpp's caps map for this template source (keys as caps::to_map)."""
    env = make_environment()

    def tojson(value, *args, **kwargs):
        _mark_all(value)
        return _tojson(value, *args, **kwargs)

    def selectattr(seq, *args, **kwargs):
        if isinstance(seq, _Str):
            seq.log.array_access.add(seq.path)
        return base_selectattr(env, seq, *args, **kwargs)
    from jinja2.filters import do_selectattr as base_selectattr
    def is_string(v) -> bool:
        if isinstance(v, (_Str, _List, _Dict)):
            v.log.string_tests.add(v.path)
        return isinstance(v, str)

    def is_iterable(v) -> bool:           # without iterating: that would count as array access
        return hasattr(type(v), "__iter__")
    env.filters["tojson"] = tojson
    env.filters["selectattr"] = selectattr
    env.tests["string"] = is_string
    env.tests["iterable"] = is_iterable
    env.context_class = _ReadLoggingContext
    template = env.from_string(source)

    def run(messages, tools, **variables) -> tuple[bool, _Log, str]:
        log = _Log()
        ctx = {"messages": _wrap(messages, log, ("messages",)), "tools": _wrap(tools, log, ("tools",)),
               "bos_token": "", "eos_token": "", "add_generation_prompt": True, **variables, _LOG_KEY: log}
        try:
            return True, log, template.render(**ctx)
        except Exception:        # a probe the template rejects (raise_exception or a type error) tells its own fact
            return False, log, ""

    caps = {"supports_tools": True, "supports_tool_calls": True, "supports_system_role": True,
            "supports_parallel_tool_calls": True, "supports_preserve_reasoning": False,
            "supports_string_content": True, "supports_typed_content": False, "supports_object_arguments": False,
            "supports_reasoning_effort": False}
    content0 = ("messages", 0, "content")

    ok, log, _ = run([{"role": "user", "content": "content"}], None)
    if content0 in log.array_access:
        caps["supports_typed_content"] = True
    if not ok:
        caps["supports_string_content"] = False
    if content0 in log.string_tests:
        # a template that asks whether content is a string may read a list otherwise (0c1e570's second probe;
        # b8462 had only the first, and so reported false for the Qwen3.5 template)
        ok, log, _ = run([{"role": "user", "content": []}], None)
        if ok and content0 in log.array_access:
            caps["supports_typed_content"] = True

    ok, log, _ = run([{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"}], [])
    if content0 not in log.used:
        caps["supports_system_role"] = False

    def tools_probe(args) -> None:
        ok, log, _ = run(_tool_conversation(args, 1), _TOOLS)
        if not ok:
            return
        if ("tools", 0, "function", "name") not in log.used:
            caps["supports_tools"] = False
        if ("messages", 1, "tool_calls") not in log.used:
            caps["supports_tool_calls"] = False
            return
        if isinstance(args, dict) and ("messages", 1, "tool_calls", 0, "function", "arguments", "arg") in log.used:
            caps["supports_object_arguments"] = True
    tools_probe({"arg": "value"})
    if not caps["supports_object_arguments"]:
        tools_probe('{"arg": "value"}')

    args = {"arg": "value"} if caps["supports_object_arguments"] else '{"arg": "value"}'
    ok, log, _ = run(_tool_conversation(args, 2), _TOOLS)
    if not ok or ("messages", 1, "tool_calls", 1, "function") not in log.used:
        caps["supports_parallel_tool_calls"] = False

    # 0c1e570: reasoning kept in the history means it shows in the prompt, also before the last user turn (b8462
    # asked only whether the template read it, which the Qwen3.5 template does without printing it there)
    placeholder = "<REASONING_CONTENT_PLACEHOLDER>"
    ok, log, text = run([{"role": "user", "content": "User message"},
                         {"role": "assistant", "content": "Assistant message", "reasoning_content": placeholder},
                         {"role": "user", "content": "User message"},
                         {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
                         {"role": "user", "content": "User message"}], [], enable_thinking=True, **_PRESERVE)
    caps["supports_preserve_reasoning"] = placeholder in text

    ok, log, _ = run([{"role": "user", "content": "User message"}], None, enable_thinking=True,
                     reasoning_effort="low", reasoning_strength="low")
    caps["supports_reasoning_effort"] = bool({"reasoning_effort", "reasoning_strength"} & log.variables)
    return dict(sorted(caps.items()))            # llama.cpp's std::map order
