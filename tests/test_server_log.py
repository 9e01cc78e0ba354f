"""The server's log as llama-server writes it (b8462): start-up lines (model, type mix, memory, template, slots,
address), one print_timings block per request, the request log; -v adds debug lines, --log-disable silences it,
--log-file gets a copy. Checked on a real `python -m llamacmp.server.app` by content, not by timing figures."""
from __future__ import annotations

import re
from collections import Counter

import httpx
import pytest

from llamacmp.gguf_file import GGUFFile
from server_harness import ServerProcess

TIMINGS = re.compile(
    r"slot print_timing: id +(\d+) \| task (\d+) \| \n"
    r"prompt eval time = +[\d.]+ ms / +(\d+) tokens \( +(?:[\d.]+|inf|nan) ms per token, +(?:[\d.]+|inf|nan) tokens per second\)\n"
    r"       eval time = +[\d.]+ ms / +(\d+) tokens \( +(?:[\d.]+|inf|nan) ms per token, +(?:[\d.]+|inf|nan) tokens per second\)\n"
    r"      total time = +[\d.]+ ms / +(\d+) tokens\n")


@pytest.fixture(scope="module")
def model(fixture_gguf):
    return fixture_gguf("tiny", "f32")


def _serve(model, tmp_path, *flags, requests=1):
    """Start the server, make `requests` completions, stop it; -> (log text, last completion JSON)."""
    with ServerProcess(model, tmp_path / "stderr.txt", "-c", "256", "-np", "2", *flags) as srv:
        httpx.get(srv.url + "/health", timeout=10)
        for _ in range(requests):
            r = httpx.post(srv.url + "/completion", json={"prompt": "Hello there", "n_predict": 3,
                                                            "temperature": 0}, timeout=60)
            assert r.status_code == 200
        out = r.json()
        port = srv.port
    return (tmp_path / "stderr.txt").read_text(encoding="utf-8"), out, port


def test_startup_and_request_lines(model, tmp_path):
    logf = tmp_path / "server.log"
    text, out, port = _serve(model, tmp_path, "--log-file", str(logf))
    f = GGUFFile(model)
    types = Counter(f.info(n).type_name.lower() for n in f.names())
    assert f"llama_model_loader: loaded meta data with {len(f.metadata)} key-value pairs and " \
           f"{len(f.names())} tensors from {model} (version GGUF V3 (latest))" in text
    for t, n in types.items():
        assert f"llama_model_loader: - type {t:>4}: {n:4d} tensors\n" in text
    assert "print_info: file type   = all F32\n" in text
    assert re.search(r"Loading model\.\.\. done \(\d+\.\d s\)\n", text)      # the progress line (not a TTY)
    assert re.search(r"print_info: file size   = [\d.]+ MiB \(32\.00 BPW\)", text)
    assert "llama_context: n_ctx_seq     = 128\n" in text               # -c 256 over 2 slots, not unified
    assert re.search(r"llama_kv_cache: size = +[\d.]+ MiB \( +256 cells, +1 layers,  2/2 seqs\), K \(f16\)", text)
    assert "llama_memory_recurrent: size = " in text
    assert "srv    load_model: initializing slots, n_slots = 2\n" in text
    assert "slot   load_model: id  1 | task -1 | new slot, n_ctx = 128\n" in text
    assert "srv    load_model: chat template from the model's tokenizer.chat_template\n" in text
    assert "init: chat template, example_format: '<|im_start|>system\nYou are a helpful assistant<|im_end|>" in text
    assert "srv          init: init: chat template, thinking = 1\n" in text
    assert f"main: server is listening on http://127.0.0.1:{port}\n" in text
    assert text.index("main: model loaded") < text.index("main: server is listening")
    # one request: its slot lines and timing block, with the response's own token counts
    assert "selected slot by LRU" in text and "processing task, is_child = 0" in text
    assert f"task.n_tokens = {out['tokens_evaluated']}\n" in text
    m = TIMINGS.search(text)
    assert m, text
    assert (int(m[3]), int(m[4])) == (out["timings"]["prompt_n"], out["tokens_predicted"]) == (
        out["tokens_evaluated"], 3)
    assert int(m[5]) == int(m[3]) + int(m[4]) and int(m[1]) == out["id_slot"]
    assert f"stop processing: n_tokens = {out['tokens_evaluated'] + 2}, truncated = 0" in text
    assert "srv  log_server_r: done request: POST /completion 127.0.0.1 200\n" in text
    assert "GET /health" not in text                                   # polled endpoints are not logged
    assert "next token:" not in text and "request:  {" not in text    # debug lines need -v
    assert logf.read_text(encoding="utf-8") in text                   # --log-file: a copy of the log
    assert TIMINGS.search(logf.read_text(encoding="utf-8"))


def test_second_request_reuses_the_cache_and_logs_again(model, tmp_path):
    text, out, _ = _serve(model, tmp_path, requests=2)
    assert len(TIMINGS.findall(text)) == 2
    assert "selected slot by LCP similarity, sim_best = 1.000" in text
    assert out["timings"]["cache_n"] > 0


def test_verbose_adds_request_debug_lines(model, tmp_path):
    text, out, _ = _serve(model, tmp_path, "-v")
    assert re.search(r"slot process_toke: id +\d \| task \d+ \| n_decoded = 1, n_remaining = 2, next token: +\d+ '",
                     text)
    assert "stopped by limit, n_decoded = 3, n_predict = 3" in text
    assert 'srv  log_server_r: request:  {"prompt":"Hello there","n_predict":3' in text
    assert 'srv  log_server_r: response: {"index":0,' in text
    assert TIMINGS.search(text)


def test_log_timestamps_and_disable(model, tmp_path):
    text, _, _ = _serve(model, tmp_path, "--log-timestamps")
    assert re.search(r"^\d+\.\d\d\.\d{3}\.\d{3} srv  update_slots: all slots are idle$", text, re.M)
    quiet, _, _ = _serve(model, tmp_path, "--log-disable")
    assert "print_timing" not in quiet and "llama_model_loader" not in quiet and "listening" not in quiet
    assert "Loading model" not in quiet
