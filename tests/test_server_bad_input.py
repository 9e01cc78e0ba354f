"""Bad client input is a 4xx naming the problem, never a 500, and the server goes on serving (issue 22)."""
from __future__ import annotations

import json

import httpx
import pytest

from llamacmp.server.errors import ApiError
from llamacmp.server.vision_input import image_url_bytes
from server_harness import LiveServer, write_tiny_model

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


@pytest.fixture(scope="module")
def srv(model):
    with LiveServer(model, "-c", "1024", "-np", "2", "-n", "4", "--slots") as s:
        yield s


@pytest.fixture
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c
        assert c.get("/health").status_code == 200          # still serving after each case


def deep(n: int) -> str:
    return "[" * n + "]" * n


# (path, raw body, status, a piece of the message)
RAW = [
    ("/completion", '{"prompt": "Hi", "temperature": NaN}', 400, "'temperature'"),
    ("/completion", '{"prompt": "Hi", "top_p": Infinity}', 400, "'top_p'"),
    ("/completion", '{"prompt": "Hi", "min_p": -Infinity}', 400, "'min_p'"),
    ("/completion", '{"prompt": "Hi", "temperature": 1e999}', 400, "'temperature'"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "top_p": [1e999]}', 400, "'top_p[0]'"),
    ("/completion", '{"prompt": "Hi", "n_predict": ' + "9" * 5000 + "}", 400, "'n_predict'"),
    ("/tokenize", '{"content": "x", "junk": ' + "1" * 4301 + "}", 400, "'junk'"),
    ("/completion", '{"prompt": "Hi", "x": ' + deep(1000) + "}", 400, "nested"),
    ("/completion", '{"prompt": "Hi", "x": ' + deep(100000) + "}", 400, "nested"),
    ("/completion", '{"prompt": "Hi", "json_schema": ' + '{"items":' * 300 + "{}" + "}" * 300 + "}", 400,
     "nested"),
    ("/completion", '{"prompt": "\\ud800"}', 400, "'prompt'"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff x"}]}', 400,
     "'messages[0].content'"),
    ("/tokenize", '{"content": "x", "\\ud800": 1}', 400, "surrogate"),
    ("/completion", '{"prompt": "Hi", "n_predict": 1e20}', 400, "'n_predict'"),
    ("/completion", '{"prompt": "Hi", "n_predict": 99999999999999999999}', 400, "'n_predict'"),
    ("/completion", '{"prompt": "Hi", "top_k": -3000000000}', 400, "'top_k'"),
    ("/completion", '{"prompt": "Hi", "temperature": 1e39}', 400, "'temperature'"),
    ("/detokenize", '{"tokens": [NaN]}', 400, "'tokens[0]'"),
]


@pytest.mark.parametrize("path,raw,status,piece", RAW, ids=[f"{i}" for i in range(len(RAW))])
def test_bad_json_values(http, path, raw, status, piece):
    r = http.post(path, content=raw.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text[:300]
    assert piece in r.json()["error"]["message"], r.json()


def test_temperature_below_float_range_is_greedy(http):
    """llama.cpp reads temperature as a float: 5e-324 is 0 there, i.e. greedy (it was a 500 'Probabilities contain
    NaN' here)."""
    body = {"prompt": "Hi", "n_predict": 4, "seed": 1}
    tiny = http.post("/completion", json={**body, "temperature": 5e-324})
    assert tiny.status_code == 200, tiny.text
    greedy = http.post("/completion", json={**body, "temperature": 0}).json()
    assert tiny.json()["content"] == greedy["content"]
    for t in (1e-40, 1e-30):                  # f32 denormal / tiny: the scaled logits must not overflow
        assert http.post("/completion", json={**body, "temperature": t}).json()["content"] == greedy["content"]


def test_non_ascii_digits(http):
    r = http.post("/slots/\u00b2?action=erase", json={})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid slot ID"
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 1, "logit_bias": {"\u00b2": -1, "\u0663": 1}})
    assert r.status_code == 200, r.text


CHAT = [
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}, *USER]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}, *USER]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": "call"}, *USER]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [1]}, *USER]}, "messages[0].tool_calls[0]"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": "f"}]}, *USER]},
     "messages[0].tool_calls[0].function"),
    ({"messages": [{"role": "user", "content": [1]}]}, "unsupported content[].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": 5, "content": "x"}]}, "messages[0].role"),
    ({"messages": USER, "chat_template_kwargs": {"raise_exception": 1}}, "chat_template_kwargs.raise_exception"),
    ({"messages": USER, "chat_template_kwargs": {"namespace": "x"}}, "chat_template_kwargs.namespace"),
    ({"messages": USER, "chat_template_kwargs": {"messages": "x"}}, "chat_template_kwargs.messages"),
    ({"messages": USER, "chat_template_kwargs": {"bos_token": 5}}, "chat_template_kwargs.bos_token"),
    ({"messages": USER, "tools": [{"type": "function", "function": "f"}]}, "tools[0].function"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                 "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
     "image input is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA=="}}]}]},
     "audio input is not supported"),
]


@pytest.mark.parametrize("body,piece", CHAT, ids=[f"{i}" for i in range(len(CHAT))])
def test_chat_shapes_are_400(http, body, piece):
    for path in ("/v1/chat/completions", "/apply-template"):
        r = http.post(path, json={**body, "max_tokens": 2})
        assert r.status_code == 400, (path, r.text[:300])
        assert piece in r.json()["error"]["message"], r.json()


MESSAGES = [
    {"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
    {"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": ["a"]}]}]},
    {"max_tokens": 2, "system": [{"type": "text", "text": 7}], "messages": USER},
    {"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"max_tokens": 2, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": 5}]},
                                   *USER]},
]


@pytest.mark.parametrize("body", MESSAGES, ids=[f"{i}" for i in range(len(MESSAGES))])
def test_anthropic_shapes_are_4xx(http, body):
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = http.post(path, json=body)
        assert 400 <= r.status_code < 500, (path, r.text[:300])


def test_multimodal_data_without_projector_is_400(http):
    r = http.post("/completion", json={"prompt": {"prompt_string": "x <__media__>", "multimodal_data": ["AA=="]}})
    assert r.status_code == 400 and "model does not support multimodal" in r.json()["error"]["message"]


def test_nul_in_a_file_url(tmp_path):
    with pytest.raises(ApiError) as e:
        image_url_bytes("file://a\0b.png", str(tmp_path))
    assert e.value.code == 400 and "file path is not allowed" in e.value.message


@pytest.mark.parametrize("template,piece", [
    ("{% include 'other.jinja' %}", "no loader"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursion"),
    ("{{ 1 / (messages | length - 1) }}", "division"),
    ("{{ raise_exception('no system role') }}", "no system role"),
    ("{{ 'x' * 2000000000 }}", "too large"),                      # not 2 GB at load (jinja folds constants)
    ("{{ messages[0].content * 1000000000 }}", "too large"),
])
def test_operator_template_that_fails_a_one_message_chat_is_refused_at_start(template, piece):
    """llama.cpp's start-up check renders a one-message chat with the operator's template and refuses the template
    when that fails; the jinja error behind it must be a TemplateError (never a crash), whatever its kind."""
    from llamacmp.args import ArgError, parse_args
    from llamacmp.chat import TemplateError, select_template
    with pytest.raises(ArgError, match="the supplied chat template is not supported"):
        parse_args("server", ["-m", "x.gguf", "--chat-template", template])
    with pytest.raises(TemplateError) as e:
        select_template({}, None, template, True).render([{"role": "user", "content": "test"}])
    assert piece in str(e.value).lower() or piece in repr(e.value.__cause__).lower(), str(e.value)


TWO = USER + [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]


@pytest.mark.parametrize("template,piece", [
    ("{% if messages | length > 1 %}{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}{% endif %}x", "chat template"),
    ("{{ 1 / (messages | length - 3) }}", "ZeroDivisionError"),
    ("{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}x", "one message only"),
    ("{% if messages | length > 1 %}{{ messages[2].content * 1000000000 }}{% endif %}x", "too large"),
])
def test_operator_template_failures_at_request_time_are_400(model, template, piece):
    with LiveServer(model, "-c", "512", "-np", "1", "--chat-template", template) as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/v1/chat/completions", json={"messages": TWO, "max_tokens": 1})
        assert r.status_code == 400 and piece in r.json()["error"]["message"], r.text[:300]
        assert c.get("/health").status_code == 200
