"""The host work MTP adds to a plain step (issue 19), on the numpy reference with the tiny MTP fixture.

Speculator.plan_ahead: the scheduler weighs the next round's draft lengths while a plain step runs on the device,
and the next plan() takes that weighing when it asks for the same sequences with the same acceptance and tables
that differ at most in the plain costs' values; then the round's choice is the one plan() made before the step's
own timing came in. Otherwise plan() weighs afresh. The costs are the H200's shape (a plain step of one sequence
3.07 ms, a round drafting n (3.2 + 0.8 n) ms).

Speculator.observe_plain: the step's hidden rows of the sequences that may draft are copied once (one copy where
they are one after another, else a gather) and each head keeps its own row."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.engine.draft_policy import Acceptance, CostTable
from llamacmp.engine.draft_vocab import AutoVocab
from llamacmp.engine.speculative import Speculator
from llamacmp.engine.tasks import GenParams
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model
from llamacmp.sampling import SamplingParams
from llamacmp.spec import SpecConfig

from test_mtp import PROMPTS, _engine_run

PLAIN = 3.07e-3
SPEC = {(1, n): (3.2 + 0.8 * n) * 1e-3 for n in (1, 2, 3)}
FAST = 0.5e-3            # a plain step timed at this: the table's plain cost drops to 1.01 ms (EMA 0.8)


@pytest.fixture(scope="module")
def lm(tmp_path_factory, tiny_vocab):
    path = write_model(tmp_path_factory.mktemp("ahead") / "tiny-mtp.gguf", replace(SHAPES["tiny"], mtp=True),
                       "q8_0", tiny_vocab)
    return load_model(path, NumpyBackend())


def _speculator(lm, auto=None) -> Speculator:
    lm.model.set_draft_vocab(0)
    return Speculator(lm.model, 3, graphs=False, costs=CostTable(plain={1: PLAIN}, spec=dict(SPEC)), auto=auto)


def _ahead(sp: Speculator) -> int:
    return sp.round_counts().get(1, {}).get("ahead", 0)


def test_the_round_after_a_plain_step_is_weighed_as_before_its_timing(lm):
    """At the prior acceptance (a = 0.5) one draft pays against a plain step of 3.07 ms and not against one of
    1.01 ms. Weighed ahead, the round after the fast step still drafts: the choice plan() made before that timing
    came in (a second Speculator shows it); the round after that weighs with it and steps plainly."""
    sp, ms = _speculator(lm), None
    ms = sp.new_seq(64)
    sp.plan_ahead([ms])
    sp.time_plain(1, FAST)
    assert sp.plan([ms]) == 1 and _ahead(sp) == 1
    assert sp.plan([ms]) == 0 and _ahead(sp) == 1          # nothing weighed ahead: afresh, with the new cost
    ref = _speculator(lm)
    ref_ms = ref.new_seq(64)
    assert ref.plan([ref_ms]) == 1                          # what plan() gave before the timing
    ref.time_plain(1, FAST)
    assert ref.plan([ref_ms]) == 0
    assert ref.round_counts()[1] == {k: v for k, v in sp.round_counts()[1].items() if k != "ahead"}


def test_plan_weighs_afresh_when_more_than_a_plain_cost_changed(lm):
    """After the fast plain step a fresh weighing steps plainly; each change below makes plan() weigh afresh (the
    weighing ahead said: draft one)."""
    def fresh(change) -> None:
        sp = _speculator(lm)
        ms = sp.new_seq(64)
        sp.plan_ahead([ms])
        sp.time_plain(1, FAST)
        seqs, others = change(sp, ms)
        assert sp.plan(seqs, others) == 0 and _ahead(sp) == 0
    fresh(lambda sp, ms: ([sp.new_seq(64)], 0))                                 # other sequences
    fresh(lambda sp, ms: (sp.time_plain(2, 4e-3), ([ms], 0))[1])                # a new entry in the table
    fresh(lambda sp, ms: (setattr(ms, "acc", Acceptance(0.0, 10.0)), ([ms], 0))[1])   # another acceptance
    fresh(lambda sp, ms: (sp.policy.costs.add_spec(1, 2, 9e-3), ([ms], 0))[1])  # a drafting round's cost


def test_nothing_is_weighed_ahead_before_a_drafting_rounds_record_or_a_head_switch(lm):
    """A drafting round's cost enters the table at the next plan() (with its commits' time), and auto's head
    switch changes the table of drafting costs at the next plan(): a weighing made before either would be of
    other tables, so none is made."""
    sp = _speculator(lm)
    st, ms = lm.backend.new_state(lm.cfg, 64), sp.new_seq(64)
    sp.prefill(st, ms, lm.tokenizer.encode(PROMPTS[0]))
    (_,), logits, h, (v,) = sp.step([(st, ms, 5)], 1)
    sp.commit(v, h, 1)
    sp.plan_ahead([ms])
    sp.plan([ms])
    assert _ahead(sp) == 0 and (1, 1) in sp.policy.costs.spec
    sp = _speculator(lm, auto=AutoVocab(prefix=128, window=8, up=2, down=1))
    ms = sp.new_seq(64)
    assert sp.plan([ms]) and sp.draft_head == "prefix"
    sp.vocab.observe([300, 301, 302])                      # ids past the prefix: auto goes to the whole head
    sp.plan_ahead([ms])
    sp.plan([ms])
    assert sp.draft_head == "whole" and _ahead(sp) == 0


def test_four_slots_step_plainly_on_weighings_made_ahead(lm):
    """The server's scheduler, four greedy slots with adaptive drafting: rounds after plain rounds of the same
    slots take the weighing made while the step ran, and every stream equals MTP off."""
    prompts = [lm.tokenizer.encode(p) for p in PROMPTS]
    reqs = [(p, GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=24)) for p in prompts]
    off, _ = _engine_run(lm, None, reqs)
    on, engine = _engine_run(lm, SpecConfig(type="draft-mtp", n_max=3), reqs, adaptive=True)
    assert on == off
    counts = engine.spec.round_counts()
    assert counts[4].get("ahead", 0) > 0
    assert sum(row.get("ahead", 0) for row in counts.values()) <= sum(row.get("plain", 0) for row in counts.values())


@pytest.mark.parametrize("rows", [[0, 1, 2], [1, 2], [0, 2], [2, 0]])
def test_observe_plain_keeps_each_sequences_row(lm, rows):
    """Rows one after another (every slot of the step may draft) and rows with a gap (a slot with a grammar or
    n_probs between) or out of order: each head's h_last is its own row of the step's h, a copy (the step's
    buffer is rewritten by the next step), queued after the row it held."""
    sp = _speculator(lm)
    items, before = [], []
    for t, r in enumerate(rows):
        st, ms = lm.backend.new_state(lm.cfg, 64), sp.new_seq(64)
        st.n_past = 1                                      # (the step ran one token: the head is one behind)
        items.append((st, ms, 7 + t, r))
        before.append(ms.h_last)
    h = np.random.default_rng(0).standard_normal((3, lm.cfg.n_embd)).astype(np.float32)
    sp.observe_plain(items, h)
    want = h.copy()
    h[:] = 0.0                                             # the next step rewrites the buffer
    for (st, ms, t, r), prev in zip(items, before):
        assert ms.pending == [t] and ms.pending_h[-1] is prev
        np.testing.assert_array_equal(np.asarray(ms.h_last), want[r:r + 1])
