"""--spec-draft-vocab auto (the default): the MTP head drafts from a prefix of the vocabulary while the committed
tokens stay in it and from the whole one once too many lie outside (engine/draft_vocab.py), with a head per set of
draft graphs and per table of the draft policy's round costs. Greedy output is MTP off's token for token whichever
head drafts. The tiny fixture's vocabulary (571 ids) is below auto's own prefix, so the tests inject AutoVocab
constants whose prefix the fixture's generated tokens cross."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from llamacmp.arg_values import ArgError
from llamacmp.args import SPEC_OPTIONS, parse_args
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.cli import bench_options, bench_rows
from llamacmp.engine.client import SlotClient
from llamacmp.engine.draft_policy import CostTable
from llamacmp.engine.draft_vocab import AutoVocab, VocabWindow
from llamacmp.engine.speculative import Speculator
from llamacmp.engine.tasks import GenParams
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model
from llamacmp.sampling import SamplingParams
from llamacmp.spec import SpecConfig, SpecError, check
from test_mtp import spy_drafts

PROMPTS = ("def foo(x):", "class Parser:\n    ", "import os\nimport sys\n", "x")
N_PREDICT = 48


@pytest.fixture(scope="module")
def lm(tmp_path_factory, tiny_vocab):
    path = write_model(tmp_path_factory.mktemp("dva") / "mtp-q8_0.gguf", replace(SHAPES["tiny"], mtp=True), "q8_0",
                       tiny_vocab)
    return load_model(path, NumpyBackend())


def generate(lm, prompt, spec=None, auto=None, graphs=None, adaptive=False):
    """-> (N_PREDICT greedy tokens, the client, [(head, drafted ids)] of every draft call). spec None: MTP off;
    auto: the Speculator is rebuilt with these constants; graphs "eager-double": the graph path, run eagerly."""
    c = SlotClient(lm, SimpleNamespace(n_ctx=256, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                       spec=spec or SpecConfig()))
    calls = []
    if c.engine.spec is not None:
        if auto is not None:
            c.engine.spec = Speculator(lm.model, 3, graphs=False, adaptive=adaptive, auto=auto)
        sp = c.engine.spec
        if not adaptive:
            sp.policy = None                                   # n_max drafts every round
        spy_drafts(sp, graphs, lambda out: calls.append(
            (sp.draft_head, lm.model.mtp.draft_head is not None, [t for d in out or [] for t in d])))
    c.history = list(lm.tokenizer.encode(prompt))
    toks = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=N_PREDICT)).tokens
    return toks, c, calls


def crossing(tokens) -> AutoVocab | None:
    """Auto constants under which these committed tokens switch the head to the whole vocabulary and back, both
    in their first two thirds (so drafts follow each switch): a small window, and the prefix searched."""
    early = tokens[:2 * len(tokens) // 3]
    for prefix in sorted(set(tokens) - {0}):
        auto = AutoVocab(prefix=prefix, min_factor=1, window=8, up=2, down=1)
        w = VocabWindow(auto)
        for t in early:
            w.observe([t])
        if w.n_switches >= 2:
            return auto
    return None


@pytest.mark.parametrize("graphs", [None, "eager-double"])
def test_auto_with_switches_equals_mtp_off(lm, graphs):
    switched = 0
    for prompt in PROMPTS:
        off, _, _ = generate(lm, prompt)
        auto = crossing(off)
        if auto is None:
            continue
        on, c, calls = generate(lm, prompt, SpecConfig("draft-mtp", 3), auto, graphs)
        assert on == off, prompt
        sp = c.engine.spec
        heads = [h for h, _, _ in calls]
        assert sp.vocab.n_switches >= 2 and "prefix" in heads and "whole" in heads, prompt
        for head, cut, ids in calls:              # the model's head is the one the window chose, each draft
            assert cut == (head == "prefix"), prompt
            if cut:
                assert max(ids, default=0) < auto.prefix, prompt
        switched += heads.index("whole") > 0       # a switch mid-generation, after prefix drafts
    assert switched >= 2                          # (of the 4 prompts)


def test_adaptive_auto_equals_mtp_off_and_keeps_costs_per_head(lm):
    """With the draft policy on: the output does not change, and each head's drafting rounds are timed into its
    own table (the prefix head's cheaper rounds must not decide for the whole one)."""
    for prompt in PROMPTS:
        off, _, _ = generate(lm, prompt)
        auto = crossing(off)
        if auto is None:
            continue
        on, c, calls = generate(lm, prompt, SpecConfig("draft-mtp", 3), auto, adaptive=True)
        assert on == off, prompt
        costs = c.engine.spec.policy.costs
        assert set(costs.heads) >= {"prefix", "whole"} and costs.spec is costs.heads[c.engine.spec.draft_head]


def test_window_switches_both_ways_with_hysteresis():
    w = VocabWindow(AutoVocab(prefix=100, min_factor=1, window=10, up=3, down=1))
    assert w.head == "prefix"
    w.observe([5, 200, 6, 300, 7, 400])        # 3 outside: not more than up
    assert (w.head, w.n_outside) == ("prefix", 3)
    w.observe([500])                           # 4 > up: the whole vocabulary
    assert (w.head, w.n_switches) == ("whole", 1)
    w.observe([1] * 6)                          # the window holds 300, 7, 400, 500 + six: still 3 outside
    assert w.head == "whole"
    w.observe([1, 1, 1])                        # one (500) left: not below down
    assert (w.head, w.n_outside) == ("whole", 1)
    w.observe([1])                              # none: back to the prefix
    assert (w.head, w.n_switches, w.n_outside) == ("prefix", 2, 0)


def test_auto_drafts_from_the_whole_head_on_a_small_vocabulary(lm):
    """The default constants: a vocabulary under 4 x 32768 ids drafts from all of it (no window)."""
    sp = Speculator.from_spec(lm.model, SpecConfig("draft-mtp", 3))
    assert sp.vocab is None and lm.model.mtp.draft_head is None and sp.draft_head == "fixed"
    assert not AutoVocab().applies(4 * 32768 - 1) and AutoVocab().applies(248320)
    with pytest.raises(ValueError, match="AutoVocab"):
        AutoVocab(up=1, down=2)


def test_cost_table_per_head():
    c = CostTable()
    c.add_spec(1, 3, 0.004)
    c.use_head("prefix")
    assert c.spec == {} and c.spec_cost(1, 3) is None
    c.add_spec(1, 3, 0.003)
    c.use_head("whole")
    c.add_spec(1, 3, 0.005)
    c.use_head("prefix")
    assert c.spec_cost(1, 3) == 0.003 and c.heads["whole"] == {(1, 3): 0.005}


def test_option_default_values_and_refusals():
    spec = lambda argv, env=None: parse_args("server", argv, env or {}).params.spec     # noqa: E731
    assert spec([]).draft_vocab == "auto" and SpecConfig().draft_vocab == "auto"
    assert spec(["--spec-type", "draft-mtp", "--spec-draft-vocab", "auto"]).draft_vocab == "auto"
    assert spec(["--spec-type", "draft-mtp", "--spec-draft-vocab", "0"]).draft_vocab == 0
    assert spec(["--spec-type", "draft-mtp", "--spec-draft-vocab", "32768"]).draft_vocab == 32768
    assert spec([], {"LLAMA_ARG_SPEC_DRAFT_VOCAB": "auto"}).draft_vocab == "auto"
    for bad in ("-1", "x", "Auto", "1.5", ""):
        with pytest.raises(ArgError, match='argument "--spec-draft-vocab"'):
            spec(["--spec-type", "draft-mtp", "--spec-draft-vocab", bad])
    with pytest.raises(SpecError, match="--spec-draft-vocab must be auto, 0"):
        check(SpecConfig("draft-mtp", 3, draft_vocab="all"))
    assert "(default: auto)" in next(o.help for o in SPEC_OPTIONS if o.names[0] == "--spec-draft-vocab")


def test_bench_accepts_auto_and_labels_it():
    s = bench_options.parse_bench_args(["-n", "4", "--spec-type", "draft-mtp"])
    assert [c.draft_vocab for c in s["spec"]] == ["auto"]                     # the default
    s = bench_options.parse_bench_args(["-n", "4", "--spec-type", "draft-mtp", "--spec-draft-vocab",
                                        "auto,0,32768-65536*2"])
    assert [c.draft_vocab for c in s["spec"]] == ["auto", 0, 32768, 65536]
    assert [bench_rows.spec_label(c) for c in s["spec"]] == ["mtp n3 Vauto", "mtp n3", "mtp n3 V32768",
                                                             "mtp n3 V65536"]
    for bad in ("x", "-5", "autox"):
        with pytest.raises(bench_options.BenchError, match="--spec-draft-vocab .*expected auto"):
            bench_options.parse_bench_args(["-n", "4", "--spec-type", "draft-mtp", "--spec-draft-vocab", bad])


def test_metrics_carry_the_draft_vocabulary(lm):
    """/metrics (server/misc.py): the rows the draft head reads now and auto's switches, from the engine's snapshot."""
    from llamacmp.server.misc import spec_vocab_lines
    prompt = PROMPTS[0]
    off, _, _ = generate(lm, prompt)
    auto = crossing(off)
    assert auto is not None
    _, c, _ = generate(lm, prompt, SpecConfig("draft-mtp", 3), auto)
    state = c.engine._query("metrics")["spec_vocab"]
    sp = c.engine.spec
    rows = auto.prefix if sp.draft_head == "prefix" else lm.model.mtp.head.shape[0]
    assert state == {"rows": rows, "switches": sp.vocab.n_switches, "coarse_rows": 0} and state["switches"] >= 2
    lines = spec_vocab_lines(state)
    assert f"llamacmp:spec_draft_vocab_rows {rows}" in lines and "# TYPE llamacmp:spec_draft_vocab_rows gauge" in lines
    assert f"llamacmp:spec_draft_vocab_switches_total {state['switches']}" in lines
    assert spec_vocab_lines({}) == []


def test_bench_rows_with_auto(lm):
    """A tg row with the default auto: `Vauto` in the md spec cell, "auto" in the JSON (the tiny vocabulary drafts
    from all of it: the row runs as 0's does)."""
    import io
    import json
    from llamacmp.cli import bench
    base = ["-m", str(lm.path), "-p", "0", "-n", "4", "-r", "1", "-ngl", "0", "--spec-type", "draft-mtp"]
    out, err = io.StringIO(), io.StringIO()
    assert bench.main(base, out=out, err=err) == 0, err.getvalue()
    assert "mtp n3 Vauto len" in out.getvalue()
    out = io.StringIO()
    assert bench.main(base + ["-o", "json", "--spec-draft-vocab", "auto,0"], out=out, err=io.StringIO()) == 0
    assert [r["spec_draft_vocab"] for r in json.loads(out.getvalue())] == ["auto", 0]


def test_scheduler_slots_with_auto_equal_mtp_off(lm):
    """Three slots generating together share the Speculator's window (their committed tokens interleaved): the
    head switches for all of them, and every stream stays MTP off's."""
    import queue
    from llamacmp.engine.scheduler import Engine, EngineConfig
    from llamacmp.engine.tasks import CompletionTask, FinalResult

    def serve(spec, auto=None):
        engine = Engine(lm, EngineConfig(n_slots=3, n_ctx_slot=256, spec=spec))
        if auto is not None:
            engine.spec = Speculator(lm.model, 3, graphs=False, adaptive=False, auto=auto)
        outs = [queue.Queue() for _ in range(3)]
        for p, out in zip(PROMPTS[:3], outs):
            params = GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=N_PREDICT)
            engine.submit(CompletionTask(lm.tokenizer.encode(p), params, out.put))
        engine.start()
        try:
            got = []
            for out in outs:
                while not isinstance(r := out.get(timeout=120), FinalResult):
                    pass
                got.append(r.tokens)
            return got, engine
        finally:
            engine.stop()
    off, _ = serve(None)
    auto = AutoVocab(prefix=sorted(t for o in off for t in o)[len(off) * N_PREDICT * 3 // 4], min_factor=1,
                     window=8, up=2, down=1)       # a quarter of the ids outside: the streams cross it often
    on, engine = serve(SpecConfig("draft-mtp", 3), auto)
    assert on == off
    assert engine.spec.vocab.n_switches >= 1 and engine.spec.n_drafted > 0
