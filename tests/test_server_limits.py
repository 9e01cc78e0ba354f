"""Per-request work and memory are bounded, and a slow or abandoned request does not hold up others (issue 22)."""
from __future__ import annotations

import os
import random
import socket
import threading
import time

import httpx
import pytest

from llamacmp.engine.stops import partial_stop_len
from llamacmp.server import misc
from llamacmp.server.gate import MAX_BODY
from llamacmp.server.errors import ApiError
from llamacmp.server.validate import MAX_GRAMMAR_BYTES, MAX_N_PROBS, MAX_STOP_CHARS, MAX_STOPS
from llamacmp.server.vision_input import image_url_bytes
from server_harness import LiveServer, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


@pytest.fixture(scope="module")
def srv(model):
    with LiveServer(model, "-c", "1024", "-np", "2", "-n", "4") as s:
        yield s


@pytest.fixture
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c
        assert c.get("/health").status_code == 200


def message(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


@pytest.mark.parametrize("path,body,piece", [
    ("/completion", {"prompt": "Hi", "n_probs": 1_000_000}, "'n_probs'"),
    ("/completion", {"prompt": "Hi", "n_probs": MAX_N_PROBS + 1}, "'n_probs'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": 100_000}, "'top_logprobs'"),
    ("/completion", {"prompt": "Hi", "stop": ["x"] * (MAX_STOPS + 1)}, "'stop'"),
    ("/completion", {"prompt": "Hi", "stop": ["x" * (MAX_STOP_CHARS + 1)]}, "'stop'"),
    ("/v1/completions", {"prompt": "Hi", "stop": "y" * (MAX_STOP_CHARS + 1)}, "'stop'"),
    ("/completion", {"prompt": "Hi", "grammar": "root ::= " + " | ".join(['"a"'] * (MAX_GRAMMAR_BYTES // 5))},
     "'grammar'"),
    ("/completion", {"prompt": "Hi", "json_schema": {"enum": ["x" * 1000] * (MAX_GRAMMAR_BYTES // 1000)}},
     "'json_schema'"),
])
def test_limits(http, path, body, piece):
    r = http.post(path, json=body)
    assert r.status_code == 400 and piece in message(r), r.text[:300]


def test_n_probs_at_the_limit_is_served(http):
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 1, "n_probs": MAX_N_PROBS})
    assert r.status_code == 200
    top = r.json()["completion_probabilities"][0]["top_logprobs"]
    assert 0 < len(top) <= MAX_N_PROBS           # capped by the vocabulary too, as llama.cpp does


def test_stops_at_the_limit_still_stop(http):
    free = http.post("/completion", json={"prompt": "Hi", "n_predict": 4, "temperature": 0}).json()["content"]
    word = free[1:3]
    stops = ["z" * MAX_STOP_CHARS] * (MAX_STOPS - 1) + [word]
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 4, "temperature": 0, "stop": stops}).json()
    assert r["stop_type"] == "word" and r["stopping_word"] == word and r["content"] == free[:free.find(word)]


def _naive_partial(text: str, stops: list[str]) -> int:
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


def test_partial_stop_len_matches_the_definition():
    r = random.Random(7)
    for _ in range(20000):
        text = "".join(r.choice("ab") for _ in range(r.randint(0, 12)))
        stops = ["".join(r.choice("abc") for _ in range(r.randint(0, 6))) for _ in range(r.randint(0, 4))]
        assert partial_stop_len(text, stops) == _naive_partial(text, stops), (text, stops)


def test_chunked_body_over_the_limit_is_413_before_it_ends(srv):
    """No Content-Length, and the body never ends: the answer must come once MAX_BODY is crossed."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * (1 << 20)
        sent = 0
        try:
            while sent <= MAX_BODY + (2 << 20):
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except OSError:                          # the server may close its side once it has answered
            pass
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def test_a_fifo_under_media_path_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe.png")
    with pytest.raises(ApiError) as e:
        image_url_bytes("file://pipe.png", str(tmp_path))
    assert e.value.code == 400 and "not a regular file" in e.value.message


def test_a_slow_prep_job_does_not_hold_up_others(srv, monkeypatch):
    release = threading.Event()
    real = misc.tokenize

    def tokenize(ctx, body):
        if body.get("content") == "block":
            release.wait(30)
        return real(ctx, body)
    monkeypatch.setattr(misc, "tokenize", tokenize)
    blocked = threading.Thread(target=lambda: httpx.post(srv.url + "/tokenize", json={"content": "block"}, timeout=60))
    blocked.start()
    time.sleep(0.3)
    try:
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/tokenize", json={"content": "free"}, timeout=10)
        assert r.status_code == 200 and r.json()["tokens"] and time.monotonic() - t0 < 5
    finally:
        release.set()
        blocked.join()


def test_a_queued_prep_job_of_a_client_that_left_never_runs(srv, monkeypatch):
    """All prep threads busy; a client that queues a job and leaves: its job is dropped, not run later."""
    release, ran = threading.Event(), []
    real = misc.tokenize

    def tokenize(ctx, body):
        if body.get("content") == "block":
            release.wait(30)
        ran.append(body.get("content"))
        return real(ctx, body)
    monkeypatch.setattr(misc, "tokenize", tokenize)
    n = srv.ctx.prep_pool._max_workers
    holders = [threading.Thread(target=lambda: httpx.post(srv.url + "/tokenize", json={"content": "block"},
                                                          timeout=60)) for _ in range(n)]
    for t in holders:
        t.start()
    time.sleep(0.3)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/tokenize", json={"content": "gone"}, timeout=0.5)
        time.sleep(0.6)                          # the server notices the disconnect within 0.25 s
    finally:
        release.set()
        for t in holders:
            t.join()
    time.sleep(0.3)
    assert ran.count("block") == n and "gone" not in ran


def test_a_running_prep_job_of_a_client_that_left_stops(srv, monkeypatch):
    """A /completion with many prompts is being tokenized when its client leaves: the job stops at the next prompt
    (prep_cancel.step) instead of tokenizing the rest for nobody (before: all 200 were tokenized)."""
    tok, encoded = srv.ctx.tokenizer, []
    real = tok.encode

    def slow_encode(text, *a, **k):
        if text == "slow":
            encoded.append(text)
            time.sleep(0.05)
        return real(text, *a, **k)
    monkeypatch.setattr(tok, "encode", slow_encode)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/completion", json={"prompt": ["slow"] * 200, "n_predict": 1}, timeout=0.5)
    time.sleep(1.0)                              # noticed within 0.25 s, then at most one more prompt
    n_after_leave = len(encoded)
    time.sleep(1.0)
    assert 0 < n_after_leave < 60 and len(encoded) == n_after_leave
