"""MTP draft-and-verify (engine/speculative.py) on CUDA graphs: the head's draft rounds and the target's verify
forward each recorded once and replayed, as backends/cuda_graphs.py does for the plain decode step. An eager
verify of a 9B model costs ~10 ms of Python and launches, a replayed one about a decode step (~3 ms).

CapturedDraft: the MTP head for a fixed list of sequences, all n_max rounds in one graph. Round 0 runs each
sequence's catch-up rows (its pending (token, h) pairs, then t0 with h_last); its last row's draft id (the head's
argmax on the device, through its coarse copy where --spec-draft-coarse set one: Qwen35Model.mtp_forward) is round
0's, and every later round embeds the previous round's ids and chains on the head's own output state, with no host
round trip between rounds. The catch-up lengths are part of the graph's shape (1 ..
n_max + 2 rows: one more than the tokens the previous step kept), so one sequence has n_max + 2 draft graphs;
several sequences come with one row each (the Speculator runs their pending pairs first), and a list of several
is captured the second time it is asked for (the first runs eagerly), so that slot lists that rarely repeat do
not capture a graph every step.

CapturedVerify: the target's forward over [t0, d1 .. dn] of each sequence, n = n_max (fixed per graph), with
StepBatch.keep_steps on, the hidden state the head reads, and the argmax of every row on the device. The host
uploads the token ids and positions, replays, and reads back only the ids (the token rows, whose drafts came from
the draft graph on the device, and the argmax, in one read); the logits and h stay in the graph's
buffers (valid until its next replay) for sampled rows, commit() and a request's last row.

Numerics: both are captured with CudaBackend.capturing set, the same row order as the decode step and as the eager
verify's decode_order(), so each verified token's logits are its decode's bit for bit (greedy output with MTP on
equals MTP off: tests/test_mtp_cuda.py runs it with graphs on and off). The per-token recurrent states a verify
keeps live on each state (CudaBackend._steps, from the backend's own arena, never a graph's); restore_steps stays
eager. Memory: as CapturedStep, each graph's intermediates come from an arena of its own.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Sequence

import numpy as np

from .base import Segment, SeqState, StepBatch
from .cuda_graphs import RecordedGraph


class _Captured:
    """Records `body()` as a cuda_graphs.RecordedGraph (the one capture mechanism: an arena of the graph's own);
    the states' n_past (and keep_steps lengths) are put back, since nothing ran."""

    def _capture(self, states: Sequence[SeqState], body) -> None:
        saved = [(s.n_past, s.steps["len"] if s.steps is not None else None) for s in states]
        try:
            self.graph = RecordedGraph(self.be, body)
        finally:
            for s, (n, steps) in zip(states, saved):
                s.n_past = n
                if s.steps is not None:
                    s.steps["len"] = steps or 0


class CapturedDraft(_Captured):
    """n rounds of the MTP head for MTP states `states` whose round 0 has `lengths` rows each (see module doc)."""

    def __init__(self, be, model, states: Sequence[SeqState], lengths: Sequence[int], n: int):
        self.be, self.states, self.lengths, self.n = be, list(states), list(lengths), n
        B, R0, D = len(self.states), sum(self.lengths), model.cfg.n_embd
        last = np.cumsum(self.lengths) - 1
        # the token ids and positions in one buffer: a replay's inputs go up in one copy (this one is on the host's
        # critical path: between the verified ids and the draft launch the device is idle)
        self.inputs = be.from_host(np.zeros(2 * R0 + (n - 1) * B, np.int32), "i32", "draft graph ids and positions")
        self.tok0, self.pos = self.inputs.rows(0, R0), self.inputs.rows(R0, R0 + (n - 1) * B)
        self._stage_inputs()
        self.h0 = be.empty((R0, D), "f32", "draft graph hidden input")
        self.ids = be.empty((n * B,), "i32", "draft graph ids")              # round r at rows r*B .. r*B + B-1
        self.last = be.from_host(last.astype(np.int32), "i32", "draft graph round-0 rows")
        self.one = be.from_host(np.arange(B, dtype=np.int32), "i32", "draft graph rows")
        self._capture(self.states, lambda: self._record(model))

    def _record(self, model) -> None:
        be, B, R0 = self.be, len(self.states), self.tok0.shape[0]
        segs, start = [], 0
        for st, L in zip(self.states, self.lengths):
            segs.append(Segment(start, L, st))
            start += L
        batch = StepBatch(self.tok0, np.zeros(R0, np.int32), segs, self.last)
        batch.device["cuda_pos"] = self.pos.rows(0, R0)
        _, h = model.mtp_forward(batch, self.h0, draft_ids=True, out=self.ids.rows(0, B))
        h = be.gather_rows(h, self.last)                                    # [B, D] each sequence's last row
        for r in range(1, self.n):
            batch = StepBatch(self.ids.rows((r - 1) * B, B), np.zeros(B, np.int32),
                              [Segment(i, 1, st) for i, st in enumerate(self.states)], self.one)
            batch.device["cuda_pos"] = self.pos.rows(R0 + (r - 1) * B, B)
            _, h = model.mtp_forward(batch, h, draft_ids=True, out=self.ids.rows(r * B, B))
        self.outputs = h

    def run(self, tokens: Sequence[int], h_parts: Sequence) -> list[list[int]]:
        """tokens [R0]: every sequence's catch-up ids; h_parts: device tensors [r_i, D] whose rows, in order, are
        h0 [R0, D] -> n drafted ids per sequence (the only bytes that cross). Advances the MTP states."""
        self.launch(tokens, h_parts)
        return self.read()

    def _stage_inputs(self) -> None:
        """The host side of a replay's inputs, laid out once (launch() is on the host's critical path: between the
        verified ids and the draft launch the device is idle): a buffer the ids and positions are written into
        and its address (ndarray.ctypes costs ~1.3 us a read), each position as (its sequence, rows past that
        sequence's n_past), and the rows each sequence advances by."""
        B = len(self.states)
        self._staged = np.zeros(2 * sum(self.lengths) + (self.n - 1) * B, np.int32)
        self._staged_at = self._staged.ctypes.data
        self._pos_of = [(i, k) for i, L in enumerate(self.lengths) for k in range(L)] + \
                       [(i, L - 1 + r) for r in range(1, self.n) for i, L in enumerate(self.lengths)]
        self._advance = [L + self.n - 1 for L in self.lengths]

    def launch(self, tokens: Sequence[int], h_parts: Sequence) -> None:
        """run() without reading the ids back: they stay in self.ids (round r of sequence i at r * B + i) for a
        verify replay to take on the device (CapturedVerify.launch_after)."""
        be, R0 = self.be, self.tok0.shape[0]
        if len(tokens) != R0:
            raise ValueError(f"draft graph of {R0} catch-up rows fed {len(tokens)} ids")
        p0 = [s.n_past for s in self.states]
        for s, p, k in zip(self.states, p0, self._advance):
            if p + k > s.n_ctx:
                raise ValueError(f"draft needs {p + k} positions, the context is {s.n_ctx}")
        self._copy_h0(h_parts)
        self._staged[:] = list(tokens) + [p0[i] + k for i, k in self._pos_of]
        be.native.cmp_memcpy_h2d(self.inputs.ptr, self._staged_at, self._staged.nbytes)
        self.graph.launch()
        for s, k in zip(self.states, self._advance):
            s.n_past += k

    def _copy_h0(self, h_parts: Sequence) -> None:
        """The pairs' h rows into h0: they live in separate tensors, gathered by d2d copies, one per run of
        adjacent rows (h_last and a round's kept rows are adjacent rows of the sequence's ring: Speculator._keep).
        Nothing is copied unless they fill h0 exactly."""
        runs, end = [], self.h0.ptr               # run: [destination, source address, bytes]
        for x in h_parts:
            nbytes = x.nbytes
            if runs and runs[-1][1] + runs[-1][2] == x.ptr:
                runs[-1][2] += nbytes
            else:
                runs.append([end, x.ptr, nbytes])
            end += nbytes
        if end != self.h0.ptr + self.h0.nbytes:
            raise ValueError(f"draft graph of {self.h0.shape[0]} catch-up rows fed "
                             f"{sum(x.shape[0] for x in h_parts)} hidden rows")
        copy = self.be.native.cmp_memcpy_d2d
        for dst, src, nbytes in runs:
            copy(dst, src, nbytes)

    def read(self) -> list[list[int]]:
        """The last replay's n ids per sequence (waits for it)."""
        ids = self.be.ids_to_host(self.ids).reshape(self.n, len(self.states))
        return [ids[:, i].tolist() for i in range(len(self.states))]


class CapturedVerify(_Captured):
    """The target's forward over 1 + n tokens of each of `states`, keep_steps on, every row argmaxed."""

    def __init__(self, be, model, states: Sequence[SeqState], n: int, n_max: int):
        self.be, self.states, self.T, self.room = be, list(states), n + 1, n_max + 1
        R = len(self.states) * self.T
        # positions, token ids and argmax ids in one buffer: a replay's inputs go up in one copy and the ids come
        # back in one read, the drafted ones (copied in from the draft graph) with the verified ones; each read is
        # a wait on the host's critical path (the device is idle from the ids' arrival to the next draft launch)
        self.io = be.from_host(np.zeros(3 * R, np.int32), "i32", "verify graph positions and ids")
        self.pos, self.tokens, self.greedy = self.io.rows(0, R), self.io.rows(R, R), self.io.rows(2 * R, R)
        self._up, self._back = self.io.rows(0, 2 * R), self.io.rows(R, 2 * R)   # (positions, tokens), (tokens, argmax)
        self.rows = be.from_host(np.arange(R, dtype=np.int32), "i32", "verify graph output rows")
        self._capture(self.states, lambda: self._record(model))

    def _record(self, model) -> None:
        T, R = self.T, self.tokens.shape[0]
        batch = StepBatch(self.tokens, np.zeros(R, np.int32),
                          [Segment(i * T, T, st) for i, st in enumerate(self.states)], self.rows)
        batch.keep_steps = self.room         # the per-token buffers of every draft length's verify: the same
        batch.device["cuda_pos"] = self.pos
        logits, h = model.forward_hidden(batch)
        self.be.argmax(logits, out=self.greedy)
        self.outputs = (logits, h)

    def run(self, tokens: Sequence[Sequence[int]]):
        """tokens: [t0, d1 .. dn] per state -> (logits [B*T, N], h [B*T, D] on the device, the argmax of every row
        [B*T] on the host). Advances every state by T and leaves its per-token states for restore_steps."""
        if len(tokens) != len(self.states) or any(len(t) != self.T for t in tokens):
            raise ValueError(f"verify graph of {len(self.states)} sequences x {self.T} tokens fed "
                             f"{[len(t) for t in tokens]}")
        self._check_room()
        self._upload([t for ts in tokens for t in ts])
        self._replay()
        return self.read()

    def read(self):
        """-> (logits, h on the device, the argmax of every row on the host: waits for the replay)."""
        return self.outputs[0], self.outputs[1], self.read_ids()[1]

    def read_ids(self):
        """-> (the token ids the replay verified, the argmax of every row), both [B*T] on the host, in one read
        (waits for the replay)."""
        R = self.tokens.shape[0]
        ids = self.be.ids_to_host(self._back)
        return ids[:R], ids[R:]

    def launch_after(self, t0s: Sequence[int], draft: "CapturedDraft") -> None:
        """run() of [t0, the draft's n ids] per state without reading back, the ids taken from the draft graph's
        buffer on the device (copied after its replay on the same stream): the host waits for neither; read_ids()
        gives them back with the verified ids."""
        be, T, B = self.be, self.T, len(self.states)
        if len(t0s) != B or len(draft.states) != B or draft.n != T - 1:
            raise ValueError(f"verify graph of {B} sequences x {T} tokens after a draft of {len(draft.states)} "
                             f"x {draft.n} with {len(t0s)} first tokens")
        self._check_room()
        tokens = [0] * (B * T)
        tokens[::T] = t0s
        self._upload(tokens)
        # the ids into rows 1 .. n of each sequence's T in min(B, n) copies: these run on the device between the
        # two graphs (one sequence: one copy, not one per round)
        if B <= draft.n:                       # sequence i's n ids (a column of the round-major buffer)
            for i in range(B):
                be.native.cmp_memcpy2d_d2d(self.tokens.row_ptr(i * T + 1), 4, draft.ids.row_ptr(i), 4 * B, 4, draft.n)
        else:                                  # round r's B ids (contiguous) -> row 1 + r of each sequence
            for r in range(draft.n):
                be.native.cmp_memcpy2d_d2d(self.tokens.row_ptr(1 + r), 4 * T, draft.ids.row_ptr(r * B), 4, 4, B)
        self._replay()

    def _check_room(self) -> None:
        for s in self.states:
            if s.n_past + self.T > s.n_ctx:
                raise ValueError(f"sequence needs {s.n_past + self.T} positions, its context is {s.n_ctx}")

    def _upload(self, tokens: Sequence[int]) -> None:
        """The next replay's positions and token ids [B*T], in one copy."""
        pos = [s.n_past + i for s in self.states for i in range(self.T)]
        self.be.copy_from_host(self._up, np.asarray(pos + list(tokens), np.int32))

    def _replay(self) -> None:
        self.graph.launch()
        for s in self.states:
            s.n_past += self.T
            s.steps["len"] = self.T


class SpecGraphs:
    """The draft and verify graphs of one Speculator (n = 1 .. n_max drafts per sequence: the draft length is chosen
    per round, engine/draft_policy.py), most recently used kept: keyed by the draft length, the states' identities
    (a graph holds its states, so an id is not reused while it is cached) and, for drafts, the catch-up lengths and
    the draft head (set_head: a draft graph bakes in the LM head's rows it read when captured)."""

    def __init__(self, be, model, n_max: int, capacity: int = 8, seqs: int = 1):
        """seqs: the sequences (server slots) that draft: each one's every draft shape is kept."""
        if capacity < 1 or n_max < 1 or seqs < 1:
            raise ValueError(f"SpecGraphs needs n_max, capacity and seqs >= 1 (got {n_max}, {capacity}, {seqs})")
        self.be, self.model, self.n, self.capacity = be, model, n_max, capacity
        # verify graphs: `capacity` lists of sequences per length; draft graphs: every catch-up length and every
        # draft length of each of the `seqs` sequences alone, and as much again for one more (lists of several
        # sequences; 2 x one list's shapes at seqs = 1). Fewer than every slot's shapes made a server whose
        # requests go to its slots in turn (LRU) capture them again at each request: -np 4 kept 24 of the 48 that
        # n_max 3 gives 4 slots. Each graph holds an arena of at least GRAPH_CHUNK, outside the memory plan like
        # the decode graphs', taken only when a shape is first used.
        self.draft_room = self._room = (seqs + 1) * sum(n + 2 for n in range(1, n_max + 1))
        self.head, self._heads = None, set()      # the draft head (None: the one the model has, fixed)
        self._draft: OrderedDict[tuple, CapturedDraft] = OrderedDict()
        self._verify: OrderedDict[tuple, CapturedVerify] = OrderedDict()
        self._asked: OrderedDict[tuple, None] = OrderedDict()     # draft shapes asked for once, not captured yet
        self.n_captured = self.n_replayed = self.n_declined = 0

    def _get(self, cache: OrderedDict, key: tuple, make, room: int):
        g = cache.get(key)
        if g is None:
            while len(cache) >= room:
                cache.popitem(last=False)
            g = cache[key] = make()
            self.n_captured += 1
        else:
            cache.move_to_end(key)
            self.n_replayed += 1
        return g

    def _length(self, n) -> int:
        n = self.n if n is None else n
        if not 1 <= n <= self.n:
            raise ValueError(f"draft length {n} outside 1 .. {self.n}")
        return n

    def set_head(self, head: str) -> None:
        """The model's draft head is now `head` (--spec-draft-vocab auto: "prefix" or "whole"): later drafts replay
        or capture that head's graphs; the other head's stay cached for a switch back (the room grows with the
        heads seen, so that switching does not evict them)."""
        self._heads.add(head)
        self.head = head
        self.draft_room = self._room * len(self._heads)

    def draft(self, states: Sequence[SeqState], tokens: Sequence[Sequence[int]], h_parts: Sequence[Sequence],
              n: int | None = None):
        """MTP states, each one's catch-up ids and their h tensors -> n (default n_max) drafted ids per sequence;
        None (nothing ran) for a shape asked for the first time: the caller drafts eagerly."""
        g = self._draft_graph(states, tokens, self._length(n))
        return None if g is None else g.run([t for ts in tokens for t in ts], [x for xs in h_parts for x in xs])

    def step(self, states: Sequence[SeqState], mtp_states: Sequence[SeqState], t0s: Sequence[int],
             tokens: Sequence[Sequence[int]], h_parts: Sequence[Sequence], n: int, while_running=None):
        """draft() then verify() of [t0, the drafts] per target state, the drafted ids passed on the device: the
        host waits once, after the verify, instead of once per graph (the Python between them left the GPU
        idle); while_running() is called while both run (the server sends the last step's results then).
        -> (drafts, logits, h, argmax ids) as draft() and verify(); None (nothing ran) where draft() declines
        the shape. The drafts come back with the verified ids, in one read (CapturedVerify.read_ids)."""
        n = self._length(n)
        d = self._draft_graph(mtp_states, tokens, n)
        if d is None:
            return None
        d.launch([t for ts in tokens for t in ts], [x for xs in h_parts for x in xs])
        # the verify graph looked up (or captured: nothing runs) while the draft runs, not before its launch: from
        # the last round's ids to this launch the device is idle
        v = self._verify_graph(states, n)
        v.launch_after(t0s, d)
        if while_running is not None:
            while_running()
        verified, ids = v.read_ids()
        T = n + 1
        return [verified[i * T + 1:(i + 1) * T].tolist() for i in range(len(states))], *v.outputs, ids

    def _draft_graph(self, states, tokens, n: int):
        """The draft graph of these MTP states, catch-up lengths and n; None when declined (see draft())."""
        lengths = tuple(map(len, tokens))
        key = (self.head, n) + tuple(map(id, states)) + lengths
        g = self._draft.get(key)
        if g is not None:           # a replay, as _get's (the usual round: its lookup is on the host's critical path)
            self._draft.move_to_end(key)
            self.n_replayed += 1
            if self._asked:         # (a shape asked once, then captured by prepare(), stops being asked here)
                self._asked.pop(key, None)
            return g
        if len(states) > 1 and key not in self._asked:
            self._asked[key] = None
            while len(self._asked) > 64 * self.capacity:
                self._asked.popitem(last=False)
            self.n_declined += 1
            return None
        self._asked.pop(key, None)
        return self._get(self._draft, key, lambda: CapturedDraft(self.be, self.model, states, lengths, n),
                         self.draft_room)

    def verify(self, states: Sequence[SeqState], tokens: Sequence[Sequence[int]]):
        """[t0, d1 .. dn] per target state (n <= n_max, the same for all) -> (logits, h, argmax ids) of
        CapturedVerify.run."""
        return self._verify_graph(states, self._length(len(tokens[0]) - 1 if tokens else None)).run(tokens)

    def _verify_graph(self, states, n: int):
        key = (n,) + tuple(map(id, states))
        return self._get(self._verify, key, lambda: CapturedVerify(self.be, self.model, states, n, self.n),
                         self.capacity * self.n)

    def prepare(self, states: Sequence[SeqState], mtp_states: Sequence[SeqState],
                lengths: Sequence[int] | None = None, catch_ups: Sequence[int] | None = None,
                stop: Callable[[], bool] | None = None) -> None:
        """Capture the verify graph of `states` and the draft graphs of `mtp_states` for each catch-up length in
        `catch_ups` (all sequences at the same length; default every one, 1 .. n + 2 rows), for each draft length
        n in `lengths` (default n_max). Graphs already held are kept, not counted as replays; capturing runs
        nothing. stop: asked before each capture; once it says True the rest are left to their first use (the
        server: another request arrived, which would wait for them). So the order is how soon a lone request needs
        them: each length's verify and its draft of the first catch-up length (1: t0 alone, a request's first
        round), the longest length first (what a new cost table explores), then the other catch-up lengths."""
        ns = sorted({self._length(n) for n in lengths or (self.n,)}, reverse=True)
        ups = {n: list(catch_ups or range(1, n + 3)) for n in ns}
        for n in ns:
            for L in ups[n]:
                if not 1 <= L <= n + 2:
                    raise ValueError(f"catch-up length {L} outside 1 .. {n + 2}")
        jobs = [(n, L) for n in ns for L in [None] + ups[n][:1]] + [(n, L) for n in ns for L in ups[n][1:]]
        for n, L in jobs:
            if L is None:
                held = self._have(self._verify, (n,) + tuple(id(s) for s in states),
                                  lambda n=n: CapturedVerify(self.be, self.model, states, n, self.n),
                                  self.capacity * self.n, stop)
            else:
                cl = (L,) * len(mtp_states)
                held = self._have(self._draft, (self.head, n) + tuple(id(s) for s in mtp_states) + cl,
                                  lambda n=n, cl=cl: CapturedDraft(self.be, self.model, mtp_states, cl, n),
                                  self.draft_room, stop)
            if not held:
                return

    def _have(self, cache: OrderedDict, key: tuple, make, room: int, stop=None) -> bool:
        """-> False when the graph is not held and stop() declined its capture."""
        if key in cache:
            cache.move_to_end(key)
        elif stop is not None and stop():
            return False
        else:
            self._get(cache, key, make, room)
        return True
