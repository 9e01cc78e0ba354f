"""benchmarks/profile_spec.py on the numpy backend (its kernel table needs torch and CUDA): the phases of the bench's
own drafting rounds timed and summing to the round, the tokens per round the synthetic acceptor gave, and the
profiler trace's device events put in the phase whose range holds them."""
from __future__ import annotations

import io
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from llamacmp.backends import spec_graphs
from llamacmp.backends.base import StepBatch
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


class EagerDraft:
    """CapturedDraft's interface on numpy: its n rounds run eagerly at launch (round 0: each state's catch-up rows,
    then one row each chained on the head's own output state)."""

    def __init__(self, be, model, states, lengths, n):
        self.be, self.model, self.states, self.lengths, self.n = be, model, list(states), list(lengths), n

    def launch(self, tokens, h_parts):
        be, cut = self.be, np.cumsum([0] + self.lengths)
        batch = StepBatch.build([(st, tokens[a:b]) for st, a, b in zip(self.states, cut, cut[1:])])
        h = be.concat(list(h_parts), axis=0)
        self.rounds = []
        for r in range(self.n):
            ids, h = self.model.mtp_forward(batch, h, draft_ids=True)
            self.rounds.append([int(i) for i in be.ids_to_host(ids)])
            h = be.gather_rows(h, batch.output_rows)
            batch = StepBatch.build([(st, [i]) for st, i in zip(self.states, self.rounds[-1])])

    def read(self):
        return [list(ids) for ids in zip(*self.rounds)]

    def run(self, tokens, h_parts):
        self.launch(tokens, h_parts)
        return self.read()


class EagerVerify:
    """CapturedVerify's interface on numpy: [t0, the drafts] of each state in one keep_steps forward."""

    def __init__(self, be, model, states, n, n_max):
        self.be, self.model, self.states, self.room = be, model, list(states), n_max + 1

    def launch_after(self, t0s, draft):
        self._forward([[t0, *ids] for t0, ids in zip(t0s, zip(*draft.rounds))])   # (on the device: no read)

    def _forward(self, tokens):
        batch = StepBatch.build(list(zip(self.states, tokens)), all_logits=True)
        batch.keep_steps = self.room
        self.tokens = np.asarray([t for ts in tokens for t in ts], np.int32)
        self.outputs = self.model.forward_hidden(batch)

    def read_ids(self):
        return self.tokens, self.be.ids_to_host(self.be.argmax(self.outputs[0]))

    def read(self):
        return *self.outputs, self.read_ids()[1]

    def run(self, tokens):
        self._forward(tokens)
        return self.read()


def test_graph_rounds_are_timed_by_their_launches_and_reads(mtp_model, monkeypatch):
    """The CUDA path (spec_graphs.SpecGraphs.step: the draft graph's launch, the verify's launch after it, one read
    of the drafted and verified ids) on numpy, with eager stand-ins for the captured graphs: each drafting round
    drafts and verifies once through them and reads the ids once."""
    monkeypatch.setattr(spec_graphs, "CapturedDraft", EagerDraft)
    monkeypatch.setattr(spec_graphs, "CapturedVerify", EagerVerify)
    be, _, _ = make_backend(0, io.StringIO())
    monkeypatch.setattr(be, "spec_graphs", lambda model, n_max, capacity=8, seqs=1:
                        spec_graphs.SpecGraphs(be, model, n_max, capacity, seqs), raising=False)
    runner = load_runner(mtp_model, be, False)
    _, on = profile_spec.bench_rows(mtp_model, 12, 4.0, 16, ngl=0)
    runner.run(on, warmup=True)
    clock = profile_spec.PhaseClock(be.synchronize)
    p = profile_spec.run_pass(runner, on, clock)
    assert EagerDraft.launch.__name__ == "launch" and p.rounds > 0
    rows = {name: (ms, calls) for name, ms, calls in profile_spec.phase_rows(p, clock)}
    for phase, calls in (("draft", 1.0), ("verify", 1.0), ("read", 1.0), ("accept", 1.0), ("commit", 1.0)):
        assert rows[phase][0] > 0 and rows[phase][1] == calls, phase


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
