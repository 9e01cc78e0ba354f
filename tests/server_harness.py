"""Start a real llamacmp-server (numpy backend) on 127.0.0.1 with a free port, in a thread of the test process.

Everything between the client and the engine is real: uvicorn, the ASGI app, the engine thread, the numpy forward.
Also: `write_tool_fixture`, a tiny GGUF whose greedy output is a fixed Qwen3.5 XML tool call (a bigram model:
every block writes zero into the residual stream, so the logits depend only on the current token).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import uvicorn

from llamacmp.args import parse_args
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.fixtures import writer
from llamacmp.fixtures.qwen_vocab import USER_DEFINED, tiny_vocab
from llamacmp.server.app import create_app
from llamacmp.server.context import ServerContext


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, model: Path, *flags: str, backend=None):
        self.port = free_port()
        params = parse_args("server", ["-m", str(model), "--port", str(self.port), *flags]).params
        self.ctx = ServerContext(params)
        self.app = create_app(self.ctx)
        self.ctx.load(backend or NumpyBackend())
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.ctx.engine.stop()


class ServerProcess:
    """`python -m llamacmp.server.app` in a child process (what a user starts: main(), its log set-up and all),
    on 127.0.0.1 with a free port; stdout and stderr go to `log_path`. Waits until /health answers 200."""

    def __init__(self, model: Path, log_path: Path, *flags: str):
        self.port = free_port()
        self.log_path = log_path
        self.argv = [sys.executable, "-m", "llamacmp.server.app", "-m", str(model), "--port", str(self.port), *flags]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ServerProcess":
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.out = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, env=env, stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.time() + 90
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.__exit__()
                raise RuntimeError(f"server did not start:\n{self.log()}")
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.out.close()


def write_tiny_model(path: Path) -> Path:
    return writer.write_model(path, writer.SHAPES["tiny"], "f32", tiny_vocab())


TOOL_TOKENS = ("<function=get_weather>", "<parameter=city>", "Paris", "</parameter>", "</function>")


def write_tool_fixture(path: Path, after_text: str) -> Path:
    """A GGUF whose greedy continuation of `after_text`'s last token is
    <tool_call><function=get_weather><parameter=city>Paris</parameter></function></tool_call><|im_end|>."""
    vocab = tiny_vocab()
    vocab = replace(vocab, tokens=vocab.tokens + list(TOOL_TOKENS),
                    token_types=vocab.token_types + [USER_DEFINED] * len(TOOL_TOKENS))
    shape = writer.SHAPES["tiny"]
    specs = list(writer.tensor_specs(shape, len(vocab.tokens)))
    tensors = {s.name: writer.encode(s, "f32", 0, False) for s in specs}
    _make_bigram(tensors, vocab, after_text)
    _write(path, shape, vocab, specs, tensors)
    return path


def _make_bigram(tensors: dict, vocab, after_text: str) -> None:
    from llamacmp.tokenizer import Tokenizer
    tok = Tokenizer.from_metadata(vocab.tokens, vocab.merges, vocab.token_types, "qwen35", vocab.eos_id)
    last = tok.encode(after_text, parse_special=True)[-1]
    chain = [last] + [vocab.tokens.index(t) for t in ("<tool_call>", *TOOL_TOKENS, "</tool_call>", "<|im_end|>")]
    for name, arr in tensors.items():
        if name.endswith(("ssm_out.weight", "attn_output.weight", "ffn_down.weight")):
            arr[...] = 0                 # no block contributes: the residual stream is the token embedding
        if name == "output_norm.weight":
            arr[...] = 1
    emb = tensors["token_embd.weight"]
    out = tensors["output.weight"]
    out[...] = 0
    for prev, nxt in zip(chain, chain[1:]):
        out[nxt] = 4.0 * emb[prev] / np.linalg.norm(emb[prev])


def _write(path: Path, shape, vocab, specs, tensors) -> None:
    import gguf
    w = gguf.GGUFWriter(str(path), "qwen35")
    # the fixture writer's metadata step, so this file differs from write_model's only in its weights
    writer._write_metadata(w, shape, "f32", vocab, "llamacmp-tool-fixture", writer.TEMPLATE_PATH.read_text())
    for s in specs:
        w.add_tensor(s.name, tensors[s.name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
