"""One run plan per start: stop strings found by one function for every tool, the GGUF header parsed once."""
from __future__ import annotations

import io

import pytest

from llamacmp import gguf_file
from llamacmp.args import parse_args
from llamacmp.engine.stops import find_stop, partial_stop_len
from llamacmp.fixtures import writer
from llamacmp.fixtures.qwen_vocab import tiny_vocab


def test_find_stop_earliest_after_since():
    assert find_stop("abc STOP def END", ["END", "STOP"], 0) == (4, "STOP")
    assert find_stop("abc STOP def", ["STOP"], 9) == (-1, "")          # ended before `since`: searched already
    assert find_stop("abc STOP def", ["STOP"], 7) == (4, "STOP")       # ends after it
    assert find_stop("x", ["", "y"], 0) == (-1, "")
    assert partial_stop_len("hello wor", ["world", "or"]) == 3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return writer.write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", writer.SHAPES["tiny"], "f32", tiny_vocab())


@pytest.fixture
def opens(monkeypatch):
    count = []
    real = gguf_file.GGUFFile.__init__

    def counted(self, path):
        count.append(path)
        real(self, path)
    monkeypatch.setattr(gguf_file.GGUFFile, "__init__", counted)
    return count


def test_cli_start_opens_the_gguf_once(model, opens):
    from llamacmp.cli.common import load
    p = parse_args("completion", ["-m", str(model), "-ngl", "0", "-c", "256", "-ctk", "q8_0", "-ctv", "q4_0"]).params
    loaded = load(p, io.StringIO())
    assert len(opens) == 1
    assert (loaded.run.n_ctx, loaded.run.k_type, loaded.run.v_type) == (256, "q8_0", "q4_0")


def test_server_start_opens_the_gguf_once(model, opens):
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.server.context import ServerContext
    ctx = ServerContext(parse_args("server", ["-m", str(model), "-c", "0"]).params)   # -c 0: the header says
    ctx.load(NumpyBackend())
    try:
        assert len(opens) == 1
    finally:
        ctx.engine.stop()
