"""FireFunction v2 templates: chosen from the template text, they get their `functions` input and their replies are
read as ` functools[{"name": ..., "arguments": {...}}]` (llama.cpp's test-chat.cpp FireFunction cases), while the
Qwen3.5 template keeps its XML calls."""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from llamacmp.chat import (FIREFUNCTION_V2, QWEN_XML, ChatTemplate, ToolCall, parse_output, tool_format_of)
from llamacmp.fixtures.writer import TEMPLATE_PATH

FIRE_PATH = Path(__file__).parent / "data" / "fireworks-ai-llama-3-firefunction-v2.jinja"
SPECIAL = {"type": "function", "function": {"name": "special_function", "description": "I'm special",
                                            "parameters": {"type": "object", "required": ["arg1"],
                                                           "properties": {"arg1": {"type": "integer"}}}}}
TOOLS = [SPECIAL]


@pytest.fixture(scope="module")
def fire():
    return ChatTemplate(FIRE_PATH.read_text(), bos_token="<|begin_of_text|>")


def read(text: str, partial: bool = False):
    return parse_output(text, "auto", tools=TOOLS, generation_prompt="", partial=partial,
                        tool_format=FIREFUNCTION_V2)


def test_format_follows_the_template_text(fire):
    assert fire.tool_format is FIREFUNCTION_V2
    assert ChatTemplate(TEMPLATE_PATH.read_text()).tool_format is QWEN_XML
    assert tool_format_of("{{ messages[0]['content'] }}") is QWEN_XML


def test_render_gets_date_and_functions(fire):
    """llama-server's test_date_inside_prompt: the template concatenates `functions` and `datetime`."""
    msgs = [{"role": "user", "content": "What is today?"}]
    today = datetime.date.today().strftime("%b %d %Y")
    plain = fire.render(msgs)
    assert f"Today is {today}." in plain and plain.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    with_tools = fire.render(msgs, tools=TOOLS)
    assert json.dumps(TOOLS, indent=2) in with_tools and json.dumps(TOOLS, indent=2) not in plain


def test_past_calls_render_as_functools(fire):
    call = {"type": "function", "function": {"name": "special_function", "arguments": {"arg1": 1}}}
    out = fire.render([{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call]}],
                      add_generation_prompt=False, tools=TOOLS)
    assert ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]<|eot_id|>' in out


def test_call_is_parsed():
    msg = read(' functools[{"name": "special_function", "arguments": {"arg1": 1}}]')
    assert msg.content == "" and msg.reasoning_content == ""
    assert msg.tool_calls == [ToolCall("special_function", '{"arg1": 1}')]


def test_content_before_calls_and_several_calls():
    msg = read('Let me check. functools[{"name": "a", "arguments": {"x": "é"}}, '
               '{"name": "b", "arguments": "{\\"y\\": 2}"}]\n')
    assert msg.content == "Let me check."
    assert msg.tool_calls == [ToolCall("a", '{"x": "é"}'), ToolCall("b", '{"y": 2}')]


def test_no_call_is_content():
    assert read("Hello, world!\nWhat's up?").content == "Hello, world!\nWhat's up?"
    assert read("Hello, world!\nWhat's up?").tool_calls == []


@pytest.mark.parametrize("text", [
    ' functools[{"name": "special_function", "arguments": {"arg1": 1}',      # never closed
    ' functools[{"arguments": {"arg1": 1}}]',                                 # no name
    ' functools[{"name": "special_function", "arguments": {}}] and more',    # text after the array
    ' functools{"name": "special_function"}',                                 # no array
])
def test_malformed_calls_stay_content(text):
    msg = read(text)
    assert msg.tool_calls == [] and msg.content == text


def test_streaming_holds_back_the_marker_and_an_open_array():
    assert read("Sure functo", partial=True).content == "Sure"
    assert read('Sure functools[{"name": "spe', partial=True).content == "Sure"
    done = read('Sure functools[{"name": "special_function", "arguments": {}}]', partial=True)
    assert done.content == "Sure" and done.tool_calls == [ToolCall("special_function", "{}")]


def test_without_tools_the_reply_is_not_parsed():
    text = ' functools[{"name": "special_function", "arguments": {}}]'
    assert parse_output(text, tools=None, generation_prompt="", tool_format=FIREFUNCTION_V2).content == text


def test_qwen_xml_unchanged_by_default():
    text = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>"
    msg = parse_output(text, tools=TOOLS, generation_prompt="")
    assert msg.tool_calls == [ToolCall("special_function", '{"arg1":1}')]
    assert parse_output(text, tools=TOOLS, generation_prompt="", tool_format=FIREFUNCTION_V2).tool_calls == []


# -- the server: the template picks the format for the whole request ------------------------------------------------

def test_stream_deltas_give_content_then_the_calls():
    from llamacmp.server.chat_api import ChatPrompt, DeltaTracker
    cp = ChatPrompt("", [], 0, TOOLS, True, "auto", False, tool_format=FIREFUNCTION_V2)
    tracker = DeltaTracker(cp)
    reply = 'Checking. functools[{"name": "special_function", "arguments": {"arg1": 1}}]'
    deltas = [d for i in range(0, len(reply), 5) for d in tracker.push(reply[i:i + 5])] + tracker.push("", final=True)
    assert "".join(d.get("content", "") for d in deltas) == "Checking."
    calls = [d["tool_calls"][0]["function"] for d in deltas if "tool_calls" in d]
    assert calls == [{"name": "special_function", "arguments": '{"arg1": 1}'}]


@pytest.fixture(scope="module")
def fire_server(tmp_path_factory):
    from server_harness import LiveServer, write_tiny_model
    model = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")
    with LiveServer(model, "-c", "2048", "-np", "1", "--chat-template-file", str(FIRE_PATH)) as s:
        yield s


def test_server_renders_functions_and_requires_functools_calls(fire_server):
    import httpx
    msgs = [{"role": "user", "content": "What is today?"}]
    r = httpx.post(fire_server.url + "/apply-template", json={"messages": msgs, "tools": TOOLS}, timeout=60)
    assert r.status_code == 200
    prompt = r.json()["prompt"]
    assert datetime.date.today().strftime("%b %d %Y") in prompt and '"name": "special_function"' in prompt
    # "required": the grammar writes this template's functools[...] (the tiny model alone would write anything)
    ping = {"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}}
    r = httpx.post(fire_server.url + "/v1/chat/completions", timeout=120,
                   json={"messages": msgs, "tools": [ping], "tool_choice": "required", "max_tokens": 64})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [{"name": "ping", "arguments": "{}"}]
