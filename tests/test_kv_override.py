"""--override-kv: llama.cpp's KEY=TYPE:VALUE list, applied to the GGUF metadata before anything reads it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from llamacmp.arg_values import ArgError, kv_overrides
from llamacmp.args import parse_args
from llamacmp.gguf_file import GGUFError
from llamacmp.loader import open_model

DEMO = "llamacmp/data/default.gguf"


def test_parse_types_and_lists():
    assert kv_overrides("a.b=int:7,c=float:0.5,d=bool:false,e=str:hi there") == \
        {"a.b": 7, "c": 0.5, "d": False, "e": "hi there"}
    for bad in ("noequals", "k=int", "k=long:3", "k=bool:yes", "k=int:x", "k=str:" + "x" * 128, "=int:1"):
        with pytest.raises(ArgError, match="Invalid type for KV override"):
            kv_overrides(bad)
    p = parse_args("server", ["--override-kv", "a=int:1", "--override-kv", "b=str:x"]).params
    assert p.kv_overrides == {"a": 1, "b": "x"}


def test_overrides_reach_the_config_and_keep_the_files_types():
    assert open_model(DEMO).cfg.n_ctx_train == 65536
    assert open_model(DEMO, {"qwen35.context_length": 1024}).cfg.n_ctx_train == 1024
    with pytest.raises(GGUFError, match="qwen35.context_length: the file's value is int, the override float"):
        open_model(DEMO, {"qwen35.context_length": 1024.0})


def test_completion_sees_the_override():
    """-c 0 takes the model's context length: overridden to 8, the prompt no longer fits."""
    def run(*extra):
        return subprocess.run([sys.executable, "-m", "llamacmp.cli.completion", "-m", DEMO, "-p",
                               "Hello there my friend how are you doing today", "-n", "2", "--temp", "0", "-no-cnv",
                               "-c", "0", *extra], capture_output=True, text=True)
    assert run().returncode == 0
    r = run("--override-kv", "qwen35.context_length=int:8")
    assert r.returncode == 1 and "prompt is too long" in r.stderr
