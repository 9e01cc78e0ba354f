"""Speculative decoding with the model's own MTP head (--spec-type draft-mtp), independent of the driver.

One step for a list of sequences, each with its last sampled token t0 pending at position P (= state.n_past):
  1. draft   up to n_max tokens per sequence with the MTP head, all sequences in one MTP forward per draft round;
  2. verify  [t0, d1..dn] of every sequence in one main forward (all logits; the recurrent layers keep their state
             after each token: StepBatch.keep_steps);
  3. accept  row by row (accept_tokens): the target's own draw at row i is compared with d(i+1) -- for greedy
             rows exactly the decode's argmax, for sampled rows the speculative-sampling rule (accept d with
             probability min(1, p(d)/q(d)), else draw from norm(max(0, p - q))), with q the draft's distribution
             (a point mass: drafts are the MTP argmax, as llama.cpp's top-k 10 draft sampler takes data[0]), so the
             output distribution is the sampler chain's own;
  4. commit  keep the first j verified tokens (Backend.restore_steps; KV rows past them are overwritten later).

How llama.cpp 0c1e570 feeds the head (common/speculative.cpp, common_speculative_impl_draft_mtp): the MTP input at
position p is the token x_p with the target's hidden state h_(p-1) (the row before; zeros before the first token),
for every position the target evaluates (process(): prompt included), so the head's own KV cache covers the whole
sequence. Here those (token, h) pairs wait in MtpSeq.pending until the next draft, whose first MTP forward runs them
together with (t0, h_(P-1)). Pairs run apart from a draft (a prompt's; plain steps' past what a draft takes) only
fill the head's KV cache (Qwen35Model.mtp_fill): nothing else of the block is read for them.

On a backend that captures graphs (Backend.spec_graphs: backends/spec_graphs.py) the draft rounds and the verify
forward are replayed CUDA graphs, with the argmax on the device and only ids crossing, while the context has room
for 1 + n rows per sequence: the draft when it runs all n rounds (no p_min, which reads each row's top-10 on the
host), the verify with fewer drafts padded to n. Otherwise, and on the numpy reference, they run eagerly
(graphs=False forces that). Both give each verified token its decode's logits.

Adaptive drafting (engine/draft_policy.py): before each round the driver asks plan() for the draft length n of
this round, 0 meaning a plain decode step (the driver's own, through its decode graph). The Speculator times its
draft and verify, the driver times its plain steps (time_plain) and feeds the heads the target's hidden states of
those steps (observe_plain), and commit() counts each sequence's acceptance; the policy picks the n with the most tokens
per second from those figures. While a plain step runs on the device the driver may have the next round weighed
(plan_ahead), which plan() then takes (the step's own timing only comes with its ids). adaptive=False drafts n_max
every round (llama.cpp's behaviour).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from ..backends.base import SeqState, StepBatch
from ..sampling import Sampler, SamplingParams
from ..spec import AUTO, COARSE_TYPE, KEPT_ROUNDS, PENDING_MAX, CoarseHead, coarse_head
from .decode import draw_tokens, plan_row
from .draft_policy import Acceptance, CostTable, DraftPolicy
from .draft_vocab import AutoVocab, VocabWindow

log = logging.getLogger("llamacmp.engine")
_ARGMAX = Sampler(SamplingParams(temp=0.0, seed=0))     # a neutral greedy chain: the backend's plain argmax
DRAFT_TOP_K = 10                                        # llama.cpp's draft sampler (p_min is a top-10 probability)


def enabled_spec(run):
    """A run_plan.RunPlan's spec.SpecConfig when it asks for speculative decoding, else None. (RunPlan.spec comes
    with the --spec-* parsing; a plan without the field runs as before.)"""
    spec = getattr(run, "spec", None)
    return spec if spec is not None and spec.enabled else None


class SpecUnsupported(ValueError):
    """The model or the request cannot run speculative decoding; the message names why."""


@dataclass(slots=True)
class MtpSeq:
    """One sequence's drafting memory: the MTP block's KV cache and the target's hidden state it is fed with.
    Invariant: state.n_past + len(pending) == the target sequence's n_past."""
    state: SeqState                                     # the MTP block's KV cache (Qwen35Model.mtp_state)
    h_last: object                                      # [1, D] the target's h at position n_past - 1 (zeros at 0)
    pending: list[int] = field(default_factory=list)    # tokens at positions state.n_past.. not yet run by the head
    pending_h: list = field(default_factory=list)       # tensors of rows [r, D]: h of the position before each
    n_drafted: int = 0                                  # this sequence's totals (timings draft_n, draft_n_accepted)
    n_accepted: int = 0
    acc: Acceptance = field(default_factory=Acceptance)  # recent acceptance (draft_policy: when drafting pays)
    kept: object = None                                 # [KEPT_ROUNDS * (n_max + 1), D]: commits' kept h rows (_keep)
    kept_at: int = 0                                    # its next row


@dataclass(slots=True)
class Verified:
    """One sequence's verify segment: t0 and its drafts at positions pos .. pos + len(drafts)."""
    state: SeqState
    mtp: MtpSeq
    t0: int
    drafts: list[int]
    pos: int
    row: int                   # the segment's first row in the verify batch's logits / h
    greedy: Optional[list[int]] = None   # the argmax of rows row .. row + len(drafts), drawn on the device (graphs)


class Speculator:
    """Draft, verify and commit for a model with an MTP head (models/qwen35.py Qwen35Model.mtp)."""
    pending_max = PENDING_MAX                         # observe_plain's queue bound (a test lowers it per instance)

    def __init__(self, model, n_max: int = 3, n_min: int = 0, p_min: float = 0.0, graphs: bool = True,
                 adaptive: bool = True, costs: Optional[CostTable] = None, auto: Optional[AutoVocab] = None,
                 n_seqs: int = 1, coarse: Optional[CoarseHead] = None, pooled: Optional[Acceptance] = None):
        """graphs: replay captured draft / verify graphs where the backend has them (False: always eager).
        adaptive: choose each round's draft length (0: plain) from measured costs (draft_policy), else always
        n_max; costs: a cost table to start from, pooled: the verifies pooled so far (start(); a benchmark's
        repetitions share both, as a server's requests do). auto: --spec-draft-vocab
        auto's constants: the head drafts from their prefix or the whole vocabulary as the committed tokens say
        (engine/draft_vocab.py; None: the head the model has, set_draft_vocab). n_seqs: the sequences that draft
        (the server's slots): the graphs keep every one's shapes. coarse: --spec-draft-coarse's head (a draft head
        of at least coarse.min_rows rows takes its argmax through a CQ2 copy of the first coarse.rows rows, its
        coarse.k best rescored by the exact head; set_coarse); None: the exact head."""
        if model.mtp is None:
            raise SpecUnsupported("the model has no MTP head")
        if n_max < 1:
            raise SpecUnsupported(f"--spec-draft-n-max must be at least 1 for draft-mtp, got {n_max}")
        self.model, self.be = model, model.be
        self.n_max, self.n_min, self.p_min = n_max, n_min, p_min
        self.n_drafted = self.n_accepted = 0          # totals, for the draft_n / draft_n_accepted timings
        self.pooled = pooled if pooled is not None else Acceptance()   # every sequence's verifies (start)
        self.prompt_head_s = self.prompt_graphs_s = 0.0   # host time of prompts' head work and lone captures (log)
        self.n_eager = 0                              # drafting rounds run eagerly though graphs exist
        self.graphs = model.be.spec_graphs(model, n_max, seqs=n_seqs) if graphs else None
        self.policy = DraftPolicy(n_max, n_min, costs) if adaptive else None
        self._round = None                            # (S, n, start, clean) of the draft awaiting its verify
        self._ahead = None                            # (key, DraftPolicy.best) of plan_ahead, for the next plan()
        self._unrecorded = None                       # [S, n, seconds] of a verified round, until its commits end
        self._flight = None                           # (items, n, while_running) of _step_graph's round on the device
        self.vocab = None                             # auto's window of committed tokens (None: a fixed head)
        if auto is not None and auto.applies(model.mtp.head.shape[0]):
            self.vocab = VocabWindow(auto)
        self._head = None
        self._use_head()
        self.coarse: Optional[CoarseHead] = None      # the coarse head the draft uses (None: the exact head)
        self.set_coarse(coarse)

    @classmethod
    def from_spec(cls, model, spec, path: str = "the model", costs: Optional[CostTable] = None,
                  n_seqs: int = 1, pooled: Optional[Acceptance] = None) -> "Speculator":
        """From a spec.SpecConfig (type draft-mtp); a file without MTP layers is refused naming it and the flag."""
        if model.mtp is None and model.cfg.n_nextn:
            raise SpecUnsupported(f"--spec-type {spec.type}: the MTP head of '{path}' is not loaded (a layer split "
                                  "over several GPUs does not run it yet: use one GPU, -sm none, or drop --spec-type)")
        if model.mtp is None:
            raise SpecUnsupported(f"--spec-type {spec.type}: '{path}' has no MTP layers "
                                  "(qwen35.nextn_predict_layers); drop --spec-type or use a GGUF with its MTP head")
        auto = AutoVocab() if spec.draft_vocab == AUTO else None
        try:
            model.set_draft_vocab(0 if auto else spec.draft_vocab)  # before cls(): draft graphs capture its head
        except ValueError as e:
            raise SpecUnsupported(str(e)) from None
        coarse = coarse_head(spec, model.mtp.head.shape[0], model.cfg.n_embd, model.mtp.head_type)
        return cls(model, spec.n_max, spec.n_min, spec.p_min, costs=costs, auto=auto, n_seqs=n_seqs, coarse=coarse,
                   pooled=pooled)

    def set_coarse(self, coarse: Optional[CoarseHead]) -> None:
        """Make the model's draft use `coarse` (None: the exact head), before any draft graph is captured. A copy
        the backend cannot make (no memory left, no such op) leaves the exact head, said once in the log."""
        self.coarse = None
        if coarse is None:
            self.model.set_draft_coarse(0)
            return
        t_start = time.perf_counter()
        try:
            made = self.model.set_draft_coarse(coarse.k, coarse.rows, coarse.min_rows)
        except (MemoryError, NotImplementedError) as e:
            log.warning("MTP draft: no %s coarse head (%s); drafting reads the exact LM head", COARSE_TYPE, e)
            return
        if made:
            self.be.synchronize()
            log.info("MTP draft: a %s copy of the LM head's first %d rows made in %.0f ms (--spec-draft-coarse %d: "
                     "draft heads of %d+ rows rescore its %d best ids with the exact head)", COARSE_TYPE,
                     coarse.rows, 1e3 * (time.perf_counter() - t_start), coarse.k, coarse.min_rows, coarse.k)
        self.coarse = coarse

    # -- the draft vocabulary (--spec-draft-vocab auto) ----------------------------------------------------------
    @property
    def draft_head(self) -> str:
        """Which head drafts: "prefix" or "whole" under auto, "fixed" otherwise (set_draft_vocab's)."""
        return self.vocab.head if self.vocab is not None else "fixed"

    def vocab_state(self) -> dict:
        """For the server's metrics: the LM head rows the draft reads now and auto's switches so far."""
        t = self.model.mtp
        head = t.head if t.draft_head is None else t.draft_head
        return {"rows": int(head.shape[0]), "switches": self.vocab.n_switches if self.vocab is not None else 0,
                "coarse_rows": int(head.shape[0]) if t.draft_coarse is not None else 0}

    def _observe(self, tokens) -> None:
        if self.vocab is not None:
            self.vocab.observe(tokens)

    def _use_head(self) -> None:
        """Put auto's chosen head in place before a round: the model's draft head, the graphs' set of draft graphs
        (one per head, kept: a switch back replays the earlier captures) and the policy's round costs (a round of
        the prefix head costs less: its timings must not decide for the whole head). A round awaiting its record
        goes into the table of the head it ran with."""
        head = self.draft_head
        if head == self._head:
            return
        self._record_round()
        self._head = head
        if self.vocab is None:
            return
        self.model.set_draft_vocab(self.vocab.auto.prefix if head == "prefix" else 0)
        if self.graphs is not None:
            self.graphs.set_head(head)
        if self.policy is not None:
            self.policy.costs.use_head(head)

    def new_seq(self, n_ctx: int, kv_type: str = "f16", v_type: str | None = None) -> MtpSeq:
        ring = np.zeros((KEPT_ROUNDS * (self.n_max + 1), self.model.cfg.n_embd), np.float32)
        return MtpSeq(self.model.mtp_state(n_ctx, kv_type, v_type), self._zeros(), kept=self.be.upload_vector(ring))

    def _zeros(self):
        return self.be.upload_vector(np.zeros((1, self.model.cfg.n_embd), np.float32))

    def reset(self, ms: MtpSeq, n_past: int) -> None:
        """The target state was set to n_past by other means (a prompt-cache checkpoint): the head's memory of it is
        gone. Drafts get worse until it has seen new tokens; the output does not change (verification decides)."""
        ms.state.n_past, ms.h_last, ms.pending, ms.pending_h = n_past, self._zeros(), [], []

    # -- prefill ------------------------------------------------------------------------------------------------
    def prefill(self, state: SeqState, ms: MtpSeq, tokens: Sequence[int], all_logits: bool = False,
                defer: bool = False):
        """The target's forward over a prompt chunk, then the head over the same positions (its KV cache) ->
        the target's logits, as Decoder.prefill. defer (the server): the head's part waits in the queue for
        prompt_end(), the first draft or the plain steps' catch-up (at most pending_max pairs: past that it runs
        now), so that it is not on the way to the prompt's first token when other requests are in flight."""
        if ms.state.n_past + len(ms.pending) != state.n_past:
            self.reset(ms, state.n_past)
        logits, h = self.model.forward_hidden(StepBatch.build([(state, list(tokens))], all_logits=all_logits))
        self._push(ms, list(tokens), h)
        if not defer or len(ms.pending) > self.pending_max:
            self._head_over_queue(ms)
        return logits

    def _head_over_queue(self, ms: MtpSeq) -> None:
        """The head's KV cache over one sequence's queued pairs (Qwen35Model.mtp_fill: nothing else of the block)."""
        t_start = time.perf_counter()
        self.model.mtp_fill(StepBatch.build([(ms.state, ms.pending)]), self.be.concat(ms.pending_h, axis=0))
        # the last row copied out: a view would hold the chunk's whole h until the next round replaces it
        ms.pending, ms.pending_h, ms.h_last = [], [], self.be.copy_rows(ms.h_last, 0, 1)
        self.prompt_head_s += time.perf_counter() - t_start

    def prompt_end(self, state: SeqState, ms: MtpSeq, alone: bool,
                   stop: Optional[Callable[[], bool]] = None) -> None:
        """A request's last prompt chunk was launched on this sequence (a server slot), its first token not drawn
        yet. alone (it may draft, no other slot is busy and no other request waits: its rounds will be of one
        sequence): the head runs over the prompt's queued pairs and the graphs of all its rounds (every draft
        length and every catch-up length: 1 row for the first round, 2 .. n + 2 for the rounds after a round that
        kept 1 .. n + 1 tokens or after plain steps) are captured now, in the prompt's time (before its first
        token is drawn), instead of in its decode, where the bench never pays them (prepare, untimed). Capturing
        only the 1-row shapes left 7-9 draft captures inside each 128-token decode of a fresh slot at synthetic
        length 2.5 (numpy replay of the server's rounds, 2026-12-02), where the bench captured none. A slot keeps
        them while the LRU does (SpecGraphs: room for every slot's shapes). Otherwise neither: the queued pairs
        wait for the first draft or the plain steps' catch-up, which runs them with the other sequences' in one
        forward, and rounds of several sequences capture their shapes at first use. Asked at the prompt's end,
        not when the request was assigned a slot: the first of requests arriving a few ms apart (mtp_streams.py's
        4 streams) found the others not there yet and captured a draft graph before its prompt (4 of the start's
        ~50 ms over MTP off, H200). stop (the server: a request arrived meanwhile): asked before each capture;
        True leaves the rest to their first use (up to 3 verify and 12 draft graphs at n_max 3, which rounds of
        several sequences never replay)."""
        if not alone:
            return
        if ms.pending and ms.state.n_past + len(ms.pending) == state.n_past:
            self._head_over_queue(ms)
        if self.graphs is None:
            return
        t_start, made = time.perf_counter(), self._events()
        try:
            self.prepare([(state, ms)], stop=stop)
        except MemoryError as e:        # (DeviceMemoryError is one) the rounds capture at first use, or run eagerly
            log.info("MTP graphs not captured ahead (%s); captured at first use", e)
        if self._events() != made:
            self.prompt_graphs_s += time.perf_counter() - t_start
            log.info("MTP graphs: %d captured for a request starting alone (%s head) in %.1f ms",
                     self._events() - made, self.draft_head, 1e3 * (time.perf_counter() - t_start))

    def _keep(self, ms: MtpSeq, h, row: int, j: int):
        """A verify's kept rows row .. row + j - 1 of h (a graph's buffer, rewritten by its next replay) copied for
        the head's queue -> the copy, in one piece (a gather per part was an index upload and a launch each, three
        a round, on the host's critical path: from the verified ids to the next draft launch the device is idle).
        Written into the sequence's ring right after the rows the last commit kept, so that the next draft's h0
        (h_last, then these) is one copy of adjacent rows and no tensor is made a round. That needs the rows it
        writes to be read by nothing later: ring rows are held only by the queue and h_last, and a draft or a
        catch-up empties the queue (their device copies, queued first, have read them), so with the queue empty
        the one ring row still to be read is h_last, the last commit's last row when it is one; where the ring
        starts over it holds at least twice a round's rows, so h_last is not under the new ones. A queue that is
        not empty (a sequence of several that did not draft keeps it) gets a copy of its own."""
        if ms.pending or 2 * j > ms.kept.shape[0]:
            return self.be.copy_rows(h, row, j)
        at = ms.kept_at if ms.kept_at + j <= ms.kept.shape[0] else 0
        ms.kept_at = at + j
        return self.be.write_rows(ms.kept, at, h, row, j)

    def _push(self, ms: MtpSeq, tokens: list[int], h) -> None:
        """tokens entered the target with hidden rows h [len(tokens), D]: pair each with the row before. The queue
        keeps views of h, which must not be rewritten (not a graph's buffer: a copy)."""
        n = len(tokens)
        ms.pending += tokens
        ms.pending_h.append(ms.h_last)
        if n > 1:
            ms.pending_h.append(self.be.rows(h, 0, n - 1))
        ms.h_last = self.be.rows(h, n - 1, 1)

    # -- adaptive drafting -------------------------------------------------------------------------------------
    def plan(self, seqs: Sequence[MtpSeq], others: int = 0, left: Optional[int] = None) -> int:
        """The draft length of the next round of these sequences (0: the driver runs a plain step, then
        observe_plain); `others`: sequences that step plainly in any case (a drafting round then runs their plain
        step apart); `left`: the most tokens the first of `seqs` to end can still make (its n_predict, its
        context; None: unbounded). Always n_max without adaptive drafting. Takes the weighing plan_ahead() made
        for the same sequences, if it made one since the last plan()."""
        self._record_round()
        self._use_head()
        ahead, self._ahead = self._ahead, None
        if self.policy is None:
            return self.n_max
        accs = [ms.acc for ms in seqs]
        if ahead is not None and ahead[0] == self._ahead_key(seqs, others, left):
            self.policy.count(len(seqs), "ahead")
            return self.policy.choose(accs, others, best=ahead[1])
        return self.policy.choose(accs, others, left=left)

    def beside_prompt(self, seqs: Sequence[MtpSeq]) -> None:
        """These sequences, which could draft, step plainly beside another request's prompt chunk (Engine._step:
        the policy is not asked, nothing of the step is timed); counted as kind 'prompt'."""
        self._tally(len(seqs), "prompt")

    def plan_ahead(self, seqs: Sequence[MtpSeq], others: int = 0, left: Optional[int] = None) -> None:
        """A plain step of these sequences is running on the device: weigh the next round's lengths now
        (DraftPolicy.best), not before the next launch, where the device waits for it. The next plan() takes it
        for the same sequences, acceptance and table entries (_ahead_key); so the round after a plain round is
        weighed without that round's own timing, which comes with its ids (docs/ARCHITECTURE.md, adaptive
        drafting). None while a drafting round's cost awaits its record or auto's head is about to switch. left:
        plan()'s for the next round (the running step makes one token of each sequence)."""
        self._ahead = None
        if self.policy is None or self._unrecorded is not None or self.draft_head != self._head:
            return
        self._ahead = (self._ahead_key(seqs, others, left), self.policy.best([ms.acc for ms in seqs], others, left))

    def _ahead_key(self, seqs: Sequence[MtpSeq], others: int, left: Optional[int]) -> tuple:
        """What plan_ahead's weighing holds for: the sequences, their acceptance, the tokens left, the tables but
        plain costs' values."""
        c = self.policy.costs
        return (tuple(map(id, seqs)), others, tuple((ms.acc.accepted, ms.acc.tried) for ms in seqs), left, c.head,
                tuple(c.plain), tuple(c.spec.items()))

    def observe_plain(self, items: Sequence[tuple[SeqState, MtpSeq, int, int]], h) -> None:
        """A plain step ran token t of each (target state, head memory, t, row) at that row of its hidden state
        h [B, D] (Decoder.decode_hidden): the head queues (t, h of the row before) for its next draft."""
        if not items:                                # (a drafting round's plain step of slots that cannot draft)
            return
        # h is the step's own buffer (a decode graph's, rewritten by its next replay): one copy takes the rows of
        # all S sequences, and each keeps a view of its row (a gather per sequence, each an index upload and a
        # launch, was a per-step cost of MTP at 4 streams, where the policy steps plainly). Rows one after another
        # (every slot of the step may draft: the usual case) are one device-to-device copy, with no index upload.
        rows = [i for _, _, _, i in items]
        if rows[-1] - rows[0] == len(rows) - 1 and rows == list(range(rows[0], rows[0] + len(rows))):
            kept = self.be.copy_rows(h, rows[0], len(rows))
        else:
            kept = self.be.gather_rows(h, np.asarray(rows, np.int32))
        for j, (st, ms, t, _) in enumerate(items):
            if ms.state.n_past + len(ms.pending) != st.n_past - 1:
                self.reset(ms, st.n_past - 1)
            ms.pending.append(int(t))
            ms.pending_h.append(ms.h_last)
            ms.h_last = self.be.rows(kept, j, 1)
        self._observe([t for _, _, t, _ in items])
        # A sequence that keeps stepping plainly (S streams where batching wins) would queue a hidden-state row per
        # token until its next draft: run the head over them once they fill a prefill-sized batch instead.
        self._catch_up([ms for _, ms, _, _ in items if len(ms.pending) >= self.pending_max], 0)

    def time_plain(self, rows: int, seconds: float) -> None:
        """A plain step of `rows` sequences took `seconds` (the driver's clean timing: nothing captured)."""
        if self.policy is not None:
            self.policy.costs.add_plain(rows, seconds)

    def _catch_up(self, seqs: Sequence[MtpSeq], keep: int) -> None:
        """Fill the head's KV cache from the pending pairs of sequences with more than `keep` of them (the draft
        graph takes the rest with t0), as prefill() does (Qwen35Model.mtp_fill: nothing else of the block)."""
        long = [ms for ms in seqs if len(ms.pending) > keep]
        if not long:
            return
        self.model.mtp_fill(StepBatch.build([(ms.state, ms.pending) for ms in long]),
                            self.be.concat([x for ms in long for x in ms.pending_h], axis=0))
        for ms in long:
            ms.pending, ms.pending_h = [], []

    def _events(self) -> int:
        """Graph captures so far: a round during which one was captured is not timed (a one-off cost). A round
        that runs eagerly (a shape of catch-up lengths declined, p_min) is timed: with several slots their lengths
        vary from round to round, so eager rounds are what drafting costs there, and leaving them out made the
        policy draft where batching won (4 streams at 0.82x of MTP off on the H200, 2026-12-02)."""
        g = self.graphs
        return 0 if g is None else getattr(g, "n_captured", 0)

    def _declined(self) -> int:
        return 0 if self.graphs is None else getattr(self.graphs, "n_declined", 0)

    # -- one step -----------------------------------------------------------------------------------------------
    def draft(self, items: Sequence[tuple[SeqState, MtpSeq, int]], n: Optional[int] = None,
              graphs: bool = True) -> list[list[int]]:
        """(target state, head memory, t0) per sequence, t0 pending at state.n_past -> up to n (default n_max)
        drafted tokens each (fewer where the context ends). One MTP forward per round for all sequences; round 0
        also runs each one's pending pairs. A head memory out of step with its target (moved by a checkpoint)
        starts over. graphs=False: eagerly, even where a draft graph could be captured."""
        n = self.n_max if n is None else n
        self._use_head()
        t_start, events = time.perf_counter(), self._events()
        out = self._draft(items, n, graphs)
        self._round = (len(items), n, t_start, events == self._events())
        return out

    def step(self, items: Sequence[tuple[SeqState, MtpSeq, int]], n: Optional[int] = None,
             while_running: Optional[Callable[[], None]] = None):
        """draft() then verify() of what was drafted -> (drafts, logits, h, [Verified]). On the graph path the
        two graphs run back to back with the drafted ids passed on the device (SpecGraphs.step): the host waits
        once per round, and calls while_running() (host work of the driver's: the server's flush of the last
        results) while the device runs them; elsewhere it is called after the verify. It is part of the round's
        timing either way, as a plain step's flush is part of the plain step's."""
        n = self.n_max if n is None else n
        self._use_head()
        t_start, events, eager = time.perf_counter(), self._events(), self.n_eager
        out = self._step(items, n, while_running)
        captured = self._events() != events
        if captured:
            self._tally(len(items), "captures")
        # (-v: what a new shape costs against a replay, the price of exploring and probing at several streams)
        log.debug("MTP round of %d sequences drafting %d: %.2f ms, %s", len(items), n,
                  1e3 * (time.perf_counter() - t_start),
                  "captured" if captured else "eager" if self.n_eager != eager else "replayed")
        return out

    def _step(self, items, n: int, while_running):
        if self._graphed(items, n) and self.p_min <= 0.0:
            t_start, events, declined = time.perf_counter(), self._events(), self._declined()
            got = self._step_graph(items, n, while_running)
            if got is not None:
                self._timed(len(items), n, t_start, events == self._events())
                return got
            # a shape of catch-up lengths seen for the first time drafts eagerly this round (asking the graphs
            # again from draft() would capture it at once: every new shape of several slots a capture)
            eager = self._declined() != declined
            drafts = self.draft(items, n, graphs=not eager)
            if eager:       # a one-off, as a capture: not timed (the policy's table holds what rounds replay)
                self._eager(len(items))
                self._round = None
        else:
            if self.graphs is not None:
                self._eager(len(items))
            drafts = self.draft(items, n)
        if while_running is not None:       # (inside the round's timing: verify() records it at its end)
            out = self.verify([(st, ms, t0, d) for (st, ms, t0), d in zip(items, drafts)], n, while_running)
        else:
            out = self.verify([(st, ms, t0, d) for (st, ms, t0), d in zip(items, drafts)], n)
        return (drafts,) + out

    def _eager(self, S: int) -> None:
        """A drafting round of S sequences ran eagerly though graphs exist (kind 'eager')."""
        self.n_eager += 1
        self._tally(S, "eager")

    def _tally(self, S: int, kind: str) -> None:
        if self.policy is not None:
            self.policy.count(S, kind)

    def round_counts(self) -> dict[int, dict[str, int]]:
        """Per number of sequences in a round: the policy's decisions (DraftPolicy.count: drafted, plain, probes,
        explored, skipped), what the drafting rounds cost beyond a replay (captures, eager) and the rounds weighed
        ahead (plan_ahead); {} without adaptive drafting. A copy (the server's metrics read it from another
        thread)."""
        return {} if self.policy is None else {S: dict(row) for S, row in sorted(self.policy.counts.items())}

    def _step_graph(self, items, n: int, while_running=None):
        self._heads_in_step(items, n)
        # the graphs' arguments in one pass over the items (not six comprehensions: before the draft launch)
        states, mtp_states, t0s, toks, hs, pos = [], [], [], [], [], []
        for st, ms, t0 in items:
            states.append(st)
            mtp_states.append(ms.state)
            t0s.append(t0)
            toks.append(ms.pending + [t0])
            hs.append(ms.pending_h + [ms.h_last])
            pos.append(st.n_past)
        if self.policy is not None:         # (the policy's part of while_running: _while_drafting)
            self._flight, while_running = (items, n, while_running), self._while_drafting
        got = self.graphs.step(states, mtp_states, t0s, toks, hs, n, while_running)
        self._flight = None
        if got is None:
            return None
        drafts, logits, h, ids = got
        for _, ms, _ in items:
            ms.pending, ms.pending_h = [], []
        self._count(drafts, items)
        T = n + 1
        segs = [Verified(st, ms, t0, list(d), p, i * T, ids[i * T:i * T + len(d) + 1].tolist())
                for i, ((st, ms, t0), d, p) in enumerate(zip(items, drafts, pos))]
        return drafts, logits, h, segs

    def _while_drafting(self) -> None:
        """_step_graph's round is on the device: the policy weighs what the next choice needs for each way the
        round can end (DraftPolicy.expect), off the host's critical path, then the driver's while_running()."""
        items, n, while_running = self._flight
        self.policy.expect([ms.acc for _, ms, _ in items], n)
        if while_running is not None:
            while_running()

    def _timed(self, S: int, n: int, t_start: float, clean: bool) -> None:
        """A round of S sequences drafting n was verified (its ids on the host) t_start ago; if nothing was
        captured, its cost goes into the table at the next plan(), with the time of its commits added: their
        rewinds and the head's queue are host work a plain step does not do (then a launch per GDN layer and
        state for each rejection, now one per rejecting sequence: left out, a round of 4 sequences looked cheaper
        than it was and the policy drafted where batching won, 4 streams at 0.93-0.95x of MTP off on the H200,
        2026-12-02)."""
        self._unrecorded = [S, n, time.perf_counter() - t_start] if self.policy is not None and clean else None

    def _record_round(self) -> None:
        if self._unrecorded is not None:
            self.policy.costs.add_spec(*self._unrecorded)
            self._unrecorded = None

    def _heads_in_step(self, items, n: int) -> None:
        """Heads out of step with their targets (moved by a checkpoint) start over; catch-ups the draft graph
        does not take run now. One sequence's graph takes up to n + 1 pending pairs (its n + 2 shapes are captured
        at request start). Of several sequences every pending pair runs now, so that their draft graph has one
        shape per draft length (catch-up lengths all 1) rather than one per combination of lengths: at 4 slots the
        combinations churned the graph cache, each new one an eager round and each second sighting a capture
        (MTP on at 0.855x of off, 4 streams at length 2.5, H200 2026-12-02)."""
        keep, behind = n + 1 if len(items) == 1 else 0, False
        for st, ms, _ in items:
            if ms.state.n_past + len(ms.pending) != st.n_past:
                self.reset(ms, st.n_past)
            behind = behind or len(ms.pending) > keep
        if behind:              # (asked before every round: usually none is, and no list is built)
            self._catch_up([ms for _, ms, _ in items], keep)

    def _draft(self, items, n: int, graphs: bool = True) -> list[list[int]]:
        be, out = self.be, [[] for _ in items]
        self._heads_in_step(items, n)
        if graphs and self._graphed(items, n) and self.p_min <= 0.0:
            got = self._draft_graph(items, n)
            if got is not None:
                return self._count(got, items)
        seqs = [(ms, t0) for _, ms, t0 in items]
        caps = [min(n, st.n_ctx - st.n_past - 1) for st, _, _ in items]
        live = [s for s in range(len(seqs)) if caps[s] > 0]
        if not live:
            return out
        rows = [(seqs[s][0].state, seqs[s][0].pending + [seqs[s][1]]) for s in live]
        h_in = be.concat([x for s in live for x in seqs[s][0].pending_h + [seqs[s][0].h_last]], axis=0)
        for s in live:
            seqs[s][0].pending, seqs[s][0].pending_h = [], []
        while live:
            batch = StepBatch.build(rows)
            ids, h_out = self._pick(batch, h_in)      # row r drafts for sequence live[r]; None: below p_min
            for r, s in enumerate(live):
                if ids[r] is not None:
                    out[s].append(ids[r])
            go = [(r, s) for r, s in enumerate(live) if ids[r] is not None and len(out[s]) < caps[s]]
            if not go:
                break
            # the next round: each drafted token with the head's own output state (llama.cpp's draft() chain)
            h_in = be.gather_rows(h_out, np.asarray([batch.output_rows[r] for r, _ in go], np.int32))
            live = [s for _, s in go]
            rows = [(seqs[s][0].state, [out[s][-1]]) for s in live]
        return self._count(out, items)

    def _count(self, out: list[list[int]], items) -> list[list[int]]:
        for o, (_, ms, _) in zip(out, items):
            if len(o) < self.n_min:
                o.clear()
            ms.n_drafted += len(o)
            self.n_drafted += len(o)
        return out

    def _graphed(self, items: Sequence[tuple], n: int) -> bool:
        """Whether the step of these items (each a tuple whose first field is a target state) has the captured
        graphs' shape: graphs, and room for t0 and n drafts."""
        if self.graphs is None:
            return False
        for it in items:               # (a loop over the items, no list of states: asked before every round)
            st = it[0]
            if st.n_past + n + 1 > st.n_ctx:
                return False
        return True

    def _draft_graph(self, items, n: int) -> Optional[list[list[int]]]:
        """draft() on the backend's captured rounds: each sequence's pending pairs and (t0, h_last) as round 0,
        n rounds in one replay -> n ids per sequence; None where the graphs decline the shape (nothing ran)."""
        toks = [ms.pending + [t0] for _, ms, t0 in items]
        hs = [ms.pending_h + [ms.h_last] for _, ms, _ in items]
        out = self.graphs.draft([ms.state for _, ms, _ in items], toks, hs, n)
        if out is not None:
            for _, ms, _ in items:
                ms.pending, ms.pending_h = [], []
        return out

    def _pick(self, batch: StepBatch, h_in) -> tuple[list[Optional[int]], object]:
        """One draft round of the head -> (its argmax per output row, h_out). The ids come from the backend (only
        they cross; through the coarse head where one is set); with p_min, the exact head's logits are drawn and
        an id is None where its top-10 probability is below p_min (llama.cpp's draft sampler: top-k 10, then
        data[0].p compared with p_min)."""
        if self.p_min <= 0.0:
            ids, h_out = self.model.mtp_forward(batch, h_in, draft_ids=True)
            return [int(i) for i in self.be.ids_to_host(ids)], h_out
        logits, h_out = self.model.mtp_forward(batch, h_in)
        R = int(logits.shape[0])
        ids = draw_tokens(self.be, logits, [_ARGMAX] * R)
        out = []
        for r in range(R):
            x = np.sort(self.be.row_to_host(logits, r).astype(np.float64))[-DRAFT_TOP_K:]
            p_top = 1.0 / np.exp(x - x[-1]).sum()
            out.append(ids[r] if p_top >= self.p_min else None)
        return out, h_out

    def verify(self, seqs: Sequence[tuple[SeqState, MtpSeq, int, list[int]]], n: Optional[int] = None,
               while_running: Optional[Callable[[], None]] = None):
        """(target state, head memory, t0, drafts) per sequence, drafts of this round's length n (default n_max)
        or fewer -> (logits [T, N] of every row, h [T, D], [Verified]). The target states advance by
        1 + len(drafts); commit() sets each back to what it keeps. Times the round (draft + verify, and
        while_running(), called after the verify) for the policy."""
        n = self.n_max if n is None else n
        events = self._events()
        out = self._verify(seqs, n)
        if while_running is not None:
            while_running()
        if self.policy is not None and self._round is not None and self._round[:2] == (len(seqs), n):
            self.be.synchronize()          # (a replayed verify has waited already: its ids came back)
            _, _, t_round, clean = self._round
            self._timed(len(seqs), n, t_round, clean and events == self._events())
        self._round = None
        return out

    def _verify(self, seqs, n: int):
        if self._graphed(seqs, n) and all(len(d) <= n for _, _, _, d in seqs):
            return self._verify_graph(seqs, n)
        batch = StepBatch.build([(st, [t0] + d) for st, _, t0, d in seqs], all_logits=True)
        batch.keep_steps = self.n_max + 1
        segs = [Verified(st, ms, t0, list(d), st.n_past, seg.start)
                for (st, ms, t0, d), seg in zip(seqs, batch.segments)]
        with self.be.decode_order():      # each verified token's logits exactly its decode's (CUDA graphs' order)
            logits, h = self.model.forward_hidden(batch)
        return logits, h, segs

    def _verify_graph(self, seqs, n: int):
        """verify() on the backend's captured forward of 1 + n tokens per sequence; each Verified carries its
        rows' device argmax. Fewer drafts are padded with t0: the padding rows come after the real ones (causal
        attention, recurrent order), so they change none of them; commit() keeps at most the real ones, and the KV
        rows they wrote lie past the kept positions, rewritten before anything reads them."""
        T = n + 1
        pos = [st.n_past for st, _, _, _ in seqs]
        toks = [[t0] + d + [t0] * (n - len(d)) for _, _, t0, d in seqs]
        logits, h, ids = self.graphs.verify([st for st, _, _, _ in seqs], toks)
        segs = [Verified(st, ms, t0, list(d), p, i * T, ids[i * T:i * T + len(d) + 1].tolist())
                for i, ((st, ms, t0, d), p) in enumerate(zip(seqs, pos))]
        return logits, h, segs

    def prepare(self, seqs: Sequence[tuple[SeqState, MtpSeq]], catch_ups: Optional[Sequence[int]] = None,
                stop: Optional[Callable[[], bool]] = None) -> None:
        """Capture the graphs a step of these sequences replays (the verify forward, the draft rounds for each
        catch-up length in `catch_ups`, default every one) now rather than at their first step: a benchmark keeps
        the captures out of its timing. Nothing runs. No graphs on this backend: nothing to do. stop: asked before
        each capture, True leaves the rest to their first use (SpecGraphs.prepare)."""
        if self.graphs is not None:
            self._use_head()           # (auto: the head the next round drafts with, whose graphs these are)
            lengths = self.policy.lengths if self.policy is not None else (self.n_max,)
            self.graphs.prepare([st for st, _ in seqs], [ms.state for _, ms in seqs], lengths, catch_ups, stop)

    def start(self, ms: MtpSeq) -> None:
        """A request starts on this sequence (a server slot). Its acceptance starts from the rate pooled over
        every sequence's recent verifies at the prior's weight (Acceptance.prior: not the slot's last request,
        which says little about this text), PRIOR before any. Nothing runs: the head's part of the prompt and the
        lone graphs wait for prompt_end()."""
        ms.acc = self.pooled.prior()

    def commit(self, v: Verified, h, j: int) -> None:
        """Keep the first j (1 <= j <= 1 + len(drafts)) verified tokens: t0 and the drafts before the j-th emitted
        token (which becomes the next t0). Rewinds the recurrent state and queues the kept tokens for the head."""
        if not 1 <= j <= len(v.drafts) + 1:
            raise ValueError(f"commit: j={j} outside 1..{len(v.drafts) + 1}")
        t_start = time.perf_counter()
        self.be.restore_steps(v.state, j)
        v.state.n_past = v.pos + j
        ms = v.mtp
        # positions from here on are rewritten from the pending pairs (the drafts' KV rows included); a sequence
        # that did not draft still holds its earlier pending pairs
        ms.state.n_past = v.pos - len(ms.pending)
        kept = [v.t0] + v.drafts[:j - 1]
        self._push(ms, kept, self._keep(ms, h, v.row, j))
        self._observe(kept)
        self.n_accepted += j - 1
        ms.n_accepted += j - 1
        ms.acc.update(len(v.drafts), j - 1)
        self.pooled.update(len(v.drafts), j - 1)
        if self._unrecorded is not None:             # part of the round's cost (_timed)
            self._unrecorded[2] += time.perf_counter() - t_start


# -- acceptance ---------------------------------------------------------------------------------------------------

def speculative_choice(ids: np.ndarray, p: np.ndarray, d: int, q: dict[int, float], rng: np.random.Generator) -> int:
    """The standard speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023): the target distribution
    p over `ids`, a draft token d drawn from the draft distribution q (token -> probability) -> d with probability
    min(1, p(d)/q(d)), else a draw from norm(max(0, p - q)). The result is distributed exactly as p."""
    pd = float(p[ids == d].sum())
    if rng.random() < min(1.0, pd / q[d]):
        return int(d)
    resid = np.maximum(0.0, p - np.asarray([q.get(int(t), 0.0) for t in ids]))
    return int(ids[rng.choice(len(ids), p=resid / resid.sum())])


def history_free_greedy(sampler: Sampler) -> bool:
    """Greedy with neutral penalties: every verify row's draw is fixed before any token is accepted, so all rows
    can be drawn at once on the backend (only ids cross)."""
    p = sampler.params
    return p.temp <= 0.0 and p.plain and (p.penalty_last_n == 0 or (p.penalty_repeat == 1.0 and p.penalty_freq == 0.0
                                                                    and p.penalty_present == 0.0))


def _plain_argmax(be, logits, v: Verified, sampler: Sampler) -> Optional[list[int]]:
    """v's rows' device argmax (a captured verify's) when it is this greedy sampler's draw: the default chain, no
    bias but lowered ids (ignore_eos, bans) none of which it landed on -> the draws, else None (draw_tokens)."""
    ids = v.greedy
    if ids is None or len(ids) < len(v.drafts) + 1:
        return None
    plan = plan_row(sampler, int(logits.shape[-1]), be.SAMPLE_MAX_K, be.SAMPLE_MAX_WINDOW)
    if plan.kind != "argmax" or (plan.lowered and any(plan.lowered.get(t, 0.0) < 0.0 for t in ids)):
        return None
    return ids[:len(v.drafts) + 1]


def accept_tokens(be, logits, v: Verified, sampler: Sampler, take: Callable[[int], bool],
                  synth: Optional[Callable[[Sequence[int]], int]] = None) -> int:
    """Walk v's verify rows: at row i the target's draw given t0, d1..di; continue while it equals d(i+1). Each
    emitted token goes to take() (the driver's Turn: it accepts the token into the sampler, so later rows see it
    in the penalty window); take() returning False stops the walk (the generation ended). -> j, the number of
    tokens emitted, for Speculator.commit.

    synth: synthetic acceptance for benchmarks (--spec-synth-len / --spec-synth-rates; spec.synth_acceptor):
    drafts -> how many are accepted, whatever the target says; the target's draw follows them."""
    n = len(v.drafts)
    n_synth = synth(v.drafts) if synth is not None else None
    fixed = None                           # the target's draw at each of v's rows, when fixed before acceptance
    if history_free_greedy(sampler):
        fixed = _plain_argmax(be, logits, v, sampler)
        if fixed is None:
            rows = [None] * int(logits.shape[0])
            for i in range(n + 1):
                rows[v.row + i] = sampler
            fixed = draw_tokens(be, logits, rows)[v.row:v.row + n + 1]
    for i in range(n + 1):
        d = v.drafts[i] if i < n else None
        if n_synth is not None and i < n_synth:
            tok = d
        elif fixed is not None:
            tok = fixed[i]
        else:
            row = be.row_to_host(logits, v.row + i)
            if d is None or sampler.params.temp <= 0.0 or n_synth is not None or sampler.params.random_chain:
                # greedy with penalties, the bonus row, after synthetic ones, or a chain that tosses coins (XTC,
                # Mirostat: its distribution is not fixed by the row, so the target draws and the draft must equal
                # the draw, which keeps the output distribution the chain's own)
                tok = sampler.sample(row)
            else:
                ids, p = sampler.post_sampling_probs(row)
                tok = speculative_choice(ids, p, d, {d: 1.0}, sampler.rng)   # q: the draft's point mass
        # a synthetic rejection (i == n_synth) ends the run with the target's draw even where it equals the
        # draft, as llama-server's server_sample_and_accept_synth does: the knob sets the acceptance, not the model
        if not take(tok) or d is None or tok != d or (n_synth is not None and i >= n_synth):
            return i + 1
    return n + 1
