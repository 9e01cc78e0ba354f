"""--sleep-idle-seconds (llama-server 0c1e570): after N idle seconds the engine frees the model, its backend memory
and the slots with their prompt caches; the next request that needs the model loads it again from the same file
and is answered as an awake server would answer it. On the numpy backend with the demo model."""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from llamacmp.args import ArgError, parse_args
from server_harness import LiveServer

DEMO = Path(__file__).resolve().parents[1] / "llamacmp" / "data" / "default.gguf"
ASK = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "cache_prompt": True}


def _sleeping(c: httpx.Client) -> bool:
    r = c.get("/props")
    assert r.status_code == 200
    return r.json()["is_sleeping"]


def _wait_for_sleep(c: httpx.Client, timeout: float = 10) -> None:
    deadline = time.time() + timeout
    while not _sleeping(c):
        assert time.time() < deadline, "the server did not fall asleep"
        time.sleep(0.1)


def _answer(c: httpx.Client) -> str:
    r = c.post("/completion", json=ASK)
    assert r.status_code == 200, r.text
    return r.json()["content"]


@pytest.mark.parametrize("bad", ["0", "-2", "x"])
def test_bad_values_are_refused_naming_the_flag(bad):
    with pytest.raises(ArgError, match="--sleep-idle-seconds"):
        parse_args("server", ["-m", "m.gguf", "--sleep-idle-seconds", bad])
    assert parse_args("server", ["-m", "m.gguf", "--sleep-idle-seconds", "-1"]).params.server.sleep_idle_seconds == -1


def test_without_the_flag_the_server_stays_awake():
    with LiveServer(DEMO, "-c", "256", "-np", "1") as s, httpx.Client(base_url=s.url, timeout=60) as c:
        _answer(c)
        time.sleep(2.5)
        assert not _sleeping(c) and s.ctx.lm.model is not None


def test_sleeps_frees_the_model_and_wakes_with_the_same_answer(caplog):
    caplog.set_level(logging.INFO, logger="llamacmp.engine")
    with LiveServer(DEMO, "-c", "256", "-np", "2", "--metrics", "--sleep-idle-seconds", "1") as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        awake = _answer(c)
        assert not _sleeping(c)
        _wait_for_sleep(c)
        assert s.ctx.lm.model is None and s.ctx.engine.slots == []      # model and slots (prompt caches) freed
        # read-only routes answer without waking it, as llama-server's
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/models").json()["data"][0]["id"] == s.ctx.model_name
        assert "llamacpp:tokens_predicted_total 8" in c.get("/metrics").text
        assert _sleeping(c)
        assert "srv  handle_sleep: server is entering sleeping state" in caplog.messages
        assert _answer(c) == awake                                      # same greedy answer from a reloaded model
        assert not _sleeping(c) and s.ctx.lm.model is not None
        assert "srv  handle_sleep: server is exiting sleeping state" in caplog.messages
        _wait_for_sleep(c)
        assert c.post("/tokenize", json={"content": "Hello"}).status_code == 200    # every other route wakes it
        assert not _sleeping(c)


def test_requests_arriving_while_asleep_are_all_served():
    with LiveServer(DEMO, "-c", "256", "-np", "2", "--sleep-idle-seconds", "1") as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        awake = _answer(c)
        _wait_for_sleep(c)
        answers: list[str] = []
        threads = [threading.Thread(target=lambda: answers.append(_answer(c))) for _ in range(4)]
        for t in threads:            # the first wakes the engine; the others wait for the reload in the queue
            t.start()
        for t in threads:
            t.join()
        assert answers == [awake] * 4


def test_a_failed_reload_is_a_503_naming_the_cause_and_the_next_request_retries(tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copy(DEMO, model)
    with LiveServer(model, "-c", "256", "-np", "1", "--sleep-idle-seconds", "1") as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        awake = _answer(c)
        _wait_for_sleep(c)
        os.rename(model, tmp_path / "gone.gguf")
        r = c.post("/completion", json=ASK)
        assert r.status_code == 503
        msg = r.json()["error"]["message"]
        assert "could not load the model again after sleeping" in msg and "m.gguf" in msg
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["error"]["message"] == msg
        os.rename(tmp_path / "gone.gguf", model)
        assert _answer(c) == awake
        assert c.get("/health").status_code == 200


def _gauge(c: httpx.Client, name: str) -> float:
    line = next(ln for ln in c.get("/metrics").text.splitlines() if ln.startswith(f"llamacpp:{name} "))
    return float(line.split()[1])


def test_metrics_gauges_cover_the_window_since_the_last_scrape_and_a_scrape_does_not_wake():
    with LiveServer(DEMO, "-c", "256", "-np", "1", "--metrics", "--sleep-idle-seconds", "1") as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        _answer(c)
        _wait_for_sleep(c)
        assert _gauge(c, "predicted_tokens_seconds") > 0      # the last generation's window
        assert _gauge(c, "predicted_tokens_seconds") == 0     # nothing ran since the previous scrape
        assert _gauge(c, "prompt_tokens_seconds") == 0
        assert _sleeping(c)


@pytest.mark.cuda
def test_on_cuda_the_arena_gives_its_memory_back_while_asleep(cuda_backend):
    from llamacmp.backends.cuda import CudaBackend
    be = CudaBackend(arena_bytes=2 << 30, native=cuda_backend.native)     # its own arena: closed while asleep
    with LiveServer(DEMO, "-c", "256", "-np", "2", "--sleep-idle-seconds", "1", backend=be) as s, \
            httpx.Client(base_url=s.url, timeout=120) as c:
        awake = _answer(c)
        assert be.arena.reserved > 0
        _wait_for_sleep(c)
        assert be.arena.reserved == 0 and be.arena.in_use == 0
        assert _answer(c) == awake
        assert be.arena.reserved > 0 and not _sleeping(c)
