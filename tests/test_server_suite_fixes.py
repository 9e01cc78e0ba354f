"""Server behaviours llama.cpp's own server test suite (tools/server/tests, b8462) checks, each as llama-server has
it: max_completion_tokens, image parts without a projector, exceed_context_size_error, CORS header names, /slots
of a never-used slot, response_format schemas, post-sampling probabilities at temperature 0, model aliases and
tags; and as llama-server 0c1e570 has them: the input_tokens routes, the "__verbose" debug field,
continue_final_message."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_harness import LiveServer, write_tiny_model  # noqa: E402

MSGS = [{"role": "user", "content": "What is the best book"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")
    with LiveServer(model, "-c", "256", "-np", "2", "--no-jinja", "-a", "tiny-2, fim,code,fim",
                    "--tags", "chat,fim,small") as s:
        yield s


def post(s, path: str, body: dict) -> httpx.Response:
    return httpx.post(s.url + path, json=body, timeout=120)


def test_slots_of_never_used_slot(server):
    # first, before any request in this module touches a slot
    slots = httpx.get(server.url + "/slots").json()
    assert [sorted(s) for s in slots] == [["id", "is_processing", "n_ctx", "speculative"]] * 2
    post(server, "/completion", {"prompt": "Hi", "n_predict": 1})
    used = [s for s in httpx.get(server.url + "/slots").json() if "params" in s]
    # the finished task's budget does not stay on the idle slot (0c1e570 test_metrics_slots_idle_after_completion;
    # b8462 showed n_decoded 1 here until the next task)
    assert len(used) == 1 and used[0]["next_token"][0]["n_decoded"] == 0 and used[0]["next_token"][0]["n_remain"] == -1
    assert used[0]["params"]["n_predict"] == 1


def test_model_aliases_and_tags(server):
    # llama-server keeps both in a std::set: stripped, unique, sorted; the first alias is the model's id
    model, = httpx.get(server.url + "/models").json()["data"]
    assert model["aliases"] == ["code", "fim", "tiny-2"] and model["id"] == "code"
    assert model["tags"] == ["chat", "fim", "small"]
    assert post(server, "/completion", {"prompt": "Hi", "n_predict": 1}).json()["model"] == "code"


def test_input_tokens_routes(server):
    n = post(server, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        assert post(server, path, {"messages": MSGS}).json() == {"input_tokens": n}
    for path in ("/responses/input_tokens", "/v1/responses/input_tokens"):
        assert post(server, path, {"input": MSGS[0]["content"]}).json() == {"input_tokens": n}
    assert post(server, "/v1/responses/input_tokens", {}).status_code == 400


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {"messages": MSGS}),
                                        ("/v1/completions", {"prompt": "What is the best book"})])
def test_verbose_field(server, path, body):
    body = {**body, "max_tokens": 2, "temperature": 0}
    plain = post(server, path, body).json()
    assert "__verbose" not in plain and "__verbose" not in post(server, path, {**body, "verbose": False}).json()
    r = post(server, path, {**body, "verbose": True}).json()
    native = r["__verbose"]
    assert "What is the best book" in native["prompt"] and native["tokens_predicted"] == 2
    assert native["tokens_evaluated"] == r["usage"]["prompt_tokens"] and native["stop"] is True


def test_verbose_server_adds_the_field_by_default(tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf")
    with LiveServer(model, "-c", "256", "--no-jinja", "-v") as s:
        body = {"messages": MSGS, "max_tokens": 1}
        assert "__verbose" in post(s, "/v1/chat/completions", body).json()
        assert "__verbose" not in post(s, "/v1/chat/completions", {**body, "verbose": False}).json()


def test_continue_final_message(server):
    chat = MSGS + [{"role": "assistant", "content": "Whill"}]
    body = {"messages": chat, "add_generation_prompt": False, "continue_final_message": True}
    prompt = post(server, "/apply-template", body).json()["prompt"]
    assert prompt.endswith("Whill") and prompt == post(server, "/apply-template", {"messages": chat}).json()["prompt"]
    both = post(server, "/chat/completions", {**body, "add_generation_prompt": True, "max_tokens": 1})
    assert both.status_code == 400 and "Cannot set both" in both.json()["error"]["message"]
    assert post(server, "/chat/completions", {"messages": chat, "continue_final_message": True}).status_code == 400
    r = post(server, "/apply-template", {**body, "continue_final_message": "x"})
    assert r.status_code == 400 and "continue_final_message must be" in r.json()["error"]["message"]
    r = post(server, "/apply-template", {**body, "continue_final_message": "reasoning_content"})
    assert r.status_code == 400 and "reasoning_content" in r.json()["error"]["message"]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "1", "function": {
        "name": "f", "arguments": "{}"}}]}
    r = post(server, "/apply-template", {**body, "messages": MSGS + [call]})
    assert r.status_code == 400 and "tool calls" in r.json()["error"]["message"]


def test_prefill_text_parts_joined_as_0c1e570(server):
    # 0c1e570 test_chat_template_assistant_prefill[prefill1]: common_chat_msg::render_content's blank line between
    # text parts, none before the first non-empty one (b8462's test expected them concatenated)
    for parts, joined in ((["Wh", "ill"], "Wh\n\nill"), (["", "Wh", "", "ill"], "Wh\n\n\n\nill")):
        last = {"role": "assistant", "content": [{"type": "text", "text": t} for t in parts]}
        prompt = post(server, "/apply-template", {"messages": MSGS + [last]}).json()["prompt"]
        assert prompt.endswith(joined)
        assert prompt.count(joined) == 1


def test_several_host_addresses_are_each_listened_on(tmp_path):
    """--host 127.0.0.1,::1: a server on each address, as llama-server 0c1e570 (its test_basic.py
    test_server_multiple_addresses); a UNIX socket in the list is refused naming the flag."""
    from server_harness import ServerProcess
    model = write_tiny_model(tmp_path / "tiny.gguf")
    with ServerProcess(model, tmp_path / "log.txt", "--host", "127.0.0.1,::1", "--api-key", "k") as s:
        for host in ("127.0.0.1", "[::1]"):
            base = f"http://{host}:{s.port}"
            assert httpx.get(base + "/health", timeout=30).status_code == 200
            r = httpx.post(base + "/completion", json={"prompt": "Hi", "n_predict": 1},
                           headers={"Authorization": "Bearer k"}, timeout=60)
            assert r.status_code == 200
        assert f"http://127.0.0.1:{s.port}, http://[::1]:{s.port}" in s.log()
    r = subprocess.run([sys.executable, "-m", "llamacmp.server.app", "-m", "unused.gguf", "--host", "a.sock,::1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--host a.sock,::1: a UNIX socket cannot be listed" in r.stderr


def test_max_completion_tokens(server):
    body = {"messages": MSGS, "temperature": 0, "max_tokens": 8}
    assert post(server, "/v1/chat/completions", body).json()["usage"]["completion_tokens"] == 8
    r = post(server, "/v1/chat/completions", {**body, "max_completion_tokens": 3})
    assert r.json()["usage"]["completion_tokens"] == 3
    r = post(server, "/v1/chat/completions", {**body, "max_completion_tokens": 3, "n_predict": 2})
    assert r.json()["usage"]["completion_tokens"] == 2          # n_predict first, as llama.cpp reads them


def test_image_without_projector_is_client_error(server):
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "image input is not supported" in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_exceed_context_size_error(server, stream):
    big = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}] * 100
    r = post(server, "/chat/completions", {"messages": big, "stream": stream})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
    assert err["n_prompt_tokens"] > 256 and err["n_ctx"] == 128


def test_cors_header_names_as_llama_server(server):
    r = httpx.options(server.url + "/completions", headers={"Origin": "web.mydomain.fr",
                                                            "Access-Control-Request-Method": "POST"})
    names = {k.decode() for k, _ in r.headers.raw}
    assert {"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Access-Control-Allow-Methods",
            "Access-Control-Allow-Headers"} <= names
    assert r.headers["access-control-allow-origin"] == "web.mydomain.fr"
    # 0c1e570's --cors-methods default (b8462 answered "GET, POST")
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"


@pytest.mark.parametrize("rf", [{"type": "json_object", "schema": 123},
                                {"type": "json_schema", "json_schema": {"schema": "x"}},
                                {"type": "json_object", "schema": {"type": 123}}])
def test_invalid_response_format_schema(server, rf):
    r = post(server, "/chat/completions", {"messages": MSGS, "max_tokens": 2, "response_format": rf})
    assert r.status_code == 400 and "error" in r.json()


def test_valid_response_format_still_constrains(server):
    rf = {"type": "json_object", "schema": {"const": "42"}}
    r = post(server, "/chat/completions", {"messages": MSGS, "max_tokens": 6, "response_format": rf})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == '"42"'


def test_post_sampling_probs_at_temperature_0(server):
    r = post(server, "/completion", {"prompt": "I believe the meaning of life is", "n_probs": 10,
                                     "temperature": 0.0, "n_predict": 5, "post_sampling_probs": True})
    probs = r.json()["completion_probabilities"]
    assert len(probs) == 5
    for tok in probs:
        assert tok["prob"] == 1.0 and len(tok["top_probs"]) == 10
        assert [p["prob"] for p in tok["top_probs"]] == [1.0] + [0.0] * 9
        assert tok["top_probs"][0]["id"] == tok["id"]
    pre = post(server, "/completion", {"prompt": "I believe the meaning of life is", "n_probs": 10,
                                       "temperature": 0.0, "n_predict": 5}).json()["completion_probabilities"]
    assert all(t["logprob"] < 0 for t in pre)        # without the flag: the model's own (pre-sampling) values


def test_post_sampling_probs_follow_the_chain(server):
    r = post(server, "/completion", {"prompt": "Hi", "n_probs": 5, "temperature": 1.0, "top_k": 3,
                                     "n_predict": 2, "post_sampling_probs": True, "seed": 1})
    for tok in r.json()["completion_probabilities"]:
        top = [p["prob"] for p in tok["top_probs"]]
        assert len(top) == 3 and abs(sum(top) - 1.0) < 1e-6 and top == sorted(top, reverse=True)


# -- tool_choice "required" -------------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def jinja_server(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("j") / "tiny.gguf")
    with LiveServer(model, "--reasoning", "off") as s:
        yield s


def test_tool_choice_required_forces_a_call(jinja_server):
    body = {"messages": MSGS, "tools": [PING], "max_tokens": 40, "temperature": 0}
    auto = post(jinja_server, "/v1/chat/completions", body).json()["choices"][0]
    assert "tool_calls" not in auto["message"] and auto["message"]["content"]     # the random model writes prose
    r = post(jinja_server, "/v1/chat/completions", {**body, "tool_choice": "required"}).json()["choices"][0]
    assert r["finish_reason"] == "tool_calls"
    assert [c["function"] for c in r["message"]["tool_calls"]] == [{"name": "ping", "arguments": "{}"}]


def test_tool_choice_required_with_arguments(jinja_server):
    body = {"messages": MSGS, "tools": [WEATHER, PING], "tool_choice": "required", "max_tokens": 24,
            "temperature": 0, "reasoning_format": "none"}
    r = post(jinja_server, "/v1/chat/completions", body).json()["choices"][0]
    msg = r["message"]
    if r["finish_reason"] == "tool_calls":
        assert msg["tool_calls"][0]["function"]["name"] in ("get_weather", "ping")
    else:                       # out of tokens inside an argument: the text so far is a call, never prose
        assert r["finish_reason"] == "length" and not msg.get("content")


def test_tool_choice_required_refuses_a_second_constraint(jinja_server):
    body = {"messages": MSGS, "tools": [PING], "tool_choice": "required",
            "response_format": {"type": "json_object"}}
    assert post(jinja_server, "/v1/chat/completions", body).status_code == 400


# -- generation_settings.logit_bias ------------------------------------------------------------------------------------

def test_logit_bias_listed_as_llama_server_with_ignore_eos(server):
    """llama-server lists the biases in effect as {"bias", "token"} (-inf as null) and, with ignore_eos, appends every
    end-of-generation token at -inf (0c1e570 test_ignore_eos.py); without it only the request's own."""
    body = {"prompt": "Hi", "n_predict": 1, "logit_bias": [[5, 2.0], [6, False]]}
    plain = post(server, "/completion", body).json()["generation_settings"]["logit_bias"]
    assert plain == [{"bias": 2.0, "token": 5}, {"bias": None, "token": 6}]
    eos = post(server, "/completion", {**body, "ignore_eos": True}).json()["generation_settings"]["logit_bias"]
    assert eos[:2] == plain and len(eos) > 2
    assert all(e["bias"] is None for e in eos[2:])
