"""Vertex AI's prediction protocol (llama-server 0c1e570's AIP_MODE=PREDICTION; its test_compat_gcp.py): the
predict route runs each instance through the named route, the health route and the port come from AIP_*."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_harness import LiveServer, ServerProcess, free_port, write_tiny_model  # noqa: E402

from llamacmp.server.gcp import add_gcp_routes, gcp_env, request_format  # noqa: E402

CHAT = {"max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "Say hello"}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("AIP_MODE", "PREDICTION")
    mp.setenv("AIP_HEALTH_ROUTE", "ping")            # no leading slash: llama-server adds it
    model = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")
    try:
        with LiveServer(model, "-c", "256", "-np", "2", "--no-jinja") as s:
            yield s
    finally:
        mp.undo()


def post(s, path: str, body) -> httpx.Response:
    return httpx.post(s.url + path, json=body, timeout=120)


def test_request_format_names():
    assert request_format("/v1/chat/completions") == "chatCompletions"
    assert request_format("/apply-template") == "applyTemplate"
    assert request_format("/slots/{id_slot}") == "slots"
    assert request_format("/v1/messages/count_tokens") == "messagesCountTokens"


def test_env_off_unless_prediction_mode():
    assert gcp_env({}) is None and gcp_env({"AIP_MODE": "x"}) is None
    env = gcp_env({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "v1/endpoints/e:predict"})
    assert (env.predict_route, env.health_route, env.port) == ("/v1/endpoints/e:predict", "", 8080)


def test_predict_route_must_not_shadow_a_route():
    # llama-server exits with "AIP_PREDICT_ROUTE=... conflicts with an existing llama-server route"
    from fastapi import FastAPI
    app = FastAPI()
    app.add_api_route("/health", lambda: {}, methods=["GET"])
    env = gcp_env({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "/health"})
    with pytest.raises(ValueError, match="AIP_PREDICT_ROUTE=/health conflicts"):
        add_gcp_routes(app, env, lambda: {}, read_body=None)


def test_predict_runs_each_instance_through_its_route(server):
    direct = post(server, "/v1/chat/completions", CHAT).json()
    r = post(server, "/predict", {"instances": [
        {"@requestFormat": "chatCompletions", **CHAT},
        {"@requestFormat": "/v1/chat/completions", **CHAT, "stream": True},    # streaming is turned off
        {"@requestFormat": "tokenize", "content": "Say hello"},
        {"@requestFormat": "health"},                                          # a GET route
        {"@requestFormat": "nope"}, "x", {"max_tokens": 1}]})
    assert r.status_code == 200
    p = r.json()["predictions"]
    assert len(p) == 7
    for chat in p[:2]:
        assert chat["object"] == "chat.completion"
        assert chat["choices"][0]["message"] == direct["choices"][0]["message"]
    assert p[2] == post(server, "/tokenize", {"content": "Say hello"}).json()
    assert p[3] == {"status": "ok"}
    assert p[4]["error"]["message"] == "no handler registered for @requestFormat: nope"
    assert p[5]["error"]["message"] == "each instance must be a JSON object"
    assert p[6]["error"]["message"] == "each instance must include a string @requestFormat"


def test_predict_passes_an_instance_error_on(server):
    p = post(server, "/predict", {"instances": [{"@requestFormat": "chatCompletions"}]}).json()["predictions"]
    assert p == [{"error": {"code": 400, "message": "'messages' is required", "type": "invalid_request_error"}}]


@pytest.mark.parametrize("body, message", [
    ([], "request body must be a JSON object"),
    ({"instances": {}}, "request body must include an array field named instances"),
    ({"instances": [{}] * 129}, "instances array exceeds maximum size of 128")])
def test_predict_refuses_a_bad_body(server, body, message):
    r = post(server, "/predict", body)
    assert r.status_code == 400 and r.json()["error"]["message"] == message


def test_health_route(server):
    assert httpx.get(server.url + "/ping").json() == {"status": "ok"}


def test_routes_absent_without_prediction_mode(tmp_path, monkeypatch):
    monkeypatch.delenv("AIP_MODE")                  # set by the module's server fixture
    with LiveServer(write_tiny_model(tmp_path / "tiny.gguf"), "-c", "256", "--no-jinja") as s:
        assert post(s, "/predict", {"instances": []}).status_code == 404


def test_aip_http_port_overrides_port(tmp_path, monkeypatch):
    s = ServerProcess(write_tiny_model(tmp_path / "tiny.gguf"), tmp_path / "log", "-c", "256", "--no-jinja")
    s.port = free_port()                             # its argv keeps --port <another>: AIP_HTTP_PORT wins
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", str(s.port))
    with s:
        assert post(s, "/predict", {"instances": []}).json() == {"predictions": []}
        assert "overriding server port" in s.log()
