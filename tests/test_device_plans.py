"""The device plans (benchmarks/device/plans/*.plan, run by benchmarks/device/session.sh on the lent GPU) are checked
here, where a mistake costs nothing: each step line is `name command` with a unique name, its command is valid bash,
every `waitfor NAME` names a marker some step writes (a step's own `NAME.done`, or a `$D/NAME.done` a background
step touches), and every repository path a step names (benchmarks/..., tests/..., @FILE node-id lists) exists. A
plan that fails on the device spends minutes of a 30-minute budget."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLANS = sorted((ROOT / "benchmarks/device/plans").glob("*.plan"))
PATH = re.compile(r"(?<![\w/.$-])@?((?:benchmarks|tests|tools|compat|llamacmp)/[\w./-]+)")


def steps(plan: Path) -> list[tuple[str, str]]:
    out = []
    for line in plan.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.strip().partition(" ")
            out.append((name, command.strip()))
    return out


def test_there_are_plans():
    assert len(PLANS) >= 5


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_plan_steps_parse(plan):
    st = steps(plan)
    assert st, f"{plan.name}: no steps"
    names = [n for n, _ in st]
    assert len(set(names)) == len(names), f"{plan.name}: step names repeat: {names}"
    markers = set(names) | set(re.findall(r"\$D/([\w-]+)\.done", plan.read_text()))   # (a file's name: m9b-Q8_0)
    for name, command in st:
        assert command, f"{plan.name}: step '{name}' has no command"
        r = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert r.returncode == 0, f"{plan.name}: step '{name}' is not valid bash: {r.stderr}"
        for waited in re.findall(r"\bwaitfor ([\w-]+)", command):
            assert waited in markers, f"{plan.name}: step '{name}' waits for '{waited}', which nothing marks"


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_plan_paths_exist(plan):
    for name, command in steps(plan):
        for path in PATH.findall(command):
            path = path.rstrip(".,;:")
            if "*" in path or "$" in path:
                continue
            assert (ROOT / path).exists(), f"{plan.name}: step '{name}' names {path}, which is not in the tree"


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_node_id_lists_name_existing_test_functions(plan):
    """An @FILE list of pytest node ids (or whole modules): each module exists and defines the id's test function
    (pytest stops the whole step at an id it cannot find)."""
    for name, command in steps(plan):
        for listed in re.findall(r"@((?:benchmarks|tests)/[\w./-]+)", command):
            for node in (ROOT / listed).read_text().split("\n"):
                if not node.strip():
                    continue
                module, _, func = node.strip().partition("::")
                func = func.split("[")[0].split("::")[-1]
                src = ROOT / module
                assert src.exists(), f"{plan.name}: {listed} names {module}, not in the tree"
                assert not func or re.search(rf"^def {re.escape(func)}\(", src.read_text(), re.M), \
                    f"{plan.name}: {listed} names {node.strip()}: no test function {func} in {module}"
