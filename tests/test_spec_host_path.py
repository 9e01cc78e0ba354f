"""An MTP drafting round's library calls on the CUDA path, counted over a no-op library (benchmarks/spec_host_path.py's
NoopNative: the CUDA backend's own Python, every libcmpkern call recorded): between the verified ids reaching the
host and the next draft launch the device is idle, so that stretch holds one read (the drafted and the verified ids
together), no index upload or gather (the kept rows are one copy, the head's queue views them) and one upload (the
draft graph's token ids and positions)."""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from llamacmp.backends.cuda import CudaBackend
from llamacmp.cli.bench_runner import load_runner
from llamacmp.fixtures.writer import SHAPES, write_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import spec_host_path  # noqa: E402


@pytest.fixture
def mtp_model(tmp_path, tiny_vocab) -> str:
    return str(write_model(tmp_path / "m.gguf", replace(SHAPES["tiny"], mtp=True), "q8_0", tiny_vocab))


def test_a_drafting_round_reads_once_and_uploads_once(mtp_model):
    nat = spec_host_path.NoopNative()
    runner = load_runner(mtp_model, CudaBackend(native=nat), True)
    runner.costs = spec_host_path.FrozenTables()          # the H200's costs: the policy drafts as there
    kinds = spec_host_path.Kinds(runner)
    inst = spec_host_path.tg_row(mtp_model, 120, 2.5)
    runner.run(inst, warmup=True)
    nat.log = []
    runner.run(inst)
    rounds = spec_host_path.drafting_rounds(nat.log, kinds.table())
    paths = [r for r in rounds if r.path is not None]
    assert len(rounds) > 30 and len(paths) >= len(rounds) - 3       # (a plain refresh or the end: no draft after)
    assert all(r.reads == 1 for r in rounds)
    calls = sum((r.calls for r in paths), Counter())
    assert set(calls) <= {"cmp_memcpy_d2d", "cmp_memcpy_h2d", "cmp_copy_regions"}, calls
    # the draft graph's ids and positions; once more at the state's first rewind, its copy table (_restore_table)
    first = [r for r in paths if r.calls["cmp_memcpy_h2d"] != 1]
    assert len(first) == 1 and first[0].calls["cmp_memcpy_h2d"] == 2 and first[0].calls["cmp_copy_regions"] == 1
    # the kept rows' copy into the sequence's ring, right after the last round's h_last, then the draft's h rows
    # in one run (two where the ring started over, or after a plain step, whose h rows are a copy of their own)
    assert all(r.calls["cmp_memcpy_d2d"] <= 3 and r.calls["cmp_copy_regions"] <= 1 for r in paths)
    assert sum(r.calls["cmp_memcpy_d2d"] == 2 for r in paths) >= 0.75 * len(paths)
    assert 0 < calls["cmp_copy_regions"] < len(paths)                # a rewind where a draft was rejected


def test_main_prints_the_path_and_the_pieces(mtp_model, capsys):
    assert spec_host_path.main(["-m", mtp_model, "-n", "40", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert "library calls on the path" in out and "memcpy_h2d 1.0" in out
    for piece in ("read", "accept", "commit", "plan", "step to launch"):
        assert f"| {piece} | " in out, piece
