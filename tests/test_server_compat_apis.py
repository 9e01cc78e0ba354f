"""The converted APIs: Anthropic /v1/messages (+count_tokens), OpenAI /v1/responses, and /infill, over HTTP."""
from __future__ import annotations

import json

import httpx
import pytest

from server_harness import LiveServer, write_tiny_model, write_tool_fixture

ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "weather",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with LiveServer(write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf"), "-c", "2048", "-np", "2") as s:
        yield s


@pytest.fixture(scope="module")
def tool_srv(tmp_path_factory):
    model = write_tool_fixture(tmp_path_factory.mktemp("t") / "tool.gguf", "<think>\n\n</think>\n\n")
    with LiveServer(model, "-c", "4096", "-np", "1", "-rea", "off") as s:
        yield s


def events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_messages_shape(srv):
    r = httpx.post(srv.url + "/v1/messages", json={"model": "x", "max_tokens": 5, "system": "Be brief.", "temperature": 0,
                                                   "messages": [{"role": "user", "content": "Hi"}]}).json()
    assert r["type"] == "message" and r["role"] == "assistant" and r["id"].startswith("msg_")
    assert r["stop_reason"] == "max_tokens" and r["usage"]["output_tokens"] == 5
    assert [b["type"] for b in r["content"]] in (["thinking"], ["thinking", "text"], ["text"])


def test_messages_stream_events(srv):
    r = httpx.post(srv.url + "/v1/messages", json={"model": "x", "max_tokens": 4, "stream": True, "temperature": 0,
                                                   "messages": [{"role": "user", "content": "Hi"}]})
    ev = events(r.text)
    names = [e for e, _ in ev]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert "content_block_start" in names and "content_block_stop" in names
    assert ev[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_messages_thinking_disabled(srv):
    r = httpx.post(srv.url + "/v1/messages", json={"model": "x", "max_tokens": 4, "thinking": {"type": "disabled"},
                                                   "messages": [{"role": "user", "content": "Hi"}]}).json()
    assert all(b["type"] != "thinking" for b in r["content"])


def test_count_tokens(srv):
    body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}]}
    n = httpx.post(srv.url + "/v1/messages/count_tokens", json=body).json()["input_tokens"]
    prompt = httpx.post(srv.url + "/apply-template", json=body).json()["prompt"]
    assert n == len(httpx.post(srv.url + "/tokenize", json={"content": prompt}).json()["tokens"])


def test_messages_tool_use(tool_srv):
    body = {"model": "x", "max_tokens": 32, "tools": ANTHROPIC_TOOLS, "temperature": 0,
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    r = httpx.post(tool_srv.url + "/v1/messages", json=body).json()
    assert r["stop_reason"] == "tool_use"
    use = [b for b in r["content"] if b["type"] == "tool_use"]
    assert use and use[0]["name"] == "get_weather" and use[0]["input"] == {"city": "Paris"}
    # a follow-up carrying the tool_use and its tool_result converts and runs
    follow = {**body, "messages": body["messages"] + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]}
    assert httpx.post(tool_srv.url + "/v1/messages", json=follow).status_code == 200
    ev = events(httpx.post(tool_srv.url + "/v1/messages", json={**body, "stream": True}).text)
    starts = [d["content_block"] for e, d in ev if e == "content_block_start"]
    assert starts[-1]["type"] == "tool_use" and starts[-1]["name"] == "get_weather"
    partial = "".join(d["delta"]["partial_json"] for e, d in ev
                      if e == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert [d for e, d in ev if e == "message_delta"][0]["delta"]["stop_reason"] == "tool_use"


def test_responses(srv, tool_srv):
    r = httpx.post(srv.url + "/v1/responses", json={"model": "x", "input": "Hi", "instructions": "Be brief.",
                                                    "max_output_tokens": 4, "temperature": 0}).json()
    assert r["object"] == "response" and r["status"] == "completed" and r["usage"]["output_tokens"] == 4
    ev = events(httpx.post(srv.url + "/v1/responses", json={"model": "x", "input": "Hi", "max_output_tokens": 3,
                                                            "stream": True}).text)
    assert ev[0][0] == "response.created" and ev[-1][0] == "response.completed"
    bad = httpx.post(srv.url + "/v1/responses", json={"input": "Hi", "previous_response_id": "resp_1"})
    assert bad.status_code == 400 and "previous_response_id" in bad.json()["error"]["message"]
    assert httpx.post(srv.url + "/v1/responses", json={"model": "x"}).status_code == 400
    tools = [{"type": "function", "name": "get_weather", "parameters": ANTHROPIC_TOOLS[0]["input_schema"]}]
    r = httpx.post(tool_srv.url + "/v1/responses", json={"input": [{"role": "user", "content": "Weather?"}],
                                                         "tools": tools, "temperature": 0}).json()
    call = [o for o in r["output"] if o["type"] == "function_call"][0]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}


def test_responses_stream_telemetry(srv):
    """0c1e570 test_responses_stream_with_llama_telemetry: return_progress creates the response at the first
    progress update, each update is a response.in_progress event with prompt_progress; timings_per_token puts
    timings on the last event of each update; response.completed always has them."""
    body = {"input": "This is a test" * 10, "max_output_tokens": 4, "stream": True,
            "chat_template_kwargs": {"enable_thinking": False}}
    ev = events(httpx.post(srv.url + "/v1/responses", json={**body, "return_progress": True,
                                                            "timings_per_token": True}).text)
    assert [e for e, _ in ev[:2]] == ["response.created", "response.in_progress"]
    progress = [d for e, d in ev if "prompt_progress" in d]
    assert progress and progress[0] is ev[1][1] and all(d["type"] == "response.in_progress" for d in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"] > 0
    assert any(e == "response.output_text.delta" and "timings" in d for e, d in ev)
    assert "prompt_per_second" in ev[-1][1]["timings"] and ev[-1][0] == "response.completed"
    plain = events(httpx.post(srv.url + "/v1/responses", json=body).text)
    assert not any("prompt_progress" in d for _, d in plain)
    assert [e for e, d in plain if "timings" in d] == ["response.completed"]


def test_infill(srv):
    r = httpx.post(srv.url + "/infill", json={"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n",
                                              "input_extra": [{"filename": "util.py", "text": "X = 1\n"}],
                                              "n_predict": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    assert "<|fim_prefix|>" in r.json()["prompt"] and r.json()["prompt"].endswith("<|fim_middle|>")
    assert httpx.post(srv.url + "/infill", json={"input_prefix": "x"}).status_code == 400
    assert httpx.post(srv.url + "/infill", json={"input_prefix": "x", "input_suffix": "y",
                                                 "input_extra": "z"}).status_code == 400
