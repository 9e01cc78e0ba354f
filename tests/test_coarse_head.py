"""--spec-draft-coarse on the numpy reference, the specification of cuda_src/coarse_head.cu: the CQ2 format
(cq2_ref.py: its levels, layout and GEMV stated independently here), the CQ2 copy of a head (quantize_cq2 of the
rows' values), the candidates' order, coarse_argmax against the exact argmax (equal when
the exact best is among the k candidates, the best of the candidates when it is not), the MTP draft through it
(greedy output with MTP on still equals MTP off), the option, and the memory plan's count of the copy.
The tiny fixtures' vocabularies (571 ids) are below spec.COARSE_MIN_ROWS, so the engine tests inject the coarse
head (CoarseHead) or lower that constant."""
from __future__ import annotations

import io
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from llamacmp import memplan
from llamacmp import spec as spec_mod
from llamacmp.arg_values import ArgError
from llamacmp.args import SPEC_OPTIONS, parse_args
from llamacmp.backends.base import StepBatch
from llamacmp.backends.cq2_ref import cq2_gemv, dequantize_cq2, quantize_cq2
from llamacmp.backends.numpy_ref import NumpyBackend, argmax_rows, best_of, top_ids
from llamacmp.backends.quant_ref import quantize_q8_blocks
from llamacmp.cli import bench_options, bench_rows
from llamacmp.engine.client import SlotClient
from llamacmp.engine.speculative import Speculator
from llamacmp.engine.tasks import GenParams
from llamacmp.fixtures.quant_blocks import random_blocks
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model, open_model
from llamacmp.run_plan import plan_run
from llamacmp.sampling import SamplingParams
from llamacmp.spec import COARSE_K_MAX, CoarseHead, SpecConfig, SpecError, check, coarse_head
from test_backend_capabilities import PlannedNumpy   # a host backend with a planned device arena
from test_mtp import PROMPTS, _greedy, spy_drafts

BE = NumpyBackend()


def head_of(kind: str, rows: int, cols: int, rng):
    """(the file's matrix, its values) of a head of GGUF type `kind` (F32 / F16: an array)."""
    if kind in ("F32", "F16"):
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16 if kind == "F16" else np.float32)
        return w, w.astype(np.float32)
    w = random_blocks(kind, rows, cols, rng)
    return w, w.dequantize()


def awkward_rows(cols: int) -> np.ndarray:
    """Blocks that test CQ2's edges: all zero, -0.0 alone, NaN among values (ignored by amax, code 0), one value
    alone (the others exactly at the 0 threshold: code 2), values exactly on the thresholds -2d, 0, 2d, a block of
    -inf (d inf: every code 0) and one whose d is an f16 subnormal."""
    out = np.zeros((7, cols), np.float32)
    out[1, 0] = -0.0
    out[2, :32] = np.linspace(-1, 1, 32)
    out[2, 5] = np.nan
    out[3, 7] = 3.5
    d = np.float32(np.float16(np.float32(5.0) * np.float32(0.2)))           # amax 5: d = 1, thresholds -2, 0, 2
    out[4, :6] = [5.0, 2.0 * d, 0.0, -2.0 * d, -5.0, 1.999]
    out[5, :32] = -np.inf
    out[6, :32] = np.linspace(-3e-6, 1e-6, 32)
    return out


def codes_by_layout(codes: np.ndarray) -> np.ndarray:
    """codes [N, n/4] u8 -> c [N, n] by cq2_ref.py's layout as stated there: value 16w + 4k + i of a block in bits
    8i + 2k of its little-endian word w."""
    N = codes.shape[0]
    words = codes.reshape(N, -1, 2, 4).copy().view("<u4")[..., 0]          # [N, nb, 2]
    c = np.empty((N, words.shape[1], 32), np.int64)
    for w in range(2):
        for k in range(4):
            for i in range(4):
                c[:, :, 16 * w + 4 * k + i] = (words[:, :, w] >> (8 * i + 2 * k)) & 3
    return c.reshape(N, -1)


# -- the format and the copy -----------------------------------------------------------------------------------------

def test_quantize_cq2_takes_the_nearest_level():
    """d = f16(0.2 amax); each value's code is its nearest level (2c - 3) d (on a threshold: the upper one), in the
    layout's bit positions; dequantize_cq2 gives those levels."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((40, 96)) * 10.0 ** rng.uniform(-3, 3, (40, 1))).astype(np.float32)
    codes, d = quantize_cq2(x)
    assert codes.shape == (40, 24) and codes.dtype == np.uint8 and d.shape == (40, 3) and d.dtype == np.float16
    xb = x.reshape(40, 3, 32)
    np.testing.assert_array_equal(d, (np.abs(xb).max(axis=2) * np.float32(0.2)).astype(np.float16))
    levels = np.array([-3, -1, 1, 3], np.float64)[None, None, None, :] * d.astype(np.float64)[..., None, None]
    dist = np.abs(xb[..., None].astype(np.float64) - levels)
    want = 3 - np.argmin(dist[..., ::-1], axis=-1)                         # the upper level on a tie
    np.testing.assert_array_equal(codes_by_layout(codes), want.reshape(40, 96))
    np.testing.assert_array_equal(dequantize_cq2(codes, d), ((2 * want - 3) * d[..., None]).reshape(40, 96))


def test_quantize_cq2_of_awkward_blocks():
    codes, d = quantize_cq2(awkward_rows(64))
    c = codes_by_layout(codes)
    assert d[0, 0] == 0 and d[1, 0] == 0 and (c[:2] == 2).all()            # d = 0: every code 2 (the +d level, 0)
    assert d[2, 0] == np.float16(np.float32(0.2)) and c[2, 5] == 0          # NaN: amax of the others, code 0
    assert c[3, 7] == 3 and (c[3, :7] == 2).all()
    assert d[4, 0] == 1 and c[4, :6].tolist() == [3, 3, 2, 1, 0, 2]         # on a threshold: the upper level
    assert np.isinf(d[5, 0]) and (c[5, :32] == 0).all()
    assert 0 < d[6, 0] < np.float16(6.2e-5) and c[6, 0] == 0 and c[6, 31] == 2


def test_cq2_gemv_is_the_dot_of_the_dequantized_values():
    """cq2_gemv = the float64 dot of the dequantized Q8 activations with the dequantized CQ2 rows (to fp32), over
    more rows than one GEMV_CHUNK."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((4101, 64)).astype(np.float32)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    codes, d = quantize_cq2(w)
    q, dx = quantize_q8_blocks(x)
    got = cq2_gemv(q.reshape(3, 64).astype(np.int8), dx, codes, d)
    want = (q * dx[..., None]).reshape(3, 64).astype(np.float64) @ dequantize_cq2(codes, d).T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("kind,cols", [("Q8_0", 64), ("Q6_K", 256), ("Q4_K", 256), ("F32", 96), ("F16", 64)])
def test_coarse_copy_is_cq2_of_the_file_values(kind, cols):
    """Every row's blocks are quantize_cq2 of the values the file's own dequantization gives (embed's), in pieces
    of COARSE_CHUNK rows (a piece boundary inside the matrix); row_prefix takes its first rows."""
    w, values = head_of(kind, 37, cols, np.random.default_rng(cols))
    be = NumpyBackend()
    be.COARSE_CHUNK = 16
    c = be.coarse_copy(be.upload_matrix(w))
    assert c.shape == (37, cols)
    want_codes, want_d = quantize_cq2(values)
    np.testing.assert_array_equal(c.codes, want_codes)
    np.testing.assert_array_equal(c.scales, want_d)
    p = be.row_prefix(c, 20)
    assert p.shape == (20, cols) and (p.codes == want_codes[:20]).all()


def test_coarse_logits_are_cq2_gemv_of_q8_activations():
    rng = np.random.default_rng(3)
    coarse = BE.coarse_copy(BE.upload_matrix(rng.standard_normal((50, 64)).astype(np.float32)))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    q, dx = quantize_q8_blocks(x)
    np.testing.assert_array_equal(BE.coarse_logits(x, coarse), cq2_gemv(q.reshape(2, 64), dx, coarse.codes,
                                                                         coarse.scales))


def test_coarse_copy_refuses_rows_not_of_32():
    with pytest.raises(ValueError, match="not CQ2 blocks of 32"):
        BE.coarse_copy(BE.upload_matrix(np.zeros((4, 40), np.float32)))


# -- candidates and the choice -------------------------------------------------------------------------------------

def test_top_ids_order():
    x = np.array([[1, 3, 3, np.nan, -np.inf, 2], [0, 0, 0, 0, 0, -0.0]], np.float32)
    assert top_ids(x, 6).tolist() == [[1, 2, 5, 0, 3, 4], [0, 1, 2, 3, 4, 5]]   # NaN as -inf, lower id first
    assert top_ids(x, 2).tolist() == [[1, 2], [0, 1]]
    assert top_ids(x, 9).shape == (2, 6)


def test_argmax_rows_and_best_of():
    x = np.array([[np.nan, -np.inf, -np.inf], [1, 5, 5], [np.nan, np.nan, np.nan], [np.nan, 2, 7]], np.float32)
    assert argmax_rows(x).tolist() == [1, 1, 0, 2]
    v = np.array([1.0, 4.0, np.nan, 4.0], np.float32)
    assert best_of(v, np.array([9, 7, 1, 3])) == 3                 # the tie: the lower id, wherever it stands
    assert best_of(np.full(3, np.nan, np.float32), np.array([8, 2, 5])) == 8    # all NaN: the coarse best


@pytest.mark.parametrize("kind,cols", [("Q8_0", 64), ("Q6_K", 256), ("F32", 64)])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_coarse_argmax_is_the_argmax_when_it_is_among_the_k(kind, cols, k):
    """A prime number of rows, 7 activation rows: wherever the exact argmax is among the coarse head's k best,
    coarse_argmax returns it; with k = N always."""
    rng = np.random.default_rng(k)
    w, _ = head_of(kind, 311, cols, rng)
    exact = BE.upload_matrix(w)
    coarse = BE.coarse_copy(exact)
    x = rng.standard_normal((7, cols)).astype(np.float32)
    want = argmax_rows(BE.matmuls(x, [exact])[0])
    cand = top_ids(BE.coarse_logits(x, coarse), k)
    got = BE.coarse_argmax(x, coarse, exact, k)
    inside = [r for r in range(7) if want[r] in cand[r]]
    assert len(inside) >= (2 if k == 1 else 4), (want, cand)     # 2-bit codes: k = 1 finds 2-3 of these 7
    assert got[inside].tolist() == want[inside].tolist()
    assert BE.coarse_argmax(x, coarse, exact, 311).tolist() == want.tolist()


def test_coarse_argmax_outside_the_k_gives_the_best_candidate():
    """A coarse head built so that it ranks the exact best low (its row negated): the result is the best of the k
    candidates by their exact logits, not the exact argmax and not the coarse favourite."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    exact = BE.upload_matrix(w)
    logits = BE.matmuls(x, [exact])[0][0]
    best = int(np.argmax(logits))
    other = w.copy()
    other[best] *= -1
    coarse = BE.coarse_copy(BE.upload_matrix(other))
    cand = top_ids(BE.coarse_logits(x, coarse), 4)[0]
    assert best not in cand
    got = int(BE.coarse_argmax(x, coarse, exact, 4)[0])
    assert got == int(cand[np.argmax(logits[cand])]) and got != best
    assert got != int(cand[0]) or np.argmax(logits[cand]) == 0


def test_coarse_argmax_ties_take_the_lowest_id_and_write_out():
    """Rows 2 and 5 equal and the largest; a coarse head that puts 5 first: the exact tie goes to 2. `out` is
    written in place (a graph's buffer)."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    x = np.ones((1, 32), np.float32)
    w[2] = w[5] = np.abs(w).max() + 1.0
    favour5 = w.copy()
    favour5[5] *= 1.5
    coarse = BE.coarse_copy(BE.upload_matrix(favour5))
    assert top_ids(BE.coarse_logits(x, coarse), 2).tolist() == [[5, 2]]
    out = np.full(3, -1, np.int32)
    BE.coarse_argmax(x, coarse, BE.upload_matrix(w), 2, out=out[1:2])
    assert out.tolist() == [-1, 2, -1]


# -- the MTP draft through it ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lm(tmp_path_factory, tiny_vocab):
    path = write_model(tmp_path_factory.mktemp("coarse") / "tiny-mtp.gguf", replace(SHAPES["tiny"], mtp=True),
                       "q8_0", tiny_vocab)
    return load_model(path, NumpyBackend())


class Counted:
    """Counts the backend's coarse_argmax calls while it lives on `be` (a `with` block)."""

    def __init__(self, be):
        self.be, self.n = be, 0

    def __enter__(self):
        inner = self.be.coarse_argmax

        def counted(*a, **kw):
            self.n += 1
            return inner(*a, **kw)
        self.be.coarse_argmax = counted
        return self

    def __exit__(self, *exc):
        del self.be.coarse_argmax


def test_draft_ids_through_the_coarse_head_follow_the_draft_head(lm):
    """mtp_forward(draft_ids=True): the coarse head's choice for draft heads of at least min_rows rows (the whole
    head here), the exact argmax of the draft head's logits for a smaller prefix; k = N gives the exact argmax."""
    m, be = lm.model, lm.backend
    N = m.mtp.head.shape[0]
    h = be.upload_vector(np.random.default_rng(1).standard_normal((4, lm.cfg.n_embd)).astype(np.float32))

    def ids_and_logits():
        batch = StepBatch.build([(m.mtp_state(8), [7, 9, 11, 13])], all_logits=True)
        ids, _ = m.mtp_forward(batch, h, draft_ids=True)
        batch = StepBatch.build([(m.mtp_state(8), [7, 9, 11, 13])], all_logits=True)
        return be.ids_to_host(ids).tolist(), be.to_host(m.mtp_forward(batch, h)[0])
    try:
        assert m.set_draft_coarse(N, N, 300) and m.mtp.draft_coarse is not None
        with Counted(be) as c:
            ids, logits = ids_and_logits()
        assert c.n == 1 and ids == argmax_rows(logits).tolist()
        assert not m.set_draft_coarse(3, N, 300)              # the copy is kept: not made again
        m.set_draft_vocab(200)                                 # a prefix below min_rows: the exact head
        assert m.mtp.draft_coarse is None
        with Counted(be) as c:
            ids, logits = ids_and_logits()
        assert c.n == 0 and ids == argmax_rows(logits).tolist() and max(ids) < 200
        m.set_draft_vocab(400)                                 # a prefix above it: the copy's first rows
        assert m.mtp.draft_coarse is not None and m.mtp.draft_coarse.shape[0] == 400
    finally:
        m.set_draft_vocab(0)
        m.set_draft_coarse(0)
    assert m.mtp.draft_coarse is None


def _coarse_client(lm, n_max, k, graphs=None):
    from test_mtp import _client
    c = _client(lm, n_max, graphs=graphs)
    c.engine.spec.set_coarse(CoarseHead(k, lm.model.mtp.head.shape[0], 1))
    return c


@pytest.mark.parametrize("graphs", [None, "eager-double"], ids=["eager", "graph-path"])
@pytest.mark.parametrize("n_max,k", [(1, 1), (3, 1), (3, 16), (4, 32)])
def test_greedy_with_the_coarse_head_equals_mtp_off(lm, n_max, k, graphs):
    """Token for token MTP off's output, the drafts through the coarse head (k = 1: the coarse argmax alone, the
    least exact), eagerly and on the graph path (EagerSpecGraphs: mtp_forward's draft ids, as the CUDA graphs)."""
    try:
        for prompt in PROMPTS[:3]:
            off, _ = _greedy(lm, prompt, 24)
            c = _coarse_client(lm, n_max, k, graphs)
            seen = []
            spy_drafts(c.engine.spec, graphs == "eager-double", seen.append)
            c.history = list(lm.tokenizer.encode(prompt))
            with Counted(lm.backend) as counted:
                on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=24)).tokens
            assert on == off, prompt
            assert c.engine.spec.n_drafted > 0 and counted.n >= len([s for s in seen if s])
    finally:
        lm.model.set_draft_coarse(0)


def test_p_min_drafts_keep_the_exact_head(lm):
    """With --spec-draft-p-min the draft reads its top-10 on the host: the exact head's logits, no coarse step."""
    try:
        off, _ = _greedy(lm, PROMPTS[1], 24)
        c = _coarse_client(lm, 3, 16)
        c.engine.spec.p_min = 0.15
        c.history = list(lm.tokenizer.encode(PROMPTS[1]))
        with Counted(lm.backend) as counted:
            on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=24)).tokens
        assert on == off and counted.n == 0 and c.engine.spec.n_drafted > 0
    finally:
        lm.model.set_draft_coarse(0)


def test_the_option_changes_the_draft(lm, monkeypatch):
    """--spec-draft-coarse through the engine's own setup (Speculator.from_spec, spec.coarse_head), with
    COARSE_MIN_ROWS lowered to the fixture's vocabulary: 16 drafts through the copy (the gauge says its rows), 0
    reads the exact head; the output is the same."""
    monkeypatch.setattr(spec_mod, "COARSE_MIN_ROWS", 1)
    outs = {}
    for k in (16, 0):
        p = parse_args("completion", ["--spec-type", "draft-mtp", "--spec-draft-coarse", str(k)], {}).params
        c = SlotClient(lm, SimpleNamespace(n_ctx=128, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                           spec=p.spec))
        c.engine.spec.policy = None
        c.history = list(lm.tokenizer.encode(PROMPTS[0]))
        with Counted(lm.backend) as counted:
            outs[k] = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=24)).tokens
        state = c.engine.spec.vocab_state()
        if k:
            assert counted.n > 0 and c.engine.spec.coarse == CoarseHead(16, lm.model.mtp.head.shape[0], 1)
            assert state["coarse_rows"] == lm.model.mtp.head.shape[0]
        else:
            assert counted.n == 0 and c.engine.spec.coarse is None and state["coarse_rows"] == 0
    assert outs[16] == outs[0]
    lm.model.set_draft_coarse(0)


def test_a_copy_the_backend_cannot_make_leaves_the_exact_head(lm, monkeypatch, caplog):
    def full(w):
        raise MemoryError("out of device memory: the coarse head")
    monkeypatch.setattr(lm.backend, "coarse_copy", full)
    sp = Speculator(lm.model, 3, coarse=CoarseHead(16, lm.model.mtp.head.shape[0], 1))
    assert sp.coarse is None and lm.model.mtp.draft_coarse is None and lm.model.mtp.coarse_k == 0
    assert "no CQ2 coarse head" in caplog.text and "exact LM head" in caplog.text


# -- when a run makes one, and its option -----------------------------------------------------------------------------

def test_coarse_head_rule():
    on = SpecConfig("draft-mtp", 3)
    assert coarse_head(on, 248320, 4096, "Q8_0") == CoarseHead(16, 248320, spec_mod.COARSE_MIN_ROWS)
    assert coarse_head(on, 248320, 4096, "Q6_K").rows == 248320 and coarse_head(on, 248320, 4096, "F16") is not None
    for t in ("Q5_K", "Q4_K", "Q4_0", "IQ4_XS", "Q3_K"):                # CQ2 is 0.3125 bytes a value
        assert coarse_head(on, 248320, 4096, t) is not None, t
    assert coarse_head(on, 248320, 4096, "Q2_K") is None                # saves too little
    assert coarse_head(replace(on, draft_vocab=32768), 248320, 4096, "Q8_0") is None         # below min rows
    assert coarse_head(replace(on, draft_vocab=131072), 248320, 4096, "Q8_0").rows == 131072
    assert coarse_head(replace(on, draft_vocab=0, draft_coarse=4), 248320, 4096, "Q8_0").k == 4
    assert coarse_head(replace(on, draft_coarse=0), 248320, 4096, "Q8_0") is None
    assert coarse_head(SpecConfig(), 248320, 4096, "Q8_0") is None
    assert coarse_head(on, 248320, 4100, "Q8_0") is None
    assert coarse_head(on, 8192, 4096, "Q8_0") is None


def test_option_values_and_refusals():
    spec = lambda argv, env=None: parse_args("server", argv, env or {}).params.spec     # noqa: E731
    assert spec([]).draft_coarse == 16 == SpecConfig().draft_coarse
    assert spec(["--spec-type", "draft-mtp", "--spec-draft-coarse", "0"]).draft_coarse == 0
    assert spec(["--spec-type", "draft-mtp", "--spec-draft-coarse", str(COARSE_K_MAX)]).draft_coarse == COARSE_K_MAX
    assert spec([], {"LLAMA_ARG_SPEC_DRAFT_COARSE": "4"}).draft_coarse == 4
    for bad in ("-1", "33", "x", "1.5", ""):
        with pytest.raises(ArgError, match='argument "--spec-draft-coarse"'):
            spec(["--spec-type", "draft-mtp", "--spec-draft-coarse", bad])
    with pytest.raises(SpecError, match="--spec-draft-coarse must be 0"):
        check(SpecConfig("draft-mtp", 3, draft_coarse=40))
    r = parse_args("server", ["--spec-draft-coarse", "4"], {})
    assert any("--spec-draft-coarse changes nothing here" in w for w in r.warnings)
    assert "(default: 16)" in next(o.help for o in SPEC_OPTIONS if o.names[0] == "--spec-draft-coarse")
    assert next(o.help for o in SPEC_OPTIONS if o.names[0] == "--spec-draft-coarse").startswith("llamacmp:")


def test_bench_lists_and_labels_it():
    s = bench_options.parse_bench_args(["-n", "4", "--spec-type", "draft-mtp", "--spec-draft-coarse", "16,0"])
    assert [c.draft_coarse for c in s["spec"]] == [16, 0]
    assert [bench_rows.spec_label(c) for c in s["spec"]] == ["mtp n3 Vauto", "mtp n3 Vauto C0"]
    with pytest.raises(bench_options.BenchError, match="--spec-draft-coarse"):
        bench_options.parse_bench_args(["-n", "4", "--spec-type", "draft-mtp", "--spec-draft-coarse", "64"])


# -- the memory plan ------------------------------------------------------------------------------------------------

def test_memory_plan_counts_the_copy_or_leaves_it_out(lm, monkeypatch):
    """The copy is part of the weights (the long-lived reserve); a cap it does not fit under drops it rather than
    the run: one note line, and planned_run turns --spec-draft-coarse off."""
    monkeypatch.setattr(spec_mod, "COARSE_MIN_ROWS", 1)
    mf = open_model(lm.path)
    p = parse_args("completion", ["-m", lm.path, "-c", "256", "--spec-type", "draft-mtp"], {}).params
    run = plan_run(p, mf.cfg.n_ctx_train, mf)
    N, D = mf.cfg.n_vocab, mf.cfg.n_embd
    size = memplan.coarse_head_bytes(N, D)
    assert size == memplan.exact(N * D // 32 * 8) + memplan.exact(N * D // 32 * 2)
    log = io.StringIO()
    fits = memplan.prepare_device(PlannedNumpy(1 << 34), mf, run, log=log)
    assert fits.coarse_rows == N and not fits.coarse_dropped and memplan.planned_run(run, fits) is run
    assert "CQ2 coarse head" in fits.item("weights").detail and "CQ2 coarse head" in log.getvalue()
    without = fits.total - size
    tight = memplan.prepare_device(PlannedNumpy(without + size // 2), mf, run)
    assert tight.coarse_dropped and tight.coarse_rows == 0 and tight.total == without
    assert any("does not fit: drafting reads the exact LM head" in line for line in tight.lines())
    assert memplan.planned_run(run, tight).spec == replace(run.spec, draft_coarse=0)
    assert fits.persistent - tight.persistent == size


def test_auto_heads_keep_the_coarse_head_for_the_whole_vocabulary(tmp_path, tiny_vocab):
    """--spec-draft-vocab auto switching mid-generation (test_draft_vocab_auto's constants) with the coarse head
    applying to the whole vocabulary only (min_rows above the prefix): the prefix drafts from its exact rows, the
    whole head through the copy, and the output is MTP off's."""
    from test_draft_vocab_auto import PROMPTS as AUTO_PROMPTS
    from test_draft_vocab_auto import crossing
    path = write_model(tmp_path / "mtp-q8_0.gguf", replace(SHAPES["tiny"], mtp=True), "q8_0", tiny_vocab)
    lm = load_model(path, NumpyBackend())
    switched = 0
    for prompt in AUTO_PROMPTS:
        off, _ = _greedy(lm, prompt, 48, n_ctx=256)
        auto = crossing(off)
        if auto is None:
            continue
        from test_mtp import _client
        c = _client(lm, 3, n_ctx=256)
        sp = c.engine.spec = Speculator(lm.model, 3, graphs=False, adaptive=False, auto=auto,
                                        coarse=CoarseHead(16, lm.model.mtp.head.shape[0], auto.prefix + 1))
        heads = []
        spy_drafts(sp, False, lambda out: heads.append((sp.draft_head, lm.model.mtp.draft_coarse is not None)))
        c.history = list(lm.tokenizer.encode(prompt))
        with Counted(lm.backend) as counted:
            on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=48)).tokens
        assert on == off, prompt
        assert sp.vocab.n_switches >= 2 and set(heads) == {("prefix", False), ("whole", True)}, heads
        assert counted.n > 0
        switched += 1
    lm.model.set_draft_coarse(0)
    assert switched >= 1
