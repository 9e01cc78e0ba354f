"""The engine thread never dies silently (issue 22): a failing task answers its request and the engine goes on;
an engine that cannot go on answers every request with 503, /health says so, and the server's on_fatal hook runs."""
from __future__ import annotations

import os
import zipfile

import httpx
import pytest

from server_harness import LiveServer, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


def _alive(c: httpx.Client) -> None:
    assert c.get("/health").status_code == 200
    r = c.post("/completion", json={"prompt": "Hi", "n_predict": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


def test_slot_save_failures_answer_and_the_engine_goes_on(model, tmp_path):
    save = tmp_path / "slots"
    with LiveServer(model, "-c", "512", "-np", "1", "--slot-save-path", str(save)) as s, \
            httpx.Client(base_url=s.url, timeout=30) as c:
        c.post("/completion", json={"prompt": "Hi", "n_predict": 2, "id_slot": 0})
        r = c.post("/slots/0?action=save", json={"filename": "a.slot"})     # the folder does not exist
        assert r.status_code == 500 and "Unable to save slot to 'a.slot'" in r.json()["error"]["message"]
        _alive(c)
        save.mkdir()
        (save / "adir").mkdir()
        r = c.post("/slots/0?action=save", json={"filename": "adir"})
        assert r.status_code == 400 and "is a directory" in r.json()["error"]["message"]
        _alive(c)
        if os.path.exists("/dev/full"):                                    # disk full
            os.symlink("/dev/full", save / "full.slot")
            r = c.post("/slots/0?action=save", json={"filename": "full.slot"})
            assert r.status_code == 500 and "No space left" in r.json()["error"]["message"]
            _alive(c)
        r = c.post("/slots/0?action=save", json={"filename": "ok.slot"})
        assert r.status_code == 200 and r.json()["n_written"] > 0


@pytest.mark.parametrize("content", [b"not a zip at all", b"PK\x03\x04" + b"\0" * 64, b""])
def test_restore_of_a_broken_file_is_a_400(model, tmp_path, content):
    with LiveServer(model, "-c", "512", "-np", "1", "--slot-save-path", str(tmp_path)) as s, \
            httpx.Client(base_url=s.url, timeout=30) as c:
        (tmp_path / "bad.slot").write_bytes(content)
        r = c.post("/slots/0?action=restore", json={"filename": "bad.slot"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("Unable to restore slot")
        with zipfile.ZipFile(tmp_path / "z.slot", "w") as z:               # a zip, but not an npz of a slot
            z.writestr("x.txt", "hello")
        r = c.post("/slots/0?action=restore", json={"filename": "z.slot"})
        assert r.status_code == 400
        _alive(c)


def test_a_failing_query_answers_and_the_engine_goes_on(model):
    with LiveServer(model, "-c", "512", "-np", "1", "--metrics") as s, httpx.Client(base_url=s.url, timeout=30) as c:
        real = s.ctx.engine._query
        s.ctx.engine._query = lambda kind: 1 / 0
        r = c.get("/metrics")
        assert r.status_code == 500 and "ZeroDivisionError" in r.json()["error"]["message"]
        s.ctx.engine._query = real
        assert c.get("/metrics").status_code == 200
        _alive(c)


def test_an_engine_that_cannot_go_on_says_so(model):
    reasons = []
    with LiveServer(model, "-c", "512", "-np", "1") as s, httpx.Client(base_url=s.url, timeout=30) as c:
        eng = s.ctx.engine
        eng.on_fatal(reasons.append)

        def broken() -> None:
            raise RuntimeError("device lost")
        eng._assign_waiting = broken                                       # every loop iteration now fails
        r = c.post("/completion", json={"prompt": "Hi", "n_predict": 2})
        assert r.status_code == 503 and "device lost" in r.json()["error"]["message"]
        eng._thread.join(timeout=10)
        assert not eng._thread.is_alive() and reasons and "device lost" in reasons[0]
        h = c.get("/health")
        assert h.status_code == 503 and "device lost" in h.json()["error"]["message"]
        r = c.post("/completion", json={"prompt": "Hi", "n_predict": 2, "stream": True})   # answered, no hang
        assert r.status_code == 503


def _start(model, *flags):
    import subprocess
    import sys
    import time

    from server_harness import free_port
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "llamacmp.server.app", "-m", str(model), "--port", str(port),
                             *flags], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.time() + 60
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.time() < deadline, "server did not come up"
        time.sleep(0.2)


def test_sigterm_drains_for_timeout_seconds_then_cancels(model):
    import signal
    import threading
    import time
    proc, url = _start(model, "-c", "65536", "-np", "1", "--timeout", "2")
    try:
        def stream() -> None:
            try:
                with httpx.stream("POST", url + "/completion", json={"prompt": "Hi", "n_predict": -1, "stream": True,
                                                                    "ignore_eos": True}, timeout=60) as r:
                    for _ in r.iter_lines():
                        pass
            except httpx.HTTPError:
                pass
        t = threading.Thread(target=stream, daemon=True)
        t.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert time.monotonic() - t0 < 10       # --timeout 2 of drain; without a bound the stream runs > 60 s
        t.join(timeout=10)
        assert not t.is_alive()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
