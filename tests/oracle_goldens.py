"""The goldens of both llama.cpp oracles (compat/oracles.py) as pytest parameters: one per oracle, or per oracle and
case. An oracle without the golden is skipped by name with compat/oracles.py's reason, never silently."""
from __future__ import annotations

import copy
import functools
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))
import oracles  # noqa: E402


def jsonl(path: Path) -> list[dict]:
    return copy.deepcopy(_read(path))


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def per_oracle(name: str) -> list:
    """pytest params of (oracle, path), id = the oracle's label."""
    return [pytest.param(o, path, id=o.label,
                         marks=() if path else pytest.mark.skip(reason=f"no {o.label} {name}: {why}"))
            for o, path, why in oracles.recorded(name)]


def per_case(name: str, case_id) -> list:
    """pytest params of (oracle, record) for each record of a JSON-lines golden, id = label-case."""
    out = []
    for o, path, why in oracles.recorded(name):
        if path is None:
            out.append(pytest.param(o, None, id=o.label, marks=pytest.mark.skip(reason=f"no {o.label} {name}: {why}")))
            continue
        out += [pytest.param(o, rec, id=f"{o.label}-{case_id(rec)}") for rec in jsonl(path)]
    return out


def expected(name: str, oracle: oracles.Oracle, case_id: str, key) -> object:
    """The answer llamacmp must give for this oracle's case: the oracle's own, or, where compat/oracles.py says
    llamacmp follows the other oracle, that one's (after checking that the two still differ there)."""
    target, why = oracles.followed(name, case_id, oracle)
    mine = {key(r): r for r in jsonl(oracle.golden(name))}[case_id]
    if target is oracle:
        return mine
    theirs = {key(r): r for r in jsonl(target.golden(name))}[case_id]
    assert strip(theirs) != strip(mine), f"{name} {case_id}: the oracles agree now; drop the Divergence ({why})"
    return theirs


def strip(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k != "oracle"}
