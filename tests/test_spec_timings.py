"""The counters and lines speculative decoding reports (llama-server 0c1e570's `timings.draft_n` /
`draft_n_accepted`, its "draft acceptance" log line; llamacmp-completion's perf block), rendered from the real
Timings objects with counts set the way the draft loop sets them (DraftStats.count)."""
from __future__ import annotations

import logging

import pytest

from llamacmp.cli.common import perf_lines
from llamacmp.engine import slot_log
from llamacmp.engine.perf import Perf
from llamacmp.engine.tasks import DraftStats, Timings


def drafted(stats: DraftStats) -> DraftStats:
    """Three verifications of 3 drafts each: 2, 0 and 3 accepted."""
    for acc in (2, 0, 3):
        stats.count(3, acc)
    return stats


def test_counts():
    d = drafted(DraftStats())
    assert (d.n, d.accepted, d.steps, d.accepted_per_pos) == (9, 5, 3, [2, 2, 1])
    assert d.mean_len == 1 + 5 / 3
    assert DraftStats().mean_len == 1.0


def test_response_timings_have_draft_fields_only_after_drafting():
    t = Timings(prompt_n=4, prompt_ms=10.0, predicted_n=8, predicted_ms=20.0)
    assert "draft_n" not in t.to_json() and "draft_n_accepted" not in t.to_json()
    drafted(t.draft)
    j = t.to_json()
    assert (j["draft_n"], j["draft_n_accepted"]) == (9, 5)
    assert list(j)[-2:] == ["draft_n", "draft_n_accepted"]        # after predicted_per_second, as llama-server


def test_acceptance_line_is_llama_servers_printf():
    assert DraftStats().acceptance_line() == ""
    assert drafted(DraftStats()).acceptance_line() == \
        "draft acceptance = 0.55556 (    5 accepted /     9 generated), mean len =  2.67"


def test_server_log_has_the_line_after_a_drafting_request(caplog):
    t = Timings(prompt_n=4, prompt_ms=10.0, predicted_n=8, predicted_ms=20.0)
    with caplog.at_level(logging.INFO, logger="llamacmp.engine"):
        slot_log.print_timings(1, 7, t)
        assert not any("draft acceptance" in r.getMessage() for r in caplog.records)
        drafted(t.draft)
        slot_log.print_timings(1, 7, t)
    last = caplog.records[-1].getMessage()
    assert last == "slot print_timing: id  1 | task 7 | draft acceptance = 0.55556 (    5 accepted /     9 " \
                   "generated), mean len =  2.67"


def test_completion_perf_block_and_turn_figures():
    t = Perf(t_start_ms=0.0, n_eval=8, t_eval_ms=20.0)
    assert "draft acceptance" not in perf_lines(t, None, 100.0)
    before = t.snapshot()
    drafted(t.draft)
    lines = perf_lines(t, None, 100.0).splitlines()
    i = next(k for k, line in enumerate(lines) if "draft acceptance" in line)
    assert lines[i] == "common_perf_print: draft acceptance = 0.55556 (    5 accepted /     9 generated), " \
                       "mean len =  2.67"
    assert "eval time" in lines[i - 1] and "total time" in lines[i + 1]
    turn = t.since(before)
    assert (turn.draft.n, turn.draft.accepted, turn.draft.steps) == (9, 5, 3)
    assert before.draft.n == 0                  # the snapshot is a copy, not the live counters


def test_server_reports_the_spec_settings_in_effect(fixture_gguf):
    """/props and each response's generation_settings: b8462's speculative.* fields carry --spec-* when drafting."""
    from llamacmp.args import parse_args
    from llamacmp.server.completions import generation_settings
    from llamacmp.server.context import ServerContext
    from llamacmp.server.schemas import GenParams
    from llamacmp.spec import SpecConfig
    ctx = ServerContext(parse_args("server", ["-m", str(fixture_gguf("tiny", "f32"))], {}).params)
    off = generation_settings(ctx, GenParams())
    assert (off["speculative.n_max"], off["speculative.p_min"], off["speculative.type"]) == (0, 0.75, "none")
    ctx.spec = SpecConfig("draft-mtp", 2, 1, 0.5)
    on = generation_settings(ctx, GenParams())
    assert (on["speculative.n_max"], on["speculative.n_min"], on["speculative.p_min"], on["speculative.type"]) == \
        (2, 1, 0.5, "draft-mtp")


def test_generation_rate_is_over_decode_steps():
    """llama-server 0c1e570 (its test_metrics.py): the first token costs no decode step, so the rate of n tokens is
    over n - 1 steps and one token has none (b8462 divided by the tokens)."""
    one = Timings(prompt_n=4, prompt_ms=10.0, predicted_n=1, predicted_ms=0.5).to_json()
    assert one["predicted_per_second"] == 0.0 and one["predicted_per_token_ms"] == 0.0
    j = Timings(prompt_n=4, prompt_ms=10.0, predicted_n=16, predicted_ms=30.0).to_json()
    assert j["predicted_per_second"] == pytest.approx(500.0) and j["predicted_per_token_ms"] == 2.0
    assert "(    2.00 ms per token,   500.00 tokens per second)" in slot_log.timings_block(
        Timings(predicted_n=16, predicted_ms=30.0))
