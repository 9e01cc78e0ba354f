"""--spec-draft-vocab on CUDA: the head's row prefix is a view of each matrix layout (Q8_0, a K-quant, f32) whose
logits are the full head's first columns, and greedy output with the captured draft graphs (which capture the
prefix head) equals MTP off."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.engine.client import SlotClient
from llamacmp.engine.tasks import GenParams
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model
from llamacmp.sampling import SamplingParams
from llamacmp.spec import SpecConfig

pytestmark = pytest.mark.cuda
PROMPTS = ("def foo(x):", "class Parser:\n    ", "import os\nimport sys\n")
K = 64


@pytest.fixture(scope="module", params=["q8_0", "f32"])
def lm(request, tmp_path_factory, tiny_vocab, cuda_backend):
    path = write_model(tmp_path_factory.mktemp("dvc") / f"{request.param}.gguf", replace(SHAPES["tiny"], mtp=True),
                       request.param, tiny_vocab)
    return load_model(path, cuda_backend)


def test_prefix_logits_are_the_full_heads_first_columns(lm):
    m, be = lm.model, lm.backend
    h = be.upload_vector(np.random.default_rng(3).standard_normal((2, lm.cfg.n_embd)).astype(np.float32))
    m.set_draft_vocab(0)
    full = be.to_host(m.mtp_forward(StepBatch.build([(m.mtp_state(8), [7, 9])], all_logits=True), h)[0])
    m.set_draft_vocab(K)
    try:
        part = be.to_host(m.mtp_forward(StepBatch.build([(m.mtp_state(8), [7, 9])], all_logits=True), h)[0])
    finally:
        m.set_draft_vocab(0)
    assert part.shape == (2, K)
    np.testing.assert_allclose(part, full[:, :K], rtol=1e-5, atol=1e-5)


def _greedy(lm, prompt, spec):
    c = SlotClient(lm, SimpleNamespace(n_ctx=128, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                       spec=spec))
    if c.engine.spec is not None:
        c.engine.spec.policy = None                       # n_max drafts every round: the draft graphs run
    c.history = list(lm.tokenizer.encode(prompt))
    return c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=24)).tokens, c


def test_greedy_with_graphs_equals_mtp_off(lm):
    for prompt in PROMPTS:
        off, _ = _greedy(lm, prompt, SpecConfig())
        on, c = _greedy(lm, prompt, SpecConfig("draft-mtp", 3, draft_vocab=K))
        assert on == off, prompt
        sp = c.engine.spec
        assert sp.n_drafted > 0 and sp.graphs is not None and lm.model.mtp.draft_head is not None


def test_auto_with_switches_and_graphs_equals_mtp_off(lm):
    """--spec-draft-vocab auto on the captured draft graphs: with constants whose prefix the fixture's tokens cross
    (tests/test_draft_vocab_auto.py), the head switches to the whole vocabulary and back mid-generation, each head
    drafting through its own draft graphs, and greedy output stays MTP off's."""
    from llamacmp.engine.speculative import Speculator
    from test_draft_vocab_auto import PROMPTS as AUTO_PROMPTS
    from test_draft_vocab_auto import crossing
    switched = 0
    for prompt in AUTO_PROMPTS:
        c = SlotClient(lm, SimpleNamespace(n_ctx=256, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                           spec=SpecConfig()))
        c.history = list(lm.tokenizer.encode(prompt))
        off = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=48)).tokens
        auto = crossing(off)
        if auto is None:
            continue
        c = SlotClient(lm, SimpleNamespace(n_ctx=256, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                           spec=SpecConfig("draft-mtp", 3)))
        sp = c.engine.spec = Speculator(lm.model, 3, adaptive=False, auto=auto)
        c.history = list(lm.tokenizer.encode(prompt))
        on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=48)).tokens
        assert on == off, prompt
        assert sp.graphs is not None and sp.vocab.n_switches >= 2 and sp.n_drafted > 0, prompt
        heads = {key[0] for key in sp.graphs._draft}         # the draft graphs captured, per head
        assert heads == {"prefix", "whole"}, (prompt, heads)
        switched += 1
    assert switched >= 2
