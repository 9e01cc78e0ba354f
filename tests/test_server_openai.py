"""llamacmp-server through the official `openai` client: typed responses, streamed and not, tool calls, auth."""
from __future__ import annotations

import json

import httpx
import pytest

# the [test] extra (pyproject.toml) has openai and CI installs it, so this module runs in CI; a machine without it
# (the GPU box) skips this module rather than failing the whole session's collection
openai = pytest.importorskip("openai", reason="openai is not installed (pip install -e '.[test]')")

from openai.types import Completion, Model  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

from server_harness import LiveServer, write_tiny_model, write_tool_fixture  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")
    with LiveServer(model, "-c", "4096", "-np", "2", "-a", "tiny-alias") as s:
        yield s


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    # with --reasoning off the generation prompt ends with "</think>\n\n"; the fixture continues it with a call
    model = write_tool_fixture(tmp_path_factory.mktemp("t") / "tool.gguf", "<think>\n\n</think>\n\n")
    with LiveServer(model, "-c", "4096", "-np", "2", "-rea", "off") as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture
def tool_client(tool_server):
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key="none", max_retries=0)


def test_models_list(client):
    models = list(client.models.list())
    assert len(models) == 1 and isinstance(models[0], Model)
    assert models[0].id == "tiny-alias"
    assert models[0].owned_by == "llamacpp"


def test_chat_non_streamed(client):
    r = client.chat.completions.create(model="anything", messages=[{"role": "user", "content": "Hello"}], **GREEDY)
    assert isinstance(r, ChatCompletion)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and len(r.id) == 9 + 32
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert r.model == "tiny-alias"


def _streamed_text(chunks: list[ChatCompletionChunk]) -> tuple[str, str]:
    content = reasoning = ""
    for c in chunks:
        for ch in c.choices:
            content += ch.delta.content or ""
            reasoning += (ch.delta.model_extra or {}).get("reasoning_content") or ""
    return reasoning, content


def test_chat_streamed_equals_non_streamed(client):
    messages = [{"role": "user", "content": "Tell me about the fox"}]
    whole = client.chat.completions.create(model="m", messages=messages, **GREEDY)
    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    reasoning, content = _streamed_text(chunks)
    msg = whole.choices[0].message
    assert content == (msg.content or "")
    assert reasoning == (msg.model_extra or {}).get("reasoning_content", "")


def test_chat_thinking_off_gives_content(client):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **GREEDY)
    msg = r.choices[0].message
    assert "reasoning_content" not in (msg.model_extra or {})
    assert isinstance(msg.content, str)


def test_completions(client, server):
    r = client.completions.create(model="m", prompt="The quick brown", **GREEDY)
    assert isinstance(r, Completion) and r.object == "text_completion"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    native = httpx.post(server.url + "/completion", json={"prompt": "The quick brown", "n_predict": 12,
                                                          "temperature": 0}).json()
    assert r.choices[0].text == native["content"]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt="The quick brown", stream=True, **GREEDY))
    assert streamed == native["content"]


def test_completion_stop_string(client, server):
    full = client.completions.create(model="m", prompt="The quick brown", **GREEDY).choices[0].text
    stop = full[3:6]
    assert stop
    r = client.completions.create(model="m", prompt="The quick brown", stop=stop, **GREEDY)
    assert r.choices[0].text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_tool_call_non_streamed(tool_client):
    r = tool_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                            tools=TOOLS, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert len(calls[0].id) == 32 and calls[0].id.isalnum()
    assert not choice.message.content


def test_tool_call_streamed(tool_client):
    chunks = list(tool_client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, temperature=0,
        stream=True))
    deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert deltas and deltas[0].index == 0 and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(args) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_result_round_trip(tool_client):
    """A follow-up that carries the assistant's tool call and the tool's answer renders and runs."""
    first = tool_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                                tools=TOOLS, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r = tool_client.chat.completions.create(model="m", messages=messages, tools=TOOLS, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"


def test_api_key(tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf")
    with LiveServer(model, "-c", "1024", "-np", "1", "--api-key", "k1,k2") as s:
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="k2", max_retries=0)
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            list(bad.models.list())             # as llama-server 0c1e570 (b8462: /v1/models was public)
        assert list(good.models.list())
        with pytest.raises(openai.AuthenticationError) as e:
            bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert e.value.status_code == 401
        r = good.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert r.usage.completion_tokens == 1


def test_context_overflow_is_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="fox " * 3000, max_tokens=1)
    body = e.value.body
    assert body["type"] == "exceed_context_size_error" and body["n_ctx"] == 2048   # -c 4096 shared by -np 2 slots
