"""MTP speculative decoding on the numpy reference: the head's forward, the recurrent-state rewind, and that
draft-and-verify changes nothing in the output (greedy: token for token; sampled: in distribution)."""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend, rms_normalize, sigmoid, silu
from llamacmp.engine.client import SlotClient
from llamacmp.engine.scheduler import Engine, EngineConfig
from llamacmp.engine.tasks import CompletionTask, GenParams
from llamacmp.engine.draft_policy import DraftPolicy
from llamacmp.engine.speculative import Speculator, SpecUnsupported, speculative_choice
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model
from llamacmp.sampling import Sampler, SamplingParams
from llamacmp.spec import SpecConfig
from llamacmp.weights import load_weights

PROMPTS = ("def foo(x):", "class Parser:\n    ", "import os\nimport sys\n", "x")


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory, tiny_vocab):
    return write_model(tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf", replace(SHAPES["tiny"], mtp=True), "q8_0",
                       tiny_vocab)


@pytest.fixture(scope="module")
def lm(mtp_path):
    return load_model(mtp_path, NumpyBackend())


# -- the head's forward -------------------------------------------------------------------------------------------

def test_mtp_forward_matches_a_plain_composition(tmp_path, tiny_vocab):
    """One token at position 0 (attention over a single key returns its value, so no rotary or softmax enters):
    the MTP forward equals the formula of llama.cpp's graph_mtp written out with float64 numpy, own head tensors."""
    path = write_model(tmp_path / "f32.gguf", replace(SHAPES["tiny"], mtp=True, mtp_own=True), "f32", tiny_vocab)
    lm = load_model(path, NumpyBackend())
    w = load_weights(lm.gguf, lm.cfg).mtp
    cfg, eps, tok = lm.cfg, lm.cfg.rms_eps, 7
    h = np.random.default_rng(1).standard_normal((1, cfg.n_embd)).astype(np.float32)

    def norm(x, g):
        return rms_normalize(np.asarray(x, np.float64), eps) * g

    b, a = w.block, w.block.attn
    x = np.concatenate([norm(w.embed[tok][None], w.enorm), norm(h, w.hnorm)], axis=1) @ w.eh_proj.T
    xn = norm(x, b.attn_norm)
    qg = (xn @ a.attn_q.T).reshape(cfg.n_head, 2, cfg.head_dim)
    v = (xn @ a.attn_v.T).reshape(cfg.n_head_kv, cfg.head_dim)
    o = np.repeat(v, cfg.n_head // cfg.n_head_kv, axis=0) * sigmoid(qg[:, 1])       # softmax over one key = 1
    x = x + o.reshape(1, -1) @ a.attn_output.T
    xn = norm(x, b.post_attention_norm)
    x = x + (silu(xn @ b.ffn_gate.T) * (xn @ b.ffn_up.T)) @ b.ffn_down.T
    hs = norm(x, w.head_norm)
    want = hs @ w.head.T

    st = lm.model.mtp_state(8, "f32")       # (an f16 cache would round v)
    logits, h_out = lm.model.mtp_forward(StepBatch.build([(st, [tok])]), h)
    assert st.n_past == 1
    np.testing.assert_allclose(h_out, hs, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(logits[0], want[0], rtol=1e-4, atol=1e-4)


def test_mtp_forward_batch_equals_token_by_token(lm):
    """The head's KV cache: a batch of positions gives what feeding them one at a time gives."""
    rng = np.random.default_rng(2)
    toks = [5, 9, 200, 31, 77]
    h = rng.standard_normal((len(toks), lm.cfg.n_embd)).astype(np.float32)
    st = lm.model.mtp_state(16)
    b = StepBatch.build([(st, toks)], all_logits=True)
    all_logits, all_h = lm.model.mtp_forward(b, h)
    st2 = lm.model.mtp_state(16)
    for i, t in enumerate(toks):
        lg, ho = lm.model.mtp_forward(StepBatch.build([(st2, [t])]), h[i:i + 1])
        np.testing.assert_allclose(lg[0], all_logits[i], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ho[0], all_h[i], rtol=1e-5, atol=1e-5)


def mtp_fill_and_forward_states(lm, k_type: str, v_type: str):
    """Three MTP states at different positions (0, 2 and 3 rows in) run one batch of a segment each, once by
    mtp_fill and once by mtp_forward with no output rows -> (the states after mtp_fill, after mtp_forward, the rows
    each had before). (also run on CUDA by tests/test_mtp_cuda.py)"""
    be, rng = lm.backend, np.random.default_rng(4)
    before, toks = [[], [5, 9], [200, 31, 77]], [[3, 14, 15], [92], [65, 35]]
    h0 = [rng.standard_normal((len(t), lm.cfg.n_embd)).astype(np.float32) for t in before[1:]]
    h = rng.standard_normal((sum(map(len, toks)), lm.cfg.n_embd)).astype(np.float32)
    out = []
    for run in (lm.model.mtp_fill, lm.model.mtp_forward):
        states = [lm.model.mtp_state(16, k_type, v_type) for _ in toks]
        lm.model.mtp_forward(StepBatch.build(list(zip(states[1:], before[1:]))), be.upload_vector(np.concatenate(h0)))
        batch = StepBatch.build(list(zip(states, toks)))
        batch.output_rows = np.zeros(0, np.int32)
        run(batch, be.upload_vector(h))
        out.append(states)
    return out[0], out[1], [len(t) for t in before]


@pytest.mark.parametrize("k_type,v_type", [("f16", "f16"), ("q8_0", "q4_0")])
def test_mtp_fill_writes_what_mtp_forward_writes(lm, k_type, v_type):
    """mtp_fill (the head's catch-ups) leaves the MTP states exactly as mtp_forward with no output rows does: every
    cache row the same bits, the same n_past, for a batch of segments at different positions."""
    filled, forwarded, n0 = mtp_fill_and_forward_states(lm, k_type, v_type)
    for a, b, n in zip(filled, forwarded, n0):
        assert a.n_past == b.n_past > n
        assert np.any(a.k[0][n:a.n_past] != 0) and np.any(a.v[0][n:a.n_past] != 0)     # (rows were written)
        assert np.array_equal(a.k[0], b.k[0]) and np.array_equal(a.v[0], b.v[0])


def test_catch_ups_write_the_head_cache_without_the_block(lm, monkeypatch):
    """The head's catch-ups of queued pairs (_catch_up of several sequences, _head_over_queue of a prompt) only
    write its KV rows (Backend.kv_write through mtp_fill): no attention over the context, no MLP, and of the
    attention's inputs k alone (key_prep: no q, no gate)."""
    sp = Speculator(lm.model, 3)
    seqs = [sp.new_seq(64) for _ in PROMPTS[:3]]
    for ms, p in zip(seqs, PROMPTS):
        sp.prefill(lm.backend.new_state(lm.cfg, 64), ms, lm.tokenizer.encode(p), defer=True)
    calls = Counter()
    for obj, name in ((lm.backend, "attention"), (lm.backend, "kv_write"), (lm.model, "_mlp"),
                      (lm.backend, "attention_prep"), (lm.backend, "key_prep")):
        fn = getattr(obj, name)
        monkeypatch.setattr(obj, name, lambda *a, fn=fn, name=name, **k: calls.update([name]) or fn(*a, **k))
    queued = [len(ms.pending) for ms in seqs]
    sp._catch_up(seqs[:2], 0)
    assert calls == {"kv_write": 1, "key_prep": 1}
    sp._head_over_queue(seqs[2])
    assert calls == {"kv_write": 2, "key_prep": 2}
    assert [(ms.state.n_past, len(ms.pending)) for ms in seqs] == [(n, 0) for n in queued]


def test_key_prep_is_the_normed_rotated_key(lm):
    """The reference's key_prep (attention_prep's k: it takes it from key_prep) against the formula written out
    here: each k head RMS-normed times k_norm, then its NeoX pairs (i, i + n_rot/2) rotated by p * base^(-2i/n_rot),
    the dims past n_rot as they are; with four equal image position ids (IMROPE) exactly the text rotation."""
    be, cfg = lm.backend, lm.cfg
    rng = np.random.default_rng(5)
    T, Hk, Dh, half = 7, cfg.n_head_kv, cfg.head_dim, cfg.n_rot // 2
    k = rng.standard_normal((T, Hk * Dh)).astype(np.float32)
    kn = rng.standard_normal(Dh).astype(np.float32)
    pos = np.arange(40, 40 + T, dtype=np.int32)
    x = k.reshape(T, Hk, Dh).astype(np.float64)
    x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.rms_eps) * kn
    want = x.copy()
    for t in range(T):
        for i in range(half):
            th = pos[t] * cfg.rope_base ** (-2.0 * i / cfg.n_rot)
            a, b = x[t, :, i], x[t, :, i + half]
            c, s = math.cos(th), math.sin(th)
            want[t, :, i], want[t, :, i + half] = a * c - b * s, a * s + b * c
    batch = StepBatch.build([(be.new_state(cfg, 64), list(range(T)))])
    batch.positions = pos
    text = be.key_prep(k, kn, batch, cfg)
    assert text.shape == (T, Hk, Dh) and text.dtype == np.float32
    assert np.allclose(text, want, rtol=1e-5, atol=1e-5) and not np.allclose(text, x, atol=1e-3)   # (rotated)
    batch.rope_pos = np.repeat(pos[:, None], 4, axis=1)
    assert np.array_equal(be.key_prep(k, kn, batch, cfg), text)


# -- rewind of the recurrent state ------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 4])
def test_restore_steps_equals_running_only_k_tokens(lm, k):
    """A keep_steps batch of L tokens then restore_steps(k): conv and ssm states equal those after feeding only
    the first k tokens (per op: conv1d_silu and gdn both keep theirs); KV rows past n_past are not looked at."""
    be, cfg = lm.backend, lm.cfg
    prompt, more = [3, 14, 15, 92], [65, 35, 89, 79]
    a = be.new_state(cfg, 32)
    lm.model.forward(StepBatch.build([(a, prompt)]))
    batch = StepBatch.build([(a, more)], all_logits=True)
    batch.keep_steps = len(more)
    lm.model.forward(batch)
    assert a.steps is not None and len(a.steps["conv"]) == len(cfg.gdn_layers) == len(a.steps["ssm"])
    be.restore_steps(a, k)
    a.n_past = len(prompt) + k
    assert a.steps is None
    b = be.new_state(cfg, 32)
    lm.model.forward(StepBatch.build([(b, prompt)]))
    for t in more[:k]:
        lm.model.forward(StepBatch.build([(b, [t])]))
    for name in ("conv", "ssm"):
        for x, y in zip(getattr(a, name), getattr(b, name)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    # and the next token's logits agree
    la = lm.model.forward(StepBatch.build([(a, [11])]))
    lb = lm.model.forward(StepBatch.build([(b, [11])]))
    np.testing.assert_allclose(la, lb, rtol=1e-5, atol=1e-5)


def test_restore_steps_refuses_bad_k(lm):
    be = lm.backend
    st = be.new_state(lm.cfg, 16)
    with pytest.raises(ValueError, match="no keep_steps batch"):
        be.restore_steps(st, 1)
    batch = StepBatch.build([(st, [1, 2, 3])], all_logits=True)
    batch.keep_steps = 3
    lm.model.forward(batch)
    with pytest.raises(ValueError, match="k=4 outside 1..3"):
        be.restore_steps(st, 4)


# -- draft and verify ----------------------------------------------------------------------------------------------

class OracleSpeculator(Speculator):
    """Drafts mostly from a reference continuation (the plain greedy output), sometimes a random id: long accepted
    runs and rejections in the middle of a verify batch. The slot's history (its cached tokens + t0) picks the
    reference that continues it."""

    def __init__(self, engine, n_max, refs, rng, p_wrong=0.3):
        super().__init__(engine.model, n_max)
        self.engine, self.refs, self.rng, self.p_wrong = engine, refs, rng, p_wrong

    def _step_graph(self, items, n, while_running=None):
        return None                  # the drafts are replaced on the host: draft() and verify() one after the other

    def draft(self, items, n=None, graphs=True):
        out = super().draft(items, n, graphs)
        for (st, _, t0), d in zip(items, out):
            slot = next(s for s in self.engine.slots if s.state is st)
            hist = list(slot.cache.tokens) + [t0]
            ref = next((r for r in self.refs if r[:len(hist)] == hist), [])
            for i in range(len(d)):
                ok = len(hist) + i < len(ref) and self.rng.random() > self.p_wrong
                d[i] = ref[len(hist) + i] if ok else int(self.rng.integers(0, 300))
        return out


def spy_drafts(sp, graphs, seen) -> None:
    """sp (a Speculator) drafts through EagerSpecGraphs (graphs true: its graph path, run eagerly) or its eager
    path, and calls seen(out) with each draft call's ids (None where a call drafted nothing)."""
    sp.graphs = EagerSpecGraphs(sp.model, sp.n_max) if graphs else None
    owner = sp.graphs if graphs else sp
    inner = owner.draft

    def draft(*a, **kw):
        out = inner(*a, **kw)
        seen(out)
        return out
    owner.draft = draft


class EagerSpecGraphs:
    """backends/spec_graphs.SpecGraphs' contract run eagerly on any backend, so that the Speculator's graph path
    (n_max drafts chained on the head's argmax, a verify of exactly 1 + n_max rows with padding, the rows' argmax
    handed to accept_tokens) is tested on the numpy reference; tests/test_mtp_cuda.py runs the real graphs."""

    def __init__(self, model, n: int):
        self.model, self.be, self.n = model, model.be, n
        self.n_draft = self.n_verify = self.n_declined = 0
        self.lengths = []                                   # the draft length of each draft and verify
        self._asked = set()
        self.prepared = []                                  # prepare()'s arguments
        self.heads = []                                     # set_head()'s arguments (--spec-draft-vocab auto)

    def set_head(self, head):
        self.heads.append(head)        # (eager: each draft reads the model's head as it is; SpecGraphs keys by it)

    def draft(self, states, tokens, h_parts, n=None):
        be, model, n = self.be, self.model, n or self.n
        assert 1 <= n <= self.n and all(len(t) <= n + 2 for t in tokens), (n, tokens)   # the graphs' shapes
        self.lengths.append(n)
        key = (n,) + tuple(id(s) for s in states) + tuple(len(t) for t in tokens)
        if len(states) > 1 and key not in self._asked:      # SpecGraphs captures a shape of several the 2nd time
            self._asked.add(key)
            self.n_declined += 1
            return None
        batch = StepBatch.build(list(zip(states, tokens)))
        ids, h = model.mtp_forward(batch, be.concat([x for xs in h_parts for x in xs], axis=0), draft_ids=True)
        out = [[int(i)] for i in be.ids_to_host(ids)]
        h = be.gather_rows(h, batch.output_rows)
        for _ in range(n - 1):
            ids, h = model.mtp_forward(StepBatch.build([(s, [o[-1]]) for s, o in zip(states, out)]), h,
                                       draft_ids=True)
            for o, i in zip(out, be.ids_to_host(ids)):
                o.append(int(i))
        self.n_draft += 1
        return out

    def step(self, states, mtp_states, t0s, tokens, h_parts, n, while_running=None):
        drafts = self.draft(mtp_states, tokens, h_parts, n)
        if drafts is None:
            return None
        out = self.verify(states, [[t0] + d for t0, d in zip(t0s, drafts)])
        if while_running is not None:
            while_running()
        return (drafts,) + out

    def verify(self, states, tokens):
        assert len({len(t) for t in tokens}) == 1 and len(tokens[0]) <= self.n + 1, tokens
        self.lengths.append(len(tokens[0]) - 1)
        batch = StepBatch.build(list(zip(states, tokens)), all_logits=True)
        batch.keep_steps = self.n + 1
        logits, h = self.model.forward_hidden(batch)
        self.n_verify += 1
        return logits, h, np.argmax(self.be.to_host(logits), axis=1).astype(np.int32)

    def prepare(self, states, mtp_states, lengths=None, catch_ups=None, stop=None):
        self.prepared.append((list(states), list(mtp_states), tuple(lengths or ()), catch_ups))


def _client(lm, n_max=None, refs=None, seed=0, p_wrong=0.3, n_ctx=128, graphs=None, adaptive=False):
    """The CLIs' one-slot client of the scheduler, MTP on with n_max (oracle drafts when refs are given).
    graphs: None the backend's own (CUDA graphs on CUDA), False none (eager), "eager-double" EagerSpecGraphs.
    adaptive: the draft policy chooses each round's length (False: n_max every round, as these tests count)."""
    spec = SpecConfig(type="draft-mtp", n_max=n_max) if n_max else SpecConfig()
    c = SlotClient(lm, SimpleNamespace(n_ctx=n_ctx, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                       spec=spec))
    if refs is not None:
        c.engine.spec = OracleSpeculator(c.engine, n_max, refs, np.random.default_rng(seed), p_wrong)
    if c.engine.spec is not None and graphs is not None:
        c.engine.spec.graphs = EagerSpecGraphs(lm.model, n_max) if graphs == "eager-double" else None
    if c.engine.spec is not None and not adaptive:
        c.engine.spec.policy = None
    return c


def _greedy(lm, prompt, n, n_max=None, refs=None, seed=0, graphs=None, n_ctx=128):
    """-> (the n greedy tokens after `prompt`, the client)."""
    c = _client(lm, n_max, refs, seed, n_ctx=n_ctx, graphs=graphs)
    c.history = list(lm.tokenizer.encode(prompt))
    return c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=n)).tokens, c


@pytest.mark.parametrize("n_max", [1, 2, 3, 4])
def test_greedy_mtp_on_equals_off(lm, n_max):
    for prompt in PROMPTS[:2]:
        off, _ = _greedy(lm, prompt, 24)
        on, c = _greedy(lm, prompt, 24, n_max)
        assert on == off, prompt
        assert c.engine.spec.n_drafted > 0


@pytest.mark.parametrize("n_max", [1, 2, 3, 4])
def test_greedy_with_accepted_drafts_equals_off(lm, n_max):
    """Drafts that are mostly right (the oracle): several tokens accepted per step, rejections in the middle of
    a verify batch rewound; the output stays the plain greedy one."""
    for seed, prompt in enumerate(PROMPTS):
        off, plain = _greedy(lm, prompt, 30)
        on, c = _greedy(lm, prompt, 30, n_max, [lm.tokenizer.encode(prompt) + off], seed)
        assert on == off, prompt
        assert c.engine.spec.n_accepted > 5 and c.engine.spec.n_accepted < c.engine.spec.n_drafted
        assert c.perf.n_eval == plain.perf.n_eval            # tokens through the target, counted as decodes


@pytest.mark.parametrize("n_max", [1, 3, 4])
def test_graph_path_greedy_equals_off(lm, n_max):
    """The Speculator's graph path (EagerSpecGraphs standing in for the CUDA graphs) with the real head and with
    oracle drafts: token for token the plain greedy output; and the graphs were what ran."""
    for seed, prompt in enumerate(PROMPTS[:3]):
        off, _ = _greedy(lm, prompt, 24)
        on, c = _greedy(lm, prompt, 24, n_max, graphs="eager-double")
        g = c.engine.spec.graphs
        assert on == off, prompt
        assert g.n_draft > 0 and g.n_verify > 0
        assert c.engine.spec.n_drafted == n_max * g.n_draft          # every graph draft gives n_max ids
        on, c = _greedy(lm, prompt, 24, n_max, [lm.tokenizer.encode(prompt) + off], seed, graphs="eager-double")
        assert on == off, prompt
        assert c.engine.spec.n_accepted > 0 and c.engine.spec.graphs.n_verify > 0


P_MIN_CUTS = 0.15     # the random head's top-10 probability is above it at some rows, below at others


def test_graph_path_pads_short_drafts_and_leaves_graphs_at_the_context_end(lm):
    """Drafts cut by p_min are verified by the graph of 1 + n_max rows (padded); near the end of the context (no
    room for 1 + n_max rows) the step runs eagerly: the output is the plain greedy one either way."""
    prompt = PROMPTS[1]
    n_ctx = len(lm.tokenizer.encode(prompt)) + 30
    off, _ = _greedy(lm, prompt, 29, n_ctx=n_ctx)
    c = _client(lm, 3, n_ctx=n_ctx)
    sp = c.engine.spec = Speculator(lm.model, 3, p_min=P_MIN_CUTS, adaptive=False)
    for slot in c.engine.slots:
        slot.mtp = sp.new_seq(n_ctx)
    sp.graphs = g = EagerSpecGraphs(lm.model, 3)
    graphed = []                                       # the fewest real drafts of each verify the graph ran

    def verify(seqs, n=None, while_running=None, verify=sp.verify):
        n0 = g.n_verify
        out = verify(seqs, n, while_running)
        if g.n_verify > n0:
            graphed.append(min(len(d) for *_, d in seqs))
        return out
    sp.verify = verify
    c.history = list(lm.tokenizer.encode(prompt))
    on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=29)).tokens
    assert on == off
    assert 0 < g.n_verify < c.engine.perf.draft.steps  # the last steps ran eagerly
    assert min(graphed) < 3 and max(graphed) == 3      # padded and full graph verifies
    assert g.n_draft == 0                              # p_min needs each row's top-10 on the host: eager drafts


def test_head_cache_equals_one_pass_over_the_accepted_tokens(lm):
    """After steps with rejections, the head's KV rows hold what one pass over the final sequence gives (each
    token with the target's hidden state of the token before: llama.cpp's process() pairing)."""
    prompt = lm.tokenizer.encode(PROMPTS[0])
    off, _ = _greedy(lm, PROMPTS[0], 20)
    _, c = _greedy(lm, PROMPTS[0], 20, 3, [prompt + off], seed=5)
    slot = c.engine.slots[0]
    n_decoded = slot.state.n_past
    toks = c.history[:n_decoded]
    ms = slot.mtp
    n = ms.state.n_past
    assert n >= len(prompt) and n + len(ms.pending) == n_decoded
    st = lm.backend.new_state(lm.cfg, 128)
    _, h = lm.model.forward_hidden(StepBatch.build([(st, toks)], all_logits=True))
    hin = np.concatenate([np.zeros((1, lm.cfg.n_embd), np.float32), h[:-1]])
    ref = lm.model.mtp_state(128)
    lm.model.mtp_forward(StepBatch.build([(ref, toks)]), hin)
    np.testing.assert_allclose(ms.state.k[0][:n].astype(np.float32), ref.k[0][:n].astype(np.float32), atol=2e-3)
    np.testing.assert_allclose(ms.state.v[0][:n].astype(np.float32), ref.v[0][:n].astype(np.float32), atol=2e-3)


@pytest.mark.parametrize("graphs", [False, "eager-double"])
def test_kept_rows_ring_starts_over_and_the_head_stays_one_pass(lm, graphs, monkeypatch):
    """commit() writes each round's kept h rows into the sequence's ring right after the last ones
    (Speculator._keep); at 2 rounds of room it starts over every few rounds: the output is MTP off's and the head's
    KV rows still hold one pass over the sequence (each token with the h of the token before)."""
    from llamacmp.engine import speculative
    monkeypatch.setattr(speculative, "KEPT_ROUNDS", 2)
    prompt = lm.tokenizer.encode(PROMPTS[0])
    off, _ = _greedy(lm, PROMPTS[0], 40)
    kept = []
    keep = speculative.Speculator._keep
    monkeypatch.setattr(speculative.Speculator, "_keep",
                        lambda self, ms, h, row, j: kept.append(ms.kept_at + j) or keep(self, ms, h, row, j))
    on, c = _greedy(lm, PROMPTS[0], 40, 3, [prompt + off], seed=5, graphs=graphs)
    assert on == off
    assert c.engine.slots[0].mtp.kept.shape[0] == 8 and sum(end > 8 for end in kept) > 2     # it started over
    _assert_head_is_one_pass(lm, c, prompt)


class ScriptedPolicy(DraftPolicy):
    """A draft policy whose rounds follow a script of lengths (0: plain), cycled: plain runs of several rounds
    (so the heads catch up over more rows than a draft graph takes), then each draft length."""

    def __init__(self, n_max, script=(0, 0, 0, 0, 0, 0, 3, 0, 1, 2, 0, 0, 3, 3)):
        super().__init__(n_max)
        self.script, self.i = script, 0
        self.lefts = []                  # the tokens left the driver said with each choice

    def choose(self, accs, others=0, best=None, left=None):
        self.lefts.append(left)
        self.i += 1
        return min(self.script[(self.i - 1) % len(self.script)], self.n_max)


def test_plain_steps_queue_at_most_pending_max(lm):
    """Plain steps queue the head's (token, h) pairs; at Speculator.pending_max they run through the head at once
    (memory stays bounded when a sequence never drafts), and the head's KV rows are still one pass over the
    sequence."""
    prompt = lm.tokenizer.encode(PROMPTS[0])
    off, _ = _greedy(lm, PROMPTS[0], 30)
    c = _client(lm, 3, adaptive=True)
    sp = c.engine.spec
    sp.pending_max = 3
    sp.policy = ScriptedPolicy(3, script=(0,) * 8 + (3,))
    seen = []
    observe = sp.observe_plain
    sp.observe_plain = lambda items, h: (observe(items, h), seen.extend(len(ms.pending) for _, ms, _, _ in items))
    c.history = list(prompt)
    on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=30)).tokens
    assert on == off and len(seen) > 10 and max(seen) < 3 and 0 in seen
    _assert_head_is_one_pass(lm, c, prompt)


@pytest.mark.parametrize("graphs", [None, "eager-double"])
def test_plain_rounds_keep_the_head_in_step(lm, graphs):
    """Rounds that decode plainly (the policy's choice) feed the head the target's hidden states: after a run of
    plain, short and full rounds the head's KV rows are still one pass over the sequence, and the output is the
    plain greedy one. On the graph path every draft's catch-up fits a draft graph (EagerSpecGraphs asserts it)."""
    c, prompt = plain_rounds_on_equals_off(lm, graphs)
    if graphs:
        assert set(c.engine.spec.graphs.lengths) == {1, 2, 3}
    _assert_head_is_one_pass(lm, c, prompt)


def _assert_head_is_one_pass(lm, c, prompt):
    """The slot's MTP KV rows equal one head pass over the sequence so far (h of the row before each token)."""
    slot = c.engine.slots[0]
    toks, ms = c.history[:slot.state.n_past], slot.mtp
    n = ms.state.n_past
    assert n >= len(prompt) + 20 and n + len(ms.pending) == len(toks)
    st = lm.backend.new_state(lm.cfg, 128)
    _, h = lm.model.forward_hidden(StepBatch.build([(st, toks)], all_logits=True))
    ref = lm.model.mtp_state(128)
    lm.model.mtp_forward(StepBatch.build([(ref, toks)]), np.concatenate([np.zeros((1, lm.cfg.n_embd), np.float32),
                                                                         h[:-1]]))
    np.testing.assert_allclose(ms.state.k[0][:n].astype(np.float32), ref.k[0][:n].astype(np.float32), atol=2e-3)


def plain_rounds_on_equals_off(lm, graphs):
    """(also run on CUDA by tests/test_mtp_cuda.py) -> the client, the prompt's ids."""
    prompt = lm.tokenizer.encode(PROMPTS[0])
    off, _ = _greedy(lm, PROMPTS[0], 40)
    c = _client(lm, 3, [prompt + off], 5, graphs=graphs, adaptive=True)
    c.engine.spec.policy = ScriptedPolicy(3)
    c.history = list(prompt)
    on = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=40)).tokens
    assert on == off
    assert c.engine.spec.policy.costs.plain and c.engine.spec.policy.costs.spec    # both kinds were timed
    return c, prompt


@pytest.mark.parametrize("graphs", [None, "eager-double"])
def test_adaptive_scheduler_greedy_on_equals_off(lm, graphs):
    adaptive_scheduler_on_equals_off(lm, graphs)


def test_graph_round_weighs_the_next_choice_while_it_runs(lm, monkeypatch):
    """A graphed round of one slot hands DraftPolicy.expect its acceptance and length while it runs (before its
    ids are read: Speculator._while_drafting), and the driver's while_running (the engine's flush) still runs
    in each; greedy equals off."""
    prompt = list(lm.tokenizer.encode(PROMPTS[0]))
    off = _client(lm)
    off.history = list(prompt)
    want = off.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=24)).tokens
    c = _client(lm, 3, graphs="eager-double", adaptive=True)
    seen, expect = [], DraftPolicy.expect
    monkeypatch.setattr(DraftPolicy, "expect", lambda self, accs, n: seen.append(n) or expect(self, accs, n))
    g, inside, flushes, flush, step = c.engine.spec.graphs, [False], [], c.engine._flush, c.engine.spec.graphs.step

    def stepping(*a):
        inside[0] = True
        try:
            return step(*a)
        finally:
            inside[0] = False
    g.step = stepping
    c.engine._flush = lambda: flushes.append(inside[0] and len(seen)) or flush()
    c.history = list(prompt)
    assert c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=24)).tokens == want
    assert seen and len(seen) == g.n_verify
    assert [f for f in flushes if f] == list(range(1, len(seen) + 1))    # each round's flush, after its weighing


def adaptive_scheduler_on_equals_off(lm, graphs):
    """Four slots with adaptive drafting (its own measured costs): the random head's drafts are rejected, so
    rounds go plain; the oracle's are mostly accepted and keep drafting. Every stream equals MTP off either way.
    (How often each kind runs depends on this machine's timings: tests/test_draft_policy.py checks the choices.)"""
    prompts = [lm.tokenizer.encode(p) for p in PROMPTS]
    params = [GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=40 + 3 * i) for i in range(4)]
    reqs = list(zip(prompts, params))
    off, _ = _engine_run(lm, None, reqs)
    on, engine = _engine_run(lm, SpecConfig(type="draft-mtp", n_max=3), reqs, graphs=graphs, adaptive=True)
    pol = engine.spec.policy
    assert on == off
    assert pol.n_plain > 0 and pol.n_spec > 0 and 4 in pol.costs.plain
    # four slots explored drafting, or the best case measured so far said it could not win, or not within the
    # 40-odd tokens these requests make ('short': draft_policy)
    assert any(S == 4 for S, _ in pol.costs.spec) or pol.counts[4].get("skipped", 0) + pol.counts[4].get("short", 0)
    refs = [p + t for p, t in zip(prompts, off)]
    on, engine = _engine_run(lm, SpecConfig(type="draft-mtp", n_max=3), reqs, refs, graphs=graphs, adaptive=True)
    # (the oracle's drafts are accepted where rounds draft: surely while one slot decodes alone; with several,
    # only where this machine's timings let a round of S sequences win, which numpy's rows-linear costs rarely do)
    assert on == off and engine.spec.n_accepted > 5
    return engine


def test_speculative_choice_has_the_target_distribution():
    """The acceptance rule alone, with drafts drawn from a q unlike p: chi-square of 40000 draws against p."""
    rng = np.random.default_rng(0)
    ids = np.arange(5)
    p = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
    qv = np.array([0.05, 0.1, 0.5, 0.05, 0.3])
    q = dict(enumerate(qv))
    n = 40000
    counts = np.bincount([speculative_choice(ids, p, int(rng.choice(5, p=qv)), q, rng) for _ in range(n)],
                         minlength=5)
    chi2 = ((counts - n * p) ** 2 / (n * p)).sum()
    assert chi2 < 18.5, (counts, chi2)        # 4 degrees of freedom: p = 0.001


def test_greedy_with_host_samplers_mtp_on_equals_off(lm):
    """DRY and XTC (at probability 1, so greedy output shows it) sample each verify row on the host, one after the
    other as the accepted tokens grow the history: the output is MTP off's."""
    params = dict(temp=0.0, ignore_eos=True, dry_multiplier=2.0, dry_allowed_length=1, xtc_probability=1.0,
                  xtc_threshold=0.02, top_k=8, min_p=0.0)
    for seed, prompt in enumerate(PROMPTS[:2]):
        toks = lm.tokenizer.encode(prompt)
        plain = _client(lm)
        plain.history = list(toks)
        off = plain.generate(GenParams(SamplingParams(**params), n_predict=20)).tokens
        greedy, _ = _greedy(lm, prompt, 20)
        assert off != greedy                                 # the samplers change the output
        c = _client(lm, 3, [toks + off], seed)
        c.history = list(toks)
        assert c.generate(GenParams(SamplingParams(**params), n_predict=20)).tokens == off
        assert c.engine.spec.n_accepted > 0


@pytest.mark.parametrize("extra", [{}, dict(xtc_probability=0.5, xtc_threshold=0.2),
                                   dict(mirostat=2, mirostat_tau=1.0)], ids=["chain", "xtc", "mirostat"])
def test_sampled_distribution_equals_mtp_off(lm, extra):
    """The first three sampled tokens (top-k 3, temp 1.5) with MTP on (oracle drafts, often right) vs off:
    chi-square homogeneity test over the joint outcomes. XTC and Mirostat toss coins inside the chain: their rows
    are verified by the target's own draw."""
    prompt = lm.tokenizer.encode(PROMPTS[0])
    params = dict(temp=1.5, top_k=3, top_p=1.0, min_p=0.0, **extra)
    off, _ = _greedy(lm, PROMPTS[0], 6)

    def draws(spec: bool, n: int) -> Counter:
        counts = Counter()
        c = _client(lm, 3, [prompt + off], 9, 0.5) if spec else _client(lm)
        for seed in range(n):
            c.history = list(prompt)
            g = c.generate(GenParams(SamplingParams(seed=seed + (10**6 if spec else 0), ignore_eos=True, **params),
                                     n_predict=3))
            counts[tuple(g.tokens)] += 1
        return counts

    n = 500
    a, b = draws(False, n), draws(True, n)
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rest = (n - sum(a[k] for k in keys), n - sum(b[k] for k in keys))
    table = np.array([[a[k], b[k]] for k in keys] + ([list(rest)] if sum(rest) else []), np.float64)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    chi2 = ((table - expected) ** 2 / expected).sum()
    dof = len(table) - 1
    assert chi2_sf(chi2, dof) > 1e-3, (chi2, dof, a.most_common(5), b.most_common(5))


def test_chi2_sf_at_known_quantiles():
    # the 5% critical values of chi-square at 1, 2, 3 and 10 degrees of freedom, and a 0.1% one at 25
    for x, k, p in ((3.841458820694124, 1, 0.05), (5.991464547107979, 2, 0.05), (7.814727903251178, 3, 0.05),
                    (18.307038053275146, 10, 0.05), (52.61965577617283, 25, 0.001)):
        assert chi2_sf(x, k) == pytest.approx(p, rel=1e-7)


def chi2_sf(x: float, k: int) -> float:
    """P(X > x) for X ~ chi-square with k (integer) degrees of freedom: the regularized upper incomplete gamma
    Q(k/2, x/2) in closed form (a finite series; erfc for odd k), so the test needs no scipy."""
    h = x / 2
    if k % 2 == 0:
        term = total = math.exp(-h)
        for i in range(1, k // 2):
            term *= h / i
            total += term
        return total
    total, term = math.erfc(math.sqrt(h)), math.exp(-h) * math.sqrt(h) / (math.sqrt(math.pi) / 2)
    for i in range(1, (k + 1) // 2):
        total += term
        term *= h / (i + 0.5)
    return total


def test_file_without_mtp_and_spec_is_refused(fixture_gguf):
    path = fixture_gguf("tiny", "q8_0")
    lm = load_model(path, NumpyBackend())
    with pytest.raises(SpecUnsupported, match=r"--spec-type draft-mtp: '.*tiny-q8_0-0\.gguf' has no MTP layers"):
        Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=64, spec=SpecConfig(type="draft-mtp")))
    assert Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=64, spec=SpecConfig())).spec is None   # type none: as today


# -- the server's scheduler ------------------------------------------------------------------------------------------

def _engine_run(lm, spec, requests, oracle_refs=None, graphs=None, adaptive=False, costs=None, policy=None):
    """requests: (prompt, GenParams) run together on len(requests) slots -> tokens per request, the engine.
    graphs, adaptive: as _client's; costs: the policy's cost table (draft_policy.CostTable) to start from;
    policy: a DraftPolicy to use instead (adaptive)."""
    import queue as q_
    from llamacmp.engine.scheduler import Engine, EngineConfig
    from llamacmp.engine.tasks import CompletionTask, FinalResult
    engine = Engine(lm, EngineConfig(n_slots=len(requests), n_ctx_slot=128, spec=spec))
    if oracle_refs is not None:
        engine.spec = OracleSpeculator(engine, 3, oracle_refs, np.random.default_rng(0))
    if engine.spec is not None and graphs is not None:
        engine.spec.graphs = EagerSpecGraphs(lm.model, engine.spec.n_max) if graphs == "eager-double" else None
    if engine.spec is not None and not adaptive:
        engine.spec.policy = None
    elif engine.spec is not None and costs is not None:
        engine.spec.policy.costs = costs
    if engine.spec is not None and policy is not None:
        engine.spec.policy = policy
    outs = [q_.Queue() for _ in requests]
    for (prompt, params), out in zip(requests, outs):
        engine.submit(CompletionTask(prompt, params, out.put))
    engine.start()
    try:
        got = []
        for out in outs:
            while not isinstance(r := out.get(timeout=120), FinalResult):
                assert hasattr(r, "text"), r
            got.append(r.tokens)
        return got, engine
    finally:
        engine.stop()


@pytest.mark.parametrize("graphs", [None, "eager-double"])
def test_scheduler_greedy_mtp_on_equals_off(lm, graphs):
    """Three slots generating together, one of them with n_probs (its rows come to the host: it decodes the plain
    way beside the others' draft-and-verify): every stream equals MTP off, with real and with oracle drafts; also
    on the graph path (several sequences per draft and verify graph, draft shapes declined the first time)."""
    scheduler_greedy_on_equals_off(lm, graphs)


def scheduler_greedy_on_equals_off(lm, graphs):
    """(also run on CUDA by tests/test_mtp_cuda.py)"""
    from llamacmp.engine.tasks import GenParams
    prompts = [lm.tokenizer.encode(p) for p in PROMPTS[:3]]
    params = [GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=20 + i) for i in range(3)]
    params[2] = GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=15, n_probs=2)
    reqs = list(zip(prompts, params))
    off, _ = _engine_run(lm, None, reqs)
    on, engine = _engine_run(lm, SpecConfig(type="draft-mtp", n_max=3), reqs, graphs=graphs)
    assert on == off and engine.spec.n_drafted > 0
    g = engine.spec.graphs
    if graphs == "eager-double":
        assert g.n_declined > 0 and g.n_draft > 0 and g.n_verify > 0
    refs = [p + t for p, t in zip(prompts, off)]
    on, engine = _engine_run(lm, SpecConfig(type="draft-mtp", n_max=3), reqs, refs, graphs=graphs)
    assert on == off
    assert engine.spec.n_accepted > 10
    assert engine.slots[0].mtp.n_accepted > 0 and engine.slots[2].mtp.n_drafted == 0
    return engine


def _arrivals(lm, spec, refs=None, graphs=None, watch=None):
    """Requests arriving while others decode, on the caller's thread: A alone for a few steps, then B (a prompt of
    several chunks: n_ubatch 4) and C, whose chunks run in steps where A (then C) decode. spec None: MTP off;
    else a policy that steps plainly and drafts 3 in turn whenever it is asked, drafts from refs (the oracle)
    when given. watch(engine):
    called once the engine is built. -> tokens per request, the engine."""
    from llamacmp.engine.tasks import FinalResult
    engine = Engine(lm, EngineConfig(n_slots=3, n_ctx_slot=128, n_ubatch=4, spec=spec))
    if spec is not None:
        if refs is not None:
            engine.spec = OracleSpeculator(engine, 3, refs, np.random.default_rng(0), p_wrong=0.2)
        if graphs is not None:
            engine.spec.graphs = EagerSpecGraphs(lm.model, 3) if graphs == "eager-double" else None
        engine.spec.policy = ScriptedPolicy(3, script=(0, 3))
    if watch is not None:
        watch(engine)
    got = {}
    prompts = [lm.tokenizer.encode(p) for p in (PROMPTS[0], PROMPTS[1] * 3, PROMPTS[2])]
    params = GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=24)

    def submit(i):
        engine.submit(CompletionTask(prompts[i], params, lambda r: got.__setitem__(i, r.tokens)
                                     if isinstance(r, FinalResult) else None))
    submit(0)
    for _ in range(5):                   # A's prompt chunks, then its first rounds alone
        engine._iterate()
    submit(1)
    engine._iterate()                    # B's first chunk beside A's round
    submit(2)
    engine.run_pending()
    return [got[i] for i in range(3)], engine


@pytest.mark.parametrize("graphs", [None, "eager-double"])
def test_no_draft_beside_a_prompt_chunk(lm, graphs):
    """A step that carries another request's prompt chunk decodes plainly: no sequence drafts there (the policy is
    not asked; such rounds count as kind 'prompt'), and neither that step nor the one after a chunk that left the
    device busy is timed into the policy's cost table. Once the prompts are in, the rounds draft again; every
    stream equals MTP off (drafts accepted by the oracle or not)."""
    beside_prompt_on_equals_off(lm, graphs)


def beside_prompt_on_equals_off(lm, graphs):
    """(also run on CUDA by tests/test_mtp_cuda.py) -> the engine of the oracle's run."""
    off, _ = _arrivals(lm, None)
    prompts = [lm.tokenizer.encode(p) for p in (PROMPTS[0], PROMPTS[1] * 3, PROMPTS[2])]
    refs = [p + t for p, t in zip(prompts, off)]
    steps, timed = [], []

    def watch(engine):
        sp = engine.spec
        step, time_plain = sp.step, sp.time_plain

        def spied_step(items, n=None, while_running=None):
            steps.append([s.phase for s in engine.slots])
            return step(items, n, while_running)

        def spied_time_plain(rows, seconds):
            timed.append([s.phase for s in engine.slots])
            time_plain(rows, seconds)
        sp.step, sp.time_plain = spied_step, spied_time_plain
    on, engine = _arrivals(lm, SpecConfig(type="draft-mtp", n_max=3), refs, graphs, watch)
    assert on == off
    assert engine.spec.n_accepted > 5
    assert steps and not any("prefill" in phases for phases in steps)
    assert timed and not any("prefill" in phases for phases in timed)    # plain steps timed once the prompts are in
    beside = {S: row.get("prompt", 0) for S, row in engine.spec.round_counts().items()}
    assert beside.get(1, 0) >= 1 and beside.get(2, 0) >= 1         # A beside B's chunks, then A and C
    lefts = [x for x in engine.spec.policy.lefts if x is not None]   # the first drafting slot to end (None: ahead)
    assert all(0 < x < 24 for x in lefts) and lefts[-1] <= 3 and min(lefts) == lefts[-1]
    on, _ = _arrivals(lm, SpecConfig(type="draft-mtp", n_max=3), None, graphs)   # the random head's drafts
    assert on == off
    return engine


def test_synthetic_acceptance(lm):
    """accept_tokens(synth=): the first k drafts are taken whatever the target says, then the target's own draw;
    through the engine, --spec-synth-len sets the acceptance (counted in the request's draft timings) and the
    seeded draws make two runs equal."""
    from llamacmp.engine.speculative import accept_tokens
    sp = Speculator(lm.model, 3)
    st, ms = lm.backend.new_state(lm.cfg, 64), sp.new_seq(64)
    sp.prefill(st, ms, lm.tokenizer.encode(PROMPTS[0]))
    drafts = [250, 251, 252]                    # ids the random model does not predict
    logits, h, (v,) = sp.verify([(st, ms, 7, drafts)])
    got = []
    j = accept_tokens(lm.backend, logits, v, Sampler(SamplingParams(temp=0.0)), lambda t: got.append(t) or True,
                      synth=lambda d: 2)
    assert j == 3 and got[:2] == drafts[:2] and got[2] == int(np.argmax(logits[v.row + 2]))
    sp.commit(v, h, j)
    assert st.n_past == len(lm.tokenizer.encode(PROMPTS[0])) + 3
    # drafts the target agrees with, synthetic acceptance 0: one token (the target's draw), not the agreeing run
    # (the server at --spec-synth-len 1 measured mean length 3.58 on the H200's repetitive random 9B, 2026-12-02)
    greedy = GenParams(SamplingParams(temp=0.0, seed=7, ignore_eos=True), n_predict=4)
    (o,), _ = _engine_run(lm, None, [(lm.tokenizer.encode(PROMPTS[1]), greedy)])
    st, ms = lm.backend.new_state(lm.cfg, 64), sp.new_seq(64)
    sp.prefill(st, ms, lm.tokenizer.encode(PROMPTS[1]))
    logits, h, (v,) = sp.verify([(st, ms, o[0], o[1:4])])
    for k, n_out in ((3, 4), (0, 1)):
        got = []
        j = accept_tokens(lm.backend, logits, v, Sampler(SamplingParams(temp=0.0)),
                          lambda t: got.append(t) or True, synth=lambda d, k=k: k)
        assert j == n_out and got[:3] == o[1:1 + min(n_out, 3)], (k, j, got, o)
    spec = SpecConfig(type="draft-mtp", n_max=3, synth_len=2.5)
    prompt = lm.tokenizer.encode(PROMPTS[0])
    params = GenParams(SamplingParams(temp=0.0, seed=7, ignore_eos=True), n_predict=40)
    runs = [_engine_run(lm, spec, [(prompt, params)]) for _ in range(2)]
    (a,), engine = runs[0]
    assert a == runs[1][0][0]
    d = engine.perf.draft
    assert d.steps > 5 and d.n == 3 * d.steps
    assert 1.3 < d.mean_len < 3.7                     # 2.5 on average; a 40-token run is a short sample
    off, _ = _engine_run(lm, None, [(prompt, params)])
    assert a != off[0]                                # synthetic: the drafts go out whatever the target says


def test_an_eager_round_of_a_declined_shape_is_not_timed(lm):
    """Two sequences whose shape the graphs decline (its first sighting) run their round eagerly; like a capture,
    that round is a one-off and stays out of the draft policy's cost table, which holds what the shape costs once
    replayed (an eager n = 3 at 4 streams, 11.9 ms against 9.6 replayed, kept the H100's rounds at n = 2 for good,
    2026-12-05). A round on the graphs is timed, with its commits."""
    sp = Speculator(lm.model, 3)
    sp.graphs = g = EagerSpecGraphs(lm.model, 3)
    items = []
    for p in PROMPTS[:2]:
        st, ms = lm.backend.new_state(lm.cfg, 96), sp.new_seq(96)
        toks = lm.tokenizer.encode(p)
        sp.prefill(st, ms, toks[:-1])
        items.append((st, ms, toks[-1]))

    def round_():
        t0 = time.perf_counter()
        _, _, h, verified = sp.step(items, 3)
        for v in verified:
            sp.commit(v, h, 1)
        items[:] = [(st, ms, 5) for st, ms, _ in items]
        spent = time.perf_counter() - t0
        assert sp.policy.costs.spec_cost(2, 3) is None   # (a timed round enters the table at the next plan())
        sp.plan([ms for _, ms, _ in items])
        return spent
    round_()
    assert g.n_declined == 1 and g.n_draft == 0          # declined, so the round ran eagerly
    assert sp.policy.costs.spec_cost(2, 3) is None      # and was not timed
    spent = round_()                                     # the graph path (this double captures nothing)
    assert g.n_draft == 1 and 0 < sp.policy.costs.spec_cost(2, 3) <= spent    # timed, with its commits


def test_several_sequences_draft_one_graph_shape(lm):
    """Sequences whose last rounds kept different numbers of tokens: their pending pairs run before the draft
    graph, which sees one catch-up row each (one shape per draft length, not one per combination of lengths:
    at 4 slots the combinations churned the graph cache, MTP on at 0.855x of off on the H200, 2026-12-02), and
    draft what the first sequence drafts alone, where the graph takes its catch-up."""
    def two_rounds(keeps):
        sp = Speculator(lm.model, 3)
        sp.graphs = g = EagerSpecGraphs(lm.model, 3)
        asked, draft = [], g.draft
        g.draft = lambda states, tokens, *a, **k: asked.append([len(t) for t in tokens]) or draft(states, tokens,
                                                                                                   *a, **k)
        items = []
        for p in PROMPTS[:len(keeps)]:
            st, ms = lm.backend.new_state(lm.cfg, 96), sp.new_seq(96)
            toks = lm.tokenizer.encode(p)
            sp.prefill(st, ms, toks[:-1])
            items.append((st, ms, toks[-1]))
        drafts, logits, h, verified = sp.step(items, 3)
        for v, j in zip(verified, keeps):
            sp.commit(v, h, j)
        assert [len(ms.pending) for _, ms, _ in items] == list(keeps)
        items = [(st, ms, 5) for st, ms, _ in items]
        second = sp.step(items, 3) or sp.step(items, 3)
        return asked, second[0]
    asked, drafts = two_rounds((3, 1))
    assert asked[-1] == [1, 1], asked                     # the pending pairs ran before the graph
    alone, drafts_alone = two_rounds((3,))
    assert alone[-1] == [4], alone                        # one sequence: the graph takes its catch-up
    assert drafts[0] == drafts_alone[0]                   # the same drafts either way


# -- the server's rounds as the bench's (issue 19: MTP at acceptance 0 cost 13% through the server, 4.9% in the bench)

def _fixed_costs(monkeypatch):
    """Every cost known and fixed (a plain step 1, a round drafting n 1.05 + 0.3 n), so that the draft policy's
    choices depend only on the acceptance and its probes; -> the list each choice goes into: (the policy, n, the
    acceptance rates it saw)."""
    from llamacmp.engine.draft_policy import CostTable
    monkeypatch.setattr(CostTable, "plain_cost", lambda self, S: 1.0 * S)
    monkeypatch.setattr(CostTable, "spec_cost", lambda self, S, n: S * (1.05 + 0.3 * n))
    monkeypatch.setattr(CostTable, "has_spec", lambda self, S: True)
    seen, choose = [], DraftPolicy.choose

    def record(self, accs, others=0, best=None, left=None):
        n = choose(self, accs, others, best, left)
        seen.append((self, n, [a.rate for a in accs]))     # (the policy itself: an id could be reused)
        return n
    monkeypatch.setattr(DraftPolicy, "choose", record)
    return seen


def test_scheduler_drafts_when_the_bench_does(lm, mtp_path, monkeypatch):
    """Acceptance 0 (--spec-synth-len 1): the scheduler's rounds are the bench loop's, round for round. A first
    request drafts once from the prior, then steps plainly with probes every 8, 16, 32 rounds, as the bench's
    warm-up repetition (4 rounds) does; a second request starts from the acceptance pooled over the verifies before it (the
    first request's rate) and does not draft its first round, as the bench's timed repetition after its warm-up
    does (the bench's repetitions each have a policy of their own: its probes start over at every 8)."""
    import io
    from llamacmp.cli import bench
    seen, N = _fixed_costs(monkeypatch), 64
    rc = bench.main(["-m", str(mtp_path), "-p", "0", "-n", str(N), "-r", "1", "-ngl", "0", "--spec-type",
                     "draft-mtp", "--spec-synth-len", "1"], out=io.StringIO(), err=io.StringIO())
    assert rc == 0
    policies = list(dict.fromkeys(p for p, _, _ in seen))          # (the warm-up repetition, then the timed one)
    warm, timed = ([n for p, n, _ in seen if p is q] for q in (policies[0], policies[-1]))
    seen.clear()
    spec = SpecConfig(type="draft-mtp", n_max=3, synth_len=1.0)
    prompt = lm.tokenizer.encode(PROMPTS[0])
    params = GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=N + 1)   # (the first from the prompt)
    engine = Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=128, spec=spec))
    server_rounds = _serve(engine, [(prompt, params)] * 2)
    first, second = [n for _, n, _ in seen[:N]], [n for _, n, _ in seen[N:]]
    assert len(policies) == 2 and first[:len(warm)] == warm
    assert [i for i, n in enumerate(first) if n] == [0, 8, 24, 56]     # the prior's draft, then probes
    assert seen[N][2] == [seen[N - 1][2][0]] and seen[N][2][0] < 0.2    # request 2 starts at request 1's rate
    assert second[0] == timed[0] == 0 and [i for i, n in enumerate(timed) if n] == [7, 23, 55]
    assert server_rounds == [N + 1, N + 1]


def _serve(engine, requests, together: bool = False) -> list[int]:
    """Run requests one after the other (together: all submitted at once) on the engine's thread -> the number of
    tokens each generated."""
    import queue as q_
    from llamacmp.engine.tasks import CompletionTask, FinalResult
    engine.start()
    try:
        outs = [q_.Queue() for _ in requests]
        got = []
        for i, ((prompt, params), out) in enumerate(zip(requests, outs)):
            engine.submit(CompletionTask(prompt, params, out.put))
            if together and i < len(requests) - 1:
                continue
            for o in outs[len(got):i + 1]:
                while not isinstance(r := o.get(timeout=120), FinalResult):
                    assert hasattr(r, "text"), r
                got.append(len(r.tokens))
        return got
    finally:
        engine.stop()


def test_request_start_captures_the_slots_graphs(lm):
    """A request's first round and its probes replay graphs captured when the request started (in its prompt
    time), not in the middle of its decode: the bench captures them before its timing. Only for a slot that starts
    alone: beside busy slots, or with other requests waiting for a slot, the rounds are of several sequences (their
    shapes are captured at first use)."""
    class Watched(EagerSpecGraphs):
        def draft(self, states, tokens, h_parts, n=None):
            assert any(mtp == list(states) for _, mtp, _, _ in self.prepared), "a draft before its graphs"
            return super().draft(states, tokens, h_parts, n)
    engine = Engine(lm, EngineConfig(n_slots=2, n_ctx_slot=128, spec=SpecConfig(type="draft-mtp", n_max=3)))
    engine.spec.graphs = g = Watched(lm.model, 3)
    # (more tokens than EXPLORE_STEPS: a fresh engine's lone sequence with fewer left steps plainly, 'short')
    params = GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=16)
    _serve(engine, [(lm.tokenizer.encode(PROMPTS[0]), params)])
    slot = next(s for s in engine.slots if s.cache.tokens)
    assert g.prepared == [([slot.state], [slot.mtp.state], (1, 2, 3), None)]     # every catch-up length
    assert g.n_draft > 0
    engine = Engine(lm, EngineConfig(n_slots=2, n_ctx_slot=128, spec=SpecConfig(type="draft-mtp", n_max=3)))
    engine.spec.graphs = g = EagerSpecGraphs(lm.model, 3)
    for p in PROMPTS[:2]:                        # two requests that arrive together (one drain of the inbox)
        engine.submit(CompletionTask(lm.tokenizer.encode(p), params, lambda r: None))
    engine.run_pending()
    assert g.prepared == []                      # the first is assigned a slot while the second waits for one
    engine = Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=128, spec=SpecConfig(type="draft-mtp", n_max=3)))
    engine.spec.graphs = g
    _serve(engine, [(lm.tokenizer.encode(PROMPTS[0]), replace(params, n_probs=2))])
    assert g.prepared == []                      # its rows come to the host: it never drafts


def test_a_request_arriving_stops_the_captures_of_a_lone_start(lm):
    """A request that started alone has its graphs captured until another request arrives (Speculator.start's
    stop: the inbox holds a task), so requests arriving a moment apart do not wait for the first one's lone shapes
    (mtp_streams.py's 4 streams: up to 15 captures, none of them replayed by rounds of 4)."""
    params = GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=4)
    engine = Engine(lm, EngineConfig(n_slots=2, n_ctx_slot=128, spec=SpecConfig(type="draft-mtp", n_max=3)))
    asked = []

    class Arriving(EagerSpecGraphs):
        def prepare(self, states, mtp_states, lengths=None, catch_ups=None, stop=None):
            super().prepare(states, mtp_states, lengths, catch_ups)
            asked.append(stop())
            if len(self.prepared) == 1:          # the second request arrives during the first one's captures
                engine.submit(CompletionTask(lm.tokenizer.encode(PROMPTS[1]), params, lambda r: None))
                asked.append(stop())
    engine.spec.graphs = g = Arriving(lm.model, 3)
    engine.submit(CompletionTask(lm.tokenizer.encode(PROMPTS[0]), params, lambda r: None))
    engine.run_pending()
    assert asked == [False, True] and len(g.prepared) == 1     # (the second started beside a busy slot)
    assert not any(s.busy for s in engine.slots) and sum(bool(s.cache.tokens) for s in engine.slots) == 2


def test_every_round_of_a_lone_slot_replays_a_shape_prepared_at_its_start(lm):
    """Under acceptance (synthetic length 2.5) a lone slot's rounds
    draft with catch-ups of 2 .. n + 2 rows (the tokens the round before kept, or the plain steps since, plus t0),
    not only the 1 row of its first round (here every round drafts n_max): each (draft length, catch-up length) it drafts with was among the
    shapes prepared when its request started, so no graph is captured in its decode (llamacmp-bench prepares them
    all before its timing; capturing only 1-row shapes cost the server 7-9 captures per 128-token decode). Two
    requests in turn on a server of two slots (LRU): each slot's own shapes."""
    seen = []

    class Shapes(EagerSpecGraphs):
        def draft(self, states, tokens, h_parts, n=None):
            shape = (n or self.n, len(tokens[0]))
            prepared = {(m, L) for _, mtp, lengths, ups in self.prepared
                        if [id(x) for x in mtp] == [id(x) for x in states]
                        for m in lengths for L in (ups or range(1, m + 3))}
            assert len(states) == 1 and shape in prepared, (shape, sorted(prepared))
            seen.append(shape)
            return super().draft(states, tokens, h_parts, n)
    spec = SpecConfig(type="draft-mtp", n_max=3, synth_len=2.5)
    engine = Engine(lm, EngineConfig(n_slots=2, n_ctx_slot=160, spec=spec))
    engine.spec.graphs = Shapes(lm.model, 3)
    engine.spec.policy = None            # n_max every round (the numpy reference's costs would step plainly)
    params = GenParams(SamplingParams(temp=0.0, ignore_eos=True, seed=3), n_predict=40, cache_prompt=False)
    got = _serve(engine, [(lm.tokenizer.encode(p), params) for p in PROMPTS[:2]])
    assert got == [40, 40]
    assert len({id(s.state) for s in engine.slots if s.cache.tokens}) == 2      # one request on each slot
    assert max(L for _, L in seen) >= 3 and len(set(seen)) >= 3                 # rounds after accepted drafts


def test_plain_step_timing_covers_the_draw(lm, monkeypatch):
    """The policy's plain-step time ends when the ids are on the host, as a drafting round's (its argmax is in
    its graph) and the bench's plain step's do: a slow draw shows in it."""
    from llamacmp.engine import scheduler
    draw = scheduler.draw_tokens

    def slow(*a, **k):
        import time
        time.sleep(0.05)
        return draw(*a, **k)
    monkeypatch.setattr(scheduler, "draw_tokens", slow)
    engine = Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=128, spec=SpecConfig(type="draft-mtp", n_max=3)))
    params = GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=8)
    _serve(engine, [(lm.tokenizer.encode(PROMPTS[0]), params)])
    assert engine.spec.policy.costs.plain[1] >= 0.05


def test_step_clock_times_runs_of_plain_steps_by_part():
    """engine/perf.py StepClock: a plain step adds its parts only after a plain step of the same rows with
    nothing between; 'between' starts at that step's tokens drawn."""
    from llamacmp.engine.perf import StepClock
    clock = StepClock()
    clock.step(4, 0.0, 1.0, 2.0, 5.0)               # the first of a run: its predecessor is unknown
    clock.step(4, 5.5, 6.0, 6.5, 10.0)
    clock.step(3, 10.0, 10.1, 10.2, 11.0)           # another number of rows: a new run
    clock.broken()                                  # a prompt chunk or a drafting round
    clock.step(3, 12.0, 12.5, 13.0, 14.0)
    clock.step(3, 14.25, 14.5, 15.0, 16.0)
    assert clock.snapshot() == {3: {"steps": 1, "between": 0.25, "launch": 0.25, "overlap": 0.5, "wait": 1.0},
                                4: {"steps": 1, "between": 0.5, "launch": 0.5, "overlap": 0.5, "wait": 3.5}}


@pytest.mark.parametrize("mtp", [False, True])
def test_plain_step_clock_reaches_the_metrics(lm, mtp):
    """The server's plain decode steps, MTP off as on, are timed by part once they run back to back (not the
    first after the prompt's chunk) and /metrics prints them (llamacmp:plain_step_seconds_total)."""
    from llamacmp.engine.scheduler import Engine, EngineConfig
    from llamacmp.engine.tasks import GenParams
    from llamacmp.server.misc import plain_step_lines
    spec = SpecConfig(type="draft-mtp", n_max=3) if mtp else None
    engine = Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=128, spec=spec))
    if mtp:
        engine.spec.policy = ScriptedPolicy(3, script=(0,))     # every round a plain step: what the clock times
    params = GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=12, cache_prompt=False)
    assert _serve(engine, [(lm.tokenizer.encode(PROMPTS[0]), params)]) == [12]
    rows = engine._query("metrics")["plain_steps"]
    assert list(rows) == [1] and rows[1]["steps"] == 10        # 11 plain steps after the prompt's token
    assert all(rows[1][part] > 0 for part in ("launch", "overlap", "wait")) and rows[1]["between"] >= 0
    lines = plain_step_lines(rows)
    assert lines[1] == "# TYPE llamacmp:plain_step_seconds_total counter"
    assert f'llamacmp:plain_step_seconds_total{{seqs="1",part="wait"}} {rows[1]["wait"]:.6f}' in lines
    assert 'llamacmp:plain_steps_total{seqs="1"} 10' in lines
    assert plain_step_lines({}) == []


def test_round_counts_reach_the_metrics(lm, caplog):
    """Speculator.round_counts: per number of sequences, the policy's decisions and the drafting rounds that ran
    eagerly (a shape of several sequences seen for the first time); the server's metrics snapshot carries them
    and /metrics prints them as llamacmp:spec_rounds_total{seqs,kind}. At -v each round's time is logged with
    its kind (replayed, eager, captured)."""
    import logging
    from llamacmp.engine.tasks import GenParams
    from llamacmp.server.misc import spec_round_lines
    prompts = [lm.tokenizer.encode(p) for p in PROMPTS[:3]]
    reqs = [(p, GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=20)) for p in prompts]
    pol = ScriptedPolicy(3)
    with caplog.at_level(logging.DEBUG, logger="llamacmp.engine"):
        _, engine = _engine_run(lm, SpecConfig(type="draft-mtp", n_max=3), reqs, graphs="eager-double", policy=pol)
    counts = engine.spec.round_counts()
    assert sum(row.get("eager", 0) for row in counts.values()) == engine.spec.graphs.n_declined > 0
    rounds = [r.getMessage() for r in caplog.records if r.getMessage().startswith("MTP round of ")]
    assert rounds and all(m.rsplit(", ", 1)[1] in ("replayed", "eager", "captured") for m in rounds)
    assert sum(m.endswith("eager") for m in rounds) == engine.spec.n_eager == engine.spec.graphs.n_declined
    assert all(S > 1 for S, row in counts.items() if "eager" in row)      # (one sequence's shapes never decline)
    assert engine._query("metrics")["spec_rounds"] == counts
    counts[3]["drafted"] = 5
    lines = spec_round_lines(counts)
    assert lines[1] == "# TYPE llamacmp:spec_rounds_total counter"
    assert 'llamacmp:spec_rounds_total{seqs="3",kind="drafted"} 5' in lines
    assert spec_round_lines({}) == []
    engine.spec.policy = None
    assert engine.spec.round_counts() == {}
