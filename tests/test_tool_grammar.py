"""tool_choice "required": the grammar's sentences are tool calls whose required parameters are all there (as
llama.cpp 0c1e570's tagged-argument parser builds them). llama.cpp's server suite caught a call with `{}` for a tool
whose schema requires `success`, and then, with free text as its value, a call never closed in 1024 tokens
(test_tool_call.py::test_completion_with_required_tool_tiny_fast[Qwen3-Coder-*]): a boolean is JSON now."""
from __future__ import annotations

import pytest

from llamacmp.server.tool_grammar import may_be_string, required_functools_grammar, required_tool_call_grammar

llguidance = pytest.importorskip("llguidance")


class _Bytes:
    """A vocabulary of the 256 bytes and an end token, so that any text is one token per byte."""
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"\xff<eos>"]
    special_token_ids = [256]

    def __call__(self, text):
        return list(text.encode() if isinstance(text, str) else text)


def accepts(lark: str, text: str) -> bool:
    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))
    m = llguidance.LLMatcher(tok, llguidance.grammar_from("lark", lark))
    return m.consume_tokens(list(text.encode())) and not m.is_error() and m.is_accepting()


def tool(name: str, props: list[str] | dict, required: list[str]) -> dict:
    schemas = props if isinstance(props, dict) else {p: {"type": "string"} for p in props}
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": schemas, "required": required}}}


def call(name: str, *args: tuple[str, str]) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args)
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def test_required_parameter_cannot_be_left_out():
    g = required_tool_call_grammar([tool("test", ["success"], ["success"])], parallel=False)
    assert accepts(g, call("test", ("success", "true")))
    assert not accepts(g, call("test"))                       # the {} call llama.cpp's grammar never allows
    assert not accepts(g, call("test", ("success", "true"), ("success", "true")))


def test_required_in_declared_order_then_optional_in_any_order():
    g = required_tool_call_grammar([tool("f", ["opt1", "a", "opt2", "b"], ["b", "a"])], parallel=False)
    assert accepts(g, call("f", ("a", "1"), ("b", "2")))
    assert accepts(g, call("f", ("a", "1"), ("b", "2"), ("opt2", "x"), ("opt1", "y"), ("opt2", "z")))
    assert not accepts(g, call("f", ("b", "2"), ("a", "1")))  # properties order, not the `required` list's
    assert not accepts(g, call("f", ("opt1", "y"), ("a", "1"), ("b", "2")))
    assert not accepts(g, call("f", ("a", "1")))


def test_no_required_parameters_allows_an_empty_call():
    g = required_tool_call_grammar([tool("ping", [], []), tool("f", ["x"], [])], parallel=True)
    assert accepts(g, call("ping"))
    assert accepts(g, call("f") + "\n" + call("f", ("x", "1")))
    assert not accepts(g, "Sure, here you go")                # prose instead of a call


def test_a_value_that_cannot_be_a_string_is_json_of_its_schema():
    t = tool("test", {"success": {"type": "boolean", "const": True}, "n": {"type": "integer"},
                      "note": {"type": "string"}}, ["success"])
    g = required_tool_call_grammar([t], parallel=False)
    assert accepts(g, call("test", ("success", "true"), ("n", "42"), ("note", "free <b> text\nover lines")))
    assert not accepts(g, call("test", ("success", "false")))          # const true
    assert not accepts(g, call("test", ("success", "yes, it worked")))  # the free text that never closed
    assert not accepts(g, call("test", ("success", "true"), ("n", "4.5")))
    untyped = required_tool_call_grammar([t], parallel=False, typed=False)
    assert accepts(untyped, call("test", ("success", "yes, it worked")))


@pytest.mark.parametrize("schema, text", [
    ({"type": "string"}, True), ({}, True), ({"type": ["integer", "string"]}, True), ({"enum": ["a", "b"]}, True),
    ({"anyOf": [{"type": "null"}, {"type": "string"}]}, True), ({"type": "number"}, False), ({"enum": [1, 2]}, False),
    ({"const": True}, False), ({"type": "object"}, False), ({"anyOf": [{"type": "integer"}]}, False)])
def test_which_values_are_text(schema, text):
    assert may_be_string(schema) is text


def test_functools_grammar_is_firefunction_calls():
    tools = [tool("f", {"n": {"type": "integer"}}, ["n"]), tool("g", [], [])]
    one = required_functools_grammar(tools, parallel=False)
    assert accepts(one, ' functools[{"name": "f", "arguments": {"n": 3}}]')
    assert accepts(one, ' functools[{"name": "g", "arguments": {}}]')
    assert not accepts(one, ' functools[{"name": "f", "arguments": {"n": "x"}}]')     # held to the schema
    assert not accepts(one, ' functools[{"name": "f", "arguments": {}}]')             # n is required
    assert not accepts(one, ' functools[{"name": "h", "arguments": {}}]')             # not a tool
    assert not accepts(one, 'Sure. functools[{"name": "g", "arguments": {}}]')         # nothing but calls
    two = ' functools[{"name": "g", "arguments": {}}, {"name": "f", "arguments": {"n": 1}}]'
    assert not accepts(one, two) and accepts(required_functools_grammar(tools, parallel=True), two)
    untyped = required_functools_grammar(tools, parallel=False, typed=False)
    assert accepts(untyped, ' functools[{"name": "f", "arguments": {"n": "x"}}]')


def test_json_values_are_compact_so_a_call_closes():
    """llguidance's JSON takes any white space by default, so a sampled small model could pad `{ }` or `[1,  2]`
    until max_tokens and never close the call (the CI run of 2438538 saw finish_reason "length" in
    test_chat_firefunction): values are compact, json.dumps' separators, in both formats."""
    ping = {"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {"n": {"type": "array", "items": {"type": "integer"}}},
        "additionalProperties": False}}}
    fire = required_functools_grammar([ping], parallel=False)
    assert accepts(fire, ' functools[{"name": "ping", "arguments": {"n": [1, 2]}}]')
    for padded in ('{ }', '{"n": [1,  2]}', '{\n"n": [1, 2]}', '{"n" : [1, 2]}'):
        assert not accepts(fire, ' functools[{"name": "ping", "arguments": ' + padded + '}]'), padded
    xml = required_tool_call_grammar([tool("f", {"n": {"type": "array", "items": {"type": "integer"}}}, ["n"])],
                                     parallel=False)
    assert accepts(xml, call("f", ("n", "[1, 2]")))
    assert not accepts(xml, call("f", ("n", "[1,   2]")))
