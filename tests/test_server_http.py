"""Every endpoint and error case of llamacmp-server over real HTTP (httpx on loopback)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from llamacmp.args import parse_args
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.server.app import create_app
from llamacmp.server.context import ServerContext
from server_harness import LiveServer, free_port, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


@pytest.fixture(scope="module")
def srv(model):
    with LiveServer(model, "-c", "4096", "-np", "2", "-n", "16", "--metrics") as s:
        yield s


@pytest.fixture
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


def sse_lines(text: str) -> list[str]:
    return [b[len("data: "):] for b in text.split("\n\n") if b.startswith("data: ")]


def err(r: httpx.Response) -> dict:
    return r.json()["error"]


# -- health, models, props ------------------------------------------------------------------------------------------

def test_health(http):
    for path in ("/health", "/v1/health"):
        r = http.get(path)
        assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_models(http):
    for path in ("/models", "/v1/models"):
        body = http.get(path).json()
        assert body["object"] == "list" and body["data"][0]["id"] == "tiny.gguf"
        meta = body["data"][0]["meta"]
        assert meta["n_vocab"] > 256 and meta["n_embd"] == 64 and meta["n_params"] > 0
        assert body["models"][0]["details"]["format"] == "gguf"
        # as llama-server 0c1e570: the slot's context, the file type's name, the name among the aliases
        assert meta["n_ctx"] == 2048 and meta["ftype"] == "all F32"
        assert body["data"][0]["aliases"] == ["tiny.gguf"]


def test_models_aliases_as_a_sorted_set(model):
    with LiveServer(model, "-c", "512", "-np", "1", "--alias", "zeta, alpha,zeta") as s:
        data = httpx.get(s.url + "/v1/models").json()["data"][0]
        assert data["aliases"] == ["alpha", "zeta"] and data["id"] == "alpha"    # as 0c1e570: the set's first


def test_props(http):
    p = http.get("/props").json()
    assert p["total_slots"] == 2 and p["default_generation_settings"]["n_ctx"] == 2048
    assert "<|im_start|>" in p["chat_template"] and p["eos_token"] == "<|im_end|>"
    assert p["endpoint_metrics"] is True and p["build_info"].startswith("b8462")
    # fields llama-server 0c1e570 added, as they are true here: no video input, images at llamacmp's media marker
    # (a fixed one; 0c1e570 draws a random one per start), no MCP CORS proxy
    assert p["model_ftype"] == "all F32" and p["modalities"] == {"vision": False, "video": False, "audio": False}
    assert p["media_marker"] == "<__media__>" and p["cors_proxy_enabled"] is False
    r = http.post("/props", json={})
    assert r.status_code == 501 and err(r)["type"] == "not_supported_error"


def test_unknown_path_and_method(http):
    r = http.get("/nope")
    assert r.status_code == 404 and err(r) == {"code": 404, "message": "File Not Found", "type": "not_found_error"}
    assert http.get("/completion").status_code == 404


def test_loading_returns_503(model):
    """Before the model is loaded every route, /health included, answers 503 'Loading model'."""
    import threading
    import uvicorn
    port = free_port()
    ctx = ServerContext(parse_args("server", ["-m", str(model), "-c", "512", "-np", "1"]).params)
    server = uvicorn.Server(uvicorn.Config(create_app(ctx), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.02)
    try:
        for path in ("/health", "/v1/models"):
            r = httpx.get(f"http://127.0.0.1:{port}{path}")
            assert r.status_code == 503 and err(r) == {"code": 503, "message": "Loading model",
                                                       "type": "unavailable_error"}
        ctx.load(NumpyBackend())
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    finally:
        server.should_exit = True
        t.join(timeout=10)
        if ctx.engine:
            ctx.engine.stop()


# -- /completion --------------------------------------------------------------------------------------------------------

def test_completion_fields(http):
    r = http.post("/completion", json={"prompt": "Hello", "n_predict": 5, "temperature": 0, "return_tokens": True})
    b = r.json()
    assert r.status_code == 200
    for key in ("index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
                "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word",
                "tokens_cached", "timings"):
        assert key in b, key
    assert b["stop"] is True and b["stop_type"] == "limit" and b["tokens_predicted"] == 5 and len(b["tokens"]) == 5
    assert b["prompt"] == "Hello" and b["generation_settings"]["n_predict"] == 5
    assert set(b["timings"]) >= {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
                                 "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
    detok = http.post("/detokenize", json={"tokens": b["tokens"]}).json()["content"]
    assert detok == b["content"]


def test_completion_stream_order(http):
    r = http.post("/completion", json={"prompt": "Hello", "n_predict": 4, "temperature": 0, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = [json.loads(x) for x in sse_lines(r.text)]
    assert "[DONE]" not in r.text                         # the native endpoint sends no end marker
    assert [c["stop"] for c in chunks] == [False] * 4 + [True]
    assert chunks[-1]["content"] == "" and chunks[-1]["stop_type"] == "limit"
    whole = http.post("/completion", json={"prompt": "Hello", "n_predict": 4, "temperature": 0}).json()
    assert "".join(c["content"] for c in chunks) == whole["content"]


@pytest.mark.parametrize("field,value,want,got", [("n_probs", "two", "number", "string"),
                                                   ("n_predict", "5", "number", "string"),
                                                   ("max_tokens", [5], "number", "array"),
                                                   ("temperature", True, "number", "boolean"),
                                                   ("stream", "yes", "boolean", "string"),
                                                   ("cache_prompt", 1, "boolean", "number")])
def test_completion_wrong_types_are_refused_as_current_llama_cpp(http, field, value, want, got):
    """llama-server 0c1e570 types its generation parameters: 400 naming the field (b8462 used the default)."""
    r = http.post("/completion", json={"prompt": "Hi", field: value})
    assert r.status_code == 400 and err(r) == {
        "code": 400, "type": "invalid_request_error",
        "message": f"Field '{field}': [json.exception.type_error.302] type must be {want}, but is {got}"}


def test_completion_server_default_n_predict_and_nulls(http):
    # null means absent: the server's defaults (-n 16 here, top_k 40); only the first n_predict name given is read
    b = http.post("/completion", json={"prompt": "Hi", "n_predict": None, "temperature": 0, "top_k": None}).json()
    assert b["tokens_predicted"] == 16 and b["generation_settings"]["top_k"] == 40
    b = http.post("/completion", json={"prompt": "Hi", "max_tokens": 3, "n_predict": None, "temperature": 0,
                                       "id_slot": "any"}).json()
    assert b["tokens_predicted"] == 3          # id_slot stays lenient in 0c1e570 too (json_value)


def test_prompt_forms(http):
    tokens = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    base = http.post("/completion", json={"prompt": "Hello world", "n_predict": 3, "temperature": 0}).json()
    as_ids = http.post("/completion", json={"prompt": tokens, "n_predict": 3, "temperature": 0}).json()
    mixed = http.post("/completion", json={"prompt": tokens[:1] + [" world"], "n_predict": 3, "temperature": 0})
    assert as_ids["content"] == base["content"] and mixed.status_code == 200
    many = http.post("/completion", json={"prompt": ["Hello world", "The fox"], "n_predict": 3,
                                          "temperature": 0}).json()
    assert isinstance(many, list) and [m["index"] for m in many] == [0, 1]
    assert many[0]["content"] == base["content"]
    bad = http.post("/completion", json={"prompt": [{"x": 1}], "n_predict": 1})
    assert bad.status_code == 400
    assert http.post("/completion", json={"n_predict": 1}).status_code == 400


def test_n_cmpl(http):
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 3, "temperature": 0, "n_cmpl": 2}).json()
    assert len(r) == 2 and r[0]["content"] == r[1]["content"]
    assert http.post("/completion", json={"prompt": "Hi", "n_cmpl": 3}).status_code == 400   # more than -np


def test_logit_bias(http):
    tok = http.post("/tokenize", json={"content": " fox"}).json()["tokens"][0]
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 4, "temperature": 0, "return_tokens": True,
                                       "logit_bias": [[tok, 100]]}).json()
    assert r["tokens"] == [tok] * 4
    r2 = http.post("/completion", json={"prompt": "Hi", "n_predict": 4, "temperature": 0, "return_tokens": True,
                                        "logit_bias": {str(tok): 100}}).json()
    assert r2["tokens"] == [tok] * 4
    base = http.post("/completion", json={"prompt": "Hi", "n_predict": 1, "temperature": 0,
                                          "return_tokens": True}).json()["tokens"][0]
    banned = http.post("/completion", json={"prompt": "Hi", "n_predict": 1, "temperature": 0, "return_tokens": True,
                                            "logit_bias": [[base, False]]}).json()["tokens"][0]
    assert banned != base


def test_seed_reproducible(http):
    body = {"prompt": "Hi", "n_predict": 8, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 42,
            "cache_prompt": False}
    a, b = http.post("/completion", json=body).json(), http.post("/completion", json=body).json()
    assert a["content"] == b["content"] and a["generation_settings"]["seed"] == 42


def test_n_probs(http):
    b = http.post("/completion", json={"prompt": "Hi", "n_predict": 2, "temperature": 0, "n_probs": 3}).json()
    probs = b["completion_probabilities"]
    assert len(probs) == 2
    first = probs[0]
    assert set(first) == {"id", "token", "bytes", "logprob", "top_logprobs"} and len(first["top_logprobs"]) == 3
    assert first["top_logprobs"][0]["id"] == first["id"]       # greedy: the chosen token is the most likely
    assert first["logprob"] <= 0
    post = http.post("/completion", json={"prompt": "Hi", "n_predict": 1, "temperature": 0, "n_probs": 2,
                                          "post_sampling_probs": True}).json()["completion_probabilities"][0]
    assert "prob" in post and "top_probs" in post


def test_response_fields(http):
    b = http.post("/completion", json={"prompt": "Hi", "n_predict": 2, "temperature": 0, "response_fields":
                                       ["content", "generation_settings/n_predict", "missing"]}).json()
    assert set(b) == {"content", "generation_settings/n_predict"} and b["generation_settings/n_predict"] == 2


def test_id_slot_and_cache_prompt(http):
    body = {"prompt": "The lazy dog sleeps", "n_predict": 2, "temperature": 0, "id_slot": 1}
    http.post("/completion", json=body)
    again = http.post("/completion", json=body).json()
    assert again["id_slot"] == 1 and again["timings"]["prompt_n"] == 0 and again["timings"]["cache_n"] > 0
    nocache = http.post("/completion", json={**body, "cache_prompt": False}).json()
    assert nocache["timings"]["cache_n"] == 0


def test_exceed_context(http):
    r = http.post("/completion", json={"prompt": "fox " * 2500, "n_predict": 1})
    e = err(r)
    assert r.status_code == 400 and e["type"] == "exceed_context_size_error"
    assert e["n_ctx"] == 2048 and e["n_prompt_tokens"] > 2048
    assert e["message"].startswith(f"request ({e['n_prompt_tokens']} tokens) exceeds the available context size")


def test_bad_json_and_bad_sampler_values(http):
    r = http.post("/completion", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    for body, field in (({"mirostat": 3}, "mirostat"), ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
                        ({"dry_multiplier": 0.8, "dry_base": 0.5}, "dry_base"),
                        ({"dry_sequence_breakers": []}, "dry_sequence_breakers"),
                        ({"dry_sequence_breakers": ["\n", 3]}, "dry_sequence_breakers")):
        r = http.post("/completion", json={"prompt": "x", "n_predict": 1, **body})
        assert r.status_code == 400 and field in err(r)["message"], body


def test_body_limit(http):
    r = http.post("/completion", content=b"x" * (33 * 1024 * 1024))
    assert r.status_code == 413


# -- OpenAI-style routes --------------------------------------------------------------------------------------------------

def test_v1_completions(http):
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0, "stream": True})
    lines = sse_lines(r.text)
    assert lines[-1] == "[DONE]"
    last = json.loads(lines[-2])
    assert last["choices"][0]["finish_reason"] == "length" and "timings" in last
    assert http.post("/v1/completions", json={"prompt": "x", "echo": True}).status_code == 400
    assert http.post("/v1/completions", json={"prompt": "x", "best_of": 2}).status_code == 400
    assert http.post("/v1/completions", json={"max_tokens": 1}).status_code == 400
    lp = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "logprobs": 2, "temperature": 0}).json()
    assert len(lp["choices"][0]["logprobs"]["content"]) == 2


@pytest.mark.parametrize("path", ["/chat/completions", "/v1/chat/completions"])
def test_chat_stream_shape(http, path):
    r = http.post(path, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
                              "stream": True, "stream_options": {"include_usage": True}})
    lines = sse_lines(r.text)
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert "timings" in chunks[-1]


def test_chat_errors(http):
    def post(body):
        return http.post("/v1/chat/completions", json=body)
    cases = [({}, "'messages' is required"), ({"messages": "hi"}, "Expected 'messages' to be an array"),
             ({"messages": [{"role": "user"}]}, "All non-assistant messages must contain 'content'"),
             ({"messages": [{"role": "assistant"}]}, "Assistant message must contain either 'content' or 'tool_calls'!"),
             ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}, "Invalid tool_choice"),
             ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "no"}},
              'invalid type for "enable_thinking"'),
             ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
              "top_logprobs requires logprobs to be set to true"),
             ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "unsupported content[].type"),
             ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
              "Assistant response prefill is incompatible with enable_thinking.")]
    for body, message in cases:
        r = post(body)
        assert r.status_code == 400, body
        assert err(r)["type"] == "invalid_request_error" and err(r)["message"].startswith(message), err(r)


def test_chat_logprobs_and_prefill(http):
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                                "logprobs": True, "top_logprobs": 2, "temperature": 0}).json()
    assert len(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure,"}],
        "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 2, "temperature": 0}).json()
    assert r["choices"][0]["finish_reason"] == "length"


def test_text_content_parts_reach_the_template_as_current_llama_cpp(http):
    """0c1e570 hands text parts to a template that reads typed content, and the Qwen3.5 one concatenates them (b8462
    joined them with a newline first): compat/goldens/0c1e570/chat_render.jsonl content_parts-*."""
    parts = [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]
    r = http.post("/apply-template", json={"messages": [{"role": "user", "content": parts}]})
    assert r.json()["prompt"].startswith("<|im_start|>user\npart onepart two<|im_end|>\n")
    # the /think switch is still seen in a message given as parts
    r = http.post("/apply-template", json={"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hi "}, {"type": "text", "text": "/no_think"}]}]})
    assert r.json()["prompt"].endswith("<think>\n\n</think>\n\n")


def test_apply_template_and_tokenize(http):
    prompt = http.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]}).json()["prompt"]
    assert prompt.startswith("<|im_start|>user\nHi<|im_end|>") and prompt.endswith("<|im_start|>assistant\n<think>\n")
    off = http.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi"}],
                                             "chat_template_kwargs": {"enable_thinking": False}}).json()["prompt"]
    assert off.endswith("<think>\n\n</think>\n\n")
    t = http.post("/tokenize", json={"content": "<|im_start|>hi"}).json()["tokens"]
    t_plain = http.post("/tokenize", json={"content": "<|im_start|>hi", "parse_special": False}).json()["tokens"]
    assert len(t) < len(t_plain)
    pieces = http.post("/tokenize", json={"content": "héllo", "with_pieces": True}).json()["tokens"]
    assert all(set(p) == {"id", "piece"} for p in pieces)
    # a piece that is not valid UTF-8 on its own comes back as a byte list; together they spell the text
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == "héllo"
    assert http.post("/detokenize", json={"tokens": t}).json()["content"] == "<|im_start|>hi"
    assert http.post("/detokenize", json={"tokens": [10 ** 9]}).status_code == 400


# -- slots, metrics, embeddings -------------------------------------------------------------------------------------------

def test_slots(http):
    slots = http.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and all(s["n_ctx"] == 2048 for s in slots)
    assert http.get("/slots?fail_on_no_slot=1").status_code == 200
    r = http.post("/slots/0?action=erase", json={})
    assert r.status_code == 200 and r.json()["id_slot"] == 0
    assert http.post("/slots/0?action=save", json={"filename": "x.bin"}).status_code == 501
    assert http.post("/slots/9?action=erase", json={}).status_code == 400
    assert http.post("/slots/0?action=dance", json={}).status_code == 400


def test_metrics(http):
    http.post("/completion", json={"prompt": "Hi", "n_predict": 2})
    r = http.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE llamacpp:prompt_tokens_total counter" in r.text
    values = dict(line.split(" ") for line in r.text.splitlines() if not line.startswith("#"))
    assert float(values["llamacpp:tokens_predicted_total"]) >= 2
    assert "llamacpp:requests_processing" in values
    # 0c1e570's speculative counters: nothing drafted without --spec-type draft-mtp
    assert values["llamacpp:spec_decode_num_draft_tokens_total"] == "0"
    assert values["llamacpp:spec_decode_num_drafts_total"] == "0"
    # 0c1e570 (its test_metrics.py): a cached-prompt counter, the busy-slots average as a gauge, and the start-time
    # header named as llama-server writes it (their harness reads headers into a plain dict)
    assert "# TYPE llamacpp:prompt_tokens_cached_total counter" in r.text
    assert "# TYPE llamacpp:n_busy_slots_per_decode gauge" in r.text
    assert b"Process-Start-Time-Unix" in dict(r.headers.raw)


def test_embeddings_not_supported(http):
    for path in ("/embedding", "/embeddings", "/v1/embeddings"):
        r = http.post(path, json={"input": "x"})
        assert r.status_code == 501 and err(r)["type"] == "not_supported_error"


# -- CORS, auth, disabled endpoints, unix socket -----------------------------------------------------------------------------

def test_cors(http):
    r = http.options("/v1/chat/completions", headers={"Origin": "http://example.test"})
    assert r.status_code == 200 and r.text == ""
    assert r.headers["access-control-allow-origin"] == "http://example.test"
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"     # 0c1e570 (b8462: GET, POST)
    assert http.get("/health", headers={"Origin": "http://a.b"}).headers["access-control-allow-origin"] == "http://a.b"


def test_cors_proxy_is_disabled(http):
    # llama-server 0c1e570's answer without --webui-mcp-proxy (its test_proxy.py::test_mcp_no_proxy); not a 404
    for method in ("GET", "POST"):
        r = http.request(method, "/cors-proxy?url=http://example.com")
        assert r.status_code == 403 and r.json()["error"] == {"message": "this feature is disabled",
                                                                "type": "feature_disabled"}


def test_auth_and_disabled_endpoints(model):
    with LiveServer(model, "-c", "512", "-np", "1", "--api-key", "secret", "--no-slots") as s:
        with httpx.Client(base_url=s.url) as c:
            assert c.get("/health").status_code == 200
            # the model lists need the key too, as in llama-server 0c1e570 (b8462 served them to anyone)
            for path in ("/v1/models", "/models"):
                assert c.get(path).status_code == 401
                assert c.get(path, headers={"Authorization": "Bearer secret"}).status_code == 200
            r = c.post("/completion", json={"prompt": "x", "n_predict": 1})
            assert r.status_code == 401 and err(r) == {"code": 401, "message": "Invalid API Key",
                                                       "type": "authentication_error"}
            ok = {"prompt": "x", "n_predict": 1}
            assert c.post("/completion", json=ok, headers={"Authorization": "Bearer secret"}).status_code == 200
            assert c.post("/completion", json=ok, headers={"X-Api-Key": "secret"}).status_code == 200
            r = c.get("/slots", headers={"Authorization": "Bearer secret"})
            assert r.status_code == 501
            assert c.get("/metrics", headers={"Authorization": "secret"}).status_code == 501
            assert c.options("/completion").status_code == 200        # preflight needs no key


def test_main_on_unix_socket(model, tmp_path):
    sock = str(tmp_path / "srv.sock")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "llamacmp.server.app", "-m", str(model), "--host", sock,
                             "-c", "512", "-np", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        transport = httpx.HTTPTransport(uds=sock)
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=30) as c:
            deadline = time.time() + 60
            while True:
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.time() < deadline, "server on the unix socket did not come up"
                time.sleep(0.2)
            r = c.post("/completion", json={"prompt": "Hi", "n_predict": 2, "temperature": 0})
            assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_reasoning_budget(http):
    """After N reasoning tokens the reply is forced to close </think> (greedy: the budgeted reasoning is a prefix
    of the unlimited one); budget 0 closes it at once."""
    def chat(**extra) -> dict:
        body = {"messages": [{"role": "user", "content": "Think hard"}], "max_tokens": 24, "temperature": 0}
        return http.post("/v1/chat/completions", json={**body, **extra}).json()["choices"][0]["message"]
    free = chat()["reasoning_content"]
    assert "content" in chat(thinking_budget_tokens=0) and not chat(thinking_budget_tokens=0).get("reasoning_content")
    short = chat(thinking_budget_tokens=3)["reasoning_content"].rstrip("\n")
    assert short and free.startswith(short) and len(short) < len(free.rstrip("\n"))


def test_grammar_and_json_schema(http):
    import re
    # bounded on purpose: a random model would happily write an endless integer
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 60, "temperature": 0, "json_schema": schema}).json()
    assert r["stop_type"] == "eos" and isinstance(json.loads(r["content"])["a"], bool)
    g = 'root ::= ("yes" | "no") " " [0-9]+'
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 20, "temperature": 0, "grammar": g}).json()
    assert re.fullmatch(r"(yes|no) [0-9]+", r["content"])
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 60, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}).json()
    assert isinstance(json.loads(r["choices"][0]["message"]["content"])["a"], bool)
    bad = http.post("/completion", json={"prompt": "Hi", "grammar": "root ::= (("})
    assert bad.status_code == 400 and "failed to parse grammar" in err(bad)["message"]
    both = http.post("/completion", json={"prompt": "Hi", "grammar": g, "json_schema": schema})
    assert both.status_code == 400 and err(both)["message"] == "Cannot use both json_schema and grammar"
    fmt = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                  "response_format": {"type": "yaml"}})
    assert fmt.status_code == 400


def test_slot_save_restore(model, tmp_path):
    with LiveServer(model, "-c", "1024", "-np", "2", "--slot-save-path", str(tmp_path)) as s:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            prompt = c.post("/tokenize", json={"content": "The quick brown fox jumps over the lazy dog"}).json()
            body = {"prompt": prompt["tokens"], "n_predict": 4, "temperature": 0, "id_slot": 0,
                    "return_tokens": True}
            first = c.post("/completion", json=body).json()
            saved = c.post("/slots/0?action=save", json={"filename": "fox.slot"}).json()
            assert saved["n_saved"] == first["tokens_evaluated"] + 3 and saved["n_written"] > 0
            assert c.post("/slots/0?action=erase", json={}).json()["n_erased"] == saved["n_saved"]
            restored = c.post("/slots/1?action=restore", json={"filename": "fox.slot"}).json()
            assert restored["n_restored"] == saved["n_saved"] and "restore_ms" in restored["timings"]
            # a continuation of the saved conversation resumes from the restored state: one token evaluated
            follow = prompt["tokens"] + first["tokens"][:3] + [42]
            again = c.post("/completion", json={**body, "prompt": follow, "id_slot": 1}).json()
            assert again["timings"]["cache_n"] == saved["n_saved"] and again["timings"]["prompt_n"] == 1
            assert c.post("/slots/0?action=save", json={"filename": "../x"}).status_code == 400
            r = c.post("/slots/0?action=restore", json={"filename": "missing.slot"})
            assert r.status_code == 400 and err(r)["message"].startswith("Unable to restore slot")


def test_return_progress(http):
    r = http.post("/completion", json={"prompt": "The quick brown fox " * 60, "n_predict": 2, "temperature": 0,
                                       "stream": True, "return_progress": True, "cache_prompt": False})
    chunks = [json.loads(x) for x in sse_lines(r.text)]
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert progress and progress[-1]["processed"] == progress[-1]["total"] == chunks[-1]["tokens_evaluated"]
    assert all(set(p) == {"total", "cache", "processed", "time_ms"} for p in progress)
    c = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                                "stream": True, "return_progress": True, "cache_prompt": False})
    first = json.loads(sse_lines(c.text)[0])
    assert first["choices"][0]["delta"]["role"] == "assistant" and "prompt_progress" in first


def test_progress_starts_at_the_cache_and_carries_timings(http):
    """As llama-server: the first update comes before anything is evaluated (processed == cache), and with
    timings_per_token every update carries the prompt's timings so far (0c1e570 test_metrics.py)."""
    r = http.post("/completion", json={"prompt": "The quick brown fox " * 60, "n_predict": 2, "stream": True,
                                       "return_progress": True, "cache_prompt": False, "timings_per_token": True})
    updates = [c for c in map(json.loads, sse_lines(r.text)) if "prompt_progress" in c]
    first = updates[0]
    assert len(updates) > 1 and first["prompt_progress"]["processed"] == first["prompt_progress"]["cache"]
    assert (first["timings"]["prompt_n"], first["timings"]["prompt_ms"], first["timings"]["predicted_n"]) == (0, 0, 0)
    ms = [u["timings"]["prompt_ms"] for u in updates]
    assert ms == sorted(ms) and ms[-1] > 0
    assert updates[-1]["timings"]["prompt_n"] == updates[-1]["prompt_progress"]["processed"]


# -- /props chat_template_caps (as llama-server 0c1e570) and /detokenize type errors (as b8462) -------------------

def test_props_chat_template_caps(http):
    """The caps llama-server 0c1e570 reports for the Qwen3.5 template (measured on the compat fixture): tool-call
    arguments read as objects, content parts read as a list, earlier turns' reasoning not printed, no reasoning
    effort. (b8462 said supports_typed_content false and supports_preserve_reasoning true, and had no
    supports_reasoning_effort.)"""
    caps = http.get("/props").json()["chat_template_caps"]
    assert caps == {"supports_object_arguments": True, "supports_parallel_tool_calls": True,
                    "supports_preserve_reasoning": False, "supports_reasoning_effort": False,
                    "supports_string_content": True, "supports_system_role": True, "supports_tool_calls": True,
                    "supports_tools": True, "supports_typed_content": True}
    assert list(caps) == sorted(caps)                  # std::map order


def test_template_caps_of_a_plain_template():
    from llamacmp.server.template_caps import template_caps
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    caps = template_caps(plain)
    assert caps["supports_system_role"] and caps["supports_string_content"]
    assert not caps["supports_tools"] and not caps["supports_tool_calls"] and not caps["supports_parallel_tool_calls"]
    no_system = "{% for m in messages %}{% if m.role != 'system' %}{{ m.content }}{% endif %}{% endfor %}"
    assert template_caps(no_system)["supports_system_role"] is False
    typed = "{% for m in messages %}{{ m.content[0].text }}{% endfor %}"
    assert template_caps(typed)["supports_typed_content"] is True      # content read as a list of parts
    failing = "{% for m in messages %}{% if m.content is string %}{{ raise_exception('parts only') }}{% endif %}" \
              "{% endfor %}"
    assert template_caps(failing)["supports_string_content"] is False


@pytest.mark.parametrize("tokens, status, message", [
    ("abc", 400, "[json.exception.type_error.302] type must be array, but is string"),
    (5, 400, "[json.exception.type_error.302] type must be array, but is number"),
    (None, 400, "[json.exception.type_error.302] type must be array, but is null"),
    ({"a": 1}, 400, "[json.exception.type_error.302] type must be array, but is object"),
    ([1, "a"], 400, "[json.exception.type_error.302] type must be number, but is string"),
])
def test_detokenize_wrong_types_are_bad_requests_with_llama_servers_text(http, tokens, status, message):
    r = http.post("/detokenize", json={"tokens": tokens})
    assert r.status_code == status
    assert err(r) == {"code": 400, "message": message, "type": "invalid_request_error"}


def test_detokenize_converts_numbers_as_llama_server(http):
    one = http.post("/detokenize", json={"tokens": [1]}).json()["content"]
    assert http.post("/detokenize", json={"tokens": [1.5]}).json()["content"] == one     # truncated
    assert http.post("/detokenize", json={"tokens": [True]}).json()["content"] == one
    assert http.post("/detokenize", json={}).json() == {"content": ""}


def test_metrics_count_what_the_responses_report(http):
    """/metrics' prompt counters add up the responses' timings (0c1e570 test_metrics_prompt_processed_and_cached): a
    repeated prompt is served from the cache, whole, and its cached tokens are counted too."""
    def counters() -> dict[str, float]:
        text = http.get("/metrics").text
        return {k: float(v) for k, v in (ln.split(" ") for ln in text.splitlines() if not ln.startswith("#"))}
    before = counters()
    body = {"prompt": "the quick brown fox jumps over the lazy dog", "n_predict": 2, "id_slot": 0}
    timings = [http.post("/completion", json=body).json()["timings"] for _ in range(2)]
    after = counters()
    assert timings[1]["cache_n"] > 0
    assert after["llamacpp:prompt_tokens_cached_total"] - before["llamacpp:prompt_tokens_cached_total"] == \
        sum(t["cache_n"] for t in timings)
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == \
        sum(t["prompt_n"] for t in timings)
