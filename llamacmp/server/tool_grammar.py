"""`tool_choice: "required"`: a grammar that lets the reply be nothing but tool calls, in the format the template
chose (chat.ToolFormat): Qwen3.5's XML (below) or FireFunction v2's ` functools[...]` (required_functools_grammar).

llama.cpp enforces "required" the same way: its chat format builds a grammar from the request's tools and, when a
call is required, applies it from the first token of the answer (not lazily on a trigger word), so the model
cannot answer in prose. Here that grammar is llguidance Lark for the format chat.py parses:

    <tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>

one call, or several separated by a newline when `parallel_tool_calls` is true. NAME is one of the tools. As in
llama.cpp (0c1e570's tagged-argument parser, common/chat-auto-parser-generator.cpp):
  - the schema's `required` parameters come first, each once, in the order `properties` lists them, then any of
    the optional ones in any order (without that a model can call with `{}` and skip what the tool needs);
  - a parameter that may be a string takes free text holding no `</` (the start of a closing tag); any other
    value is JSON held to its schema (compact), so that `{"type": "boolean"}` is `true` or `false` and the call
    closes (a small model writing free text there can fill its whole budget and never close the call).
"""
from __future__ import annotations

import json

_TEXT_VALUE = 'VALUE: (/[^<]/ | "<" /[^\\/]/)*'


def _json(schema: dict) -> str:
    """A Lark `%json` of the schema with compact white space (json.dumps' ", " and ": ", nothing else): llguidance's
    JSON is white-space flexible by default, so a model could pad a value with blanks until its token budget ran out
    and never close the call (llama.cpp's JSON grammars bound white space the same way). A schema's own x-guidance
    options are kept."""
    schema = schema if isinstance(schema, dict) else {}          # (the schema `true`: anything)
    compact = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    return "%json " + json.dumps({**schema, "x-guidance": {**compact, **schema.get("x-guidance", {})}},
                                 ensure_ascii=False)


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)      # a Lark string literal: JSON's quoting of \\n and "


def may_be_string(schema: dict) -> bool:
    """Whether the parameter's value can be a string (then it is written as raw text), as llama.cpp decides."""
    t = schema.get("type")
    if t is None:
        alternatives = schema.get("anyOf") or schema.get("oneOf")
        if alternatives:
            return any(may_be_string(a) for a in alternatives if isinstance(a, dict))
        values = schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
        return values is None or any(isinstance(v, str) for v in values)
    return t == "string" or isinstance(t, list) and "string" in t


def _parameter_rules(name: str, arg: str, schema: dict, typed: bool) -> list[str]:
    """`name`: the parameter's whole <parameter=...> block. A text value is one terminal with its tags, so that
    the lexer, not the parser, decides where the text ends."""
    open_, close = _lit(f"<parameter={arg}>\n"), _lit("\n</parameter>\n")
    if not typed or may_be_string(schema):
        return [f"{name}: {name.upper()}", f"{name.upper()}: {open_} VALUE {close}"]
    return [f"{name}: {open_} {name}_json {close}", f"{name}_json: {_json(schema)}"]


def _function_rules(i: int, tool: dict, typed: bool) -> list[str]:
    fn = tool.get("function", tool)
    schema = fn.get("parameters") or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ()) & set(props)
    rule = {arg: f"p{i}x{j}" for j, arg in enumerate(props)}
    optional = [rule[a] for a in props if a not in required]
    body = [rule[a] for a in props if a in required] + ([f"({' | '.join(optional)})*"] if optional else [])
    rules = [f"f{i}: {_lit('<function=' + str(fn.get('name', '')) + '>' + chr(10))} "
             + "".join(b + " " for b in body) + _lit("</function>")]
    for arg, name in rule.items():
        rules += _parameter_rules(name, arg, props[arg] if isinstance(props[arg], dict) else {}, typed)
    return rules


def required_tool_call_grammar(tools: list[dict], parallel: bool, typed: bool = True) -> str:
    """Lark whose every sentence is one tool call (or several, when parallel) to one of `tools`. typed=False
    takes free text for every value (for a schema llguidance cannot compile)."""
    calls = 'call ("\\n" call)*' if parallel else "call"
    rules = [f"start: {calls}",
             "call: " + _lit("<tool_call>\n") + " fn " + _lit("\n</tool_call>"),
             "fn: " + " | ".join(f"f{i}" for i in range(len(tools))),
             _TEXT_VALUE]
    for i, tool in enumerate(tools):
        rules += _function_rules(i, tool, typed)
    return "\n".join(rules) + "\n"


def required_functools_grammar(tools: list[dict], parallel: bool, typed: bool = True) -> str:
    """FireFunction v2's form of the same (chat.FIREFUNCTION_V2): ` functools[` then one call, or several separated
    by ", " when parallel, then `]`; a call is `{"name": NAME, "arguments": ARGS}` as its template writes past
    calls, ARGS JSON held to the tool's parameter schema (any object when typed is False)."""
    calls = 'call (", " call)*' if parallel else "call"
    rules = [f'start: {_lit(" functools[")} {calls} "]"',
             "call: " + " | ".join(f"f{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool)
        schema = (fn.get("parameters") or {"type": "object"}) if typed else {"type": "object"}
        head = '{"name": ' + json.dumps(str(fn.get("name", "")), ensure_ascii=False) + ', "arguments": '
        rules += [f'f{i}: {_lit(head)} a{i} "}}"', f"a{i}: {_json(schema)}"]
    return "\n".join(rules) + "\n"


# chat.ToolFormat.name -> the grammar of a reply that is nothing but calls in that format
REQUIRED_GRAMMARS = {"qwen3.5-xml": required_tool_call_grammar, "firefunction-v2": required_functools_grammar}
