"""compat/server_suites.py: llama.cpp's own server test suite run against llamacmp-server (a few of its tests, from
the sdist tree when this machine has it), its refusals when a tree, a build or a harness module is missing, and
the not-applicable table."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "compat"))
import server_suites  # noqa: E402
from suite_na import not_applicable  # noqa: E402
from suite_plugin import SLOW  # noqa: E402

TOOL = [sys.executable, str(ROOT / "compat" / "server_suites.py")]


def run_tool(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TOOL, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_missing_suite_tree_is_named(tmp_path):
    r = run_tool("--suite", "b8462", "--server", "llamacmp", LLAMACMP_SDIST_SRC=str(tmp_path))
    assert r.returncode != 0 and r.stdout == ""
    assert f"the b8462 suite is not at {tmp_path}/llama_cpp_python-0.3.17" in r.stderr
    assert "pip download --no-deps --no-binary :all: llama-cpp-python==0.3.17" in r.stderr


@pytest.mark.skipif(not server_suites.SUITES["0c1e570"][0].is_dir(), reason="llama-cpp-python 0.3.36 sdist tree "
                    f"absent ({server_suites.SUITES['0c1e570'][0]})")
def test_missing_llama_server_build_is_named(tmp_path):
    r = run_tool("--suite", "0c1e570", "--server", "both", LLAMACMP_CACHE=str(tmp_path))
    assert r.returncode != 0
    assert f"no llama-server at {tmp_path}/llama.cpp-0c1e570/build-cpu/bin/llama-server" in r.stderr
    assert "compat/build_llamacpp.sh --version 0.3.36" in r.stderr


def test_not_applicable_table():
    assert not_applicable("unit/test_vision_api.py::test_vision_chat_completion[False-x]").startswith("needs a vision")
    assert "draft model" in not_applicable("unit/test_speculative.py::test_with_and_without_draft")
    assert not_applicable("unit/test_slot_save.py::test_slot_save_restore_with_image")
    assert not_applicable("unit/test_slot_save.py::test_slot_save_restore") == ""
    assert not_applicable("unit/test_basic.py::test_server_props") == ""
    assert not_applicable("unit/test_router.py::test_router_unload_model").startswith("router mode loads")
    # router mode itself needs no download: these run
    assert not_applicable("unit/test_router.py::test_router_props") == ""
    assert not_applicable("unit/test_router.py::test_router_chat_completion_stream[non-existent/model-False]") == ""


def test_table_marks_the_gaps():
    runs = {"llama": {"a": {"id": "a", "outcome": "passed", "reason": ""},
                      "b": {"id": "b", "outcome": "skipped", "reason": "not applicable: needs x"}},
            "llamacmp": {"a": {"id": "a", "outcome": "failed", "reason": "assert 1 == 2"},
                         "b": {"id": "b", "outcome": "skipped", "reason": "not applicable: needs x"}}}
    text = server_suites.table("b8462", runs)
    assert "| llama | 1 | 0 | 0 | 0 | 1 | 2 |" in text and "| llamacmp | 0 | 1 | 0 | 0 | 1 | 2 |" in text
    assert "| `a` | passed | failed | llamacmp: assert 1 == 2 |" in text
    assert "| `b` | n/a | n/a | not applicable: needs x |" in text
    assert server_suites.gaps(runs) == ["a"]
    del runs["llamacmp"]["a"]                   # not run on llamacmp (a run stopped at its time limit): no gap
    assert server_suites.gaps(runs) == [] and "| `a` | passed | not run |" in server_suites.table("b8462", runs)


def test_report_reads_earlier_outcomes(tmp_path):
    line = '{"id": "unit/test_a.py::test_x", "outcome": "%s", "reason": "%s", "s": 1.0}\n'
    (tmp_path / "b8462-llama.jsonl").write_text(line % ("passed", ""))
    (tmp_path / "b8462-llamacmp.jsonl").write_text(line % ("failed", "assert 1") + line % ("passed", ""))
    r = run_tool("--suite", "b8462", "--work", str(tmp_path), "--report")
    assert r.returncode == 0 and "b8462: 0 pass on llama-server and not on llamacmp-server" in r.stdout
    assert "| `unit/test_a.py::test_x` | passed | passed |  |" in (tmp_path / "table.md").read_text()   # last wins


def test_llama_from_reads_the_llama_column_of_a_written_table(tmp_path):
    """--llama-from: llama-server's outcomes from a table table() wrote (an id may hold '|'), then the table
    again with llamacmp's outcomes from <work>; the committed table's counts come back whole."""
    pipe_id = 'unit/test_a.py::test_x[(a|b)+|\\{ "c"]'
    llama = {pipe_id: {"id": pipe_id, "outcome": "passed", "reason": ""},
             "b": {"id": "b", "outcome": "skipped", "reason": "not applicable: needs x"},
             "c": {"id": "c", "outcome": "skipped", "reason": "their skip"},
             "d": {"id": "d", "outcome": "failed", "reason": "assert 0"}}
    ours = {**llama, pipe_id: {"id": pipe_id, "outcome": "failed", "reason": "assert 1 == 2"}}
    written = tmp_path / "old.md"
    written.write_text(server_suites.table("b8462", {"llama": llama, "llamacmp": ours}) + "\n\n"
                       + server_suites.table("0c1e570", {"llama": {"e": {"id": "e", "outcome": "error",
                                                                           "reason": ""}}}) + "\n")
    parsed = server_suites.from_table(written, "b8462")
    assert parsed == {**llama, "d": {"id": "d", "outcome": "failed", "reason": ""}}   # a failure's reason: not shown
    assert server_suites.from_table(written, "0c1e570") == {"e": {"id": "e", "outcome": "error", "reason": ""}}
    work = tmp_path / "work"
    work.mkdir()
    (work / "b8462-llamacmp.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ours.values()))
    r = run_tool("--suite", "b8462", "--work", str(work), "--report", "--llama-from", str(written))
    assert r.returncode == 0, r.stderr
    assert "b8462: 1 pass on llama-server and not on llamacmp-server" in r.stdout and pipe_id in r.stdout
    assert (work / "table.md").read_text().splitlines()[:6] == written.read_text().splitlines()[:6]
    r = run_tool("--suite", "both", "--work", str(work), "--report", "--llama-from", str(tmp_path / "x.md"))
    assert r.returncode != 0 and f"no table at {tmp_path / 'x.md'}" in r.stderr
    (tmp_path / "x.md").write_text("### b8462\n")
    r = run_tool("--suite", "b8462", "--server", "llamacmp", "--llama-from", str(tmp_path / "x.md"))
    assert r.returncode != 0 and "has no llama outcomes under '### b8462'" in r.stderr
    r = run_tool("--suite", "b8462", "--llamacmp-from", str(written))
    assert r.returncode != 0 and "--llamacmp-from is for --report" in r.stderr


def test_the_committed_table_reads_back_whole(tmp_path):
    """Both columns of compat/server_suites_table.md, read back, make the same table again (counts, cells and
    reasons): so --llama-from / --llamacmp-from lose nothing of it."""
    committed = ROOT / "compat" / "server_suites_table.md"
    sections = [server_suites.table(suite, {s: server_suites.from_table(committed, suite, s)
                                            for s in ("llama", "llamacmp")}) for suite in ("b8462", "0c1e570")]
    assert "\n\n".join(sections) + "\n" == committed.read_text()


def test_llamacmp_from_keeps_the_outcomes_run_again(tmp_path):
    old = {"a": {"id": "a", "outcome": "passed", "reason": ""}, "b": {"id": "b", "outcome": "passed", "reason": ""}}
    ours = {"a": {"id": "a", "outcome": "failed", "reason": "assert 1"}, "b": old["b"]}
    written = tmp_path / "old.md"
    written.write_text(server_suites.table("0c1e570", {"llama": old, "llamacmp": ours}) + "\n")
    assert server_suites.from_table(written, "0c1e570", "llamacmp") == ours     # a gap's reason, unprefixed
    work = tmp_path / "work"
    work.mkdir()
    (work / "0c1e570-llamacmp.jsonl").write_text(json.dumps({**ours["a"], "outcome": "passed", "reason": ""}) + "\n")
    r = run_tool("--suite", "0c1e570", "--work", str(work), "--report", "--llama-from", str(written),
                 "--llamacmp-from", str(written))
    assert r.returncode == 0, r.stderr
    assert "0c1e570: 0 pass on llama-server" in r.stdout
    assert "| llamacmp | 2 | 0 | 0 | 0 | 0 | 2 |" in (work / "table.md").read_text()


HARNESS = [m for m in server_suites.HARNESS_NEEDS if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(not server_suites.SUITES["b8462"][0].is_dir(), reason="llama-cpp-python 0.3.17 sdist tree "
                    f"absent ({server_suites.SUITES['b8462'][0]})")
@pytest.mark.skipif(bool(HARNESS), reason=f"the suite's harness needs {', '.join(HARNESS)}")
def test_a_few_suite_tests_pass_on_llamacmp(tmp_path):
    # their test_basic.py, demo model, llamacmp-server on the numpy backend: 15 s (30 s on a loaded machine)
    r = run_tool("--suite", "b8462", "--server", "llamacmp", "--files", "test_basic.py",
                 "--work", str(tmp_path), "--timeout", "100")
    assert r.returncode == 0, r.stderr
    results = {e["id"]: e for e in map(json.loads, (tmp_path / "b8462-llamacmp.jsonl").read_text().splitlines())}
    assert results["unit/test_basic.py::test_load_split_model"]["reason"].startswith("not applicable: loads a model")
    passed = {t for t, e in results.items() if e["outcome"] == "passed"}
    assert {"unit/test_basic.py::test_server_props", "unit/test_basic.py::test_server_model_aliases_and_tags",
            "unit/test_basic.py::test_no_webui"} <= passed
    assert "| `unit/test_basic.py::test_server_props` | - | passed |" in (tmp_path / "table.md").read_text()


FAKE_TESTS = '''
import os, time, pytest
def test_ok():
    pass
@pytest.mark.slow
def test_slow():
    pass
def test_stuck():
    time.sleep(60)
def test_flaky():
    assert os.path.exists(os.environ["FAKE_FLAG"])
'''
FAKE_UTILS = '''
class ServerPreset:
    @staticmethod
    def tinyllama2():
        return object()
    @staticmethod
    def router():
        return object()
    @staticmethod
    def load_all():
        raise AssertionError("the plugin makes load_all a no-op")
'''


@pytest.mark.skipif(bool(HARNESS), reason=f"the suite's harness needs {', '.join(HARNESS)}")
def test_slow_marker_time_limit_and_retry_gaps(tmp_path):
    """On a stand-in suite tree: a test marked slow is n/a (their tests.sh's default), --test-limit fails a stuck
    test instead of waiting, and --retry-gaps runs again only what llama-server passed and llamacmp did not."""
    tests = tmp_path / "src" / "llama_cpp_python-0.3.17" / "vendor" / "llama.cpp" / "tools" / "server" / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "unit" / "test_fake.py").write_text(FAKE_TESTS)
    (tests / "utils.py").write_text(FAKE_UTILS)
    (tests / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    work, flag = tmp_path / "work", tmp_path / "flag"
    env = {"LLAMACMP_SDIST_SRC": str(tmp_path / "src"), "FAKE_FLAG": str(flag)}
    r = run_tool("--suite", "b8462", "--server", "llamacmp", "--work", str(work), "--test-limit", "3", **env)
    assert r.returncode == 0, r.stderr
    first = server_suites.load(work / "b8462-llamacmp.jsonl")
    outcome = {t.split("::")[1]: (e["outcome"], e["reason"]) for t, e in first.items()}
    assert outcome["test_ok"][0] == "passed" and outcome["test_flaky"][0] == "failed"
    assert outcome["test_slow"] == ("skipped", "not applicable: " + SLOW)
    assert outcome["test_stuck"][0] == "failed" and "runner time limit" in outcome["test_stuck"][1]
    (work / "b8462-llama.jsonl").write_text("".join(
        json.dumps({"id": t, "outcome": "failed" if "stuck" in t else e["outcome"] if "slow" in t else "passed",
                    "reason": ""}) + "\n" for t, e in first.items()))
    flag.touch()
    r = run_tool("--retry-gaps", "--suite", "b8462", "--work", str(work), "--test-limit", "3", **env)
    assert r.returncode == 0, r.stderr
    assert "b8462: retrying 1 tests on llamacmp-server" in r.stdout
    assert "b8462: 0 pass on llama-server and not on llamacmp-server" in r.stdout
    lines = (work / "b8462-llamacmp.jsonl").read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[-1])["id"].endswith("test_flaky")
