"""Run llama.cpp's own server test suite (tools/server/tests) against llamacmp-server and/or llama-server, every
preset pointed at one qwen35 fixture (real vocabulary and chat template), and print a pass/fail table.

    python3 compat/server_suite.py [--suite b8462|0c1e570|both] [--server llamacmp|llama|both]
                                   [--llama-server PATH] [-k EXPR] [--files test_basic.py ...] [--timeout S]

The suites are the ones shipped in the llama-cpp-python sdists (0.3.17 = b8462, 0.3.36 = 0c1e570) under
/work/cache/src (LLAMACPP_B8462 / LLAMACPP_CURRENT override). Each run copies `tools/server/tests` to a scratch
folder and changes exactly two things, both through what the harness already offers:
  - the binary: LLAMA_SERVER_BIN_PATH (their utils.py reads it) names a launcher for llamacmp-server (this
    checkout, via PYTHONPATH) or the llama-server binary;
  - the model: code appended to utils.py wraps every ServerPreset that loads a model so that the preset it
    returns loads the fixture (model_file) instead of its Hugging Face repo (model_hf_repo / model_hf_file
    cleared); the router preset keeps having no model. ServerPreset.load_all, which conftest runs before each
    module only to download every preset's model, becomes a no-op: the fixture is local. (It also starts every
    preset, so one preset a server refuses, e.g. --reranking, would otherwise fail every test of every module.)
  Nothing else changes: the presets' other settings, the tests and conftest.py are theirs.
The harness's own requirements (requests, wget, prometheus-client, aiohttp, openai) must be importable by this
Python (a venv with --system-site-packages works). Results: <work>/results-<suite>-<server>.txt (one line per
test), <work>/log-<suite>-<server>.txt (pytest's output) and the table on stdout.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = {
    "b8462": os.environ.get("LLAMACPP_B8462", "/work/cache/src/llama_cpp_python-0.3.17/vendor/llama.cpp"),
    "0c1e570": os.environ.get("LLAMACPP_CURRENT", "/work/cache/src/llama_cpp_python-0.3.36/vendor/llama.cpp"),
}
CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
DEFAULT_LLAMA_SERVER = CACHE / "llama.cpp-49bfddeca" / "build-cpu" / "bin" / "llama-server"

POINT_AT_FIXTURE = '''

# -- appended by llamacmp's compat/server_suite.py: every preset loads the qwen35 fixture ------------------------
def _llamacmp_fixture(make):
    def preset():
        server = make()
        server.model_file = os.environ["LLAMACMP_SUITE_MODEL"]
        server.model_hf_repo = None
        server.model_hf_file = None
        return server
    return staticmethod(preset)


for _name, _make in list(vars(ServerPreset).items()):
    if isinstance(_make, staticmethod) and _name not in ("load_all", "router"):
        setattr(ServerPreset, _name, _llamacmp_fixture(_make.__func__))

# load_all only downloads the presets' models before each module; a local fixture needs no download
ServerPreset.load_all = staticmethod(lambda: None)
'''
# pytest -v, one line per test as it ends (so a run stopped by --timeout keeps what it had):
# "unit/test_x.py::test_y[params] PASSED   [ 12%]" (params may hold spaces; SKIPPED may carry "(reason)")
RESULT = re.compile(r"^(unit/.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b.*\[\s*\d+%\]$")


def fixture(folder: Path) -> Path:
    """The tiny qwen35 shape with the real Qwen3.5 vocabulary and chat template, Q8_0."""
    path = folder / "qwen35-tiny-q8_0.gguf"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "llamacmp.fixtures.writer", str(path), "--shape", "tiny",
                        "--type", "q8_0", "--vocab", "qwen35"], check=True, env=_env())
    return path


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def launcher(folder: Path) -> Path:
    """LLAMA_SERVER_BIN_PATH must name one executable: a script that runs this checkout's llamacmp-server."""
    path = folder / "llamacmp-server"
    path.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" '
                    f'-m llamacmp.server.app "$@"\n')
    path.chmod(0o755)
    return path


def run_suite(suite: str, binary: Path, model: Path, work: Path, pytest_args: list[str], timeout: int) -> dict:
    # the copy keeps its place in a tree: tests read ../../../models/templates/*.jinja
    tree = work / f"tree-{suite}-{binary.name}"
    tests = tree / "tools" / "server" / "tests"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(Path(TREES[suite]) / "tools" / "server" / "tests", tests)
    (tree / "models").symlink_to(Path(TREES[suite]) / "models")
    with open(tests / "utils.py", "a") as f:
        f.write(POINT_AT_FIXTURE)
    env = {**_env(), "LLAMA_SERVER_BIN_PATH": str(binary), "LLAMACMP_SUITE_MODEL": str(model),
           "LLAMA_CACHE": str(work / "llama-cache")}
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *pytest_args]
    # its own session, so that a run stopped at the timeout takes the servers it started along with it
    proc = subprocess.Popen(cmd, cwd=tests, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[server_suite] stopped after {timeout} s\n"
    results = {}
    for line in out.splitlines():
        if m := RESULT.match(line):
            results[m.group(1)] = "ERROR" if results.get(m.group(1)) == "PASSED" else m.group(2)   # teardown
    return {"results": results, "log": out}


def table(runs: dict[tuple[str, str], dict]) -> str:
    lines = ["| suite | server | passed | failed | error | skipped | total |", "|---|---|---|---|---|---|---|"]
    for (suite, server), run in runs.items():
        c = Counter(run["results"].values())
        lines.append(f"| {suite} | {server} | {c['PASSED']} | {c['FAILED']} | {c['ERROR']} | {c['SKIPPED']} | "
                     f"{len(run['results'])} |")
    both = {s for s, _ in runs}
    for suite in sorted(both):
        ours, theirs = runs.get((suite, "llamacmp")), runs.get((suite, "llama"))
        if ours and theirs:
            gaps = sorted(t for t, r in theirs["results"].items()
                          if r == "PASSED" and ours["results"].get(t) != "PASSED")
            lines.append(f"\n{suite}: {len(gaps)} tests pass on llama-server and not on llamacmp-server")
            lines += [f"  {t}" for t in gaps]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=["b8462", "0c1e570", "both"], default="both")
    ap.add_argument("--server", choices=["llamacmp", "llama", "both"], default="llamacmp")
    ap.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    ap.add_argument("--files", nargs="*", default=[], help="unit/ test files to run (default: all)")
    ap.add_argument("-k", default="", help="pytest -k expression")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per suite run")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="llamacmp-suite-"))
    work.mkdir(parents=True, exist_ok=True)
    model = fixture(work)
    binaries = {"llamacmp": launcher(work), "llama": args.llama_server}
    servers = ["llamacmp", "llama"] if args.server == "both" else [args.server]
    suites = ["b8462", "0c1e570"] if args.suite == "both" else [args.suite]
    pytest_args = [f"unit/{f}" for f in args.files] or ["unit"]
    if args.k:
        pytest_args += ["-k", args.k]
    runs = {}
    for suite in suites:
        for server in servers:
            run = run_suite(suite, binaries[server], model, work, pytest_args, args.timeout)
            (work / f"results-{suite}-{server}.txt").write_text(
                "".join(f"{r} {t}\n" for t, r in sorted(run["results"].items())))
            (work / f"log-{suite}-{server}.txt").write_text(run["log"])
            runs[(suite, server)] = run
            print(f"[server_suite] {suite} on {server}: {Counter(run['results'].values())} "
                  f"(log: {work / f'log-{suite}-{server}.txt'})", flush=True)
    print(table(runs))


if __name__ == "__main__":
    main()
