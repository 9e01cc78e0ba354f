"""The chat page in a real headless Chromium (Debian's `chromium`; .ci/run installs it), against a real
llamacmp-server process with the bundled demo model on loopback: settings typed into the page, a message typed and
sent with mouse clicks, the answer streamed into the page, equal to the same request answered over plain HTTP;
the stop button ends a stream and the server frees the slot.

Skipped only where no Chromium binary exists (CI installs one, so CI never skips).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cdp import Browser, find_chromium
from server_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "llamacmp" / "data" / "default.gguf"
KEY = "page-key"
SYSTEM = "You write Python."
MESSAGE = "def parse"
# The demo model thinks until the budget ends its reasoning, then answers: both parts of the page get text.
SETTINGS = {"#temperature": "0", "#top_p": "1", "#top_k": "1", "#max_tokens": "20", "#system": SYSTEM,
            "#api_key": KEY}

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install "
                                                          "chromium; .ci/run installs it)")


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                  "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def _get(url: str) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def server():
    """llamacmp-server as a user starts it (a process of its own), with an API key and a reasoning budget."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-m", "llamacmp.server.app", "-m", str(DEMO), "--host", "127.0.0.1",
                             "--port", str(port), "-c", "2048", "-np", "1", "--api-key", KEY,
                             "--reasoning-budget", "6"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"llamacmp-server exited: {proc.stderr.read()}")
            assert time.time() < deadline, "llamacmp-server did not come up in 60 s"
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def page(server):
    with Browser(CHROMIUM) as b:
        b.open(server + "/")
        b.click("#toggle-settings")
        for selector, value in SETTINGS.items():
            b.type_into(selector, value)
        yield b


# Records the assistant bubble's answer and reasoning text after each DOM change, with the time of the change.
WATCH = """(() => {
  window.seen = [];
  new MutationObserver(() => {
    const b = document.querySelector('.msg.assistant:last-child');
    if (!b) return;
    window.seen.push([performance.now(), b.querySelector('.reasoning .text').textContent.length,
                      b.querySelector('.answer').textContent.length]);
  }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
})()"""
LAST = "document.querySelector('.msg.assistant:last-child')"


def test_message_streams_an_answer_equal_to_http(page, server):
    page.evaluate(WATCH)
    page.type_into("#input", MESSAGE)
    page.click("#send")
    page.wait_for(f"{LAST} && {LAST}.dataset.state", timeout=60)
    state, reasoning, answer, user = page.evaluate(
        f"[{LAST}.dataset.state, {LAST}.querySelector('.reasoning .text').textContent, "
        f"{LAST}.querySelector('.answer').textContent, document.querySelector('.msg.user').textContent]")
    assert state == "done", page.evaluate(f"{LAST}.textContent")
    assert user == MESSAGE

    # The same request over HTTP, not streamed: the page's text is exactly its reply.
    want = _post(server + "/v1/chat/completions", {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": MESSAGE}],
        "temperature": 0, "top_p": 1, "top_k": 1, "max_tokens": 20})["choices"][0]["message"]
    assert reasoning == want["reasoning_content"] and answer == want["content"]
    assert reasoning.strip() and answer.strip(), "the budget should split the reply into reasoning and answer"
    assert page.evaluate(f"!{LAST}.querySelector('.reasoning').hidden")

    # It streamed: the page showed partial text first, at more than one moment, growing until the final text.
    seen = page.evaluate("window.seen")
    totals = [(t, r + a) for t, r, a in seen]
    final = len(reasoning) + len(answer)
    partial = [(t, n) for t, n in totals if 0 < n < final]
    assert len({n for _, n in partial}) >= 3, seen
    assert partial[-1][0] > partial[0][0]
    assert all(n2 >= n1 for (_, n1), (_, n2) in zip(totals, totals[1:])), seen
    assert totals[-1][1] == final


def test_stop_button_ends_the_stream_and_frees_the_slot(page, server):
    page.type_into("#max_tokens", "-1")
    page.type_into("#input", MESSAGE)
    page.click("#send")
    page.wait_for(f"{LAST} && {LAST}.querySelector('.reasoning .text').textContent.length > 0", timeout=60)
    assert page.evaluate("document.getElementById('stop').disabled") is False
    page.click("#stop")
    page.wait_for(f"{LAST}.dataset.state === 'stopped'", timeout=10)
    assert page.evaluate("document.getElementById('send').disabled") is False
    # the server noticed the closed connection and cancelled the generation
    deadline = time.time() + 20
    while any(s["is_processing"] for s in _get(server + "/slots")):
        assert time.time() < deadline, "the slot kept generating after the page stopped"
        time.sleep(0.2)
