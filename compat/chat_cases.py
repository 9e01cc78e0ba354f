"""The chat cases whose llama.cpp renders and parses become goldens (compat/gen_chat_goldens.py) and which
tests/test_compat_chat.py replays against llamacmp.chat. Deterministic: the same list every run."""
from __future__ import annotations

import itertools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "hours": {"type": "array", "items": {"type": "integer"}},
        "options": {"type": "object"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
                   "required": ["query"]}}}
TOOLS = [WEATHER, SEARCH]

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": '{"query": "cafés"}'}}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    "multi_turn": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"},
                   {"role": "user", "content": "and 2+2?"}],
    "reasoning_last": [{"role": "user", "content": "Think about it"},
                       {"role": "assistant", "content": "Done.", "reasoning_content": "Let me think."}],
    "reasoning_earlier": [{"role": "user", "content": "a"},
                          {"role": "assistant", "content": "b", "reasoning_content": "why b"},
                          {"role": "user", "content": "c"}],
    "unicode": [{"role": "user", "content": "日本語で答えて 🙂 — naïve café\n\ttabs"}],
    "tools_user": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}],
    "tool_call_result": [{"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": "", "tool_calls": [CALL]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21C"}],
    "two_tool_results": [{"role": "user", "content": "Weather and news?"},
                         {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, CALL2]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
                         {"role": "tool", "tool_call_id": "call_2", "content": "No news"}],
    "after_tools": [{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "Rain"},
                    {"role": "assistant", "content": "It rains."}, {"role": "user", "content": "Thanks"}],
    "empty_system": [{"role": "system", "content": ""}, {"role": "user", "content": "x"}],
    "long_multi": [m for i in range(4) for m in ({"role": "user", "content": f"question {i}"},
                                                  {"role": "assistant", "content": f"answer {i}"})]
                  + [{"role": "user", "content": "last"}],
    "content_parts": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                    {"type": "text", "text": "part two"}]}],
}
WITH_TOOLS = {"tools_user", "tool_call_result", "two_tool_results", "after_tools"}


def render_cases() -> list[dict]:
    cases = []
    for (name, msgs), thinking, gen in itertools.product(CONVERSATIONS.items(), (True, False), (True, False)):
        if name == "reasoning_last" and gen:
            continue            # a trailing assistant turn with a generation prompt is not a real request
        case = {"id": f"{name}-think{int(thinking)}-gen{int(gen)}", "messages": msgs,
                "enable_thinking": thinking, "add_generation_prompt": gen}
        if name in WITH_TOOLS:
            case["tools"] = TOOLS
        cases.append(case)
    return cases


TOOL_XML = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[9, 12]\n</parameter>\n"
            "<parameter=options>\n{\"unit\": \"C\"}\n</parameter>\n</function>\n</tool_call>")
TOOL_XML2 = "<tool_call>\n<function=search>\n<parameter=query>\nbest café\n</parameter>\n</function>\n</tool_call>"

OUTPUTS = {
    "plain": "Hello there.",
    "think_answer": "I should greet.\n</think>\n\nHello!",
    "think_only": "Still thinking about it",
    "think_multiline": "Step 1\nStep 2\n</think>\n\nLine A\nLine B",
    "tool": "I will check.\n</think>\n\n" + TOOL_XML,
    "tool_no_text": "ok\n</think>\n\n" + TOOL_XML,
    "two_tools": "Both.\n</think>\n\n" + TOOL_XML + "\n" + TOOL_XML2,
    "content_then_tool": "Let me see.\n</think>\n\nChecking now.\n\n" + TOOL_XML2,
    # whitespace the model writes at the start of its reasoning (0c1e570 drops it with the prompt's newline)
    "think_lead_space": "\n \tIndented thought\n</think>\n\nAnswer",
}


def parse_cases() -> list[dict]:
    """Each output parsed whole and at a few partial cut points, with and without tools, thinking on and off."""
    cases = []
    for (name, text), thinking, tools in itertools.product(OUTPUTS.items(), (True, False), (True, False)):
        if not thinking and "</think>" in text:
            text = text.split("</think>\n\n", 1)[1]       # with thinking off the model writes no reasoning
        cuts = sorted({len(text), len(text) // 3, (2 * len(text)) // 3})
        outputs = [{"text": text[:c], "is_partial": c < len(text)} for c in cuts]
        case = {"id": f"{name}-think{int(thinking)}-tools{int(tools)}",
                "messages": [{"role": "user", "content": "Go"}], "enable_thinking": thinking,
                "add_generation_prompt": True, "outputs": outputs}
        if tools:
            case["tools"] = TOOLS
            # llama.cpp only accepts a second call when the request allows parallel calls.
            case["parallel_tool_calls"] = name == "two_tools"
        cases.append(case)
    return cases
