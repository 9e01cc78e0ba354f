"""-hf from the local caches only, with llama.cpp's file naming and quant matching (llamacmp/hf_cache.py)."""
from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr

import pytest

from llamacmp.hf_cache import HfCacheError, best_model, resolve

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_repo(root, repo, files):
    base = root / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(COMMIT + "\n")
    snap = base / "snapshots" / COMMIT
    for f in files:
        (snap / f).parent.mkdir(parents=True, exist_ok=True)
        (snap / f).write_bytes(b"GGUF")
    return snap


def test_quant_rules():
    names = sorted(["Qwen3.5-9B-Q8_0.gguf", "Qwen3.5-9B-Q4_K_M.gguf", "mmproj-Qwen3.5-9B-Q4_K_M.gguf",
                    "Qwen3.5-9B-IQ4_XS.gguf"])
    assert best_model(names, "") == "Qwen3.5-9B-Q4_K_M.gguf"           # default Q4_K_M, never the mmproj
    assert best_model(names, "q8_0") == "Qwen3.5-9B-Q8_0.gguf"         # case-insensitive
    assert best_model(names, "Q5_K_M") is None                         # an asked tag has no fallback
    assert best_model(["a-IQ4_XS.gguf"], "") == "a-IQ4_XS.gguf"        # no default tag: the first model file
    split = ["m-Q8_0-00002-of-00002.gguf", "m-Q8_0-00001-of-00002.gguf"]
    assert best_model(sorted(split), "Q8_0") == "m-Q8_0-00001-of-00002.gguf"


def test_hub_layout_from_hf_home(tmp_path):
    snap = hub_repo(tmp_path / "hf" / "hub", "unsloth/Qwen3.5-9B-GGUF",
                    ["Qwen3.5-9B-Q4_K_M.gguf", "Qwen3.5-9B-Q8_0.gguf", "sub/Qwen3.5-9B-BF16.gguf"])
    env = {"HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf")}
    assert resolve("unsloth/Qwen3.5-9B-GGUF", env=env) == str(snap / "Qwen3.5-9B-Q4_K_M.gguf")
    assert resolve("unsloth/Qwen3.5-9B-GGUF:Q8_0", env=env) == str(snap / "Qwen3.5-9B-Q8_0.gguf")
    assert resolve("unsloth/Qwen3.5-9B-GGUF:bf16", env=env) == str(snap / "sub/Qwen3.5-9B-BF16.gguf")
    assert resolve("unsloth/Qwen3.5-9B-GGUF", "Qwen3.5-9B-Q8_0.gguf", env=env) == str(snap / "Qwen3.5-9B-Q8_0.gguf")


def test_b8462_flat_cache(tmp_path):
    cache = tmp_path / "llama.cpp"
    cache.mkdir()
    (cache / "user_repo_model-Q6_K.gguf").write_bytes(b"GGUF")
    (cache / "user_repo_model-Q8_0.gguf").write_bytes(b"GGUF")
    (cache / "manifest=user=repo=latest.json").write_text(json.dumps({"ggufFile": {"rfilename": "model-Q6_K.gguf"}}))
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path), "LLAMA_CACHE": str(cache)}
    assert resolve("user/repo", env=env) == str(cache / "user_repo_model-Q6_K.gguf")     # the manifest's file
    assert resolve("user/repo:Q8_0", env=env) == str(cache / "user_repo_model-Q8_0.gguf")


def test_miss_says_where_it_looked_and_that_nothing_downloads(tmp_path):
    env = {"HOME": str(tmp_path)}
    with pytest.raises(HfCacheError) as e:
        resolve("user/repo:Q4_K_M", env=env)
    text = str(e.value)
    assert str(tmp_path / ".cache/huggingface/hub/models--user--repo") in text
    assert str(tmp_path / ".cache/llama.cpp") in text and "does not download" in text
    with pytest.raises(HfCacheError, match="expected <user>/<model>"):
        resolve("justarepo", env=env)


def test_hf_flag_sets_the_model_and_a_miss_exits(tmp_path, monkeypatch):
    from llamacmp.args import parse_or_exit
    snap = hub_repo(tmp_path / "hub", "u/r", ["r-Q4_K_M.gguf"])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("LLAMA_CACHE", raising=False)
    err = io.StringIO()
    with redirect_stderr(err):
        p = parse_or_exit("completion", ["-hf", "u/r"])
    assert p.model == str(snap / "r-Q4_K_M.gguf") and "from the local cache" in err.getvalue()
    with redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as e:
        parse_or_exit("server", ["-hf", "u/other"])
    assert e.value.code == 1 and "models--u--other" in err.getvalue()
