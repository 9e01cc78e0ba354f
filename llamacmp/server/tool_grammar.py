"""`tool_choice: "required"`: a grammar that lets the reply be nothing but Qwen3.5 XML tool calls.

llama.cpp enforces "required" the same way: its chat format builds a grammar from the request's tools and, when a
call is required, applies it from the first token of the answer (not lazily on a trigger word), so the model
cannot answer in prose. Here that grammar is GBNF for the format chat.py parses:

    <tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>

one call, or several separated by a newline when `parallel_tool_calls` is true. NAME is one of the tools. As in
llama.cpp (0c1e570's tagged-argument parser, common/chat-auto-parser-generator.cpp), the schema's `required`
parameters come first, each once, in the order `properties` lists them, then any of the optional ones in any
order; without that a model could call with `{}` and skip what the tool needs. A value holds no `</` (the start
of a closing tag); unlike llama.cpp, a non-string value is not held to its JSON schema.
"""
from __future__ import annotations

import json


def _lit(text: str) -> str:
    return json.dumps(text)            # a GBNF string literal: JSON's quoting of \\n and " is GBNF's


def _function_rule(i: int, tool: dict) -> list[str]:
    fn = tool.get("function", tool)
    schema = fn.get("parameters") or {}
    props = list(schema.get("properties") or {})
    required = set(schema.get("required") or ()) & set(props)
    rule = {arg: f"p{i}x{j}" for j, arg in enumerate(props)}
    optional = [rule[a] for a in props if a not in required]
    body = [rule[a] for a in props if a in required] + ([f"({' | '.join(optional)})*"] if optional else [])
    rules = [f"f{i} ::= {_lit('<function=' + str(fn.get('name', '')) + '>' + chr(10))} "
             + "".join(b + " " for b in body) + _lit("</function>")]
    for arg, name in rule.items():
        rules.append(f"{name} ::= {_lit('<parameter=' + arg + '>' + chr(10))} value {_lit(chr(10) + '</parameter>' + chr(10))}")
    return rules


def required_tool_call_grammar(tools: list[dict], parallel: bool) -> str:
    """GBNF whose every sentence is one tool call (or several, when parallel) to one of `tools`."""
    calls = "call (\"\\n\" call)*" if parallel else "call"
    rules = [f"root ::= {calls}",
             "call ::= " + _lit("<tool_call>\n") + " fn " + _lit("\n</tool_call>"),
             "fn ::= " + " | ".join(f"f{i}" for i in range(len(tools))),
             'value ::= ([^<] | "<" [^/])*']
    for i, tool in enumerate(tools):
        rules += _function_rule(i, tool)
    return "\n".join(rules) + "\n"
