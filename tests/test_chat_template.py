"""Chat template rendering (the real Qwen3.5 template, sandboxed) and the Qwen3.5 output parser."""
from __future__ import annotations

import itertools
import json

import pytest

from llamacmp.chat import (CHATML_TEMPLATE, ChatTemplate, ReasoningSplitter, TemplateError, parse_output,
                           parse_tool_calls, split_reasoning, thinking_switch)
from llamacmp.fixtures.writer import TEMPLATE_PATH

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather <now> & later",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "object"},
        "note": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def qwen():
    return ChatTemplate(TEMPLATE_PATH.read_text())


def test_generation_prompt_with_and_without_thinking(qwen):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert qwen.render(msgs) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                 "<|im_start|>assistant\n<think>\n")
    assert qwen.render(msgs, enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert qwen.supports_thinking
    assert not ChatTemplate(CHATML_TEMPLATE).supports_thinking


def test_tools_block_uses_hf_tojson(qwen):
    out = qwen.render([{"role": "user", "content": "weather?"}], tools=[WEATHER])
    assert out.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
    # HF's tojson: ", " / ": " separators, key order kept, no HTML escaping of < > &
    assert json.dumps(WEATHER) in out and "Weather <now> & later" in out


def test_tool_call_history_with_string_arguments(qwen):
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris", "units": {"t": "C"}}'}}]},
            {"role": "tool", "content": "sunny"}]
    out = qwen.render(msgs, tools=[WEATHER])
    assert ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            '<parameter=units>\n{"t": "C"}\n</parameter>\n</function>\n</tool_call><|im_end|>') in out
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in out


def test_developer_role_becomes_system(qwen):
    out = qwen.render([{"role": "developer", "content": "rules"}, {"role": "user", "content": "x"}])
    assert out.startswith("<|im_start|>system\nrules<|im_end|>")


def test_raise_exception_surfaces_as_template_error(qwen):
    with pytest.raises(TemplateError, match="No user query found"):
        qwen.render([{"role": "system", "content": "only system"}])


def test_helpers_and_loopcontrols():
    t = ChatTemplate("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"
                     "|{{ strftime_now('%Y') | length }}|{{ {'a': '<b>'} | tojson }}"
                     "|{{ [1, 2] | tojson(indent=2) | length > 6 }}")
    assert t.render([]) == '012|4|{"a": "<b>"}|True'


def test_sandbox_blocks_attribute_escape():
    with pytest.raises(TemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
    with pytest.raises(TemplateError, match="syntax error"):
        ChatTemplate("{% if %}")


def test_from_metadata_uses_gguf_template_and_chatml_fallback():
    md = {"tokenizer.chat_template": "X{{ messages[0].content }}", "tokenizer.ggml.eos_token_id": 1}
    t = ChatTemplate.from_metadata(md, ["a", "<eos>"])
    assert t.render([{"role": "user", "content": "m"}]) == "Xm" and t.eos_token == "<eos>"
    assert ChatTemplate.from_metadata({}).source == CHATML_TEMPLATE
    assert ChatTemplate.from_metadata(md, override="Y").source == "Y"


def test_split_reasoning_formats():
    out = "Let me think.\n</think>\n\nThe answer."
    # llama.cpp 0c1e570 drops the template's "\n" after <think> and any whitespace the model writes there
    # (b8462 kept it: compat/oracles.py DIVERGENCES); the whitespace before </think> stays
    assert split_reasoning(out) == ("Let me think.\n", "The answer.")
    assert split_reasoning(out, "deepseek") == ("Let me think.\n", "The answer.")
    assert split_reasoning(out, "none") == ("", out)
    assert split_reasoning(out, "deepseek-legacy") == ("Let me think.\n", out)
    assert split_reasoning("still thinking") == ("still thinking", "")
    assert split_reasoning("\n \tindented\n</think>x") == ("indented\n", "x")
    assert split_reasoning("\n</think>\n\nNo thoughts.") == ("", "No thoughts.")
    no_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert split_reasoning("plain", generation_prompt=no_think) == ("", "plain")
    assert split_reasoning("plain", thinking_open=False) == ("", "plain")
    # thinking off: the prompt closed an empty think block, so all output is content (leading space dropped)
    assert split_reasoning(" plain", thinking_open=False) == ("", "plain")
    # a template whose prompt opens no think block: a think block the model writes itself is still reasoning
    assert split_reasoning("<think>r</think>c", generation_prompt="<|im_start|>assistant\n") == ("r", "c")


def test_tool_calls_typed_by_schema():
    out = ("I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
           "<parameter=days>\n3\n</parameter>\n<parameter=units>\n{\"t\": \"C\"}\n</parameter>\n"
           "<parameter=note>\nline one\nline two\n</parameter>\n</function>\n</tool_call>")
    content, calls = parse_tool_calls(out, [WEATHER])
    assert content == "I'll check.\n\n"                  # llama.cpp keeps the text before the call verbatim
    assert [c.name for c in calls] == ["get_weather"]
    args = json.loads(calls[0].arguments)
    assert args == {"city": "42", "days": 3, "units": {"t": "C"}, "note": "line one\nline two"}
    # compact between arguments; non-string values keep their own text, like llama.cpp
    assert calls[0].arguments.startswith('{"city":"42","days":3,"units":{"t": "C"}')


def test_parse_output_full_message_with_two_calls():
    out = ("plan\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
           "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
           "</parameter>\n</function>\n</tool_call>")
    msg = parse_output(out, tools=[WEATHER])
    assert msg.reasoning_content == "plan\n" and msg.content == ""
    assert [json.loads(c.arguments)["city"] for c in msg.tool_calls] == ["Paris", "Rome"]
    assert parse_output(out).tool_calls == []            # no tools offered: the text stays content


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_streaming_splitter_matches_batch_split(step):
    out = "Step one.\nStep two.\n</think>\n\nFinal answer.\nDone."
    s = ReasoningSplitter(thinking_open=True)
    pieces = []
    for i in range(0, len(out), step):
        pieces += list(s.push(out[i:i + step]))
    pieces += list(s.flush())
    joined = {k: "".join(t for _, t in g) for k, g in itertools.groupby(pieces, key=lambda x: x[0])}
    # The streaming splitter is for display: it drops the blank lines around the tags.
    reasoning, content = split_reasoning(out.lstrip("\n"))
    assert (joined["reasoning"], joined["content"]) == (reasoning.strip("\n"), content)


def test_streaming_splitter_content_only_and_late_think():
    s = ReasoningSplitter(thinking_open=False)
    assert list(s.push("Hello")) == [("content", "Hello")]
    s = ReasoningSplitter(thinking_open=False)
    assert list(s.push("<thi")) == []
    assert list(s.push("nk>r</think>\n\nc")) == [("reasoning", "r"), ("content", "c")]
    s = ReasoningSplitter(thinking_open=True, reasoning_format="none")
    assert list(s.push("a</think>b")) == [("content", "a</think>b")]


def test_thinking_switches():
    assert thinking_switch("what is 2+2? /no_think") is False
    assert thinking_switch("/no_think first, then /think") is True
    assert thinking_switch("no switch here") is None
    assert thinking_switch("path/no_thinking") is None


def test_text_parts_joined_only_for_templates_that_take_strings_alone():
    """llama.cpp 0c1e570: text parts stay a list for a template that reads typed content (the Qwen3.5 one
    concatenates them); a template that only prints content as a string gets them joined with newlines."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "user\nab<|im_end|>" in ChatTemplate(TEMPLATE_PATH.read_text()).render(parts)
    assert ChatTemplate(CHATML_TEMPLATE).render(parts) == "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
