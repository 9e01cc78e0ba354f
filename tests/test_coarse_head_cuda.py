"""--spec-draft-coarse on CUDA (cuda_src/coarse_head.cu) against the numpy reference (tests/test_coarse_head.py,
backends/cq2_ref.py): the CQ2 copy byte for byte (cmp_quantize_cq2 alone, and CudaBackend.coarse_copy of every head
kind, over several row pieces), cmp_cq2_gemv against cq2_gemv (every T of a launch and more, rows not a multiple of
a block's 16, rows of one and of several rounds, every int8 dot route), cmp_topk's ids exactly (ties, NaN, -inf,
rows against its thresholds; no, one and two merge passes), cmp_coarse_rescore's choice, coarse_argmax against
numpy's; then the MTP draft through it: the captured draft rounds equal the eager ones, and greedy output with graphs
on and off equals MTP off (with --spec-draft-vocab auto's two heads too).

Tolerances: the copy and the candidates are exact (the same f32 operations as cq2_ref / a stable sort); the GEMV's
block dots are exact integers, its sums fp32 (1e-5 of the row's sum of |terms|); the logits the choice compares are
the GEMVs' and the rescoring's fp32 sums, so an id may differ from the reference's only between logits within 1e-5
of the row's largest magnitude (a near tie)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cuda_helpers import INT8_DOTS, up
from llamacmp.backends.base import StepBatch
from llamacmp.backends.cq2_ref import cq2_gemv, cq2_levels, quantize_cq2
from llamacmp.backends.numpy_ref import NumpyBackend, argmax_rows, best_of, top_ids
from llamacmp.backends.spec_graphs import SpecGraphs
from llamacmp.engine.speculative import Speculator
from llamacmp.engine.tasks import GenParams
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.lib._native import CMP_DOTS, NativeError
from llamacmp.loader import load_model
from llamacmp.sampling import SamplingParams
from llamacmp.spec import CoarseHead
from test_coarse_head import awkward_rows, head_of
from test_mtp import PROMPTS, _client, _greedy

pytestmark = pytest.mark.cuda
REF = NumpyBackend()
NEAR_TIE = 1e-5


def device_bytes(be, t) -> np.ndarray:
    """A u8 device tensor's bytes [rows, width]."""
    return be.kv_rows_raw(t, t.shape[0])


def assert_planes(be, got, codes: np.ndarray, scales: np.ndarray) -> None:
    """A CQ2Matrix's device planes = the reference's codes [N, n/4] u8 and scales [N, n/32] f16."""
    np.testing.assert_array_equal(device_bytes(be, got.scales), scales.view(np.uint8))
    np.testing.assert_array_equal(device_bytes(be, got.codes), codes)


# -- the copy --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,cols", [(1, 32), (5, 64), (37, 96), (300, 4096)])
def test_quantize_cq2_equals_reference(cuda_backend, rows, cols):
    """cmp_quantize_cq2 of f32 rows (every row its own scale, 1e-3 .. 1e3; the awkward blocks of the reference
    test on top: zero, -0, NaN, thresholds, -inf, subnormal d) = cq2_ref.quantize_cq2, byte for byte."""
    be, rng = cuda_backend, np.random.default_rng(rows)
    x = (rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-3, 3, (rows, 1))).astype(np.float32)
    x[:min(rows, 7)] = awkward_rows(cols)[:min(rows, 7)]
    nb = cols // 32
    codes, scales = be.empty((rows, nb * 8), "u8"), be.empty((rows, nb * 2), "u8")
    xd = up(be, x)
    be.native.cmp_quantize_cq2(xd.ptr, codes.ptr, scales.ptr, rows, cols)
    want_codes, want_scales = quantize_cq2(x)
    np.testing.assert_array_equal(device_bytes(be, scales), want_scales.view(np.uint8))
    np.testing.assert_array_equal(device_bytes(be, codes), want_codes)


@pytest.mark.parametrize("kind,cols", [("Q8_0", 64), ("Q6_K", 256), ("Q4_K", 256), ("IQ4_XS", 256), ("F32", 96),
                                       ("F16", 64)])
def test_coarse_copy_equals_numpy(cuda_backend, monkeypatch, kind, cols):
    """CudaBackend.coarse_copy of every head kind = numpy_ref's, byte for byte; pieces of 16 rows (the staging size
    lowered), so 37 rows take three, the last one short; row_prefix views its first rows."""
    be = cuda_backend
    w, _ = head_of(kind, 37, cols, np.random.default_rng(cols + len(kind)))
    monkeypatch.setattr(be, "STAGING_BYTES", 16 * cols * 4)
    got = be.coarse_copy(be.upload_matrix(w))
    want = REF.coarse_copy(REF.upload_matrix(w))
    assert got.shape == (37, cols)
    assert_planes(be, got, want.codes, want.scales)
    assert_planes(be, be.row_prefix(got, 20), want.codes[:20], want.scales[:20])


def test_coarse_copy_of_a_tall_head_in_default_pieces(cuda_backend):
    """70001 rows of 256 Q8_0 values: two pieces of the default staging size (65536 rows of 1 KB f32)."""
    be = cuda_backend
    w, _ = head_of("Q8_0", 70001, 256, np.random.default_rng(70001))
    got = be.coarse_copy(be.upload_matrix(w))
    want = REF.coarse_copy(REF.upload_matrix(w))
    assert_planes(be, got, want.codes, want.scales)


# -- the GEMV ---------------------------------------------------------------------------------------------------------

def gemv_device(be, xq: np.ndarray, xd: np.ndarray, codes: np.ndarray, scales: np.ndarray, dot: str) -> np.ndarray:
    """cmp_cq2_gemv on uploaded copies (each held by a name until the call returns: the arena hands a dropped
    temporary's block to the next upload)."""
    T, n = xq.shape
    N = codes.shape[0]
    q = be.from_host(np.ascontiguousarray(xq, np.int8), "i8")
    d = be.from_host(np.ascontiguousarray(xd, np.float32), "f32")
    c = be.from_host(np.ascontiguousarray(codes), "u8")
    s = be.from_host(np.ascontiguousarray(scales).view(np.uint8), "u8")
    y = be.empty((T, N), "f32")
    be.native.cmp_cq2_gemv(q.ptr, d.ptr, c.ptr, s.ptr, y.ptr, T, N, n, CMP_DOTS[dot])
    return be.to_host(y)


def gemv_inputs(T: int, N: int, n: int, seed: int):
    """Q8 activations of full range (every code -127 .. 127, scales of several magnitudes) and a CQ2 matrix."""
    rng = np.random.default_rng(seed)
    xq = rng.integers(-127, 128, (T, n)).astype(np.int8)
    xd = (10.0 ** rng.uniform(-3, 1, (T, n // 32))).astype(np.float32)
    w = (rng.standard_normal((N, n)) * 10.0 ** rng.uniform(-2, 1, (N, 1))).astype(np.float32)
    codes, scales = quantize_cq2(w)
    return xq, xd, codes, scales


def assert_gemv_close(got, xq, xd, codes, scales) -> None:
    """got = cq2_gemv to within 1e-5 of each output's sum of |block terms| (fp32 sums of exact block dots)."""
    want = cq2_gemv(xq, xd, codes, scales)
    T, n = xq.shape
    lv = np.abs(cq2_levels(codes)) * scales.astype(np.float64)[..., None]           # [N, nb, 32]
    bound = np.einsum("tbv,nbv->tn", np.abs(xq.astype(np.float64)).reshape(T, -1, 32) * xd[..., None], lv)
    assert got.shape == want.shape
    assert (np.abs(got.astype(np.float64) - want) <= 1e-5 * bound + 1e-30).all(), np.abs(got - want).max()


@pytest.mark.parametrize("T,N,n", [(1, 1, 32), (1, 7, 96), (2, 7, 96), (3, 17, 64), (4, 33, 4096), (1, 1001, 4096),
                                   (2, 300, 4128), (4, 61, 8192), (5, 19, 256), (9, 45, 128)])
def test_cq2_gemv_equals_reference(cuda_backend, T, N, n):
    """Every T of one launch (1..4) and more (5, 9: several launches, their rows of y apart), N of one row, under
    a warp's 4, not a multiple of a block's 16, rows of one block, of one round (4096: 4 blocks a lane) and of
    several (4128, 8192)."""
    xq, xd, codes, scales = gemv_inputs(T, N, n, T * N + n)
    assert_gemv_close(gemv_device(cuda_backend, xq, xd, codes, scales, "dp4a"), xq, xd, codes, scales)


@pytest.mark.parametrize("dot", INT8_DOTS)
@pytest.mark.parametrize("T", [1, 2, 4])
def test_cq2_gemv_routes_give_the_same_bits(cuda_backend, dot, T):
    """The int8 dot routes give the same integers, so the same bits as DP4A, and match the reference."""
    xq, xd, codes, scales = gemv_inputs(T, 77, 320, 5 + T)
    got = gemv_device(cuda_backend, xq, xd, codes, scales, dot)
    assert_gemv_close(got, xq, xd, codes, scales)
    np.testing.assert_array_equal(got, gemv_device(cuda_backend, xq, xd, codes, scales, "dp4a"))


def test_cq2_gemv_refuses_bad_shapes(cuda_backend):
    be = cuda_backend
    with pytest.raises(NativeError, match="cmp_cq2_gemv: bad shape"):
        be.native.cmp_cq2_gemv(None, None, None, None, None, 1, 4, 40, 0)
    with pytest.raises(NativeError, match="unknown int8 dot route"):
        y = be.empty((1, 4), "f32")
        be.native.cmp_cq2_gemv(y.ptr, y.ptr, y.ptr, y.ptr, y.ptr, 1, 4, 32, 7)


def test_coarse_logits_equal_numpy(cuda_backend):
    """CudaBackend.coarse_logits (the activations' Q8 blocks, then the GEMV) = numpy_ref's."""
    be, rng = cuda_backend, np.random.default_rng(11)
    w, _ = head_of("Q8_0", 211, 256, rng)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    ref_coarse = REF.coarse_copy(REF.upload_matrix(w))
    xd = up(be, x)
    got = be.to_host(be.coarse_logits(xd, be.coarse_copy(be.upload_matrix(w))))
    xq, dx = be.quantize(xd)
    assert_gemv_close(got, be.to_host(xq).astype(np.int8), be.to_host(dx), ref_coarse.codes, ref_coarse.scales)
    want = REF.coarse_logits(x, ref_coarse)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


# -- the candidates -----------------------------------------------------------------------------------------------

def topk_device(be, x: np.ndarray, k: int) -> np.ndarray:
    R, N = x.shape
    ids = be.empty((R, k), "i32")
    work = be.empty((max(1, be.native.topk_work_bytes(R, N, k)),), "u8")
    be.native.cmp_topk(up(be, x).ptr, ids.ptr, work.ptr, R, N, k)
    return be.ids_to_host(ids)


@pytest.mark.parametrize("R,N,k", [(1, 1, 1), (3, 5, 5), (2, 31, 1), (2, 33, 32), (4, 1023, 32), (4, 1024, 16),
                                   (4, 1025, 16), (2, 2047, 16), (2, 2048, 16), (3, 2049, 32), (7, 4099, 9),
                                   (1, 65537, 16), (1, 248320, 1), (2, 248320, 16), (4, 248320, 16),
                                   (2, 248320, 32), (1, 262144, 16), (3, 262145, 32), (1, 300007, 32)])
def test_topk_equals_numpy(cuda_backend, R, N, k):
    """Exactly numpy's ids in numpy's order: values of few levels (many ties, the lower id first), NaN (as -inf)
    and -inf sprinkled, a row's best at its end; sizes below a warp's slice (1024 values: one launch), of one slice
    and one + 1 (one merge), of 256 slices (one merge block) and 257 (two merge passes), and the vocabulary's."""
    rng = np.random.default_rng(N + k)
    x = (rng.integers(0, 40, (R, N)) / 4.0).astype(np.float32)
    x[rng.random((R, N)) < 0.01] = np.nan
    x[rng.random((R, N)) < 0.01] = -np.inf
    x[:, -1] = 11.0
    np.testing.assert_array_equal(topk_device(cuda_backend, x, k), top_ids(x, k))


def topk_pattern(kind: str, R: int, N: int, rng) -> np.ndarray:
    """[R, N] float32 rows that are hard for cmp_topk's thresholds (ties that crowd the best into few lanes or
    lists, padding-like rows) or for its order (NaN, -inf, signed zeros)."""
    j = np.arange(N)
    if kind == "equal":                                       # the k lowest ids, all from the first slice
        return np.zeros((R, N), np.float32)
    if kind == "nan":
        return np.full((R, N), np.nan, np.float32)
    if kind == "minus-inf":
        return np.full((R, N), -np.inf, np.float32)
    if kind == "ascending":                                   # the best at the row's end, in the last slice
        return np.tile(j.astype(np.float32), (R, 1))
    if kind == "descending":
        return np.tile(-j.astype(np.float32), (R, 1))
    if kind == "lane-periodic":                               # one lane of every slice holds all the best values
        return np.tile((j % 32 == 5) * 2.0 + (j % 32 == 9) * 1.0, (R, 1)).astype(np.float32)
    if kind == "few-real":                                    # fewer numbers than k, the rest -inf and NaN
        x = np.where(rng.random((R, N)) < 0.5, np.nan, -np.inf).astype(np.float32)
        x[:, rng.integers(0, N, 3)] = rng.standard_normal(3)
        return x
    if kind == "signed-zeros":                                # -0 == +0: ties by id
        return np.where(rng.random((R, N)) < 0.5, -0.0, 0.0).astype(np.float32) - (rng.random((R, N)) < 0.5)
    if kind == "normal":                                      # logits: what the thresholds are tuned for
        return rng.standard_normal((R, N)).astype(np.float32)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["equal", "nan", "minus-inf", "ascending", "descending", "lane-periodic", "few-real",
                                  "signed-zeros", "normal"])
@pytest.mark.parametrize("R,N,k", [(4, 248320, 16), (3, 248320, 32), (5, 300007, 32), (2, 1000, 1), (1, 40, 32)])
def test_topk_patterns_equal_numpy(cuda_backend, kind, R, N, k):
    """Exactly numpy's ids on rows built against cmp_topk's shortcuts: its thresholds assume the best values spread
    over the slices and lanes, and these crowd them (ties going to the lowest ids, one lane holding them all) or
    leave fewer numbers than k."""
    x = topk_pattern(kind, R, N, np.random.default_rng(N + k))
    np.testing.assert_array_equal(topk_device(cuda_backend, x, k), top_ids(x, k))


def test_topk_of_a_row_of_nan_and_minus_inf(cuda_backend):
    x = np.array([[np.nan, -np.inf, np.nan, -np.inf, 0.0]], np.float32)
    np.testing.assert_array_equal(topk_device(cuda_backend, x, 5), top_ids(x, 5))


def test_topk_refuses_bad_k(cuda_backend):
    be = cuda_backend
    for N, k in ((100, 33), (4, 5), (4, 0)):
        x, ids, work = up(be, np.zeros((1, N))), be.empty((1, 40), "i32"), be.empty((1 << 16,), "u8")
        with pytest.raises(NativeError, match="cmp_topk: bad shape"):
            be.native.cmp_topk(x.ptr, ids.ptr, work.ptr, 1, N, k)


# -- the rescoring ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("quantized", [True, False], ids=["q8-activations", "f32-activations"])
def test_rescore_picks_the_best_candidate(cuda_backend, quantized):
    """cmp_coarse_rescore on given candidates and rows: the best exact logit (of the activations as the head's
    GEMV sees them), the lower id of a tie wherever it stands, NaN passed over, a row of NaN -> its first
    candidate. Rows: 0 random, 1 a tie of ids 9 and 4 (9 listed first), 2 NaN in the best candidate, 3 all NaN."""
    be, rng = cuda_backend, np.random.default_rng(int(quantized))
    R, k, D = 4, 5, 96
    x = rng.standard_normal((R, D)).astype(np.float32)
    rows = rng.standard_normal((R, k, D)).astype(np.float32)
    cand = np.array([[7, 3, 12, 0, 5], [9, 1, 4, 2, 8], [6, 2, 4, 8, 10], [5, 6, 7, 8, 9]], np.int32)
    rows[1, 0] = rows[1, 2] = np.abs(rows[1]).max() * np.sign(x[1])      # ids 9 and 4: the same, the largest
    rows[2, 0, 3] = np.nan
    rows[3, :, 0] = np.nan
    xq, xd = be.quantize(up(be, x))
    if quantized:
        q, d = be.to_host(xq.view((R, D))), be.to_host(xd)
        xs = (q.reshape(R, D // 32, 32) * d[..., None]).reshape(R, D).astype(np.float64)
    else:
        xs = x.astype(np.float64)
    logits = np.einsum("rd,rkd->rk", xs, rows.astype(np.float64))
    out = be.empty((R,), "i32")
    # bound, so that each input keeps its own block until the ids are read back (tests/test_temporary_tensors.py)
    x_d, rows_d, cand_d = up(be, x), up(be, rows.reshape(R * k, D)), be.from_host(cand, "i32")
    be.native.cmp_coarse_rescore(xq.ptr if quantized else None, xd.ptr if quantized else None, x_d.ptr, 0,
                                 rows_d.ptr, cand_d.ptr, out.ptr, R, k, D)
    got = be.ids_to_host(out).tolist()
    assert got == [best_of(logits[r], cand[r]) for r in range(R)]
    assert got[1] == 4 and got[3] == 5


# -- the op -----------------------------------------------------------------------------------------------------------

def assert_same_choice(got, want, exact_logits) -> None:
    """got (device ids) = want (the reference's) but where the two ids' exact logits are a near tie."""
    for r, (g, w) in enumerate(zip(got, want)):
        if g != w:
            row = exact_logits[r]
            assert abs(row[g] - row[w]) <= NEAR_TIE * np.abs(row).max(), (r, g, w, row[g], row[w])


@pytest.mark.parametrize("kind,cols", [("Q8_0", 256), ("Q6_K", 256), ("Q4_K", 256), ("F32", 64), ("F16", 96)])
@pytest.mark.parametrize("R,k", [(1, 1), (3, 16), (16, 32)])
def test_coarse_argmax_equals_numpy(cuda_backend, kind, cols, R, k):
    """coarse_argmax on a head of 997 rows (prime) of each kind, the coarse copies made by each backend: the same
    ids as the reference (near ties aside), and where the exact argmax is among the k, the exact argmax."""
    be, rng = cuda_backend, np.random.default_rng(R * k + cols)
    w, _ = head_of(kind, 997, cols, rng)
    x = rng.standard_normal((R, cols)).astype(np.float32)
    ref_exact = REF.upload_matrix(w)
    ref_coarse = REF.coarse_copy(ref_exact)
    want = REF.coarse_argmax(x, ref_coarse, ref_exact, k)
    exact = be.upload_matrix(w)
    got = be.ids_to_host(be.coarse_argmax(up(be, x), be.coarse_copy(exact), exact, k)).tolist()
    logits = REF.matmuls(x, [ref_exact])[0].astype(np.float64)
    assert_same_choice(got, want.tolist(), logits)
    inside = [r for r in range(R) if argmax_rows(logits)[r] in top_ids(REF.coarse_logits(x, ref_coarse), k)[r]]
    assert_same_choice([got[r] for r in inside], argmax_rows(logits)[inside].tolist(), logits[inside])


def test_coarse_argmax_over_a_vocabulary_of_rows(cuda_backend):
    """The real vocabulary's row count (248320, cols 64): cmp_topk's merge passes inside the op, the out buffer
    written in place."""
    be, rng = cuda_backend, np.random.default_rng(248320)
    w, _ = head_of("Q8_0", 248320, 64, rng)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    ref_exact = REF.upload_matrix(w)
    want = REF.coarse_argmax(x, REF.coarse_copy(ref_exact), ref_exact, 16)
    exact = be.upload_matrix(w)
    out = be.zeros((3,), "i32", "ids")
    be.coarse_argmax(up(be, x), be.coarse_copy(exact), exact, 16, out=out.rows(1, 2))
    got = be.ids_to_host(out).tolist()
    assert got[0] == 0
    assert_same_choice(got[1:], want.tolist(), REF.matmuls(x, [ref_exact])[0].astype(np.float64))


# -- the MTP draft through it --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lms(tmp_path_factory, tiny_vocab, cuda_backend):
    made = {}

    def get(shape="small"):
        if shape not in made:
            path = write_model(tmp_path_factory.mktemp("coarsec") / f"{shape}.gguf", replace(SHAPES[shape], mtp=True),
                               "q8_0", tiny_vocab)
            made[shape] = load_model(path, cuda_backend)
        return made[shape]
    return get


@pytest.fixture(scope="module")
def lm(lms):
    return lms("small")


def coarse(lm, k: int = 16, min_rows: int = 1) -> CoarseHead:
    return CoarseHead(k, lm.model.mtp.head.shape[0], min_rows)


def _prefilled(lm, sp, prompt, n_ctx=64):
    st, ms = lm.backend.new_state(lm.cfg, n_ctx), sp.new_seq(n_ctx)
    sp.prefill(st, ms, lm.tokenizer.encode(prompt))
    return st, ms


@pytest.mark.parametrize("n_max", [1, 3])
def test_draft_graph_with_the_coarse_head_equals_eager_draft(lm, n_max):
    """The captured draft rounds (the coarse GEMV, top-k, rescoring inside the graph) against the eager ones on
    twin sequences: the same drafted ids every step, and the draft head is the coarse one."""
    be = lm.backend
    try:
        eager = Speculator(lm.model, n_max, graphs=False, coarse=coarse(lm))
        graphed = Speculator(lm.model, n_max, coarse=coarse(lm))
        assert lm.model.mtp.draft_coarse is not None
        a, b = _prefilled(lm, eager, PROMPTS[2]), _prefilled(lm, graphed, PROMPTS[2])
        t0 = 17
        for keep in (1, n_max + 1, 1):
            da = eager.draft([(a[0], a[1], t0)])
            db = graphed.draft([(b[0], b[1], t0)])
            assert db == da and len(db[0]) == n_max
            la, ha, (va,) = eager.verify([(a[0], a[1], t0, da[0])])
            lb, hb, (vb,) = graphed.verify([(b[0], b[1], t0, db[0])])
            eager.commit(va, ha, keep)
            graphed.commit(vb, hb, keep)
            t0 = int(np.argmax(be.to_host(la)[keep - 1]))
        assert graphed.graphs.n_captured >= 2
    finally:
        lm.model.set_draft_coarse(0)


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("n_max,k", [(1, 1), (3, 16), (4, 32)])
def test_greedy_with_the_coarse_head_equals_mtp_off_cuda(lm, n_max, k, graphs):
    """Token for token MTP off's output with the draft through the coarse head (k = 1: the coarse argmax alone),
    draft and verify as CUDA graphs or eager."""
    try:
        for prompt in PROMPTS[:3]:
            off, _ = _greedy(lm, prompt, 32)
            c = _client(lm, n_max, graphs=None if graphs else False)
            c.engine.spec.set_coarse(coarse(lm, k))
            c.history = list(lm.tokenizer.encode(prompt))
            on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=32)).tokens
            assert on == off, prompt
            sp = c.engine.spec
            assert sp.n_drafted > 0 and sp.coarse is not None and lm.model.mtp.draft_coarse is not None
            if graphs:
                assert isinstance(sp.graphs, SpecGraphs) and sp.graphs.n_replayed > 0
            else:
                assert sp.graphs is None
    finally:
        lm.model.set_draft_coarse(0)


def test_auto_heads_with_the_coarse_head_equal_mtp_off_cuda(lms):
    """--spec-draft-vocab auto switching mid-generation (test_draft_vocab_auto's constants, on the tiny fixture of
    test_draft_vocab_cuda's auto test, whose tokens cross them) with a coarse head for the whole vocabulary only
    (min_rows above the prefix): each head drafts through its own captured graphs, the output is MTP off's."""
    from test_draft_vocab_auto import PROMPTS as AUTO_PROMPTS
    from test_draft_vocab_auto import crossing
    lm, switched = lms("tiny"), 0
    try:
        for prompt in AUTO_PROMPTS:
            off, _ = _greedy(lm, prompt, 48, n_ctx=256)
            auto = crossing(off)
            if auto is None:
                continue
            c = _client(lm, 3, n_ctx=256)
            sp = c.engine.spec = Speculator(lm.model, 3, adaptive=False, auto=auto,
                                            coarse=coarse(lm, 16, auto.prefix + 1))
            c.history = list(lm.tokenizer.encode(prompt))
            on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=48)).tokens
            assert on == off, prompt
            assert sp.vocab.n_switches >= 2 and {key[0] for key in sp.graphs._draft} == {"prefix", "whole"}
            switched += 1
    finally:
        lm.model.set_draft_vocab(0)
        lm.model.set_draft_coarse(0)
    assert switched >= 1


def test_a_draft_batch_of_several_sequences(lm):
    """Two sequences drafting in one round (R = 2 rows into the coarse GEMV, top-k and rescoring): the drafts of
    the graph path equal the eager path's."""
    try:
        eager = Speculator(lm.model, 2, graphs=False, coarse=coarse(lm))
        graphed = Speculator(lm.model, 2, coarse=coarse(lm))
        a = [_prefilled(lm, eager, p) for p in PROMPTS[:2]]
        b = [_prefilled(lm, graphed, p) for p in PROMPTS[:2]]
        graphed.prepare(b)
        for _ in range(2):
            da = eager.draft([(st, ms, 17) for st, ms in a])
            db = graphed.draft([(st, ms, 17) for st, ms in b])
            assert db == da
            for (st, ms), (st2, ms2), d, d2 in zip(a, b, da, db):
                _, ha, (va,) = eager.verify([(st, ms, 17, d)])
                _, hb, (vb,) = graphed.verify([(st2, ms2, 17, d2)])
                eager.commit(va, ha, 1)
                graphed.commit(vb, hb, 1)
    finally:
        lm.model.set_draft_coarse(0)


def test_draft_ids_equal_the_reference_model(tmp_path, tiny_vocab, cuda_backend):
    """The head's draft ids through the coarse head on both backends, same file and inputs: equal (near ties aside,
    judged on the reference's exact logits)."""
    path = write_model(tmp_path / "small.gguf", replace(SHAPES["small"], mtp=True), "q8_0", tiny_vocab)
    out = []
    for be in (NumpyBackend(), cuda_backend):
        lm = load_model(path, be)
        lm.model.set_draft_coarse(16, lm.model.mtp.head.shape[0], 1)
        h = be.upload_vector(np.random.default_rng(3).standard_normal((5, lm.cfg.n_embd)).astype(np.float32))
        ids, _ = lm.model.mtp_forward(StepBatch.build([(lm.model.mtp_state(16), [5, 9, 200, 31, 77])],
                                                      all_logits=True), h, draft_ids=True)
        lm.model.set_draft_coarse(0)
        logits, _ = lm.model.mtp_forward(StepBatch.build([(lm.model.mtp_state(16), [5, 9, 200, 31, 77])],
                                                         all_logits=True), h)
        out.append((be.ids_to_host(ids).tolist(), be.to_host(logits).astype(np.float64)))
    (want, ref_logits), (got, _) = out
    for r, (g, w) in enumerate(zip(got, want)):
        assert g == w or abs(ref_logits[r, g] - ref_logits[r, w]) <= 2e-2 * np.abs(ref_logits[r]).max()
