"""--webui-mcp-proxy: /cors-proxy against a loopback target that records what reaches it
(llamacmp/server/cors_proxy.py). Only what llama-server 0c1e570's proxy sends goes out, and only to http(s) URLs
without a password."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from server_harness import LiveServer, free_port, write_tiny_model

KEY = "secret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Target(BaseHTTPRequestHandler):
    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.server.seen.append({"method": self.command, "path": self.path,
                                 "headers": {k.lower(): v for k, v in self.headers.items()},
                                 "body": self.rfile.read(n)})
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "/capture?from=redirect")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/nocontent"):
            self.send_response(204)
            self.end_headers()
            return
        body = b"target says hi"
        self.send_response(201)
        self.send_header("Content-Type", "text/x-test")
        self.send_header("X-Custom", "yes")
        self.send_header("Set-Cookie", "a=1")
        self.send_header("Set-Cookie", "b=2")
        self.send_header("Access-Control-Allow-Origin", "http://evil.test")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def target():
    t = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    t.seen = []
    threading.Thread(target=t.serve_forever, daemon=True).start()
    yield t
    t.shutdown()
    t.server_close()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")
    with LiveServer(model, "-c", "512", "-np", "1", "--webui-mcp-proxy", "--api-key", KEY) as s:
        yield s


@pytest.fixture
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c


def via(target, path: str) -> str:
    return f"/cors-proxy?url=http://127.0.0.1:{target.server_port}{path}"


def test_only_explicit_headers_go_out(http, target):
    target.seen.clear()
    r = http.get(via(target, "/capture"), headers={
        **AUTH, "Proxy-Authorization": "Basic secret", "X-Api-Key": KEY, "Cookie": "session=secret",
        "User-Agent": "client-agent", "Origin": "http://page.test",
        "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer explicit",
        "x-llama-server-proxy-header-accept-encoding": "gzip",
        "x-llama-server-proxy-header-host": "elsewhere.test"})
    assert r.status_code == 201 and r.text == "target says hi"
    sent = target.seen[-1]["headers"]
    assert sent["accept"] == "application/json" and sent["authorization"] == "Bearer explicit"
    assert sent["host"] == f"127.0.0.1:{target.server_port}"
    # nothing of the client's own, nothing of the HTTP library's
    assert set(sent) == {"accept", "authorization", "host"}, sent


def test_the_answer_comes_back(http, target):
    r = http.get(via(target, "/capture?x=1"), headers={**AUTH, "Origin": "http://page.test"})
    assert target.seen[-1]["path"] == "/capture?x=1"
    assert r.status_code == 201 and r.headers["content-type"] == "text/x-test" and r.headers["x-custom"] == "yes"
    assert r.headers.get_list("set-cookie") == ["a=1", "b=2"]
    assert r.headers.get_list("access-control-allow-origin") == ["http://page.test"]    # ours, not the target's


def test_post_redirect_and_no_content(http, target):
    r = http.post(via(target, "/capture"), content=b'{"jsonrpc": "2.0"}', headers=AUTH)
    assert r.status_code == 201 and target.seen[-1]["method"] == "POST"
    assert target.seen[-1]["body"] == b'{"jsonrpc": "2.0"}'
    r = http.get(via(target, "/redirect"), headers=AUTH)
    assert r.status_code == 201 and target.seen[-1]["path"] == "/capture?from=redirect"
    r = http.post(via(target, "/nocontent"), content=b"{}", headers=AUTH)
    assert r.status_code == 204 and r.content == b""


def test_the_proxy_reaches_this_server_too(http, srv):
    r = http.get(f"/cors-proxy?url={srv.url}/models", headers=AUTH)
    assert r.status_code == 401          # the proxy does not pass the client's key on
    r = http.get(f"/cors-proxy?url={srv.url}/models",
                 headers={**AUTH, "x-llama-server-proxy-header-authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and "data" in r.json()


@pytest.mark.parametrize("url, status, message", [
    ("", 500, "invalid URL: no scheme"),
    ("ftp://127.0.0.1/x", 500, "unsupported URL scheme: ftp"),
    ("file:///etc/passwd", 500, "unsupported URL scheme: file"),
    ("http://user:pw@127.0.0.1:1/", 500, "authentication in target URL is not supported"),
    ("http:///path", 500, "invalid target URL: missing host"),
    ("http://127.0.0.1:notaport/", 400, "invalid target URL"),
])
def test_refused_urls(http, url, status, message):
    r = http.get("/cors-proxy", params={"url": url}, headers=AUTH)
    assert r.status_code == status and message in r.json()["error"]["message"]


def test_unreachable_target_and_environment_proxies(http, target, monkeypatch):
    r = http.get(f"/cors-proxy?url=http://127.0.0.1:{free_port()}/", headers=AUTH)
    assert r.status_code == 500 and r.text.startswith("proxy error: ")
    # a proxy named in the environment is not used (nor .netrc credentials): the target is reached directly
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{free_port()}")
    assert http.get(via(target, "/capture"), headers=AUTH).status_code == 201


def test_needs_the_api_key_and_shows_in_props(http, target):
    assert http.get(via(target, "/capture")).status_code == 401
    assert http.get("/props", headers=AUTH).json()["cors_proxy_enabled"] is True
