"""llama-server 0c1e570's /tools (--tools, --tools-runtime, the x-tool-* headers), its CORS options and router mode
(no -m), over real HTTP on loopback: a router app served by uvicorn in a thread, a model server (LiveServer), and
`python -m llamacmp.server.app` without -m in a child process."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn

from llamacmp.args import ArgError, parse_args
from llamacmp.server.agent.setup import start_tools
from llamacmp.server.router import RouterContext, create_router_app
from server_harness import LiveServer, free_port, write_tiny_model


class RouterServer:
    """The router-mode app (what main() serves without -m) with these flags, on 127.0.0.1, in a thread."""

    def __init__(self, *flags: str):
        self.port = free_port()
        params = parse_args("server", ["--port", str(self.port), *flags], {}).params
        self.tools = start_tools(params.server)
        app = create_router_app(RouterContext(params), self.tools)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> httpx.Client:
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        return self.client

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.tools.close()


@pytest.fixture(scope="module")
def tools():
    with RouterServer("--tools", "all") as c:
        yield c


def call(http, name: str, params: dict, headers: dict | None = None) -> dict:
    r = http.post("/tools", json={"tool": name, "params": params}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def ok(http, name: str, params: dict, headers: dict | None = None) -> dict:
    body = call(http, name, params, headers)
    assert "error" not in body, body
    return body


def sse(text: str) -> list[dict]:
    return [json.loads(b[len("data: "):]) for b in text.split("\n\n") if b.startswith("data: ")]


# -- the registry: listing, errors, off by default -------------------------------------------------------------------

def test_tools_are_off_without_the_flag_on_a_model_server_too(tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf")
    (tmp_path / "f.txt").write_text("content")
    call_it = {"tool": "read_file", "params": {"path": str(tmp_path / "f.txt")}}
    with LiveServer(model, "-c", "512") as s, httpx.Client(base_url=s.url) as http:
        for r in (http.get("/tools"), http.post("/tools", json=call_it)):
            assert r.status_code == 403
            assert r.json() == {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
    with LiveServer(model, "-c", "512", "--tools", "read_file") as s, httpx.Client(base_url=s.url) as http:
        assert http.post("/tools", json=call_it).json() == {"plain_text_response": "content\n"}


def test_tools_flag_names_the_tools_listed_in_llama_servers_order():
    with RouterServer("--tools", "exec_shell_command,read_file") as http:
        listed = http.get("/tools").json()
        assert [t["tool"] for t in listed] == ["read_file", "exec_shell_command"]
        assert listed[1] == {**listed[1], "display_name": "Execute shell command", "type": "server",
                             "permissions": {"write": True}, "uses_cwd": True}
        assert listed[1]["definition"]["function"]["parameters"]["required"] == ["command"]
        r = http.post("/tools", json={"tool": "write_file", "params": {"path": "x", "content": "y"}})
        assert r.status_code == 404 and r.json()["message"] == 'unknown tool "write_file"'


def test_request_errors(tools):
    r = tools.post("/tools", content=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "invalid_request_error"
    r = tools.post("/tools", json={"tool": "read_file", "params": {}})
    assert r.status_code == 400 and "path" in r.json()["message"]
    r = tools.post("/tools", json={"tool": "read_file", "params": "x"})
    assert r.status_code == 400 and r.json()["message"] == '"params" must be an object'
    r = tools.post("/tools", json={"tool": "read_file", "params": {"path": "x", "start_line": "2"}})
    assert r.status_code == 400 and "start_line" in r.json()["message"]
    r = tools.post("/tools", json={"tool": "read_file", "params": {"path": "x"}, "stream": True})
    assert r.status_code == 404 and r.json()["message"] == 'tool "read_file" does not support stream = true'


def test_api_key_guards_tools():
    with RouterServer("--tools", "all", "--api-key", "k") as http:
        assert http.get("/tools").status_code == 401
        assert http.get("/tools", headers={"Authorization": "Bearer k"}).status_code == 200


# -- read_file, write_file, edit_file ------------------------------------------------------------------------------

def test_read_file_ranges_numbers_and_base64(tools, tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"one\ntwo\nthree\n")
    assert ok(tools, "read_file", {"path": str(f)})["plain_text_response"] == "one\ntwo\nthree\n"
    got = ok(tools, "read_file", {"path": str(f), "start_line": 2, "end_line": 2, "append_loc": True})
    assert got["plain_text_response"] == "2\u2192two\n"
    got = ok(tools, "read_file", {"path": str(f)}, headers={"x-resp-type": "base64"})
    assert base64.b64decode(got["base64"]) == f.read_bytes() and got["size_bytes"] == 14
    # the model cannot ask for base64 itself: only the header can
    assert "plain_text_response" in ok(tools, "read_file", {"path": str(f), "resp_type": "base64"})
    assert call(tools, "read_file", {"path": str(tmp_path / "none")}) == {
        "error": f"cannot stat file: {tmp_path / 'none'}"}
    big = tmp_path / "big.txt"
    big.write_text("x" * 20000)
    assert "file too large (20000 bytes, max 16384)" in call(tools, "read_file", {"path": str(big)})["error"]


def test_write_then_edit(tools, tmp_path):
    f = tmp_path / "sub" / "f.txt"
    got = ok(tools, "write_file", {"path": str(f), "content": "a \u201cq\u201d  \nkeep\u2019  \nlast\n"})
    assert got == {"result": "file written successfully", "path": str(f), "bytes": len(f.read_bytes())}
    # old_text found only after normalizing quotes and trailing blanks: the untouched line keeps its own
    got = ok(tools, "edit_file", {"path": str(f), "edits": [{"old_text": 'a "q"', "new_text": "A"}]})
    assert got["edits_applied"] == 1
    assert f.read_text() == "A\nkeep\u2019  \nlast\n"
    err = call(tools, "edit_file", {"path": str(f), "edits": [{"old_text": "zzz", "new_text": "y"}]})["error"]
    assert err.startswith("could not find edits[0].old_text")
    err = call(tools, "edit_file", {"path": str(f), "edits": [{"old_text": "last", "new_text": "last"}]})["error"]
    assert err == "no changes made: the replacement(s) produced identical content"
    f.write_text("dup\ndup\n")
    assert "it must be unique" in call(tools, "edit_file", {"path": str(f), "edits": [
        {"old_text": "dup", "new_text": "x"}]})["error"]
    f.write_text("l1\nl2\n")
    assert "overlap" in call(tools, "edit_file", {"path": str(f), "edits": [
        {"old_text": "l1\nl2", "new_text": "a"}, {"old_text": "l2", "new_text": "b"}]})["error"]
    assert call(tools, "edit_file", {"path": str(f), "edits": []})["error"] == '"edits" must be a non-empty array'


# -- file_glob_search, grep_search -----------------------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    for rel, text in {"src/main.cpp": "int main() {}\n", "src/util.cpp": "// TODO one\nint x;\n// todo two\n",
                      "README.md": "todo list\n", "node_modules/dep/index.js": "TODO hidden\n",
                      "deep/a/b/c.txt": "x\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_file_glob_search(tools, tree):
    got = ok(tools, "file_glob_search", {"path": str(tree), "include": "*.cpp"})
    assert sorted(e["path"] for e in got["entries"]) == ["src/main.cpp", "src/util.cpp"]
    assert got["base"] == str(tree) and "Total matches: 2" in got["plain_text_response"]
    got = ok(tools, "file_glob_search", {"path": str(tree), "type": "dir", "max_depth": 1})
    assert sorted(e["path"] for e in got["entries"]) == ["deep", "node_modules", "src"]   # junk listed...
    got = ok(tools, "file_glob_search", {"path": str(tree), "type": "all"})
    assert not any(e["path"].startswith("node_modules/") for e in got["entries"])          # ...never walked
    assert "deep/a/b/" in got["plain_text_response"]
    got = ok(tools, "file_glob_search", {"path": str(tree), "exclude": "*.cpp", "limit": 1})
    assert len(got["entries"]) == 1 and "Total matches: 2" in got["plain_text_response"]
    assert "[1 results limit reached (2 total matches)" in got["plain_text_response"]
    got = ok(tools, "file_glob_search", {"path": str(tree), "include": "a/**"})     # anchored as **/a/**
    assert [e["path"] for e in got["entries"]] == ["deep/a/b/c.txt"]
    assert call(tools, "file_glob_search", {"path": str(tree), "limit": 0})["error"] == \
        "invalid limit: 0 (expected 1 or more)"
    assert call(tools, "file_glob_search", {"path": str(tree / "nope")})["error"] == \
        f"path does not exist or is not a directory: {tree / 'nope'}"


def test_file_glob_search_follows_gitignore_in_a_repository(tools, tree):
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / ".gitignore").write_text("deep/\n")
    got = ok(tools, "file_glob_search", {"path": str(tree)})
    paths = {e["path"] for e in got["entries"]}
    assert "README.md" in paths and "deep/a/b/c.txt" not in paths


def test_grep_search(tools, tree):
    text = ok(tools, "grep_search", {"path": str(tree), "pattern": "TODO"})["plain_text_response"]
    assert text == "src/util.cpp:// TODO one\n\n---\nTotal matches: 1\n"
    text = ok(tools, "grep_search", {"path": str(tree), "pattern": "todo", "ignore_case": True,
                                     "include": "*.cpp", "context_lines": 1})["plain_text_response"]
    assert text.startswith("src/util.cpp:1:// TODO one\nsrc/util.cpp-2-int x;\n--\n")
    assert "Total matches: 2" in text
    single = str(tree / "src" / "main.cpp")
    text = ok(tools, "grep_search", {"path": single, "pattern": "main()", "literal": True,
                                     "return_line_numbers": True})["plain_text_response"]
    assert text.startswith(f"{single}:1:int main() {{}}\n")
    assert call(tools, "grep_search", {"path": str(tree), "pattern": "("})["error"].startswith("invalid regex: ")


# -- exec_shell_command, the cwd and runtime headers ----------------------------------------------------------------

def test_exec_shell_command(tools):
    got = ok(tools, "exec_shell_command", {"command": "echo out; echo err >&2; exit 3"})
    assert got["plain_text_response"] == "out\nerr\n\n[exit code: 3]"
    got = ok(tools, "exec_shell_command", {"command": "sleep 5", "timeout": 1})
    assert got["plain_text_response"].endswith(" [exit due to timed out]")
    got = ok(tools, "exec_shell_command", {"command": "head -c 20000 /dev/zero | tr '\\0' x"})
    assert got["plain_text_response"].startswith("x" * 16384 + "\n[output truncated]\n[exit code: 0]")


def test_exec_shell_command_stream(tools):
    r = tools.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo a; sleep 0.2; echo b"},
                                   "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.text)
    assert events[-1] == {"done": True}
    assert "".join(e["chunk"] for e in events[:-1]) == "a\nb\n\n[exit code: 0]"
    assert len(events) >= 3                  # the output came in pieces, as the command wrote it


def test_cwd_header_wins_over_the_models_cwd(tools, tmp_path):
    (tmp_path / "rel.txt").write_text("here")
    h = {"x-tool-cwd": str(tmp_path)}
    got = ok(tools, "read_file", {"path": "rel.txt", "cwd": "/nonexistent"}, headers=h)
    assert got["plain_text_response"] == "here\n"
    ok(tools, "exec_shell_command", {"command": "pwd > where.txt"}, headers=h)
    assert (tmp_path / "where.txt").read_text().strip() == str(tmp_path)
    # without the header the model's "cwd" is dropped: the path resolves against the server's directory
    assert "cannot stat file" in call(tools, "read_file", {"path": "rel.txt", "cwd": str(tmp_path)})["error"]


@pytest.mark.parametrize("runtime,message", [
    ("fake:does-not-exist", "unknown tool runtime: fake:does-not-exist"),
    ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand=touch /tmp/pwned"),
    ("docker-container:--privileged", "invalid container id: --privileged"),
    ("podman:busybox", "tool runtime must name a running container: podman:busybox"),
])
def test_runtime_header_refusals(tools, runtime, message):
    r = tools.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi"}},
                   headers={"x-tool-runtime": runtime})
    assert r.status_code == 500 and r.json() == {"code": 500, "message": message, "type": "server_error"}
    r = tools.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi"}, "stream": True},
                   headers={"x-tool-runtime": runtime})
    assert sse(r.text) == [{"done": True, "error": message}]


def test_a_runtime_in_the_params_is_not_the_models_to_choose(tools):
    got = ok(tools, "exec_shell_command", {"command": "echo host", "runtime": "fake:x"})
    assert got["plain_text_response"].startswith("host\n")


def test_container_runtime_runs_through_engine_exec(tmp_path):
    """A fake `docker` on PATH records its argv and runs the command itself: the tools run through
    `docker exec [-i] <id> ...`, with the cwd set inside."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    log = tmp_path / "argv.log"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\nshift\n[ "$1" = -i ] && shift\nshift\nexec "$@"\n')
    fake.chmod(0o755)
    env_path = os.environ["PATH"]
    os.environ["PATH"] = f"{fake.parent}:{env_path}"
    try:
        with RouterServer("--tools", "all") as http:
            h = {"x-tool-runtime": "docker-container:abc123", "x-tool-cwd": str(tmp_path)}
            assert ok(http, "write_file", {"path": "c.txt", "content": "in box\n"}, h)["bytes"] == 7
            assert ok(http, "read_file", {"path": "c.txt"}, h)["plain_text_response"] == "in box\n"
            assert "in box" in ok(http, "exec_shell_command", {"command": "cat c.txt"}, h)["plain_text_response"]
    finally:
        os.environ["PATH"] = env_path
    calls = log.read_text().splitlines()
    assert all(c.startswith("exec ") and " abc123 " in c for c in calls)
    assert any(c.startswith("exec -i abc123 sh -c cd") and "timeout 10s sh -c cat c.txt" in c for c in calls)


# -- CORS -----------------------------------------------------------------------------------------------------------

def preflight(http, origin: str) -> httpx.Response:
    return http.options("/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})


def test_cors_localhost_reflects_only_local_origins():
    with RouterServer("--cors-origins", "localhost") as http:
        for origin in ("http://localhost:8080", "http://127.0.0.1", "http://[::1]:3000"):
            assert preflight(http, origin).headers["access-control-allow-origin"] == origin
        for origin in ("http://evil.com", "http://localhost.evil.com", "http://notlocalhost"):
            assert "access-control-allow-origin" not in preflight(http, origin).headers
        assert "access-control-allow-origin" not in http.get("/health", headers={"Origin": "http://e.com"}).headers


def test_cors_tools_default_to_localhost_unless_origins_are_given(tools):
    assert "access-control-allow-origin" not in preflight(tools, "http://evil.com").headers
    with RouterServer("--tools", "all", "--cors-origins", "*") as http:
        assert preflight(http, "http://evil.com").headers["access-control-allow-origin"] == "http://evil.com"


def test_cors_fixed_origin_methods_headers_credentials():
    with RouterServer("--cors-origins", "https://app.test", "--cors-methods", "GET", "--cors-headers", "X-A",
                      "--no-cors-credentials") as http:
        h = preflight(http, "http://other.test").headers
        assert h["access-control-allow-origin"] == "https://app.test"
        assert (h["access-control-allow-methods"], h["access-control-allow-headers"],
                h["access-control-allow-credentials"]) == ("GET", "X-A", "false")
    with RouterServer("--no-cors-credentials") as http:      # "*" without credentials is sent as it is
        assert preflight(http, "http://other.test").headers["access-control-allow-origin"] == "*"


# -- router mode ----------------------------------------------------------------------------------------------------

def test_router_mode_process(tmp_path):
    port = free_port()
    out = open(tmp_path / "log", "w")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "llamacmp.server.app", "--port", str(port), "--models-max", "2",
                             "--no-models-autoload"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "log").read_text()
            time.sleep(0.2)
        props = httpx.get(url + "/props").json()
        assert (props["role"], props["max_instances"], props["models_autoload"]) == ("router", 2, False)
        assert props["build_info"].startswith("b")
        assert httpx.get(url + "/v1/models").json() == {"data": [], "object": "list"}
        r = httpx.post(url + "/v1/chat/completions", json={"model": "non-existent/model", "stream": True,
                                                           "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["message"] == "model 'non-existent/model' not found"
        r = httpx.post(url + "/completion", json={"prompt": "hi"})
        assert r.json()["error"]["message"] == "model name is missing from the request"
        assert httpx.get(url + "/props?model=x").status_code == 400
        assert httpx.get(url + "/tools").status_code == 403
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        out.close()
    assert "router mode" in (tmp_path / "log").read_text()


# -- the options -----------------------------------------------------------------------------------------------------

def test_options_check_their_values():
    with pytest.raises(ArgError, match='unknown tool "bogus". available tools: read_file'):
        parse_args("server", ["--tools", "read_file,bogus"], {})
    with pytest.raises(ArgError, match="invalid ssh target: -x"):
        parse_args("server", ["--tools-runtime", "ssh:-x"], {})
    with pytest.raises(ArgError, match="requires an image name"):
        parse_args("server", ["--tools-runtime", "docker:"], {})
    r = parse_args("server", [], {"LLAMA_ARG_TOOLS": "read_file", "LLAMA_ARG_CORS_ORIGINS": "*"})
    assert r.params.server.tools == ["read_file"] and r.params.server.cors_origins == "*"
    r = parse_args("server", ["--tools", "all", "-no-ag"], {})
    assert r.params.server.tools == [] and r.params.server.cors_origins == "*" and r.warnings == ()


def test_stream_stops_the_command_when_the_client_leaves(tools, tmp_path):
    pidfile = tmp_path / "pid"
    body = {"tool": "exec_shell_command", "stream": True,
            "params": {"command": f"echo $$ > {pidfile}; while true; do echo x; sleep 0.05; done", "timeout": 60}}
    with tools.stream("POST", "/tools", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break                               # one chunk seen: leave
    pid = int(pidfile.read_text())
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.05)
    alive = os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]
    assert not alive, "the shell kept running after its client left"


def test_tools_runtime_spawns_owns_and_removes_a_container(tmp_path):
    """--tools-runtime docker:<image> with a fake `docker`: `run --rm -i --cidfile F <image> sh` writes an id and
    waits on stdin; calls then go through `docker exec <that id>`; stopping the server ends the container."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    log = tmp_path / "argv.log"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                    f'if [ "$1" = run ]; then echo cid42 > "$5"; cat > /dev/null; echo stopped >> {log}; exit 0; fi\n'
                    'shift\n[ "$1" = -i ] && shift\nshift\nexec "$@"\n')
    fake.chmod(0o755)
    env_path = os.environ["PATH"]
    os.environ["PATH"] = f"{fake.parent}:{env_path}"
    try:
        with RouterServer("--tools", "exec_shell_command", "--tools-runtime", "docker:busybox") as http:
            got = ok(http, "exec_shell_command", {"command": "echo inside"})
            assert got["plain_text_response"].startswith("inside\n")
    finally:
        os.environ["PATH"] = env_path
    calls = log.read_text().splitlines()
    assert calls[0].startswith("run --rm -i --cidfile ") and calls[0].endswith(" busybox sh")
    assert any(c.startswith("exec -i cid42 timeout 10s sh -c echo inside") for c in calls)
    assert calls[-1] == "stopped"
