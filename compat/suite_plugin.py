"""pytest plugin for llama.cpp's server test suite (tools/server/tests), loaded by compat/server_suites.py with
`-p suite_plugin` from the suite's own folder. It changes two things through what their harness offers and nothing
else:
  - every preset that loads a model loads LLAMACMP_SUITE_MODEL (their model_file) instead of a Hugging Face repo
    (model_hf_repo / model_hf_file cleared); the router preset keeps having no model. ServerPreset.load_all, which
    their conftest runs once only to download every preset's model, becomes a no-op: the model is local (and
    load_all starts every preset, so one preset a server refuses would fail every test of the session).
  - tests that need what the local model or this offline machine cannot give (another architecture, an adapter,
    a draft model, a projector, a download) are skipped as "not applicable: <reason>" (suite_na.py), and so are
    the tests marked `slow`, which their tests.sh leaves out (`-m "not slow"`) unless SLOW_TESTS=1.
  - with LLAMACMP_SUITE_TEST_LIMIT=S a test still running after S seconds fails with "runner time limit", so that
    one stuck test cannot use up a whole run (their teardown then stops its server).
Each test's outcome goes to LLAMACMP_SUITE_RESULTS as one JSON line when it ends, so a run stopped at its time
limit keeps what it had (and with LLAMACMP_SUITE_RESUME=1 the next run leaves those tests out)."""
from __future__ import annotations

import json
import os
import signal

import pytest

from suite_na import not_applicable


def _local(make):
    def preset():
        server = make()
        server.model_file = os.environ["LLAMACMP_SUITE_MODEL"]
        server.model_hf_repo = None
        server.model_hf_file = None
        return server
    return staticmethod(preset)


def pytest_configure(config):
    import utils    # theirs: the suite's folder is the working directory and on sys.path
    for name, make in list(vars(utils.ServerPreset).items()):
        if isinstance(make, staticmethod) and name not in ("load_all", "router"):
            setattr(utils.ServerPreset, name, _local(make.__func__))
    utils.ServerPreset.load_all = staticmethod(lambda: None)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LLAMACMP_SUITE_RESUME") == "1" and os.path.exists(os.environ["LLAMACMP_SUITE_RESULTS"]):
        # a run stopped at its time limit goes on from where it stopped: what has an outcome already is left out
        with open(os.environ["LLAMACMP_SUITE_RESULTS"]) as f:
            done = {json.loads(line)["id"] for line in f}
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in done])
        items[:] = [i for i in items if i.nodeid not in done]
    for item in items:
        if reason := not_applicable(item.nodeid) or (item.get_closest_marker("slow") and SLOW):
            item.add_marker(pytest.mark.skip(reason=f"not applicable: {reason}"))


SLOW = ("marked slow: their tests.sh runs `-m 'not slow'` unless SLOW_TESTS=1, which first downloads the real "
        "models these tests load (scripts/fetch_server_test_models.py)")


class RunnerTimeLimit(Exception):
    """Raised in a test that outlived LLAMACMP_SUITE_TEST_LIMIT (ours, not their harness's)."""


def _time_limit(signum, frame):
    raise RunnerTimeLimit(f"runner time limit: still running after {os.environ['LLAMACMP_SUITE_TEST_LIMIT']} s")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    limit = int(os.environ.get("LLAMACMP_SUITE_TEST_LIMIT", "0"))
    if limit:
        signal.signal(signal.SIGALRM, _time_limit)
        signal.alarm(limit)
    try:
        return (yield)
    finally:
        signal.alarm(0)


_outcomes: dict[str, dict] = {}


def pytest_runtest_logreport(report):
    # one test has up to three reports (setup, call, teardown); the worst one is the test's outcome
    entry = _outcomes.setdefault(report.nodeid, {"id": report.nodeid, "outcome": "passed", "reason": "", "s": 0.0})
    entry["s"] = round(entry["s"] + report.duration, 2)
    if report.failed:
        if entry["outcome"] not in ("failed", "error"):       # the first failure is the one to read
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry["reason"] = _last_error_line(report.longreprtext)
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        entry["reason"] = reason.removeprefix("Skipped: ")
    if report.when == "teardown":
        with open(os.environ["LLAMACMP_SUITE_RESULTS"], "a") as f:
            f.write(json.dumps(entry) + "\n")


def _last_error_line(text: str) -> str:
    """The assertion or exception pytest printed last ('E   ...'), short enough for a table cell."""
    errors = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    return (errors[-1] if errors else text.strip().splitlines()[-1] if text.strip() else "")[:200]
