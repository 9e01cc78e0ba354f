"""backends/spec_graphs.SpecGraphs' bookkeeping on the host (the graphs themselves run in tests/test_mtp_cuda.py):
which shapes are captured when, that prepare() captures exactly the shapes a step of those sequences asks for,
and the least recently used graph goes first."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from llamacmp.backends import spec_graphs
from llamacmp.backends.spec_graphs import SpecGraphs


class FakeDraft:
    made: list = []

    def __init__(self, be, model, states, lengths, n):
        self.lengths, self.n = tuple(lengths), n
        FakeDraft.made.append(self.lengths)

    def run(self, tokens, h_parts):
        return [[0] * self.n for _ in self.lengths]


class FakeVerify:
    made: list = []

    def __init__(self, be, model, states, n, n_max):
        FakeVerify.made.append(len(states))

    def run(self, tokens):
        return "logits", "h", [0] * sum(len(t) for t in tokens)


@pytest.fixture
def graphs(monkeypatch):
    monkeypatch.setattr(spec_graphs, "CapturedDraft", FakeDraft)
    monkeypatch.setattr(spec_graphs, "CapturedVerify", FakeVerify)
    FakeDraft.made, FakeVerify.made = [], []
    return lambda n_max=3, capacity=8: SpecGraphs(object(), object(), n_max, capacity)


def _states(n):
    return [SimpleNamespace(n_past=0, n_ctx=64) for _ in range(n)]


def test_one_sequence_captures_at_once_and_replays(graphs):
    g = graphs()
    (ms,) = _states(1)
    assert g.draft([ms], [[1, 2]], [[None]]) == [[0, 0, 0]]
    assert g.draft([ms], [[1, 2]], [[None]]) == [[0, 0, 0]]
    assert FakeDraft.made == [(2,)] and g.n_captured == 1 and g.n_replayed == 1 and g.n_declined == 0


def test_several_sequences_capture_a_shape_the_second_time(graphs):
    g = graphs()
    a, b = _states(2)
    assert g.draft([a, b], [[1], [1, 2]], [[None], [None]]) is None          # first ask: the caller drafts eagerly
    assert g.draft([a, b], [[1, 2, 3], [1]], [[None], [None]]) is None       # another shape
    assert g.draft([a, b], [[1], [1, 2]], [[None], [None]]) == [[0] * 3] * 2
    assert FakeDraft.made == [(1, 2)] and g.n_declined == 2


def test_prepare_captures_what_the_steps_ask_for(graphs):
    """The benchmark's captures happen before its timing: no step of the prepared sequences captures again."""
    g = graphs(n_max=3)
    st, ms = _states(1)[0], _states(1)[0]
    g.prepare([st], [ms])
    made = g.n_captured
    assert made == 1 + 5 and sorted(FakeDraft.made) == [(L,) for L in range(1, 6)]
    for L in range(1, 6):                                   # every catch-up length a step can have: 1 .. n_max + 2
        g.draft([ms], [[7] * L], [[None]])
    g.verify([st], [[1, 2, 3, 4]])
    assert g.n_captured == made


def test_prepare_of_some_catch_ups_keeps_what_it_holds(graphs):
    """The server's request start (Speculator.start): each draft length's verify and its one-row catch-up draft;
    a second prepare of the same slot captures nothing and counts no replay."""
    g = graphs(n_max=3)
    st, ms = _states(1)[0], _states(1)[0]
    g.prepare([st], [ms], (1, 2, 3), catch_ups=(1,))
    assert g.n_captured == 3 + 3 and FakeDraft.made == [(1,)] * 3 and FakeVerify.made == [1] * 3
    g.prepare([st], [ms], (1, 2, 3), catch_ups=(1,))
    assert (g.n_captured, g.n_replayed) == (6, 0)
    g.draft([ms], [[7]], [[None]], 2)
    assert (g.n_captured, g.n_replayed) == (6, 1)
    with pytest.raises(ValueError, match="catch-up length 6 outside 1 .. 5"):
        g.prepare([st], [ms], (3,), catch_ups=(6,))


def test_prepare_stops_before_a_capture_when_asked(graphs):
    """stop() is asked before each capture (not for a shape already held): once it says True the rest are left to
    their first use, and a later prepare captures them."""
    g = graphs(n_max=3)
    st, ms = _states(1)[0], _states(1)[0]
    asked = []

    def stop():
        asked.append(g.n_captured)
        return g.n_captured >= 2
    g.prepare([st], [ms], (1, 2, 3), stop=stop)
    assert g.n_captured == 2 and asked == [0, 1, 2]          # verify n = 3, its 1-row draft, then stopped
    assert FakeDraft.made == [(1,)] and FakeVerify.made == [1]
    g.prepare([st], [ms], (1, 2, 3), stop=lambda: False)
    assert g.n_captured == 3 + 12 and FakeVerify.made == [1] * 3
    asked.clear()
    g.prepare([st], [ms], (1, 2, 3), stop=lambda: asked.append(1) or True)
    assert asked == [] and g.n_captured == 15                 # everything held: nothing asked, nothing captured


def test_least_recently_used_goes_first(graphs):
    g = graphs(n_max=1, capacity=1)              # room for 1 verify graph, 2 * (1 + 2) draft graphs
    s1, s2 = _states(2)
    g.verify([s1], [[1, 2]])
    g.verify([s2], [[1, 2]])
    g.verify([s1], [[1, 2]])
    assert FakeVerify.made == [1, 1, 1]          # s1's graph was dropped for s2's, then captured again
    for L in (1, 2, 3, 1):
        g.draft([s1], [[0] * L], [[None]])
    for L in (1, 2, 3):
        g.draft([s2], [[0] * L], [[None]])
    assert FakeDraft.made == [(1,), (2,), (3,)] * 2
    g.draft([s1], [[0] * 3], [[None]])
    assert len(FakeDraft.made) == 6
    g.draft([s1], [[0] * 4], [[None]])         # a seventh shape: the least recently used (s1's length 2) goes
    g.draft([s1], [[0] * 2], [[None]])
    assert FakeDraft.made[-2:] == [(4,), (2,)]


def test_bad_sizes_are_refused(graphs):
    with pytest.raises(ValueError, match="n_max, capacity and seqs >= 1"):
        graphs(n_max=0)
    with pytest.raises(ValueError, match="n_max, capacity and seqs >= 1"):
        SpecGraphs(object(), object(), 3, seqs=0)


@pytest.mark.parametrize("n_max", [1, 3, 4])
@pytest.mark.parametrize("seqs", [1, 4, 8])
def test_draft_room_keeps_every_sequence_s_shapes(n_max, seqs):
    """Each of `seqs` sequences drafting alone has n_max draft lengths x (n + 2) catch-up lengths (what
    Speculator.start prepares for a lone slot): the LRU holds all of them and one more list's worth (lists of
    several sequences), so a server whose requests take its slots in turn does not capture them again at each
    request. One sequence keeps twice its shapes, as before."""
    per_seq = sum(n + 2 for n in range(1, n_max + 1))
    g = SpecGraphs(object(), object(), n_max, seqs=seqs)
    assert g.draft_room == (seqs + 1) * per_seq
    g.set_head("whole")
    g.set_head("prefix")                       # auto's two heads: each keeps as much
    assert g.draft_room == 2 * (seqs + 1) * per_seq


class FakeBackend:
    """What CapturedDraft.run / CapturedVerify.run ask of the backend, recorded: uploads, copies, launches."""

    def __init__(self, ids):
        self.uploads, self.copies, self.launches, self.ids, self.destroyed = {}, [], 0, ids, []
        self.h2d = []                            # (address, the int32 values) of each upload by address
        self.native = SimpleNamespace(cmp_memcpy_d2d=lambda dst, src, n: self.copies.append((dst, src, n)),
                                      cmp_memcpy_h2d=lambda dst, src, n: self.h2d.append(
                                          (dst, [int(x) for x in np.frombuffer(ctypes.string_at(src, n), np.int32)])),
                                      cmp_memcpy2d_d2d=lambda *a: self.copies.append(a),
                                      cmp_graph_launch=self._launch, cmp_graph_destroy=self.destroyed.append)

    def _launch(self, exec_):
        self.launches += 1

    def copy_from_host(self, t, a):
        self.uploads[t.name] = [int(x) for x in a]

    def ids_to_host(self, t):
        return np.asarray(self.ids, np.int32)


def recorded(be):
    """A RecordedGraph as captured (exec 1, no arena): the fake backend records its launches and its destruction."""
    from llamacmp.backends.cuda_graphs import RecordedGraph
    g = RecordedGraph.__new__(RecordedGraph)
    g.be, g.exec, g.out, g.arena = be, 1, None, None
    return g


class FakeTensor:
    def __init__(self, name, shape, ptr=0, row_bytes=4):
        self.name, self.shape, self.ptr, self.row_bytes = name, shape, ptr, row_bytes

    @property
    def nbytes(self):
        return self.shape[0] * self.row_bytes

    def row_ptr(self, r):
        return self.ptr + r * self.row_bytes


def test_draft_replay_feeds_the_recorded_layout():
    """Round 0's rows per sequence at n_past .., round r's row of each sequence at (its t0's position) + r, both
    uploaded in one copy after the token ids; the ids read back round-major; the h parts copied in, adjacent ones at
    once; the head states advance by their rows + n - 1; a context too short is refused."""
    g = spec_graphs.CapturedDraft.__new__(spec_graphs.CapturedDraft)
    B, n, lengths = 2, 3, [2, 1]
    g.be = FakeBackend([10, 20, 11, 21, 12, 22])                         # round r: [seq 0, seq 1]
    g.states = [SimpleNamespace(n_past=5, n_ctx=64), SimpleNamespace(n_past=9, n_ctx=64)]
    g.lengths, g.n, g.graph = lengths, n, recorded(g.be)
    g.inputs, g.tok0 = FakeTensor("inputs", (3 + 3 + (n - 1) * B,), 300), FakeTensor("tok0", (3,))
    g.h0, g.ids = FakeTensor("h0", (3, 8), 1000, 32), FakeTensor("ids", (n * B,))
    g._stage_inputs()
    h = [FakeTensor("h_a", (1, 8), 5000, 32), FakeTensor("h_b", (1, 8), 6000, 32), FakeTensor("h_c", (1, 8), 7000, 32)]
    assert g.run([1, 2, 3], h) == [[10, 11, 12], [20, 21, 22]]
    assert g.be.h2d == [(300, [1, 2, 3] + [5, 6, 9, 7, 10, 8, 11])]
    assert g.be.copies == [(1000, 5000, 32), (1032, 6000, 32), (1064, 7000, 32)]
    assert [s.n_past for s in g.states] == [5 + 2 + 2, 9 + 1 + 2] and g.be.launches == 1
    g.be.copies.clear()
    g.run([1, 2, 3], [FakeTensor("h_a", (1, 8), 5000, 32), FakeTensor("kept 0", (1, 8), 6000, 32),
                      FakeTensor("kept 1", (1, 8), 6032, 32)])                 # views of one copy: one copy in
    assert g.be.copies == [(1000, 5000, 32), (1032, 6000, 64)]
    g.states[0].n_past, g.states[1].n_past = 9, 12
    g.states[1].n_ctx = 14                                           # 12 + 1 + 2 positions do not fit
    with pytest.raises(ValueError, match="draft needs 15 positions, the context is 14"):
        g.run([1, 2, 3], h)
    assert g.be.launches == 2
    with pytest.raises(ValueError, match="3 catch-up rows fed 2 ids"):
        g.run([1, 2], h)


def verify_graph(be, T, states):
    """A CapturedVerify as captured, over fake tensors: io [positions | tokens | argmax] at address 100."""
    g = spec_graphs.CapturedVerify.__new__(spec_graphs.CapturedVerify)
    g.be, g.T, g.states, g.graph, g.outputs = be, T, states, recorded(be), ("logits", "h")
    R = T * len(states)
    g.tokens, g.greedy = FakeTensor("tokens", (R,), 100 + 4 * R), FakeTensor("greedy", (R,), 100 + 8 * R)
    g._up, g._back = FakeTensor("positions, tokens", (2 * R,), 100), FakeTensor("tokens, argmax", (2 * R,), 100 + 4 * R)
    return g


def test_verify_replay_feeds_every_row_and_keeps_the_steps():
    """The positions and token ids go up in one copy, the verified and the argmax ids come back in one read."""
    be = FakeBackend([1, 2, 3, 4, 5, 6] + [4, 5, 6, 7, 8, 9])
    g = verify_graph(be, 3, [SimpleNamespace(n_past=3, n_ctx=64, steps={"len": 0}),
                             SimpleNamespace(n_past=8, n_ctx=64, steps={"len": 0})])
    logits, h, ids = g.run([[1, 2, 3], [4, 5, 6]])
    assert (logits, h, list(ids)) == ("logits", "h", [4, 5, 6, 7, 8, 9])
    assert g.be.uploads == {"positions, tokens": [3, 4, 5, 8, 9, 10] + [1, 2, 3, 4, 5, 6]}
    assert [(s.n_past, s.steps["len"]) for s in g.states] == [(6, 3), (11, 3)]
    with pytest.raises(ValueError, match=r"2 sequences x 3 tokens fed \[3, 2\]"):
        g.run([[1, 2, 3], [4, 5]])
    be = g.be
    del g
    assert be.destroyed == [1]                   # the graph goes with its object


def test_verify_after_a_draft_takes_its_ids_on_the_device():
    """launch_after: t0 per sequence uploaded, the draft's round-major ids copied into each sequence's rows 1 .. n
    on the device (one 2-D copy per sequence, or per round where the rounds are fewer), then the replay as run();
    a draft of another shape is refused."""
    be = FakeBackend([7, 10, 11, 8, 20, 21] + [4, 5, 6, 7, 8, 9])
    g = verify_graph(be, 3, [SimpleNamespace(n_past=3, n_ctx=64, steps={"len": 0}),
                             SimpleNamespace(n_past=8, n_ctx=64, steps={"len": 0})])
    draft = SimpleNamespace(states=[None, None], n=2, ids=FakeTensor("ids", (4,), 500))   # [r0: s0 s1, r1: s0 s1]
    g.launch_after([7, 8], draft)
    tokens, ids = g.read_ids()
    assert (list(tokens), list(ids)) == ([7, 10, 11, 8, 20, 21], [4, 5, 6, 7, 8, 9])
    assert g.be.uploads == {"positions, tokens": [3, 4, 5, 8, 9, 10] + [7, 0, 0, 8, 0, 0]}
    # sequence i: n = 2 ids of 4 bytes from ids[i], ids[B + i] (pitch 4 * B) to tokens[i * T + 1 ..] (pitch 4)
    assert g.be.copies == [(128, 4, 500, 8, 4, 2), (140, 4, 504, 8, 4, 2)]
    assert [(s.n_past, s.steps["len"]) for s in g.states] == [(6, 3), (11, 3)] and g.be.launches == 1
    g = verify_graph(FakeBackend([0] * 18), 2, [SimpleNamespace(n_past=0, n_ctx=64, steps={"len": 0})
                                                for _ in range(3)])
    g.launch_after([7, 8, 9], SimpleNamespace(states=[None] * 3, n=1, ids=FakeTensor("ids", (3,), 500)))
    # round 0: B = 3 ids of 4 bytes from ids[0] to tokens[1], tokens[T + 1], tokens[2 T + 1] (pitch 4 * T)
    assert g.be.copies == [(124 + 4, 8, 500, 4, 4, 3)]
    assert g.be.uploads == {"positions, tokens": [0, 1] * 3 + [7, 0, 8, 0, 9, 0]}
    with pytest.raises(ValueError, match="after a draft of 2 x 3"):
        g.launch_after([7, 8], SimpleNamespace(states=[None, None], n=3, ids=None))


def test_step_runs_the_draft_and_the_verify_graph_of_its_length(graphs, monkeypatch):
    """SpecGraphs.step: the draft graph launched, the verify of the same length after it, one read: the drafted ids
    are the verify's tokens 1 .. n of each sequence (the draft's own buffer is not read); the verify graph is
    looked up (here: captured) after the draft's launch, off the host's critical path; a shape of several sequences
    asked for the first time is declined (None) before anything runs."""
    calls = []
    monkeypatch.setattr(FakeVerify, "__init__", lambda self, *args: calls.append(("verify made",)))
    monkeypatch.setattr(FakeDraft, "launch", lambda self, tokens, h: calls.append(("draft", self.n, tuple(tokens))),
                        raising=False)
    monkeypatch.setattr(FakeDraft, "read", lambda self: calls.append(("read",)), raising=False)
    monkeypatch.setattr(FakeVerify, "launch_after", lambda self, t0s, d: calls.append(("verify", d.n, tuple(t0s))),
                        raising=False)
    monkeypatch.setattr(FakeVerify, "outputs", ("l", "h"), raising=False)
    monkeypatch.setattr(FakeVerify, "read_ids", lambda self: calls.append(("verify read",)) or
                        (np.asarray([7, 1, 2], np.int32), [0]), raising=False)
    g = graphs(n_max=3)
    st, ms = _states(1)[0], _states(1)[0]
    assert g.step([st], [ms], [7], [[5, 7]], [[None, None]], 2, lambda: calls.append(("meanwhile",))) == \
        ([[1, 2]], "l", "h", [0])
    assert calls == [("draft", 2, (5, 7)), ("verify made",), ("verify", 2, (7,)), ("meanwhile",), ("verify read",)]
    a, b = _states(2)
    assert g.step([a, b], [a, b], [1, 2], [[1], [2]], [[None], [None]], 3) is None and len(calls) == 5
