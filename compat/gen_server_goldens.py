"""Generate server goldens from llama-server on a fixture GGUF written by our own fixture writer.

    python3 compat/gen_server_goldens.py [--oracle b8462|0c1e570] [--llama-server PATH]

Writes the fixture (tiny shape, real Qwen3.5 vocabulary and template, seed server_cases.FIXTURE_SEED) to a temporary
folder, starts two llama-server instances on 127.0.0.1 with free ports (one plain, one with --api-key), sends every
case in compat/server_cases.py with httpx and writes one record per case to compat/goldens/server.jsonl: status, the
JSON field tree {path: type} (for event streams: one tree per chunk and the end marker), exact values of the
deterministic fields and probabilities, into the oracle's goldens folder (compat/oracles.py). Both servers are
killed at the end, whatever happens.
tests/test_compat_server.py regenerates the same fixture and checks llamacmp-server against these records.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))    # this checkout's fixture writer
import oracles  # noqa: E402
from server_cases import API_KEY, CASES, FIXTURE_NAME, FIXTURE_SEED, SERVER_FLAGS, send  # noqa: E402


def write_fixture(folder: Path) -> Path:
    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
    from llamacmp.fixtures.writer import SHAPES, write_model
    return write_model(folder / FIXTURE_NAME, SHAPES["tiny"], "f32", load_qwen35_vocab(), seed=FIXTURE_SEED,
                       name="compat-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("llama-server did not become ready")


def main() -> None:
    p = argparse.ArgumentParser()
    oracles.add_argument(p)
    p.add_argument("--llama-server", type=Path, help="default: the oracle's build")
    args = p.parse_args()
    oracle = oracles.parse(args.oracle)
    server = args.llama_server or oracle.tool("llama-server")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as d:
        model = write_fixture(Path(d))
        bases = {}
        try:
            for name, extra in (("main", []), ("auth", ["--api-key", API_KEY])):
                port = free_port()
                log = open(Path(d) / f"{name}.log", "w")
                procs.append(subprocess.Popen(
                    [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                     "--no-webui", *SERVER_FLAGS, *extra], stdout=log, stderr=subprocess.STDOUT))
                bases[name] = f"http://127.0.0.1:{port}"
            for name, proc in zip(bases, procs):
                wait_ready(bases[name], proc)
            lines = []
            for case in CASES:
                # a fresh connection per case: no case depends on how the previous one left a kept-alive socket
                with httpx.Client(timeout=120) as client:
                    try:
                        rec = send(client, bases[case.server], case)
                    except httpx.HTTPError:
                        for name, proc in zip(bases, procs):
                            if proc.poll() is not None:
                                print((Path(d) / f"{name}.log").read_text()[-3000:])
                        raise
                rec["request"] = asdict(case)
                # current llama-server names the model by its -m path: the temporary folder becomes {TMP}
                lines.append(json.dumps(oracle.stamp(rec), ensure_ascii=False).replace(d, "{TMP}"))
                print(f"{case.id}: {rec['status']}")
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    out = oracle.golden("server.jsonl")
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} cases -> {out}")


if __name__ == "__main__":
    main()
