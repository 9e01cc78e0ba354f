"""Embeddings (--embeddings, --pooling): the hidden state after output_norm, pooled and normalized as llama-server
does. The hidden state is tied to the model's own logits (output @ h = the forward's logits, which match llama.cpp's
logits goldens), chunking must not change it, and the endpoints answer in llama-server's shapes."""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from llamacmp import embedding
from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.loader import load_model

sys.path.insert(0, str(Path(__file__).parent))
from server_harness import LiveServer, write_tiny_model  # noqa: E402

TOKENS = [5, 17, 42, 99, 3, 250, 7, 64, 11]


@pytest.fixture(scope="module")
def lm(fixture_gguf):
    return load_model(fixture_gguf("tiny", "f32"), NumpyBackend())


def _logits(lm, tokens) -> np.ndarray:
    state = lm.backend.new_state(lm.cfg, len(tokens))
    batch = StepBatch.build([(state, tokens)], all_logits=True)
    return lm.backend.to_host(lm.model.forward(batch))


def test_hidden_state_is_what_the_head_reads(lm):
    h = embedding.hidden_states(lm.model, TOKENS)                     # [T, D]
    assert h.shape == (len(TOKENS), lm.cfg.n_embd)
    logits = lm.backend.to_host(lm.backend.matmuls(lm.backend.upload_vector(h), [lm.model.output])[0])
    np.testing.assert_allclose(logits, _logits(lm, TOKENS), rtol=1e-4, atol=1e-4)


def test_chunks_do_not_change_it(lm):
    whole = embedding.hidden_states(lm.model, TOKENS, n_ubatch=512)
    np.testing.assert_allclose(embedding.hidden_states(lm.model, TOKENS, n_ubatch=4), whole, rtol=1e-5, atol=1e-5)


def test_pooling_and_normalization(lm):
    h = embedding.hidden_states(lm.model, TOKENS)
    for pooling, row in (("mean", h.mean(0)), ("cls", h[0]), ("last", h[-1])):
        v = np.asarray(embedding.embed(lm.model, TOKENS, pooling)[0])
        np.testing.assert_allclose(v, row / np.linalg.norm(row), rtol=1e-5, atol=1e-6)
    raw = np.asarray(embedding.embed(lm.model, TOKENS, "last", norm=-1)[0])
    np.testing.assert_allclose(raw, h[-1], rtol=1e-6)
    maxabs = np.asarray(embedding.embed(lm.model, TOKENS, "last", norm=0)[0])
    assert abs(np.abs(maxabs).max() - 32760.0) < 1e-2
    np.testing.assert_allclose(embedding.embed(lm.model, TOKENS, "none"), h, rtol=1e-6)   # per token, as is


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("e") / "tiny.gguf")


def test_off_by_default(model_path):
    with LiveServer(model_path) as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 501 and "--embeddings" in r.json()["error"]["message"]


@pytest.mark.parametrize("flag", ["--embeddings", "--embedding"])
def test_endpoints(model_path, flag):
    with LiveServer(model_path, flag, "--pooling", "mean") as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": ["hello world", "x"]})
        body = r.json()
        assert r.status_code == 200 and body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
        v = np.asarray(body["data"][0]["embedding"])
        assert abs(np.linalg.norm(v) - 1) < 1e-5 and body["usage"]["prompt_tokens"] > 2
        native = httpx.post(s.url + "/embedding", json={"content": "hello world"}).json()
        np.testing.assert_allclose(native[0]["embedding"][0], v, rtol=1e-6)
        b64 = httpx.post(s.url + "/v1/embeddings", json={"input": "hello world", "encoding_format": "base64"})
        decoded = np.frombuffer(base64.b64decode(b64.json()["data"][0]["embedding"]), np.float32)
        np.testing.assert_allclose(decoded, v, rtol=1e-6)
        assert httpx.post(s.url + "/v1/embeddings", json={"input": ""}).status_code == 400
        assert httpx.post(s.url + "/v1/embeddings", json={}).status_code == 400


def test_pooling_none(model_path):
    with LiveServer(model_path, "--embeddings", "--pooling", "none") as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": "hello world"})
        assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]
        rows = httpx.post(s.url + "/embedding", json={"content": "hello world"}).json()[0]["embedding"]
        assert len(rows) > 1 and abs(np.linalg.norm(rows[0]) - 1) > 1e-3     # per token, not normalized


@pytest.mark.parametrize("pooling, longest", [("last", -1), ("mean", 0)])
def test_input_must_fit_a_slot(model_path, pooling, longest):
    # as llama-server: 'last' pooling leaves room for one more token (>= n_ctx is refused), the others fill the slot
    with LiveServer(model_path, "--embeddings", "--pooling", pooling, "-c", "128", "-np", "2") as s:
        n_ctx = httpx.get(s.url + "/slots").json()[0]["n_ctx"]
        ok = httpx.post(s.url + "/embedding", json={"content": [[9] * (n_ctx + longest)]}, timeout=60)
        assert ok.status_code == 200
        r = httpx.post(s.url + "/v1/embeddings", json={"input": ["hi", [9] * (n_ctx + longest + 1)]}, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
        assert err["n_prompt_tokens"] == n_ctx + longest + 1 and err["n_ctx"] == n_ctx
        assert f"({n_ctx} tokens)" in err["message"]


# -- against llama.cpp b8462's llama-embedding (compat/gen_embedding_goldens.py) -------------------------------------

GOLDEN = json.loads((Path(__file__).parents[1] / "compat" / "goldens" / "embeddings.json").read_text())


@pytest.fixture(scope="module")
def golden_model(fixture_gguf):
    f = GOLDEN["fixture"]
    return fixture_gguf(f["shape"], f["dtype"], f["seed"])


def _cases(pooling: str) -> list[dict]:
    return [c for c in GOLDEN["cases"] if c["pooling"] == pooling]


@pytest.mark.parametrize("pooling", ["mean", "last", "cls", "none"])
def test_vectors_match_llamacpp(golden_model, pooling):
    """The same text gives llama.cpp's tokens and, within 1e-3, its vectors (pooled ones normalized, as
    llama-server's default; none raw per token, as llama-server answers it)."""
    with LiveServer(golden_model, "--embeddings", "--pooling", pooling) as s:
        for case in _cases(pooling):
            assert httpx.post(s.url + "/tokenize", json={"content": case["prompt"]}).json()["tokens"] == case["tokens"]
            if pooling == "none":          # per token: only llama.cpp's own shape can carry it
                got = httpx.post(s.url + "/embedding", json={"content": case["prompt"]}).json()[0]["embedding"]
            else:
                got = [httpx.post(s.url + "/v1/embeddings", json={"input": case["prompt"]}).json()["data"][0]
                       ["embedding"]]
            np.testing.assert_allclose(np.asarray(got), np.asarray(case["vectors"]), rtol=0, atol=1e-3)


def test_embd_normalize_flag_sets_the_servers_default(golden_model):
    """--embd-normalize -1: the pooled vector comes back raw, i.e. the mean of llama.cpp's raw per-token rows."""
    case = _cases("none")[0]
    raw_mean = np.asarray(case["vectors"]).mean(0)
    with LiveServer(golden_model, "--embeddings", "--pooling", "mean", "--embd-normalize", "-1") as s:
        got = httpx.post(s.url + "/v1/embeddings", json={"input": case["prompt"]}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(got, raw_mean, rtol=0, atol=1e-3)
        unit = httpx.post(s.url + "/v1/embeddings", json={"input": case["prompt"], "embd_normalize": 2}).json()
        np.testing.assert_allclose(unit["data"][0]["embedding"], raw_mean / np.linalg.norm(raw_mean), atol=1e-3)


def test_openai_content_parts_input(model_path):
    """llama-server 0c1e570 takes {"content": [parts]} as an input: its text parts joined, the same vector as the
    string (their test_embedding.py); media without a projector and unknown part types are refused."""
    with LiveServer(model_path, "--embeddings", "--pooling", "last") as s:
        parts = {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}
        r = httpx.post(s.url + "/v1/embeddings", json={"input": ["hello world", parts]})
        assert r.status_code == 200
        data = r.json()["data"]
        assert data[0]["embedding"] == data[1]["embedding"]
        for bad in ({"content": "string"}, {"content": [{"type": "unknown"}]},
                    {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}):
            assert httpx.post(s.url + "/v1/embeddings", json={"input": bad}).status_code == 400
