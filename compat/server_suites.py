"""Run llama.cpp's own server test suite (tools/server/tests of b8462 or of 0c1e570, from the llama-cpp-python
sdists) against llama.cpp's llama-server and/or llamacmp-server on the same local qwen35 model, and write a
per-test table.

    python3 compat/server_suites.py [--suite b8462|0c1e570|both] [--server llama|llamacmp|both]
                                    [--model FILE] [--files test_basic.py ...] [-k EXPR] [-x] [--timeout S]
                                    [--test-limit S] [--llama-from TABLE.md]
                                    [--llamacmp-from TABLE.md (with --report)]
                                    [--work DIR [--resume | --retry-gaps | --report]] [--table FILE]

Each run copies the suite's `tools/server/tests` to a scratch tree (their tests read ../../../models, which is
linked) and runs their pytest there with compat/suite_plugin.py, which points every model preset at --model
(default: the bundled demo model) and skips as "not applicable" what needs another model, a projector or a
download (compat/suite_na.py, with reasons). The binary is named through their LLAMA_SERVER_BIN_PATH: the
llama-server built by compat/build_llamacpp.sh for that suite's commit, or a launcher for this checkout's
llamacmp-server. Nothing else in their harness changes.

Writes <work>/<suite>-<server>.jsonl (one outcome per test, as each test ends), <work>/<suite>-<server>.log
(pytest's output) and the table (markdown; --table, default <work>/table.md): test id, llama.cpp's result,
llamacmp's result, reason.
A run stops at --timeout with the outcomes it has; --resume with the same --work runs the rest. --test-limit fails
a single test that runs longer ("runner time limit"), so that one stuck test does not use up the run.
Tests marked `slow` are not applicable, as their tests.sh leaves them out unless SLOW_TESTS=1. --retry-gaps runs
again, on llamacmp-server, the tests of --work that pass on llama-server and not on llamacmp-server (after a fix);
their new outcomes are appended, and the last one counts.
--llama-from TABLE.md takes llama-server's outcomes from a table this tool wrote (the committed
compat/server_suites_table.md) instead of running it or reading <work>: for a machine without a llama-server build,
where only llamacmp-server's half is run again. --report --llamacmp-from TABLE.md takes llamacmp-server's outcomes
from such a table too, those in <work> replacing theirs: a table refreshed for the files run again.
b8462's test_tool_call.py binds port 8081 whatever $PORT says: run one b8462 suite at a time on a machine.
Needs the harness's requirements (requests, wget, prometheus_client, aiohttp, openai, filelock) importable by
this Python (a venv with --system-site-packages works).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
SRC = Path(os.environ.get("LLAMACMP_SDIST_SRC", "/work/cache/src"))
SUITES = {   # suite -> (llama.cpp tree inside the unpacked sdist, llama.cpp commit built by build_llamacpp.sh)
    "b8462": (SRC / "llama_cpp_python-0.3.17" / "vendor" / "llama.cpp", "49bfddeca", "0.3.17"),
    "0c1e570": (SRC / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp", "0c1e570", "0.3.36"),
}
DEMO_MODEL = ROOT / "llamacmp" / "data" / "default.gguf"
HARNESS_NEEDS = ["pytest", "requests", "wget", "prometheus_client", "aiohttp", "openai", "filelock"]
RESULTS = ["passed", "failed", "error", "skipped", "n/a"]


class Missing(SystemExit):
    """Something the run needs is not on this machine: one line naming it and how to get it."""

    def __init__(self, what: str):
        super().__init__(f"server_suites: {what}")


def suite_tests(suite: str) -> Path:
    tree, _, version = SUITES[suite]
    tests = tree / "tools" / "server" / "tests"
    if not (tests / "unit").is_dir():
        raise Missing(f"the {suite} suite is not at {tests} (unpack llama-cpp-python=={version}'s sdist under "
                      f"{SRC}: pip download --no-deps --no-binary :all: llama-cpp-python=={version}; "
                      f"or set LLAMACMP_SDIST_SRC)")
    return tests


def llama_server(suite: str, override: Path | None) -> Path:
    path = override or CACHE / f"llama.cpp-{SUITES[suite][1]}" / "build-cpu" / "bin" / "llama-server"
    if not os.access(path, os.X_OK):
        raise Missing(f"no llama-server at {path} (build it: compat/build_llamacpp.sh"
                      f"{'' if suite == 'b8462' else ' --version ' + SUITES[suite][2]}; or pass --llama-server)")
    return path


def files_in(suite: str, files: list[str]) -> list[str]:
    """The --files this suite has (the two suites' files differ), as pytest paths; all of unit/ by default."""
    unit = suite_tests(suite) / "unit"
    absent = [f for f in files if not (unit / f).is_file()]
    if absent:
        print(f"[server_suites] {suite} has no {', '.join(absent)}", flush=True)
        if len(absent) == len(files):
            raise Missing(f"none of {', '.join(files)} is in {unit}")
    return [f"unit/{f}" for f in files if f not in absent] or ["unit"]


def check_harness() -> None:
    absent = [m for m in HARNESS_NEEDS if importlib.util.find_spec(m) is None]
    if absent:
        raise Missing(f"the suite's harness needs {', '.join(absent)} in {sys.executable} "
                      f"(pip install {' '.join(absent)}, or a venv with --system-site-packages)")


def launcher(folder: Path) -> Path:
    """LLAMA_SERVER_BIN_PATH names one executable: a script that runs this checkout's llamacmp-server."""
    path = folder / "llamacmp-server"
    path.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" '
                    f'-m llamacmp.server.app "$@"\n')
    path.chmod(0o755)
    return path


def free_port() -> int:
    # their harness listens on $PORT (8080 by default, which another run on this machine may hold)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_suite(suite: str, server: str, binary: Path, model: Path, work: Path, selection: list[str],
              timeout: int, resume: bool, test_limit: int = 0, keep: bool = False) -> dict[str, dict]:
    """Runs the suite's pytest on one server; returns test id -> {"id", "outcome", "reason"}. resume: keep the
    outcomes <work> has from an earlier run and run only the tests without one; keep: keep them and run the
    selection whatever its outcomes (--retry-gaps)."""
    tree = work / f"tree-{suite}-{server}"
    tests = tree / "tools" / "server" / "tests"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(suite_tests(suite), tests)
    (tree / "models").symlink_to(SUITES[suite][0] / "models")
    results = work / f"{suite}-{server}.jsonl"
    if not (resume or keep):
        results.unlink(missing_ok=True)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "compat"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONDONTWRITEBYTECODE": "1", "LLAMA_SERVER_BIN_PATH": str(binary), "LLAMACMP_SUITE_MODEL": str(model),
           "LLAMACMP_SUITE_RESULTS": str(results), "LLAMACMP_SUITE_RESUME": "1" if resume else "0",
           "LLAMA_CACHE": str(work / "llama-cache"), "LLAMACMP_SUITE_TEST_LIMIT": str(test_limit),
           "PORT": str(free_port())}
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "suite_plugin", *selection]
    # its own session, so that a run stopped at the time limit takes the servers it started along with it
    with open(work / f"{suite}-{server}.log", "a" if resume or keep else "w") as log:
        proc = subprocess.Popen(cmd, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.write(f"\n[server_suites] stopped after {timeout} s\n")
    if not results.exists():
        raise SystemExit(f"server_suites: {suite} on {server} ran no test (see {work / f'{suite}-{server}.log'})")
    return load(results)


def label(entry: dict | None) -> str:
    if entry is None:
        return "not run"
    if entry["outcome"] == "skipped" and entry["reason"].startswith("not applicable"):
        return "n/a"
    return entry["outcome"]


def counts(run: dict[str, dict]) -> Counter:
    return Counter(label(e) for e in run.values())


def table(suite: str, runs: dict[str, dict[str, dict]]) -> str:
    """Markdown: the counts per server, then one row per test."""
    lines = [f"### {suite}", "", "| server | " + " | ".join(RESULTS) + " | total |",
             "|---|" + "---|" * (len(RESULTS) + 1)]
    for server, run in runs.items():
        c = counts(run)
        lines.append(f"| {server} | " + " | ".join(str(c[r]) for r in RESULTS) + f" | {len(run)} |")
    ids = sorted({t for run in runs.values() for t in run})
    lines += ["", "| test | llama.cpp | llamacmp | reason |", "|---|---|---|---|"]
    for t in ids:
        theirs, ours = runs.get("llama", {}).get(t), runs.get("llamacmp", {}).get(t)
        reason = next((e["reason"] for e in (theirs, ours) if e and label(e) in ("n/a", "skipped")), "")
        if label(theirs) == "passed" and ours and label(ours) != "passed":
            reason = f"llamacmp: {ours['reason']}"
        cells = [label(theirs) if "llama" in runs else "-", label(ours) if "llamacmp" in runs else "-"]
        lines.append(f"| `{t}` | {cells[0]} | {cells[1]} | {_cell(reason)} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ").replace("`", "'")


def gaps(runs: dict[str, dict[str, dict]]) -> list[str]:
    """Tests that pass on llama-server and ran on llamacmp-server without passing."""
    theirs, ours = runs.get("llama"), runs.get("llamacmp")
    if theirs is None or ours is None:
        return []
    return sorted(t for t, e in theirs.items() if label(e) == "passed" and t in ours and label(ours[t]) != "passed")


TABLE_ROW = re.compile(r"^\| `(?P<id>.+)` \| (?P<llama>[a-z/ -]+) \| (?P<llamacmp>[a-z/ -]+) "
                       r"\| (?P<reason>[^|]*?) ?\|$")


def from_table(path: Path, suite: str, server: str = "llama") -> dict[str, dict]:
    """One server's outcomes in a table written by table(): its column of the suite's section, as run_suite's
    entries. A reason is kept where the table shows that server's (its n/a and skips; llamacmp's gaps);
    "not run" and "-" are no outcome. The id is the backquoted cell up to the last three cells (an id may hold
    "|", a reason never does)."""
    if not path.is_file():
        raise Missing(f"no table at {path} (--{server}-from names a table this tool wrote)")
    section, run = None, {}
    for line in path.read_text().splitlines():
        if line.startswith("### "):
            section = line[4:].strip()
        elif section == suite and (row := TABLE_ROW.match(line)):
            if (result := row[server]) not in ("not run", "-"):
                run[row["id"]] = entry(path, row, server, result)
    if not run:
        raise SystemExit(f"server_suites: {path} has no {server} outcomes under '### {suite}'")
    return run


def entry(path: Path, row: re.Match, server: str, result: str) -> dict:
    if result not in RESULTS:
        raise SystemExit(f"server_suites: {path}: unknown {server} result {result!r} for {row['id']}")
    reason = row["reason"]
    if server == "llamacmp" and reason.startswith("llamacmp: "):
        reason = reason[len("llamacmp: "):]          # a gap's: table() wrote llamacmp's reason with this prefix
    elif result not in ("n/a", "skipped"):
        reason = ""                                   # the table shows no reason of a failure but a gap's
    return {"id": row["id"], "outcome": "skipped" if result == "n/a" else result, "reason": reason}


def runs_of(work: Path, suite: str, servers: list[str], llama_from: Path | None,
            llamacmp_from: Path | None = None) -> dict[str, dict[str, dict]]:
    """The outcomes in <work> per server; llama-server's from --llama-from's table when given; with
    --llamacmp-from, llamacmp-server's from that table, those in <work> (run again since) replacing theirs."""
    runs = {s: load(work / f"{suite}-{s}.jsonl") for s in servers if (work / f"{suite}-{s}.jsonl").exists()}
    if llama_from:
        runs = {"llama": from_table(llama_from, suite), **{s: r for s, r in runs.items() if s != "llama"}}
    if llamacmp_from:
        runs["llamacmp"] = {**from_table(llamacmp_from, suite, "llamacmp"), **runs.get("llamacmp", {})}
    return runs


def load(path: Path) -> dict[str, dict]:
    """An outcome file; a test listed twice (a run resumed after a change) keeps its last outcome."""
    return {e["id"]: e for e in map(json.loads, path.read_text().splitlines())}


def report(work: Path | None, suites: list[str], servers: list[str], out: Path | None,
           llama_from: Path | None = None, llamacmp_from: Path | None = None) -> None:
    if work is None:
        raise SystemExit("server_suites: --report needs --work (the folder of an earlier run)")
    sections = []
    for suite in suites:
        runs = runs_of(work, suite, servers, llama_from, llamacmp_from)
        if runs:
            sections.append(table(suite, runs))
            print(f"[server_suites] {suite}: {len(gaps(runs))} pass on llama-server and not on llamacmp-server"
                  + "".join(f"\n  {t}" for t in gaps(runs)))
    (out or work / "table.md").write_text("\n\n".join(sections) + "\n")
    print(f"[server_suites] table: {out or work / 'table.md'}")


def retry_gaps(args, suites: list[str]) -> None:
    if args.work is None:
        raise SystemExit("server_suites: --retry-gaps needs --work (the folder of an earlier run)")
    check_harness()
    for suite in suites:
        ids = gaps(runs_of(args.work, suite, ["llama", "llamacmp"], args.llama_from))
        print(f"[server_suites] {suite}: retrying {len(ids)} tests on llamacmp-server", flush=True)
        if ids:
            run_suite(suite, "llamacmp", launcher(args.work), args.model.resolve(), args.work, ids, args.timeout,
                      False, args.test_limit, keep=True)
    report(args.work, suites, ["llama", "llamacmp"], args.table, args.llama_from)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", choices=["b8462", "0c1e570", "both"], default="both")
    ap.add_argument("--server", choices=["llama", "llamacmp", "both"], default="both")
    ap.add_argument("--llama-server", type=Path, default=None,
                    help="llama-server binary (default: the build of the suite's own commit)")
    ap.add_argument("--model", type=Path, default=DEMO_MODEL, help="GGUF every preset loads (default: demo model)")
    ap.add_argument("--files", nargs="*", default=[], help="unit/ test files to run (default: all)")
    ap.add_argument("-k", default="", help="pytest -k expression")
    ap.add_argument("-x", action="store_true", help="stop each run at its first failure")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per suite x server run")
    ap.add_argument("--test-limit", type=int, default=0,
                    help="seconds one test may run before it fails as 'runner time limit' (default: no limit)")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the outcomes in --work from an earlier run and run only the tests without one")
    ap.add_argument("--retry-gaps", action="store_true",
                    help="run again on llamacmp-server the tests of --work it fails and llama-server passes")
    ap.add_argument("--table", type=Path, default=None, help="markdown table (default: <work>/table.md)")
    ap.add_argument("--report", action="store_true", help="run nothing: the table from the outcomes in --work")
    ap.add_argument("--llama-from", type=Path, default=None, metavar="TABLE.md",
                    help="llama-server's outcomes from a table this tool wrote (run only llamacmp-server)")
    ap.add_argument("--llamacmp-from", type=Path, default=None, metavar="TABLE.md",
                    help="with --report: llamacmp-server's outcomes from a table this tool wrote, those in --work "
                         "replacing theirs (some files run again)")
    args = ap.parse_args()
    if args.llamacmp_from and not args.report:
        raise SystemExit("server_suites: --llamacmp-from is for --report (runs append to <work>'s outcomes)")

    suites = ["b8462", "0c1e570"] if args.suite == "both" else [args.suite]
    servers = ["llama", "llamacmp"] if args.server == "both" else [args.server]
    if args.llama_from:
        if args.server == "llama":
            raise SystemExit("server_suites: --llama-from gives llama-server's outcomes: nothing to run with "
                             "--server llama")
        servers = ["llama", "llamacmp"] if args.report else ["llamacmp"]
        for suite in suites:          # a missing section is named before anything runs
            from_table(args.llama_from, suite)
    if args.report:
        return report(args.work, suites, servers, args.table, args.llama_from, args.llamacmp_from)
    if args.retry_gaps:
        return retry_gaps(args, suites)
    for suite in suites:          # everything missing is named before anything runs
        suite_tests(suite)
        if "llama" in servers:
            llama_server(suite, args.llama_server)
    check_harness()
    if not args.model.is_file():
        raise Missing(f"no model at {args.model}")
    work = args.work or Path(tempfile.mkdtemp(prefix="llamacmp-suites-"))
    work.mkdir(parents=True, exist_ok=True)
    options = (["-k", args.k] if args.k else []) + (["-x"] if args.x else [])

    sections = []
    for suite in suites:
        selection = files_in(suite, args.files) + options
        runs = {"llama": from_table(args.llama_from, suite)} if args.llama_from else {}
        for server in servers:
            binary = llama_server(suite, args.llama_server) if server == "llama" else launcher(work)
            runs[server] = run_suite(suite, server, binary, args.model.resolve(), work, selection, args.timeout,
                                     args.resume, args.test_limit)
            print(f"[server_suites] {suite} on {server}: {dict(counts(runs[server]))}", flush=True)
        missing = gaps(runs)
        print(f"[server_suites] {suite}: {len(missing)} pass on llama-server and not on llamacmp-server"
              + "".join(f"\n  {t}" for t in missing), flush=True)
        sections.append(table(suite, runs))
    out = args.table or work / "table.md"
    out.write_text("\n\n".join(sections) + "\n")
    print(f"[server_suites] table: {out}")


if __name__ == "__main__":
    main()
