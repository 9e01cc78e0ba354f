"""The CUDA decode path: graphs per set of sequences (backends/cuda_graphs.py), sampling on the device
(Backend.sample_rows through engine/decode.py), and batch invariance: a sequence's greedy tokens do not depend on
which other sequences share its decode steps (issue 5: every completed greedy stream equals the request alone)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.engine.decode import Decoder, draw_tokens
from llamacmp.engine.scheduler import Engine, EngineConfig
from llamacmp.engine.tasks import CompletionTask, ErrorResult, FinalResult, GenParams
from llamacmp.loader import load_model
from llamacmp.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.cuda

SETTINGS = [dict(), dict(temp=0.7, top_k=200, top_p=0.9, min_p=0.02, min_keep=3),
            dict(temp=1.3, top_k=1024, top_p=0.5, min_p=0.0), dict(temp=0.9, min_p=0.6),
            dict(temp=0.8, penalty_repeat=1.3, penalty_freq=0.4, penalty_present=0.2, penalty_last_n=16),
            dict(temp=0.0), dict(temp=0.0, penalty_repeat=1.5, penalty_last_n=8, logit_bias={1: 2.0}),
            dict(temp=0.6, ignore_eos=True), dict(top_k=0)]      # the last: whole vocabulary, on the host


@pytest.fixture(scope="module")
def lms(fixture_gguf, cuda_backend):
    made = {}

    def get(shape, dtype="q8_0"):
        if shape not in made:
            path = fixture_gguf(shape, dtype)
            made[shape] = (load_model(path, NumpyBackend()), load_model(path, cuda_backend))
        return made[shape]
    return get


@pytest.mark.parametrize("N", [1, 97, 248320])
def test_sample_rows_seeded_streams_equal_host_sampler(cuda_backend, N):
    """Every row of one call keeps its own settings; seeded streams equal the host chain (float64) token for
    token. Where the float32 device sums and the float64 host sums fall on either side of a boundary they could
    differ; these seeds have none (the numpy mirror of the kernel, tested on CPU, shows the same)."""
    rng = np.random.default_rng(N)
    eog = frozenset({N - 1}) if N > 1 else frozenset()
    host = [Sampler(SamplingParams(seed=i, **kw), eog) for i, kw in enumerate(SETTINGS)]
    dev = [Sampler(SamplingParams(seed=i, **kw), eog) for i, kw in enumerate(SETTINGS)]
    for step in range(12):
        x = (rng.standard_normal((len(SETTINGS), N)) * 3).astype(np.float32)
        x[:, :4] = x.max(axis=1, keepdims=True)           # ties at the top: the lower id first
        want = [s.sample(x[i]) for i, s in enumerate(host)]
        got = draw_tokens(cuda_backend, cuda_backend.from_host(x, "f32"), dev)
        assert got == want, f"step {step}"
        for i in range(len(SETTINGS)):
            host[i].accept(want[i])
            dev[i].accept(got[i])
    assert [s.rng.random() for s in host] == [s.rng.random() for s in dev]


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_graph_rows_do_not_depend_on_the_batch(lms, shape):
    """Decode graphs over 11 sequences (more than one GEMV launch of rows), over 3, and over each alone give
    bitwise the same logits per sequence; and they agree with the numpy reference."""
    ref, dev = lms(shape)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(0, dev.cfg.n_vocab, n)] for n in (5, 9, 17, 3, 30, 12, 7, 21, 2, 11, 64)]

    def run(groups):
        dec = Decoder(dev, max_graphs=4)
        states = [dev.backend.new_state(dev.cfg, 640) for _ in prompts]
        for st, p in zip(states, prompts):
            dec.prefill(st, p)
        out = {}
        for step in range(3):
            for g in groups:
                logits = dev.backend.to_host(dec.decode([states[i] for i in g], [(7 * i + step) % 50 for i in g]))
                for r, i in enumerate(g):
                    out[i, step] = logits[r]
        graphs = dec.graphs
        # one group: step 0 eager, step 1 captured, step 2 replayed; alternating groups always run eagerly
        assert (graphs.n_captured, graphs.n_replayed) == ((1, 1) if len(groups) == 1 else (0, 0))
        return out

    n = len(prompts)
    together = run([list(range(n))])                     # eager, then graph: 11 rows (two GEMV launches)
    some = run([[0, 4, 10], [1, 2, 3, 5, 6, 7, 8, 9]])     # eager
    alone = run([[i] for i in range(n)])                  # eager, one row
    for key in together:
        assert np.array_equal(together[key], alone[key]), key
        assert np.array_equal(some[key], alone[key]), key
    # and a graph over one sequence replays what its eager step computed
    single = run([[4]])
    for step in range(3):
        assert np.array_equal(single[4, step], alone[4, step])
    # the graph computes the model: sequence 0 against the reference
    st = ref.backend.new_state(ref.cfg, 640)
    ref_dec = Decoder(ref)
    ref_dec.prefill(st, prompts[0])
    want = ref_dec.decode([st], [0])[0]
    tol = 6e-2 if shape == "small" else 1e-2
    assert np.linalg.norm(alone[0, 0] - want) / np.linalg.norm(want) < tol


def _complete(engine, prompts, params_list):
    done, results = threading.Event(), {}
    lock = threading.Lock()

    def sink_for(i):
        def sink(r):
            if isinstance(r, (FinalResult, ErrorResult)):
                with lock:
                    results[i] = r
                    if len(results) == len(prompts):
                        done.set()
        return sink
    for i, (p, gp) in enumerate(zip(prompts, params_list)):
        engine.submit(CompletionTask(list(p), gp, sink_for(i)))
    assert done.wait(300), "engine did not finish"
    out = []
    for i in range(len(prompts)):
        r = results[i]
        assert isinstance(r, FinalResult), getattr(r, "message", r)
        out.append(r.tokens)
    return out


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_concurrent_greedy_streams_equal_alone(lms, shape):
    """12 greedy requests on 10 slots (prompts of different lengths, so slots join and leave the decode set at
    different steps, and two wait for a free slot) give the tokens each gives alone; seeded sampled requests too."""
    _, dev = lms(shape)
    rng = np.random.default_rng(9)
    prompts = [[int(t) for t in rng.integers(0, dev.cfg.n_vocab, n)] for n in
               (3, 40, 7, 90, 15, 5, 64, 22, 9, 31, 2, 50)]

    def params(i):
        kw = dict(temp=0.0) if i % 3 else dict(seed=100 + i, temp=0.9)
        return GenParams(sampling=SamplingParams(**kw), n_predict=10 + 3 * (i % 5), cache_prompt=False)
    engine = Engine(dev, EngineConfig(n_slots=10, n_ctx_slot=256, cache_ram_mib=0))
    engine.start()
    try:
        alone = [_complete(engine, [p], [params(i)])[0] for i, p in enumerate(prompts)]
        together = _complete(engine, prompts, [params(i) for i in range(len(prompts))])
    finally:
        engine.stop()
    assert together == alone
    assert engine.metrics.n_busy_slots_total > engine.metrics.n_decode_total   # steps really were shared


def test_cli_client_greedy_on_graphs_equals_reference(lms):
    """The CLIs' slot (engine/client.py) decodes through a graph and draws on the device: tiny Q8_0 greedy tokens
    equal the numpy backend's for 32 steps."""
    from llamacmp.engine.client import SlotClient
    from llamacmp.run_plan import RunPlan
    ref, dev = lms("tiny")
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, ref.cfg.n_vocab, 12)]
    out = []
    for lm in (ref, dev):
        c = SlotClient(lm, RunPlan(128, 1, "f16", "f16", 2048, 512))
        c.history = list(prompt)
        out.append(c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), 32)).tokens)
    assert len(out[0]) == 32 and out[0] == out[1]


@pytest.mark.parametrize("Dk,K,V,S", [(16, 2, 4, 1), (16, 2, 4, 3), (32, 1, 3, 5), (64, 2, 2, 2), (128, 16, 32, 16),
                                      (128, 2, 4, 17)])
def test_rows_kernels_equal_one_launch_per_sequence(cuda_backend, Dk, K, V, S):
    """cmp_gdn_rows / cmp_conv1d_silu_rows (a decode batch in one launch, CudaBackend.gdn_rows) give bitwise what
    one cmp_gdn / cmp_conv1d_silu launch per sequence gives: outputs and every sequence's updated state."""
    be, nat = cuda_backend, cuda_backend.native
    rng = np.random.default_rng(Dk * 7 + S)
    C, kernel = (2 * K + V) * Dk, 4
    qkv = rng.normal(0, 1, (S, C)).astype(np.float32)
    g = -np.abs(rng.normal(0, 0.5, (S, V))).astype(np.float32)
    b = rng.uniform(0, 1, (S, V)).astype(np.float32)
    w = rng.normal(0, 0.5, (C, kernel)).astype(np.float32)
    ssm0 = rng.normal(0, 0.3, (S, V, Dk, Dk)).astype(np.float32)
    conv0 = rng.normal(0, 1, (S, kernel - 1, C)).astype(np.float32)
    x_d, qkv_d, g_d, b_d, w_d = (be.from_host(a, "f32") for a in (qkv, qkv, g, b, w))

    def run(rows: bool):
        ssm = [be.from_host(ssm0[s], "f32") for s in range(S)]
        conv = [be.from_host(conv0[s], "f32") for s in range(S)]
        o, out = be.empty((S, V * Dk)), be.empty((S, C))
        if rows:
            tab = lambda ts: be.from_host(np.array([t.ptr for t in ts], np.uint64).view(np.uint8), "u8")  # noqa: E731
            ssm_t, conv_t = tab(ssm), tab(conv)
            nat.cmp_conv1d_silu_rows(x_d.ptr, w_d.ptr, conv_t.ptr, out.ptr, S, C, kernel)
            nat.cmp_gdn_rows(qkv_d.ptr, g_d.ptr, b_d.ptr, ssm_t.ptr, o.ptr, S, K, V, Dk, 1e-6)
        else:
            for s in range(S):
                nat.cmp_conv1d_silu(x_d.row_ptr(s), w_d.ptr, conv[s].ptr, out.row_ptr(s), 1, C, kernel)
                nat.cmp_gdn(qkv_d.row_ptr(s), g_d.row_ptr(s), b_d.row_ptr(s), ssm[s].ptr, o.row_ptr(s), 1, K, V, Dk,
                            1e-6)
        return (be.to_host(o), be.to_host(out), [be.to_host(t) for t in ssm], [be.to_host(t) for t in conv])
    one, each = run(True), run(False)
    assert np.array_equal(one[0], each[0]) and np.array_equal(one[1], each[1])
    for s in range(S):
        assert np.array_equal(one[2][s], each[2][s]) and np.array_equal(one[3][s], each[3][s]), s
    assert not np.array_equal(one[2][0], ssm0[0])           # the states did move


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_graph_rows_launches_give_the_same_logits(lms, shape):
    """Decode graphs (and eager steps) with the one-launch conv / GDN (gdn_rows) give bitwise the logits of one
    launch per sequence, over 11 sequences and 3 steps."""
    _, dev = lms(shape)
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(0, dev.cfg.n_vocab, n)] for n in (5, 9, 17, 3, 30, 12, 7, 21, 2, 11, 64)]

    def run(rows: bool):
        saved, dev.backend.gdn_rows = dev.backend.gdn_rows, rows
        try:
            dec = Decoder(dev, max_graphs=2)
            states = [dev.backend.new_state(dev.cfg, 640) for _ in prompts]
            for st, p in zip(states, prompts):
                dec.prefill(st, p)
            out = [dev.backend.to_host(dec.decode(states, [(7 * i + step) % 50 for i in range(len(states))]))
                   for step in range(3)]
            assert (dec.graphs.n_eager, dec.graphs.n_captured, dec.graphs.n_replayed) == (1, 1, 1)
            return out
        finally:
            dev.backend.gdn_rows = saved
    on, off = run(True), run(False)
    for step in range(3):
        assert np.array_equal(on[step], off[step]), step


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_small_kernels_with_pdl_give_the_same_logits(lms, shape):
    """CudaBackend.launch_pdl (the small kernels start while the one before drains, and wait for it before touching
    memory) changes no arithmetic: prefill logits and 4 decode steps over 6 sequences, eager and in replayed
    graphs, bitwise those of plain launches; stale inputs (a kernel reading before its producer finished) would not
    be."""
    _, dev = lms(shape)
    be = dev.backend
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(0, dev.cfg.n_vocab, n)] for n in (5, 40, 3, 17, 64, 9)]

    def run():
        dec = Decoder(dev, max_graphs=2)
        states = [be.new_state(dev.cfg, 640) for _ in prompts]
        out = [be.to_host(dec.prefill(st, p)) for st, p in zip(states, prompts)]
        out += [be.to_host(dec.decode(states, [(5 * i + step) % 50 for i in range(len(states))]))
                for step in range(4)]
        assert (dec.graphs.n_eager, dec.graphs.n_captured, dec.graphs.n_replayed) == (1, 1, 2)
        return out

    saved = be.launch_pdl
    try:
        be.launch_pdl = True
        if not be.launch_pdl:
            pytest.skip("PDL needs compute_90+ code on an sm_90+ GPU (this library or GPU is older)")
        on = run()
        be.launch_pdl = False
        off = run()
    finally:
        be.launch_pdl = saved
    for i, (a, b) in enumerate(zip(on, off)):
        assert np.array_equal(a, b), i
