"""benchmarks/profile_spec.py on the numpy backend (its kernel table needs torch and CUDA): the phases of the bench's
own drafting rounds timed and summing to the round, the tokens per round the synthetic acceptor gave, and the
profiler trace's device events put in the phase whose range holds them."""
from __future__ import annotations

import io
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llamacmp.cli.bench_runner import load_runner, make_backend
from llamacmp.engine import speculative
from llamacmp.fixtures.writer import SHAPES, write_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import profile_spec  # noqa: E402


@pytest.fixture
def mtp_model(tmp_path, tiny_vocab) -> str:
    return str(write_model(tmp_path / "m.gguf", replace(SHAPES["tiny"], mtp=True), "q8_0", tiny_vocab))


def test_help():
    with pytest.raises(SystemExit) as e:
        profile_spec.main(["--help"])
    assert e.value.code == 0


def test_phases_of_the_bench_rounds_sum_to_the_round(mtp_model, monkeypatch):
    """Length 4 (every draft accepted) makes the policy draft on numpy too; the tokens per round are what the
    acceptance rule returned (the loop's j per drafting round), and every timed part is put back afterwards."""
    be, _, _ = make_backend(0, io.StringIO())
    runner = load_runner(mtp_model, be, False)
    _, on = profile_spec.bench_rows(mtp_model, 12, 4.0, 16, ngl=0)
    runner.run(on, warmup=True)
    js, accept = [], speculative.accept_tokens

    def recorded(*args, **kwargs):
        js.append(accept(*args, **kwargs))
        return js[-1]
    monkeypatch.setattr(speculative, "accept_tokens", recorded)
    clock = profile_spec.PhaseClock(be.synchronize)
    p = profile_spec.run_pass(runner, on, clock)
    assert speculative.accept_tokens is recorded and "restore_steps" not in vars(be) and "_speculator" not in vars(runner)
    assert p.rounds == len(js) > 0 and sum(p.lengths.values()) == p.rounds
    assert p.tokens_per_round == pytest.approx(sum(js) / len(js)) and p.tokens == sum(js) + p.plain
    rows = {name: (ms, calls) for name, ms, calls in profile_spec.phase_rows(p, clock)}
    for phase in ("plan", "draft", "verify", "accept", "commit"):
        assert rows[phase][0] > 0 and rows[phase][1] == 1.0, phase
    named = sum(ms for name, (ms, _) in rows.items() if name not in ("host gaps", "round"))
    assert rows["round"][0] == pytest.approx(named + rows["host gaps"][0])
    assert 0.5 * rows["round"][0] < named <= rows["round"][0]


def test_main_prints_both_rows_and_the_phase_table(mtp_model, capsys):
    assert profile_spec.main([mtp_model, "-ngl", "0", "-n", "6", "--spec-synth-len", "4"]) == 0
    out = capsys.readouterr().out
    assert "MTP off: " in out and "MTP on, unprofiled: " in out and "tokens a round" in out
    for row in ("draft", "verify", "accept", "commit", "host gaps", "round"):
        assert f"| {row} | " in out, row


def test_device_events_go_to_the_innermost_phase_holding_them():
    def ev(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    r = profile_spec.RANGE
    events = [ev("user_annotation", r + "draft", 10, 90), ev("user_annotation", r + "verify", 100, 300),
              ev("user_annotation", r + "commit", 420, 80), ev("user_annotation", r + "restore", 430, 30),
              ev("cpu_op", "aten::empty", 0, 1000),
              ev("kernel", "prefill_gemm(int)", 2, 5),                # before the first range: the -d fill
              ev("kernel", "mtp_gemv(float const*)", 20, 3), ev("kernel", "mtp_gemv(float const*)", 40, 5),
              ev("kernel", "(anonymous namespace)::gdn_keep(int)", 150, 40),
              ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 410, 2),   # between ranges
              ev("kernel", "copy_regions_kernel(x)", 440, 30), ev("kernel", "gather_rows(x)", 470, 2)]
    got = {ph: {k: tuple(v) for k, v in names.items()} for ph, names in profile_spec.device_by_phase(events).items()}
    assert got == {"draft": {"mtp_gemv": (2, 8.0)}, "verify": {"gdn_keep": (1, 40.0)},
                   "gap": {"Memcpy HtoD": (1, 2.0)}, "restore": {"copy_regions_kernel": (1, 30.0)},
                   "commit": {"gather_rows": (1, 2.0)}}
