"""llamacmp-bench's --spec-* extension (llama-bench 0c1e570 has no speculative decoding): which rows it makes, the
checks llama.cpp makes at start, the spec column / fields, and a tg row with the MTP head drafting (numpy)."""
from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest

from llamacmp.cli import bench, bench_options, bench_rows
from llamacmp.spec import SpecConfig


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    rc = bench.main(argv, out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_rows_per_spec_setting_and_pp_once():
    s = bench_options.parse_bench_args(["-p", "8", "-n", "4", "--spec-type", "none,draft-mtp", "--spec-synth-len", "1.5,2.5"])
    got = [(i.name, i.spec) for i in bench_rows.instances(s)]
    assert got == [("pp8", SpecConfig()), ("tg4", SpecConfig()),
                   ("tg4", SpecConfig("draft-mtp", 3, synth_len=1.5)), ("tg4", SpecConfig("draft-mtp", 3, synth_len=2.5))]
    s = bench_options.parse_bench_args(["-p", "0", "-n", "4", "--spec-type", "draft-mtp", "--spec-draft-n-max", "2,3",
                                "--spec-synth-len", "2"])
    assert [i.spec.n_max for i in bench_rows.instances(s)] == [2, 3]
    with pytest.raises(bench_options.BenchError, match="must contain 1 values, got 2"):     # every n_max gets the rates
        bench_options.parse_bench_args(["-n", "4", "--spec-type", "draft-mtp", "--spec-draft-n-max", "1-2",
                                "--spec-synth-rates", "0.5,0.5"])


@pytest.mark.parametrize("argv,message", [
    (["--spec-type", "ngram-mod"], "--spec-type ngram-mod is not supported"),
    (["--spec-synth-len", "2"], "--spec-synth-len need --spec-type draft-mtp"),
    (["--spec-type", "none", "--spec-draft-n-max", "2"], "--spec-draft-n-max need --spec-type draft-mtp"),
    (["--spec-type", "draft-mtp", "--spec-synth-len", "5"], r"within \[1, 4\]"),
    (["--spec-type", "draft-mtp", "--spec-synth-rates", "0.5"], "must contain 3 values, got 1"),
    (["--spec-type", "draft-mtp", "--spec-synth-len", "x"], "invalid parameter for argument: --spec-synth-len"),
])
def test_refusals(argv, message):
    with pytest.raises(bench_options.BenchError, match=message):
        bench_options.parse_bench_args(argv)


def test_labels():
    assert bench_rows.spec_label(SpecConfig()) == "none"
    assert bench_rows.spec_label(SpecConfig("draft-mtp", 3, synth_len=2.5)) == "mtp n3 L2.5 Vauto"   # the default
    assert bench_rows.spec_label(SpecConfig("draft-mtp", 2, synth_rates=(0.9, 0.5), draft_vocab=0)) == \
        "mtp n2 R0.9/0.5"
    assert bench_rows.spec_label(SpecConfig("draft-mtp", 4, draft_vocab=0)) == "mtp n4"        # the whole vocabulary


def test_file_without_mtp_head_is_refused_naming_it(fixture_gguf):
    path = str(fixture_gguf("tiny", "f32"))
    rc, out, err = run(["-m", path, "-p", "0", "-n", "2", "-r", "1", "-ngl", "0", "--spec-type", "draft-mtp"])
    assert rc == 1 and f"'{path}' has no MTP layers" in err


def test_spec_column_and_fields_only_when_asked(fixture_gguf):
    path = str(fixture_gguf("tiny", "f32"))
    base = ["-m", path, "-p", "0", "-n", "2", "-r", "1", "-ngl", "0"]
    rc, out, _ = run(base)
    assert rc == 0 and "spec" not in out.splitlines()[0]
    rc, out, _ = run(base + ["--spec-type", "none"])
    head = [c.strip() for c in out.splitlines()[0].strip("|").split("|")]
    assert rc == 0 and head[-3:] == ["spec", "test", "t/s"] and "| none" in out.splitlines()[2]
    rc, out, _ = run(base + ["--spec-type", "none", "-o", "json"])
    row = json.loads(out)[0]
    assert (row["spec_type"], row["draft_n"], row["draft_n_accepted"], row["spec_mean_len"]) == ("none", 0, 0, 1.0)
    assert list(row)[-11:] == ["spec_type", "spec_draft_n_max", "spec_synth_len", "spec_synth_rates",
                               "spec_draft_vocab", "spec_draft_coarse", "draft_n",
                              "draft_n_accepted", "spec_mean_len", "spec_draft_share", "spec_probes"]
    assert (row["spec_draft_share"], row["spec_probes"]) == (0.0, 0)


def test_tg_row_with_the_mtp_head_drafting(tmp_path, tiny_vocab):
    """Needs the engine's draft loop (engine/speculative.py) and the writer's MTP block (issue 19, mtp-model)."""
    pytest.importorskip("llamacmp.engine.speculative", reason="the MTP draft loop is not in this tree yet")
    from llamacmp.fixtures.writer import SHAPES, write_model
    path = tmp_path / "mtp.gguf"
    write_model(path, replace(SHAPES["tiny"], mtp=True), "f32", tiny_vocab, seed=0)
    argv = ["-m", str(path), "-p", "0", "-n", "12", "-r", "2", "-ngl", "0", "-o", "json", "--spec-type", "draft-mtp",
            "--spec-synth-len", "1,4"]
    rc, out, err = run(argv)
    assert rc == 0, err
    rows = json.loads(out)
    assert [r["spec_synth_len"] for r in rows] == [1.0, 4.0]
    never, always = rows
    assert never["draft_n"] > 0 and never["draft_n_accepted"] == 0 and never["spec_mean_len"] == 1.0
    # length 4 = n_max + 1: every draft accepted (the policy may draft fewer than 3 per round, or step plainly)
    assert always["draft_n_accepted"] == always["draft_n"] > 0 and always["spec_mean_len"] > 1.0
    for r in rows:
        assert 0.0 < r["spec_draft_share"] <= 1.0 and r["spec_probes"] >= 0
    rc, out, err = run(["md" if x == "json" else x for x in argv])
    assert rc == 0, err
    cells = [line.split("|")[6].strip() for line in out.splitlines()[2:4]]
    assert cells[0].startswith("mtp n3 L1 Vauto len 1.00 dr ") and cells[1].startswith("mtp n3 L4 Vauto len ")
    assert all(c.endswith("%") for c in cells)
