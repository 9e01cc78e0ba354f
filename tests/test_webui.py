"""The chat page at / and its flags (--ui/--webui, --no-ui/--no-webui, --path, their env vars) over real HTTP.
The page itself is driven in a real browser by tests/test_webui_browser.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import pytest

from llamacmp.args import parse_args
from llamacmp.server.webui import page_html
from server_harness import LiveServer, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


def get(srv: LiveServer, path: str, **kw) -> httpx.Response:
    return httpx.get(srv.url + path, timeout=30, **kw)


def test_page_is_self_contained():
    html = page_html().decode()
    # no external scripts, styles, fonts or images: the page works offline and leaks nothing
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "url(" not in html
    for needed in ("v1/chat/completions", "reasoning_content", "AbortController", 'id="system"',
                   'id="temperature"', 'id="top_p"', 'id="top_k"', 'id="max_tokens"', 'id="api_key"'):
        assert needed in html


def test_page_served_at_root_and_index(model):
    with LiveServer(model, "-c", "512", "-np", "1") as s:
        for path in ("/", "/index.html"):
            r = get(s, path)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            assert r.content == page_html()
            assert "<!doctype html>" in r.text        # what llama.cpp's test_basic.py::test_no_webui looks for
        props = get(s, "/props").json()
        assert props["webui"] is True and props["ui"] is True
        assert "unregister()" in get(s, "/sw.js").text     # removes a worker left by llama-server's own UI


@pytest.mark.parametrize("flags,env", [(["--no-ui"], {}), (["--no-webui"], {}), ([], {"LLAMA_ARG_UI": "0"}),
                                       ([], {"LLAMA_ARG_WEBUI": "false"}), ([], {"LLAMA_ARG_NO_UI": "1"})])
def test_ui_off(flags, env):
    assert parse_args("server", flags, env).params.server.webui is False


def test_ui_flags_and_env_precedence():
    assert parse_args("server", [], {}).params.server.webui is True
    assert parse_args("server", ["--ui"], {"LLAMA_ARG_UI": "0"}).params.server.webui is True
    assert parse_args("server", ["--webui"], {}).params.server.webui is True
    # current's LLAMA_ARG_UI is read after b8462's LLAMA_ARG_WEBUI, so it wins
    assert parse_args("server", [], {"LLAMA_ARG_WEBUI": "0", "LLAMA_ARG_UI": "1"}).params.server.webui is True
    assert parse_args("server", ["--path", "/srv/www"], {}).params.server.public_path == "/srv/www"
    assert parse_args("server", [], {"LLAMA_ARG_STATIC_PATH": "/x"}).params.server.public_path == "/x"


def test_no_ui_answers_404(model):
    with LiveServer(model, "-c", "512", "-np", "1", "--no-ui") as s:
        for path in ("/", "/index.html"):
            r = get(s, path)
            assert r.status_code == 404 and r.json()["error"]["message"] == "File Not Found"
        assert get(s, "/props").json()["ui"] is False
        assert get(s, "/health").status_code == 200


def test_path_serves_a_folder(model, tmp_path):
    (tmp_path / "index.html").write_text("<p>mine</p>")
    (tmp_path / "app.js").write_text("let x = 1;")
    with LiveServer(model, "-c", "512", "-np", "1", "--path", str(tmp_path)) as s:
        assert get(s, "/").text == "<p>mine</p>"
        assert get(s, "/app.js").text == "let x = 1;"
        assert get(s, "/nope.js").status_code == 404
        assert get(s, "/health").json() == {"status": "ok"}       # the API routes are not shadowed
        r = httpx.post(s.url + "/tokenize", json={"content": "hi"}, timeout=30)
        assert r.status_code == 200 and r.json()["tokens"]


def test_missing_path_stops_startup(model, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "llamacmp.server.app", "-m", str(model), "--port", "0",
                        "--path", str(tmp_path / "absent")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"static assets path not found: {tmp_path / 'absent'}" in r.stderr


def test_api_key_page_loads_without_it_and_the_api_needs_it(model):
    with LiveServer(model, "-c", "512", "-np", "1", "--api-key", "sekret") as s:
        assert get(s, "/").status_code == 200
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(s.url + "/v1/chat/completions", json=body, timeout=30).status_code == 401
        r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=30,
                       headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200


def test_api_prefix_serves_the_page_under_it(model):
    from starlette.testclient import TestClient
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.server.app import create_app
    from llamacmp.server.context import ServerContext
    from llamacmp.server.listen import with_prefix
    ctx = ServerContext(parse_args("server", ["-m", str(model), "-c", "512", "-np", "1",
                                              "--api-prefix", "/llm"]).params)
    ctx.load(NumpyBackend())
    try:
        with TestClient(with_prefix(create_app(ctx), "/llm")) as c:
            assert c.get("/llm/").content == page_html()
            assert c.get("/").status_code == 404
    finally:
        ctx.engine.stop()
