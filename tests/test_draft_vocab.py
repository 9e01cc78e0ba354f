"""--spec-draft-vocab N: the MTP head drafts only among token ids 0..N-1 (a row prefix of its LM head); the verify
keeps the full vocabulary, so greedy output is token for token MTP off's."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from llamacmp.args import parse_args
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.engine.client import SlotClient
from llamacmp.engine.speculative import SpecUnsupported, Speculator
from llamacmp.engine.tasks import GenParams
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model
from llamacmp.sampling import SamplingParams
from llamacmp.spec import SpecConfig, SpecError, check
from test_mtp import spy_drafts

PROMPTS = ("def foo(x):", "class Parser:\n    ", "import os\nimport sys\n", "x")
K = 64


@pytest.fixture(scope="module", params=["q8_0", "f32"])
def lm(request, tmp_path_factory, tiny_vocab):
    path = write_model(tmp_path_factory.mktemp("dv") / f"mtp-{request.param}.gguf",
                       replace(SHAPES["tiny"], mtp=True), request.param, tiny_vocab)
    return load_model(path, NumpyBackend())


def _greedy(lm, prompt, n, spec=None, graphs=None):
    """-> (n greedy tokens after prompt, every drafted id, the client); graphs: None eager, "eager-double" the
    Speculator's graph path run eagerly (test_mtp.EagerSpecGraphs)."""
    c = SlotClient(lm, SimpleNamespace(n_ctx=128, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                       spec=spec or SpecConfig()))
    drafted = []
    sp = c.engine.spec
    if sp is not None:
        sp.policy = None                                   # n_max drafts every round
        spy_drafts(sp, graphs, lambda out: drafted.extend(t for d in out or [] for t in d))
    c.history = list(lm.tokenizer.encode(prompt))
    toks = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=n)).tokens
    return toks, drafted, c


@pytest.mark.parametrize("graphs", [None, "eager-double"])
def test_greedy_with_a_draft_vocab_equals_mtp_off(lm, graphs):
    full_drafts = []
    for prompt in PROMPTS:
        off, _, _ = _greedy(lm, prompt, 24)
        on, drafts, c = _greedy(lm, prompt, 24, SpecConfig("draft-mtp", 3, draft_vocab=K), graphs)
        assert on == off, prompt
        assert drafts and max(drafts) < K, prompt           # the flag takes effect: every draft is in the prefix
        _, d, _ = _greedy(lm, prompt, 24, SpecConfig("draft-mtp", 3), graphs)
        full_drafts += d
    assert max(full_drafts) >= K                            # without it the head drafts beyond the prefix


def test_draft_vocab_is_a_row_prefix_of_the_head(lm):
    """The head's logits over the prefix are the first K columns of the full head's (the same rows, a view)."""
    from llamacmp.backends.base import StepBatch
    m = lm.model
    h = np.random.default_rng(3).standard_normal((1, lm.cfg.n_embd)).astype(np.float32)
    m.set_draft_vocab(0)
    full, _ = m.mtp_forward(StepBatch.build([(m.mtp_state(8), [7])]), h)
    m.set_draft_vocab(K)
    try:
        part, _ = m.mtp_forward(StepBatch.build([(m.mtp_state(8), [7])]), h)
    finally:
        m.set_draft_vocab(0)
    assert part.shape == (1, K)
    np.testing.assert_array_equal(part, full[:, :K])


def test_refusals(lm):
    n_vocab = lm.model.mtp.head.shape[0]
    with pytest.raises(SpecUnsupported, match=rf"--spec-draft-vocab {n_vocab + 1}: must be 1 \.\. {n_vocab}"):
        Speculator.from_spec(lm.model, SpecConfig("draft-mtp", 3, draft_vocab=n_vocab + 1))
    with pytest.raises(SpecError, match="--spec-draft-vocab must be auto, 0 .* or 1 .. n_vocab"):
        check(SpecConfig("draft-mtp", 3, draft_vocab=-1))
    Speculator.from_spec(lm.model, SpecConfig("draft-mtp", 3, draft_vocab=n_vocab))   # all of it: accepted
    assert lm.model.mtp.draft_head is None


def test_row_prefix_of_a_block_quant_matrix():
    """Other block types (here Q4_0: f16 d, 16 bytes of nibbles per 32 values) slice by rows as well."""
    from llamacmp.gguf_file import QuantTensor
    rng = np.random.default_rng(4)
    blocks = rng.integers(0, 256, (40, 2, 18), dtype=np.uint8)
    blocks[:, :, :2] = np.full((40, 2), 0.01, np.float16).view(np.uint8).reshape(40, 2, 2)
    be = NumpyBackend()
    w = be.upload_matrix(QuantTensor("Q4_0", blocks))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    full = be.matmuls(x, [w])[0]
    part = be.matmuls(x, [be.row_prefix(w, 9)])[0]
    np.testing.assert_array_equal(part, full[:, :9])


def test_option_and_env():
    spec = lambda argv, env=None: parse_args("server", argv, env or {}).params.spec     # noqa: E731
    assert spec(["--spec-type", "draft-mtp", "--spec-draft-vocab", "32768"]).draft_vocab == 32768
    assert spec(["--spec-type", "draft-mtp"], {"LLAMA_ARG_SPEC_DRAFT_VOCAB": "100"}).draft_vocab == 100
    assert spec([]).draft_vocab == "auto"          # the default (tests/test_draft_vocab_auto.py)
    r = parse_args("server", ["--spec-draft-vocab", "100"], {})
    assert any("--spec-draft-vocab changes nothing here" in w for w in r.warnings)


def test_bench_rows_per_draft_vocab(lm):
    """llamacmp-bench: --spec-draft-vocab is a list (one row each), shown in the spec cell and the JSON; the head
    reads only the prefix while its row runs (its drafts are all below it); refused without draft-mtp."""
    import io
    import json
    from llamacmp.cli import bench, bench_options
    path = str(lm.path)
    drafts = []
    real = Speculator.draft

    def draft(self, *a, **kw):
        out = real(self, *a, **kw)
        drafts.append((self.model.mtp.draft_head is not None, [t for d in out for t in d]))
        return out
    Speculator.draft = draft
    try:
        out, err = io.StringIO(), io.StringIO()
        rc = bench.main(["-m", path, "-p", "0", "-n", "8", "-r", "1", "-ngl", "0", "-o", "json", "--spec-type",
                         "draft-mtp", "--spec-draft-vocab", f"0,{K}"], out=out, err=err)
    finally:
        Speculator.draft = real
    assert rc == 0, err.getvalue()
    assert [r["spec_draft_vocab"] for r in json.loads(out.getvalue())] == [0, K]
    assert all(max(ids, default=0) < K for cut, ids in drafts if cut) and any(cut for cut, _ in drafts)
    out = io.StringIO()
    assert bench.main(["-m", path, "-p", "0", "-n", "4", "-r", "1", "-ngl", "0", "--spec-type", "draft-mtp",
                       "--spec-draft-vocab", str(K)], out=out, err=io.StringIO()) == 0
    assert f"mtp n3 V{K} len" in out.getvalue()
    with pytest.raises(bench_options.BenchError, match="--spec-draft-vocab need --spec-type draft-mtp"):
        bench_options.parse_bench_args(["-n", "4", "--spec-draft-vocab", "100"])


def test_run_plan_refuses_a_draft_vocab_above_the_vocabulary(lm):
    """The tools' start (run_plan) names the flag and the vocabulary before anything loads."""
    from llamacmp.loader import open_model
    from llamacmp.run_plan import RunPlanError, plan_run
    mf = open_model(lm.path)
    n = mf.cfg.n_vocab
    p = parse_args("server", ["--spec-type", "draft-mtp", "--spec-draft-vocab", str(n + 1)], {}).params
    with pytest.raises(RunPlanError, match=rf"--spec-draft-vocab {n + 1}: must be 1 \.\. {n} \(the vocabulary\)"):
        plan_run(p, 128, mf)
    p = parse_args("server", ["--spec-type", "draft-mtp", "--spec-draft-vocab", str(n)], {}).params
    assert plan_run(p, 128, mf).spec.draft_vocab == n
