"""Speculative decoding options (llama.cpp 0c1e570's --spec-*, b8462's --draft-*), their checks, and the synthetic
acceptance rule of --spec-synth-len / --spec-synth-rates (issue 19)."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.arg_values import ArgError, Unsupported
from llamacmp.args import parse_args
from llamacmp.loader import open_model
from llamacmp.run_plan import RunPlanError, check_options, plan_run
from llamacmp.spec import (SpecConfig, SpecError, SynthRng, has_mtp_head, synth_accepted, synth_acceptor,
                           synth_log_lines, synth_mean_len,
                           synth_probs, synth_rates)


def spec_of(tool, *argv, env=None):
    return parse_args(tool, list(argv), env or {}).params.spec


# -- parsing --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tool", ["cli", "completion", "server"])
def test_spec_flags_fill_spec_config(tool):
    assert spec_of(tool) == SpecConfig()
    s = spec_of(tool, "--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--spec-draft-n-min", "1",
                "--spec-draft-p-min", "0.5", "--spec-synth-len", "2.5")
    assert s == SpecConfig("draft-mtp", 2, 1, 0.5, 2.5, ())
    assert spec_of(tool, "--spec-synth-rates", "0.9, 0.5,0.25").synth_rates == (0.9, 0.5, 0.25)


def test_old_names_are_aliases():
    assert spec_of("server", "--draft-max", "5").n_max == 5          # b8462
    assert spec_of("cli", "--draft", "4").n_max == 4
    assert spec_of("server", "--draft-min", "2").n_min == 2
    assert spec_of("server", "--draft-p-min", "0.25").p_min == 0.25  # 0c1e570 keeps this one


def test_environment_variables_new_over_old_and_argv_over_both():
    assert spec_of("server", env={"LLAMA_ARG_SPEC_TYPE": "draft-mtp", "LLAMA_ARG_SPEC_DRAFT_N_MAX": "4",
                                  "LLAMA_ARG_SPEC_SYNTH_RATES": "1,0.5,0.5,0"}) == \
        SpecConfig("draft-mtp", 4, synth_rates=(1.0, 0.5, 0.5, 0.0))
    assert spec_of("server", env={"LLAMA_ARG_DRAFT_MAX": "7"}).n_max == 7
    assert spec_of("server", env={"LLAMA_ARG_DRAFT_MAX": "7", "LLAMA_ARG_SPEC_DRAFT_N_MAX": "2"}).n_max == 2
    r = parse_args("server", ["--spec-draft-n-max", "1"], {"LLAMA_ARG_SPEC_DRAFT_N_MAX": "6"})
    assert r.params.spec.n_max == 1 and any("LLAMA_ARG_SPEC_DRAFT_N_MAX" in w for w in r.warnings)


def test_spec_type_list_follows_llama_cpp():
    assert spec_of("server", "--spec-type", "none").type == "none"
    assert spec_of("server", "--spec-type", "draft-mtp,none").type == "none"       # none ends the list
    # each --spec-type adds to the types already set, so a later "none" turns nothing off
    assert spec_of("server", "--spec-type", "draft-mtp", "--spec-type", "none").type == "draft-mtp"
    with pytest.raises(ArgError, match="unknown speculative type: mtp"):
        spec_of("server", "--spec-type", "mtp")


@pytest.mark.parametrize("value", ["ngram-mod", "draft-eagle3", "draft-mtp,draft-dflash", "draft-simple"])
def test_other_spec_types_are_refused_by_name(value):
    with pytest.raises(Unsupported, match=f"--spec-type {value.split(',')[-1]} is not supported"):
        spec_of("server", "--spec-type", value)


@pytest.mark.parametrize("argv,named", [
    (["-md", "d.gguf"], "-md"), (["--spec-draft-model", "d.gguf"], "--spec-draft-model"),
    (["-hfd", "u/r"], "-hfd"), (["-devd", "none"], "-devd"), (["--spec-replace", "a", "b"], "--spec-replace"),
    (["--spec-ngram-mod-n-max", "8"], "--spec-ngram-mod-n-max"), (["--spec-default"], "--spec-default"),
    (["-lcs", "x.bin"], "-lcs"), (["-ctkd", "q8_0"], "--cache-type-k-draft q8_0"),
])
def test_draft_model_and_ngram_flags_are_refused_by_name(argv, named):
    with pytest.raises(Unsupported, match=named):
        spec_of("server", *argv)


def test_draft_model_env_is_refused_too():
    with pytest.raises(Unsupported, match="LLAMA_ARG_MODEL_DRAFT"):
        spec_of("server", env={"LLAMA_ARG_MODEL_DRAFT": "d.gguf"})


def test_noop_draft_flags_say_so():
    r = parse_args("server", ["-td", "4", "-ctkd", "f16", "--spec-draft-p-split", "0.2"], {})
    assert len([w for w in r.warnings if "changes nothing" in w]) == 3 and r.params.spec == SpecConfig()


def test_bad_values_are_errors():
    for argv in (["--spec-draft-n-max", "-1"], ["--spec-synth-len", "-1"], ["--spec-synth-len", "2x"],
                 ["--spec-synth-rates", "0.5,,0.2"], ["--spec-draft-p-min", "high"]):
        with pytest.raises(ArgError, match="error while handling argument"):
            spec_of("server", *argv)


def test_perplexity_takes_no_spec_flags():
    with pytest.raises(ArgError, match="invalid argument: --spec-type"):
        spec_of("perplexity", "--spec-type", "draft-mtp")


# -- checks before start ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (["--spec-synth-len", "2"], "need --spec-type draft-mtp"),
    (["--spec-type", "draft-mtp", "--spec-synth-len", "2", "--spec-synth-rates", "1,1,1"], "mutually exclusive"),
    (["--spec-type", "draft-mtp", "--spec-synth-len", "4.5"], r"within \[1, 4\]"),
    (["--spec-type", "draft-mtp", "--spec-synth-len", "0.5"], r"within \[1, 4\]"),
    (["--spec-type", "draft-mtp", "--spec-synth-rates", "0.5,0.5"], "must contain 3 values, got 2"),
    (["--spec-type", "draft-mtp", "--spec-synth-rates", "0.5,0.6,0.1"], "non-increasing"),
    (["--spec-type", "draft-mtp", "--spec-synth-rates", "1.5,1,1"], r"within \[0, 1\]"),
    (["--spec-type", "draft-mtp", "--spec-draft-n-max", "0", "--spec-synth-len", "1"], "at least one"),
])
def test_combinations_llama_cpp_refuses_at_start(argv, message):
    p = parse_args("server", argv, {}).params
    with pytest.raises(RunPlanError, match=message):
        check_options(p)


def test_draft_mtp_on_a_file_without_mtp_head_stops_naming_the_file(fixture_gguf):
    path = fixture_gguf("tiny", "f32")
    mf = open_model(path)
    off = parse_args("cli", ["-m", str(path)], {}).params
    assert plan_run(off, mf.cfg.n_ctx_train, mf).spec == SpecConfig()      # files without MTP keep working
    on = parse_args("cli", ["-m", str(path), "--spec-type", "draft-mtp"], {}).params
    with pytest.raises(RunPlanError, match=f"'{path}' has no MTP layers"):
        plan_run(on, mf.cfg.n_ctx_train, mf)


def test_mtp_head_detection_is_llama_cpps_rule():
    names = ["blk.0.attn_norm.weight", "blk.4.nextn.eh_proj.weight"]
    assert has_mtp_head(names, 5)
    assert not has_mtp_head(names, 6)       # the head must sit in the last block
    assert not has_mtp_head(["blk.3.nextn.enorm.weight"], 4)


# -- synthetic acceptance ------------------------------------------------------------------------------------------

def test_synth_len_resolves_to_geometric_rates():
    for n in (1, 2, 3, 4):
        for length in (1.0, 1.5, 2.5, n + 1.0):
            if length > n + 1:
                continue
            cfg = SpecConfig("draft-mtp", n, synth_len=length)
            r = synth_rates(cfg)
            assert len(r) == n and synth_mean_len(cfg) == pytest.approx(length, abs=1e-8)
            assert all(b <= a for a, b in zip(r, r[1:]))
    assert synth_rates(SpecConfig("draft-mtp", 3, synth_len=1.0)) == (0.0, 0.0, 0.0)
    assert synth_rates(SpecConfig("draft-mtp", 3, synth_len=4.0)) == (1.0, 1.0, 1.0)
    p = synth_rates(SpecConfig("draft-mtp", 3, synth_len=2.5))[0]
    assert p + p * p + p ** 3 == pytest.approx(1.5, abs=1e-8)
    assert synth_probs(SpecConfig("draft-mtp", 3, synth_len=2.5)) == pytest.approx((p, p, p))


def test_synth_probs_are_conditional():
    cfg = SpecConfig("draft-mtp", 4, synth_rates=(0.8, 0.4, 0.0, 0.0))
    assert synth_probs(cfg) == pytest.approx((0.8, 0.5, 0.0, 0.0))
    with pytest.raises(SpecError):
        synth_probs(SpecConfig("draft-mtp", 2, synth_rates=(0.8,)))


def draws(cfg, n, seed=1, draft_len=None):
    probs, rng = synth_probs(cfg), SynthRng(seed)
    draft = list(range(10, 10 + (draft_len or cfg.n_max)))
    return np.array([synth_accepted(probs, draft, frozenset(), rng) for _ in range(n)])


@pytest.mark.parametrize("length", [1.5, 2.5, 3.5])
def test_mean_accepted_length_is_the_target(length):
    acc = draws(SpecConfig("draft-mtp", 3, synth_len=length), 40000)
    # 1 + accepted drafts per verification; its standard error here is below 0.006
    assert 1 + acc.mean() == pytest.approx(length, abs=0.03)


def test_rates_per_position():
    rates = (0.9, 0.6, 0.3, 0.1)
    acc = draws(SpecConfig("draft-mtp", 4, synth_rates=rates), 40000, seed=7)
    for i, r in enumerate(rates):       # position i accepted when more than i drafts were accepted
        assert (acc > i).mean() == pytest.approx(r, abs=0.015)


def test_short_drafts_end_shorter_and_eog_is_never_accepted():
    cfg = SpecConfig("draft-mtp", 3, synth_len=4.0)                  # every position accepted ...
    assert set(draws(cfg, 50, draft_len=2)) == {2}
    rng = SynthRng(3)
    assert synth_accepted(synth_probs(cfg), [5, 6, 2], frozenset({6}), rng) == 1      # ... up to an EOG draft


def test_same_seed_same_decisions():
    cfg = SpecConfig("draft-mtp", 3, synth_len=2.0)
    assert (draws(cfg, 200, seed=42) == draws(cfg, 200, seed=42)).all()
    assert (draws(cfg, 200, seed=42) != draws(cfg, 200, seed=43)).any()


def test_rng_is_std_mt19937_with_libstdcxx_canonical_doubles():
    """std::mt19937(5489)'s first two outputs are 3499211612 and 581869302 (and its 10000th 4123659995, the
    C++ standard's check); generate_canonical<double, 53> puts the first in the low word."""
    u = SynthRng(5489).uniform()
    assert u == (3499211612 + 581869302 * 2.0 ** 32) / 2.0 ** 64
    rng = SynthRng(5489)
    for _ in range(4999):
        rng.uniform()
    assert rng._words[rng._next + 1] == 4123659995       # outputs 9999 and 10000 come next


def test_draws_taken_in_blocks_are_the_draws_of_two():
    """SynthRng takes the generator's outputs BLOCK at a time: across block boundaries the draws are those of a
    generator asked for two outputs per draw."""
    rng, mt = SynthRng(7), np.random.RandomState(7)
    for _ in range(3 * SynthRng.BLOCK // 2 + 5):
        lo, hi = (int(x) for x in mt.randint(0, 1 << 32, size=2, dtype=np.uint32))
        assert rng.uniform() == float(lo + (hi << 32)) / 2.0 ** 64


def test_synth_acceptor_per_request():
    assert synth_acceptor(SpecConfig("draft-mtp"), 1, frozenset()) is None
    cfg = SpecConfig("draft-mtp", 3, synth_len=2.5)
    a, b = synth_acceptor(cfg, 9, frozenset({0})), synth_acceptor(cfg, 9, frozenset({0}))
    seq = [a([5, 6, 7]) for _ in range(50)]
    assert seq == [b([5, 6, 7]) for _ in range(50)] and set(seq) <= {0, 1, 2, 3} and len(set(seq)) > 1
    assert synth_acceptor(SpecConfig("draft-mtp", 3, synth_len=4.0), -1, frozenset({0}))([5, 0, 7]) == 1


def test_synth_log_lines_are_llama_cpps():
    assert synth_log_lines(SpecConfig("draft-mtp")) == []
    lines = synth_log_lines(SpecConfig("draft-mtp", 2, synth_rates=(0.75, 0.5)))
    assert lines[1] == "synthetic acceptance: n_max = 2, mean length = 2.250000, rates = [0.75, 0.5]"
    assert "not valid" in lines[0]


def test_draft_settings_without_spec_type_say_they_change_nothing():
    r = parse_args("server", ["--draft-max", "5", "--spec-draft-p-min", "0.5"], {})
    said = [w for w in r.warnings if "no --spec-type" in w]
    assert said == ["llamacmp: --spec-draft-n-max changes nothing here: no --spec-type draft-mtp",
                    "llamacmp: --spec-draft-p-min changes nothing here: no --spec-type draft-mtp"]
    r = parse_args("server", ["--draft-max", "5", "--spec-type", "draft-mtp"], {})
    assert not [w for w in r.warnings if "no --spec-type" in w] and r.params.spec.n_max == 5


# std::uniform_real_distribution<double>(0, 1) over std::mt19937(seed), first four draws, printed with %.17g by this
# program built with g++ 13 (libstdc++, as llama.cpp's Linux builds):
#   for (unsigned seed : {0u, 42u, 4294967295u}) { std::mt19937 rng(seed); std::uniform_real_distribution<double>
#   dist(0.0, 1.0); for (int i = 0; i < 4; ++i) printf("%.17g ", dist(rng)); }
LIBSTDCXX_DRAWS = {
    0: (0.59284461651668263, 0.84426574425659828, 0.85794561998982988, 0.84725173738433124),
    42: (0.79654298428784598, 0.18343478789336848, 0.77969099761266125, 0.59685016158005655),
    4294967295: (0.11160666544400902, 0.56269337421105781, 0.52632130700839574, 0.77061474201735192),
}


@pytest.mark.parametrize("seed", sorted(LIBSTDCXX_DRAWS))
def test_draws_equal_libstdcxx_bit_for_bit(seed):
    rng = SynthRng(seed)
    assert tuple(rng.uniform() for _ in range(4)) == LIBSTDCXX_DRAWS[seed]


def test_rates_equal_llama_cpps_bit_for_bit():
    """common_speculative_synth_rates_resolve's bisection and products, n_max 3, replayed in C++ (g++ 13, %.17g)."""
    assert synth_rates(SpecConfig("draft-mtp", 3, synth_len=2.5)) == \
        (0.69141397986095399, 0.47805329154716369, 0.33053272889425339)
    assert synth_rates(SpecConfig("draft-mtp", 3, synth_len=1.5)) == \
        (0.3425080314045772, 0.11731175157663884, 0.040180217093137377)


def test_acceptance_counts_equal_llama_servers():
    """One seeded request through llama-server 0c1e570 per case (compat/gen_synth_goldens.py): replaying its draft
    schedule (min(n_max, tokens left - 1) drafts per step after the prompt's token, get_n_draft_max) through
    synth_acceptor gives its draft_n and draft_n_accepted exactly."""
    import json
    from pathlib import Path
    rows = json.loads((Path(__file__).resolve().parents[1] / "compat/goldens/synth_acceptance.json").read_text())
    assert len(rows) == 5
    for r in rows:
        accept = synth_acceptor(SpecConfig("draft-mtp", r["n_max"], synth_len=r["synth_len"]), r["seed"], frozenset())
        n_decoded, drafted, accepted = 1, 0, 0
        while n_decoded < r["n_predict"]:
            k = min(r["n_max"], r["n_predict"] - n_decoded - 1)
            a = accept(list(range(100, 100 + k))) if k > 0 else 0
            drafted, accepted, n_decoded = drafted + k, accepted + a, n_decoded + a + 1
        assert (drafted, accepted) == (r["draft_n"], r["draft_n_accepted"]), r
