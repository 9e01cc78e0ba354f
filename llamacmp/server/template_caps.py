"""/props `chat_template_caps`: what the chat template does with each kind of message field, found as llama.cpp
finds it (common/jinja/caps.cpp): render fixed probe conversations and see which fields the template reads.

llama.cpp's jinja runtime counts a value as used when the template reads it; here the probe messages are dicts
that log each key read (item or attribute access, iteration over items, and everything `tojson` serializes), and
strings that log index access (typed content). The probes and the rules are caps.cpp's, one for one.
"""
from __future__ import annotations

from typing import Any

from ..chat import _tojson, make_environment

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
        return [_wrap(x, log, path + (i,)) for i, x in enumerate(v)]
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
    env.filters["tojson"] = tojson
    env.filters["selectattr"] = selectattr
    template = env.from_string(source)

    def run(messages, tools) -> tuple[bool, _Log]:
        log = _Log()
        ctx = {"messages": _wrap(messages, log, ("messages",)), "tools": _wrap(tools, log, ("tools",)),
               "bos_token": "", "eos_token": "", "add_generation_prompt": True}
        try:
            template.render(**ctx)
            return True, log
        except Exception:        # a probe the template rejects (raise_exception or a type error) tells its own fact
            return False, log

    caps = {"supports_tools": True, "supports_tool_calls": True, "supports_system_role": True,
            "supports_parallel_tool_calls": True, "supports_preserve_reasoning": False,
            "supports_string_content": True, "supports_typed_content": False, "supports_object_arguments": False}
    content0 = ("messages", 0, "content")

    ok, log = run([{"role": "user", "content": "content"}], None)
    if content0 in log.array_access:
        caps["supports_typed_content"] = True
    if not ok:
        caps["supports_string_content"] = False

    ok, log = run([{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"}], [])
    if content0 not in log.used:
        caps["supports_system_role"] = False

    def tools_probe(args) -> None:
        ok, log = run(_tool_conversation(args, 1), _TOOLS)
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
    ok, log = run(_tool_conversation(args, 2), _TOOLS)
    if not ok or ("messages", 1, "tool_calls", 1, "function") not in log.used:
        caps["supports_parallel_tool_calls"] = False

    ok, log = run([{"role": "user", "content": "User message"},
                   {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
                   {"role": "user", "content": "User message"}], [])
    if ("messages", 1, "reasoning_content") in log.used:
        caps["supports_preserve_reasoning"] = True
    return dict(sorted(caps.items()))            # llama.cpp's std::map order
