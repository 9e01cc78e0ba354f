"""MTP speculative decoding on the CUDA backend against the numpy reference: the rewind kernels (conv and gdn with
per-token states kept on the device), concat, the head's forward, the captured draft and verify graphs
(backends/spec_graphs.py) against their eager runs, and greedy output with MTP on == off, graphs on and off."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cuda_helpers import rel, up
from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.backends.spec_graphs import SpecGraphs
from llamacmp.engine.scheduler import Engine, EngineConfig
from llamacmp.engine.speculative import Speculator
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model
from llamacmp.spec import SpecConfig
from test_mtp import (PROMPTS, _greedy, adaptive_scheduler_on_equals_off, beside_prompt_on_equals_off,
                      mtp_fill_and_forward_states, plain_rounds_on_equals_off, scheduler_greedy_on_equals_off)

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def lms(tmp_path_factory, tiny_vocab, cuda_backend):
    made = {}

    def get(shape="tiny"):
        if shape not in made:
            path = write_model(tmp_path_factory.mktemp("mtpc") / f"{shape}.gguf", replace(SHAPES[shape], mtp=True),
                               "q8_0", tiny_vocab)
            made[shape] = (load_model(path, NumpyBackend()), load_model(path, cuda_backend))
        return made[shape]
    return get


@pytest.mark.parametrize("axis", [0, 1])
def test_concat(cuda_backend, axis):
    rng = np.random.default_rng(axis)
    shapes = [(3, 64), (3, 32), (3, 1)] if axis else [(1, 40), (5, 40), (2, 40)]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = cuda_backend.to_host(cuda_backend.concat([up(cuda_backend, x) for x in xs], axis))
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))


@pytest.mark.parametrize("width", [40, 41])
def test_concat_of_many_rows_is_one_table(cuda_backend, width):
    """concat along rows from CONCAT_TABLE_MIN pieces on (the MTP head's catch-up: 256 single hidden rows per
    sequence), the one cmp_copy_regions launch, equals numpy: 302 pieces of 1-3 rows, and exactly CONCAT_TABLE_MIN.
    Rows of 41 floats put pieces at offsets that are not 16-byte aligned (the kernel's 4-byte path)."""
    be = cuda_backend
    rng = np.random.default_rng(width)
    for counts in ([1] * 300 + [3, 2], [2] * be.CONCAT_TABLE_MIN):
        xs = [rng.standard_normal((c, width)).astype(np.float32) for c in counts]
        got = be.to_host(be.concat([up(be, x) for x in xs], 0))
        np.testing.assert_array_equal(got, np.concatenate(xs, axis=0))


def test_copy_rows_is_a_copy_of_its_own(cuda_backend):
    """Backend.copy_rows (a verify graph's kept h rows, a plain step's rows): the numpy slice's values, in a block
    of its own that keeps them when the source is rewritten."""
    be = cuda_backend
    x = np.arange(5 * 8, dtype=np.float32).reshape(5, 8)
    t = up(be, x)
    c = be.copy_rows(t, 1, 3)
    assert c.shape == (3, 8) and c.ptr != t.row_ptr(1)
    be.copy_from_host(t, np.zeros_like(x))
    np.testing.assert_array_equal(be.to_host(c), x[1:4])
    np.testing.assert_array_equal(NumpyBackend().copy_rows(x, 1, 3), x[1:4])
    with pytest.raises(ValueError, match="rows 4 .. 5 of a tensor of 5"):
        be.copy_rows(t, 4, 2)


def test_write_rows_into_a_tensor(cuda_backend):
    """Backend.write_rows (commit's kept h rows into the sequence's ring): the rows land where numpy's slice
    assignment puts them, the rest stays, and the view it returns reads them; out of range or another row shape is
    refused."""
    be = cuda_backend
    ring, h = np.zeros((6, 8), np.float32), np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    r, t = up(be, ring), up(be, h)
    got = be.write_rows(r, 3, t, 1, 2)
    want = ring.copy()
    want[3:5] = h[1:3]
    np.testing.assert_array_equal(be.to_host(r), want)
    np.testing.assert_array_equal(be.to_host(got), h[1:3])
    assert got.ptr == r.row_ptr(3)
    np.testing.assert_array_equal(NumpyBackend().write_rows(ring, 3, h, 1, 2), h[1:3])
    np.testing.assert_array_equal(ring, want)
    with pytest.raises(ValueError, match="rows 5 .. 6 of a tensor of 6"):
        be.write_rows(r, 5, t, 1, 2)
    with pytest.raises(ValueError, match="write_rows"):
        be.write_rows(r, 0, up(be, np.zeros((2, 4), np.float32)), 0, 2)


def test_rows_are_views_that_keep_their_block(cuda_backend):
    """Backend.rows (the plain step's hidden rows, one per sequence, of one gathered copy): the numpy slice's values,
    the same memory, and the block stays allocated while a view lives after its tensor is dropped."""
    be = cuda_backend
    x = np.arange(5 * 8, dtype=np.float32).reshape(5, 8)
    t = up(be, x)
    v = be.rows(t, 2, 3)
    np.testing.assert_array_equal(be.to_host(v), x[2:5])
    assert v.ptr == t.row_ptr(2)
    in_use = be.arena.in_use
    del t
    assert be.arena.in_use == in_use
    np.testing.assert_array_equal(be.to_host(be.concat([v], 0)), x[2:5])
    with pytest.raises(ValueError, match="rows 2 .. 3 of a tensor of 3"):
        be.rows(v, 2, 2)


@pytest.mark.parametrize("shape", ["tiny", "small", "heads"])
@pytest.mark.parametrize("L,k", [(1, 1), (2, 1), (3, 2), (4, 1), (4, 3), (4, 4), (5, 2)])
def test_keep_steps_and_restore_equal_numpy(lms, shape, L, k):
    """A keep_steps batch on both backends, then restore_steps(k): conv and ssm states equal the reference's, and
    equal (bit for bit on CUDA) feeding only the first k tokens one at a time through the decode path. The shapes'
    state sizes: Dk 16, 32 and 128 (the real models'); the kernel alone: test_kernels_cuda's
    test_gdn_keep_equals_decode_steps."""
    ref, dev = lms(shape)
    prompt, more = [3, 14, 15, 92, 6], [65, 35, 89, 79, 32][:L]
    states = []
    for lm in (ref, dev):
        st = lm.backend.new_state(lm.cfg, 32)
        lm.model.forward(StepBatch.build([(st, prompt)]))
        b = StepBatch.build([(st, more)], all_logits=True)
        b.keep_steps = len(more)
        lm.model.forward(b)
        lm.backend.restore_steps(st, k)
        st.n_past = len(prompt) + k
        states.append(lm.backend.state_to_host(st))
    alone = dev.backend.new_state(dev.cfg, 32)
    dev.model.forward(StepBatch.build([(alone, prompt)]))
    for t in more[:k]:
        dev.model.forward(StepBatch.build([(alone, [t])]))
    alone = dev.backend.state_to_host(alone)
    for name in ("conv", "ssm"):
        for a, b, c in zip(states[0][name], states[1][name], alone[name]):
            assert rel(b, a) < 1e-4, name
            np.testing.assert_array_equal(b, c)


def test_mtp_forward_equals_numpy(lms):
    ref, dev = lms("small")
    toks = [5, 9, 200, 31, 77]
    h = np.random.default_rng(3).standard_normal((len(toks), ref.cfg.n_embd)).astype(np.float32)
    out = []
    for lm in (ref, dev):
        st = lm.model.mtp_state(16)
        logits, h_out = lm.model.mtp_forward(StepBatch.build([(st, toks)], all_logits=True),
                                             lm.backend.upload_vector(h))
        out.append((lm.backend.to_host(logits), lm.backend.to_host(h_out)))
    assert rel(out[1][0], out[0][0]) < 2e-2 and rel(out[1][1], out[0][1]) < 2e-2


@pytest.mark.parametrize("shape,kv_type", [("tiny", "f16"), ("small", "f16"), ("small", "q8_0")])
def test_mtp_fill_writes_what_mtp_forward_writes_cuda(lms, shape, kv_type):
    """mtp_fill's K and V rows are mtp_forward's byte for byte on the device too, through the round-1 kernels' write
    (tiny: head dim 32) and the v2 kernels' (small: 64, f16 and quantized); and they are the reference's rows."""
    ref, dev = lms(shape)
    be = dev.backend
    filled, forwarded, _ = mtp_fill_and_forward_states(dev, kv_type, kv_type)
    want, _, _ = mtp_fill_and_forward_states(ref, kv_type, kv_type)
    for a, b, w in zip(filled, forwarded, want):
        assert a.n_past == b.n_past == w.n_past
        for x, y in ((a.k[0], b.k[0]), (a.v[0], b.v[0])):
            assert np.array_equal(be.kv_rows_raw(x, a.n_past), be.kv_rows_raw(y, b.n_past))
        got, exp = be.state_to_host(a), ref.backend.state_to_host(w)
        assert rel(got["k"][0], exp["k"][0]) < 2e-2 and rel(got["v"][0], exp["v"][0]) < 2e-2


def _check_graphs(c, graphs: bool) -> None:
    """The Speculator ran the captured graphs (graphs on) or had none (off): the parametrization is not vacuous."""
    g = c.engine.spec.graphs
    if graphs:
        assert isinstance(g, SpecGraphs) and g.n_captured > 0 and g.n_replayed > 0
    else:
        assert g is None


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("n_max", [1, 2, 3, 4])
def test_greedy_mtp_on_equals_off_cuda(lms, n_max, graphs):
    """Token for token on the CUDA backend, with the real head and with oracle drafts (long accepted runs,
    rejections mid-batch rewound on the device); draft and verify as CUDA graphs or eager."""
    _, dev = lms("small")
    mode = None if graphs else False
    for seed, prompt in enumerate(PROMPTS):
        off, _ = _greedy(dev, prompt, 40)
        on, c = _greedy(dev, prompt, 40, n_max, graphs=mode)
        assert on == off, prompt
        _check_graphs(c, graphs)
        on, c = _greedy(dev, prompt, 40, n_max, [dev.tokenizer.encode(prompt) + off], seed, graphs=mode)
        assert on == off, prompt
        assert c.engine.spec.n_accepted > 0
        _check_graphs(c, graphs)


def test_greedy_mtp_graphs_to_the_context_end_cuda(lms):
    """A context that ends mid-generation: graph steps while 1 + n_max rows fit, eager ones after; = MTP off."""
    _, dev = lms("small")
    prompt = PROMPTS[1]
    n_ctx = len(dev.tokenizer.encode(prompt)) + 30
    off, _ = _greedy(dev, prompt, 29, n_ctx=n_ctx)
    on, c = _greedy(dev, prompt, 29, 3, [dev.tokenizer.encode(prompt) + off], n_ctx=n_ctx)
    assert on == off
    _check_graphs(c, True)


def test_scheduler_greedy_mtp_graphs_cuda(lms):
    """Three slots (one of them with n_probs, decoding the plain way): draft and verify graphs of several
    sequences, draft shapes captured the second time; every stream equals MTP off."""
    _, dev = lms("small")
    engine = scheduler_greedy_on_equals_off(dev, None)
    assert isinstance(engine.spec.graphs, SpecGraphs) and engine.spec.graphs.n_replayed > 0


def test_plain_rounds_through_the_hidden_decode_graph_cuda(lms):
    """Adaptive drafting's plain rounds (a scripted policy: runs of plain steps, then drafts of 3, 1, 2) on the
    CUDA graphs: the decode graph that also gives the hidden state, draft and verify graphs of every length; the
    output equals MTP off."""
    _, dev = lms("small")
    c, _ = plain_rounds_on_equals_off(dev, None)
    g, dg = c.engine.spec.graphs, c.engine.decoder.graphs
    assert isinstance(g, SpecGraphs) and {key[0] for key in g._verify} == {1, 2, 3}
    assert dg.hidden and dg.n_replayed > 0


def test_adaptive_scheduler_cuda(lms):
    """Four slots drafting adaptively on the CUDA graphs (the policy's own timings): every stream = MTP off."""
    _, dev = lms("small")
    engine = adaptive_scheduler_on_equals_off(dev, None)
    assert engine.spec.graphs.n_replayed > 0


def test_no_draft_beside_a_prompt_chunk_cuda(lms):
    """Requests arriving while others decode on the CUDA graphs: no round drafts beside a prompt chunk, nothing
    of those steps is timed, every stream equals MTP off."""
    _, dev = lms("small")
    beside_prompt_on_equals_off(dev, None)


def test_hidden_decode_graph_gives_the_decode_logits_cuda(lms):
    """A decode graph made with hidden=True: the logits bit for bit the plain graph's (twin states), h the
    eager forward_hidden's."""
    from llamacmp.engine.decode import Decoder
    _, dev = lms("small")
    be = dev.backend
    plain, hidden = Decoder(dev, max_graphs=1), Decoder(dev, max_graphs=1, hidden=True)
    prompt = dev.tokenizer.encode(PROMPTS[0])
    twins = []
    for _ in range(3):
        st = be.new_state(dev.cfg, 64)
        dev.model.forward(StepBatch.build([(st, prompt)]))
        twins.append(st)
    for tok in (11, 12, 13):                       # eager, captured, replayed
        la = be.to_host(plain.decode([twins[0]], [tok]))
        lb, h = hidden.decode_hidden([twins[1]], [tok])
        np.testing.assert_array_equal(be.to_host(lb), la)
        with be.decode_order():
            _, h_ref = dev.model.forward_hidden(StepBatch.build([(twins[2], [tok])]))
        assert rel(be.to_host(h), be.to_host(h_ref)) < 1e-5
    assert hidden.graphs.n_replayed > 0


def _prefilled(lm, sp, prompt, n_ctx=64):
    st, ms = lm.backend.new_state(lm.cfg, n_ctx), sp.new_seq(n_ctx)
    sp.prefill(st, ms, lm.tokenizer.encode(prompt))
    return st, ms


@pytest.mark.parametrize("n_max", [1, 3])
def test_verify_graph_equals_eager_verify(lms, n_max):
    """The captured verify against Speculator's eager one (decode_order) on twin states, over two steps (the second
    replay at other positions, after a rewind): logits and h bit for bit, the device argmax = the logits' argmax,
    the recurrent states after restore_steps equal."""
    _, dev = lms("small")
    be = dev.backend
    eager, graphed = Speculator(dev.model, n_max, graphs=False), Speculator(dev.model, n_max)
    a, b = _prefilled(dev, eager, PROMPTS[0]), _prefilled(dev, graphed, PROMPTS[0])
    rng = np.random.default_rng(n_max)
    for k in (1, n_max + 1):                      # keep 1 token (rewind n_max), then all
        t0, drafts = int(rng.integers(0, 300)), [int(x) for x in rng.integers(0, 300, n_max)]
        la, ha, (va,) = eager.verify([(a[0], a[1], t0, drafts)])
        lb, hb, (vb,) = graphed.verify([(b[0], b[1], t0, drafts)])
        assert va.greedy is None and vb.greedy is not None
        la, lb = be.to_host(la), be.to_host(lb)
        np.testing.assert_array_equal(lb, la)
        np.testing.assert_array_equal(be.to_host(hb), be.to_host(ha))
        assert vb.greedy == [int(i) for i in np.argmax(la, axis=1)]
        eager.commit(va, ha, k)
        graphed.commit(vb, hb, k)
        assert a[0].n_past == b[0].n_past
        sa, sb = be.state_to_host(a[0]), be.state_to_host(b[0])
        for name in ("conv", "ssm"):
            for x, y in zip(sa[name], sb[name]):
                np.testing.assert_array_equal(y, x)
    assert graphed.graphs.n_captured == 1 and graphed.graphs.n_replayed == 1


@pytest.mark.parametrize("prepared", [False, True])
@pytest.mark.parametrize("rounds", [((3, 4), (1, 1), (2, 1), (2, 3), (3, 2)), ((1, 1), (2, 1), (3, 1), (2, 2))])
def test_verify_graphs_of_every_length_equal_eager_verify(lms, rounds, prepared):
    """Adaptive drafting's verifies: one Speculator of n_max 3 verifying drafts of 3, 1 and 2 in turn (each length
    its own graph, captured mid-run or all up front), some rejected: every round's logits are the eager verify's
    bit for bit and the recurrent states after commit equal (adaptive greedy output with plain rounds once left
    MTP off at the first replay of the n = 2 graph)."""
    _, dev = lms("small")
    be = dev.backend
    eager, graphed = Speculator(dev.model, 3, graphs=False), Speculator(dev.model, 3)
    a, b = _prefilled(dev, eager, PROMPTS[0]), _prefilled(dev, graphed, PROMPTS[0])
    if prepared:
        graphed.graphs.prepare([b[0]], [b[1].state], lengths=(1, 2, 3), catch_ups=(1,))
    rng = np.random.default_rng(7)
    for i, (n, keep) in enumerate(rounds):
        t0, drafts = int(rng.integers(0, 300)), [int(x) for x in rng.integers(0, 300, n)]
        la, ha, (va,) = eager.verify([(a[0], a[1], t0, drafts)], n)
        lb, hb, (vb,) = graphed.verify([(b[0], b[1], t0, drafts)], n)
        la, lb = be.to_host(la), be.to_host(lb)
        assert np.array_equal(lb, la), f"round {i} (n {n}): max |diff| {np.abs(lb - la).max(axis=1)}"
        eager.commit(va, ha, keep)
        graphed.commit(vb, hb, keep)
        sa, sb = be.state_to_host(a[0]), be.state_to_host(b[0])
        for name in ("conv", "ssm"):
            for layer, (x, y) in enumerate(zip(sa[name], sb[name])):
                assert np.array_equal(y, x), f"round {i} (n {n}, keep {keep}): {name} state of layer {layer}"
    assert {key[0] for key in graphed.graphs._verify} == {n for n, _ in rounds}


@pytest.mark.parametrize("n_max", [1, 3, 4])
def test_draft_graph_equals_eager_draft(lms, n_max):
    """The captured draft rounds against the eager ones on twin sequences, over steps whose catch-up lengths
    differ (each its own graph): the same drafted ids, the head's KV cache rows equal."""
    _, dev = lms("small")
    be = dev.backend
    eager, graphed = Speculator(dev.model, n_max, graphs=False), Speculator(dev.model, n_max)
    a, b = _prefilled(dev, eager, PROMPTS[2]), _prefilled(dev, graphed, PROMPTS[2])
    t0 = 17
    for keep in (1, n_max + 1, 2 if n_max > 1 else 1):
        da = eager.draft([(a[0], a[1], t0)])
        db = graphed.draft([(b[0], b[1], t0)])
        assert db == da and len(db[0]) == n_max
        assert a[1].state.n_past == b[1].state.n_past
        n = a[1].state.n_past
        ka, kb = be.state_to_host(a[1].state), be.state_to_host(b[1].state)
        np.testing.assert_array_equal(kb["k"][0][:n], ka["k"][0][:n])
        la, ha, (va,) = eager.verify([(a[0], a[1], t0, da[0])])
        lb, hb, (vb,) = graphed.verify([(b[0], b[1], t0, db[0])])
        eager.commit(va, ha, keep)
        graphed.commit(vb, hb, keep)
        t0 = int(np.argmax(be.to_host(la)[keep - 1]))
    assert graphed.graphs.n_captured >= 2


@pytest.mark.parametrize("n_max", [1, 3])
@pytest.mark.parametrize("B", [1, 2])
def test_fused_step_equals_draft_then_verify_cuda(lms, n_max, B):
    """Speculator.step on the graphs (the drafted ids passed to the verify on the device, a 2-D copy per sequence or
    per round, whichever are fewer; read back with the argmax in one copy) against draft() then verify() on twin
    sequences: the same drafts, logits bit for bit, the same row argmax."""
    _, dev = lms("small")
    be = dev.backend
    split, fused = Speculator(dev.model, n_max), Speculator(dev.model, n_max)
    a = [_prefilled(dev, split, p) for p in PROMPTS[:B]]
    b = [_prefilled(dev, fused, p) for p in PROMPTS[:B]]
    fused.prepare(b)                  # every catch-up shape of these sequences captured: no eager fallback
    t0s = [17] * B
    for keep in (1, n_max + 1):
        da = split.draft([(st, ms, t) for (st, ms), t in zip(a, t0s)])
        la, ha, va = split.verify([(st, ms, t, d) for (st, ms), t, d in zip(a, t0s, da)])
        replayed = fused.graphs.n_replayed
        db, lb, hb, vb = fused.step([(st, ms, t) for (st, ms), t in zip(b, t0s)])
        assert fused.graphs.n_replayed == replayed + 2          # the draft and the verify graph
        assert db == da and [v.greedy for v in vb] == [v.greedy for v in va]
        np.testing.assert_array_equal(be.to_host(lb), be.to_host(la))
        for x, y in zip(va, vb):
            split.commit(x, ha, keep)
            fused.commit(y, hb, keep)
        t0s = [v.greedy[keep - 1] for v in va]


def test_bench_mtp_rows_cuda(tmp_path, tiny_vocab, cuda_backend):
    """llamacmp-bench's MTP rows on the GPU: plain rounds through the greedy step graph that also gives h, drafted
    rounds through SpecGraphs.step; at length n_max + 1 every draft is accepted (a round may draft fewer than n_max:
    probes, the policy). How many rounds draft is the policy's choice from wall-clock costs (a tiny model beside 11
    other test workers may rightly step plainly in most rounds: 42% drafted on 2026-12-02 22:36), so it is not
    asserted here; test_draft_policy.py checks the choice on given costs."""
    import io
    import json
    from llamacmp.cli import bench
    path = write_model(tmp_path / "small-mtp.gguf", replace(SHAPES["small"], mtp=True), "q8_0", tiny_vocab)
    out, err = io.StringIO(), io.StringIO()
    rc = bench.main(["-m", str(path), "-p", "0", "-n", "64", "-r", "2", "-o", "json", "--spec-type", "draft-mtp",
                     "--spec-synth-len", "1,4"], out, err)
    assert rc == 0, err.getvalue()
    never, always = json.loads(out.getvalue())
    assert never["draft_n_accepted"] == 0 and never["spec_mean_len"] == 1.0, never
    assert always["draft_n_accepted"] == always["draft_n"] > 0, always
    assert 1.0 < always["spec_mean_len"] <= 4.0 and 0 < always["spec_draft_share"] <= 1, always


def test_server_engine_keeps_every_slot_s_draft_shapes_cuda(lms):
    """-np 4: the engine's draft graphs hold each slot's n_max x (n + 2) shapes and one more list's worth, so a
    server whose requests take its slots in turn (LRU) captures each slot's shapes once (Speculator.start)."""
    _, lm = lms()
    engine = Engine(lm, EngineConfig(n_slots=4, n_ctx_slot=128, spec=SpecConfig(type="draft-mtp", n_max=3)))
    assert isinstance(engine.spec.graphs, SpecGraphs)
    assert engine.spec.graphs.draft_room == (4 + 1) * (3 + 4 + 5)
