"""The engine thread: owns the backend and the slots, and runs continuous batching.

Every step runs one decode step holding one token for each generating slot (on CUDA a graph captured once per set
of slots, backends/cuda_graphs.py), then prompt chunks of the slots still prefilling, each in its own forward, up
to n_batch tokens in all; then draws each slot's token with that slot's own settings on the backend
(engine/decode.py: only the ids cross to the host). HTTP handlers talk to it only through `submit` / `cancel` /
`query` (thread-safe queue of typed tasks); results go back through each task's `sink`.

A request's arithmetic does not depend on its neighbours, so N concurrent greedy streams give the same tokens as
each run alone: prompt chunks are cut per slot (at n_ubatch and at planned checkpoints) and never share a forward
with other rows; decode rows are computed row by row in the same order whatever the batch (see cuda_graphs.py).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..sampling import Sampler, SamplerVocab
from . import slot_log
from .checkpoints import read_host_state, state_ops_for, write_host_state
from .decode import Decoder, LogitsRow, draw_tokens
from .grammar import GrammarCompiler
from .perf import Perf, StepClock, now_ms
from .prompt_cache import HostCache, ResumePoint, SlotCache, restore_from_host, rewind
from .slot import GENERATE, PREFILL, Slot
from ..spec import synth_acceptor
from .speculative import Speculator, accept_tokens
from .tasks import CancelTask, CompletionTask, EmbedTask, ErrorResult, QueryTask, SlotActionTask, WakeTask

log = logging.getLogger("llamacmp.engine")


@dataclass(slots=True)
class EngineConfig:
    n_slots: int = 4
    n_ctx_slot: int = 4096
    n_batch: int = 2048                  # most tokens in one step (decode tokens first, then prompt chunks)
    n_ubatch: int = 512                  # most prompt tokens one slot adds in one step
    k_type: str = "f16"                  # -ctk
    v_type: str = "f16"                  # -ctv
    cache_ram_mib: int = 8192            # -cram: -1 no limit, 0 off
    ctx_checkpoints: int = 32            # -ctxcp
    checkpoint_every: int = 8192         # -cpent: also one every N prompt tokens (-1 off)
    checkpoint_tail: int = 4             # one this many tokens before the prompt end (llama.cpp PR #20288)
    slot_prompt_similarity: float = 0.10 # -sps
    max_graphs: int = 8                  # CUDA: decode graphs kept (one per set of slots generating together)
    spec: object = None                  # spec.SpecConfig (--spec-*): draft-mtp runs engine/speculative.py
    sync_forwards: bool = False          # wait for each forward before the draw, so that `perf` splits eval and
                                         # sampling time as llama.cpp's does (the CLIs; the server overlaps them)
    sleep_idle_s: float = -1             # --sleep-idle-seconds: free the model after this long idle (-1: never)
    cache_idle_slots: bool = False       # --cache-idle-slots: a launch saves the idle slots to the host cache ...
    kv_unified: bool = False             # ... and, with -kvu, clears them (llama-server's 0c1e570 behaviour)


@dataclass(slots=True)
class EngineMetrics:
    """Counters for /metrics (llama.cpp's server_metrics)."""
    n_prompt_tokens_processed_total: int = 0
    t_prompt_processing_total: float = 0.0   # ms
    n_tokens_predicted_total: int = 0
    t_tokens_generation_total: float = 0.0   # ms
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_requests_deferred: int = 0
    n_tokens_max: int = 0
    n_prompt_tokens_cached_total: int = 0
    n_draft_tokens_total: int = 0           # speculative decoding, summed over finished requests
    n_draft_accepted_total: int = 0
    n_draft_steps_total: int = 0


class Engine:
    def __init__(self, lm, cfg: EngineConfig, reloader=None):
        """reloader (--sleep-idle-seconds): `.release()` frees the backend memory the model left, `.load()` loads
        the model again from the same file with the same plan (a LoadedModel)."""
        self.lm, self.cfg, self.tokenizer = lm, cfg, lm.tokenizer
        self._reloader = reloader
        self.sleeping = False             # the model is released (--sleep-idle-seconds): /props is_sleeping
        self.wake_error = ""              # why the last reload failed ("" if it did not): /health says so
        self._last_task = time.monotonic()
        self._build_model_parts()
        self.grammars = GrammarCompiler(self.tokenizer)   # used by handlers (compile) and here (matchers)
        self.metrics = EngineMetrics()
        self._metrics_mark: dict = {}     # the WINDOW counters at the last /metrics scrape
        self.perf = Perf()                # llama.cpp's perf counters, over every slot (the CLIs print them)
        self.clock = StepClock()          # where the plain decode steps' time goes (llamacmp-only metrics)
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: list[CompletionTask] = []
        self._cancelled: set[int] = set()
        self._next_id = 1
        self._id_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._flushers: list = []         # see on_results_flush
        self._prompt_queued = False       # the last step left a prompt chunk on the device (_step)
        self._submit_lock = threading.Lock()
        self.failed = ""                  # why the engine stopped for good ("" while it runs); see _die
        self._on_fatal: list = []
        self._init_idle_slots()

    def _build_model_parts(self) -> None:
        """Everything that holds the model or backend memory: made at start and again on waking from sleep."""
        lm, cfg = self.lm, self.cfg
        self.model, self.backend = lm.model, lm.backend
        self.ops = state_ops_for(self.backend)
        self.spec = Speculator.from_spec(lm.model, cfg.spec, lm.path, n_seqs=cfg.n_slots) \
            if cfg.spec is not None and cfg.spec.enabled else None
        # with MTP on, plain steps also give the hidden state the heads read (adaptive drafting: plain rounds)
        self.decoder = Decoder(lm, max_graphs=cfg.max_graphs, hidden=self.spec is not None)
        self.slots = [Slot(i, self.backend.new_state(lm.cfg, cfg.n_ctx_slot, cfg.k_type, cfg.v_type),
                           SlotCache(cfg.ctx_checkpoints)) for i in range(cfg.n_slots)]
        for slot in self.slots if self.spec else ():
            slot.mtp = self.spec.new_seq(cfg.n_ctx_slot, cfg.k_type, cfg.v_type)
        self.host_cache = HostCache(cfg.cache_ram_mib)

    def _init_idle_slots(self) -> None:
        """--cache-idle-slots needs the host cache to save into: without one it is turned off, with llama-server's
        warning; its debug line says the feature is on (0c1e570's test suite reads it)."""
        if not self.cfg.cache_idle_slots:
            return
        if not self.host_cache.enabled:
            log.warning("%s", slot_log.srv("init", "--cache-idle-slots requires --cache-ram, disabling"))
            self.cfg.cache_idle_slots = False
            return
        what = "saved to prompt cache and cleared" if self.cfg.kv_unified else "saved to prompt cache"
        slot_log.srv_debug("init", f"idle slots will be {what} upon starting a new task")
        slot_log.srv_debug("init", "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")

    # -- thread-safe API (called from HTTP handlers) ----------------------------------------------------------
    def new_task_id(self) -> int:
        with self._id_lock:
            self._next_id += 1
            return self._next_id - 1

    def submit(self, task) -> int:
        if isinstance(task, CompletionTask) and task.id == 0:
            task.id = self.new_task_id()
        if isinstance(task, CompletionTask):
            task.t_queued = time.perf_counter()
        with self._submit_lock:          # against _die: a task is either queued before it or answered here
            if not self.failed:
                self._inbox.put(task)
                return getattr(task, "id", 0)
        self._answer_dead(task)
        self._flush()
        return getattr(task, "id", 0)

    def on_fatal(self, fn) -> None:
        """Call `fn(reason)` (on the engine thread) if the engine stops for good: the server then answers 503 on
        /health and exits non-zero."""
        self._on_fatal.append(fn)

    def cancel(self, task_id: int) -> None:
        self._inbox.put(CancelTask(task_id))

    def on_results_flush(self, fn) -> None:
        """Call `fn()` on the engine thread whenever the results given to sinks so far should go out: right after
        each forward is launched (the device is busy, the engine thread is about to wait for it: listeners woken
        now run meanwhile instead of taking the GIL in the middle of the next step's host work), and when the
        engine runs out of work. A sink may hold its results until then and hand them over in one go
        (server/worker.py: one event-loop wakeup a step instead of one a token)."""
        self._flushers.append(fn)

    def _flush(self) -> None:
        for fn in self._flushers:
            fn()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="llamacmp-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the loop ---------------------------------------------------------------------------------------------
    def _run(self) -> None:
        # CUDA's current device is per thread: this thread runs the backend's work, so select its device here
        # (the model was loaded on another thread; a layer split runs its parts on threads of its own)
        failures = 0
        try:
            self.backend.activate()
            while not self._stop.is_set():
                try:
                    self._iterate()
                    failures = 0
                except Exception as e:   # fail what is in flight and go on; the same failure again and again
                    failures += 1        # (nothing succeeds in between) means the engine cannot go on
                    log.exception("engine loop failed (%d in a row)", failures)
                    self._fail_busy_slots(f"engine error: {e}")
                    if failures >= self.MAX_FAILURES:
                        raise
        except BaseException as e:       # never a silent death: every request is answered, /health says so
            self._die(f"{type(e).__name__}: {e}")

    # the counters the throughput gauges of /metrics read, per window between two scrapes
    WINDOW = ("n_prompt_tokens_processed_total", "t_prompt_processing_total", "n_tokens_predicted_total",
              "t_tokens_generation_total")
    MAX_FAILURES = 3                     # loop failures in a row before the engine gives up

    def run_pending(self) -> None:
        """Run the loop on the caller's thread until every task submitted so far is answered: a single-sequence
        tool's way in (engine/client.py), with no engine thread; sinks are called on this thread."""
        while self._waiting or not self._inbox.empty() or any(s.busy for s in self.slots):
            self._iterate()

    def _iterate(self) -> None:
        busy = any(s.busy for s in self.slots)
        self._drain(block=not busy and not self._waiting)
        self._assign_waiting()
        if any(s.busy for s in self.slots):
            try:
                self._step()
            except Exception as e:  # a failed step must not take the server down: fail its requests
                log.exception("engine step failed")
                self._fail_busy_slots(f"engine error: {e}")
            self._last_task = time.monotonic()
        if not any(s.busy for s in self.slots):    # else the next step's launch flushes them
            self._flush()
            if self._should_sleep():
                self._sleep()

    # -- sleeping (--sleep-idle-seconds) ------------------------------------------------------------------------
    def _should_sleep(self) -> bool:
        idle = self.cfg.sleep_idle_s
        return (idle > 0 and self._reloader is not None and not self.sleeping and not self._waiting and self._inbox.empty()
                and time.monotonic() - self._last_task >= idle)

    def _sleep(self) -> None:
        """Release the model, its backend memory and the slots with their prompt caches (slot and host-RAM caches:
        a request after waking evaluates its prompt from the start). The tokenizer and the metrics stay."""
        # llama-server 0c1e570's two lines (server-queue.cpp, server-context.cpp)
        log.info("que  %12s: entering sleeping state", "start_loop")
        log.info("%s", slot_log.srv("handle_sleep", "server is entering sleeping state"))
        self.slots, self.host_cache = [], HostCache(self.cfg.cache_ram_mib)
        self.model = self.spec = self.decoder = self.ops = None
        self.lm.model = None
        import gc
        try:
            gc.collect()                 # device blocks go back to the arena when their tensors are collected
            self._reloader.release()
        finally:
            # /props says is_sleeping once the memory is back (set first, a client polling it could see the
            # arena still holding its chunks: the CUDA sleep test did on a loaded GPU)
            self.sleeping = True

    def _wake(self) -> bool:
        """Load the model again; False (and wake_error set, the engine still asleep) if that failed: the next
        task tries again."""
        log.info("que  %12s: exiting sleeping state", "start_loop")
        log.info("%s", slot_log.srv("handle_sleep", "server is exiting sleeping state"))
        try:
            fresh = self._reloader.load()
            self.lm.model, self.lm.backend, self.lm.gguf = fresh.model, fresh.backend, fresh.gguf
            self._build_model_parts()
            self.backend.activate()
        except Exception as e:
            log.exception("could not load the model again after sleeping")
            self.lm.model = self.model = None
            self.slots = []
            self._reloader.release()
            self.wake_error = f"could not load the model again after sleeping: {type(e).__name__}: {e}"
            return False
        self.sleeping, self.wake_error = False, ""
        self._last_task = time.monotonic()
        return True

    def _needs_model(self, item) -> bool:
        return not (isinstance(item, CancelTask) or isinstance(item, QueryTask) and item.kind == "metrics")

    def _die(self, reason: str) -> None:
        log.critical("engine stopped: %s", reason)
        with self._submit_lock:
            self.failed = reason or "engine stopped"
        pending = [s.task for s in self.slots if s.task is not None] + self._waiting
        self._waiting = []
        while True:
            try:
                pending.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for task in pending:
            self._answer_dead(task)
        try:
            self._flush()
        finally:
            for fn in self._on_fatal:
                fn(self.failed)

    def _answer_unloaded(self, task) -> None:
        sink = getattr(task, "sink", None)
        if sink is not None:
            sink(ErrorResult(getattr(task, "id", 0), getattr(task, "index", 0), self.wake_error,
                             "unavailable_error", 503))

    def _answer_dead(self, task) -> None:
        sink = getattr(task, "sink", None)
        if sink is None:
            return
        try:
            sink(ErrorResult(getattr(task, "id", 0), getattr(task, "index", 0),
                             f"the engine has stopped: {self.failed}", "unavailable_error", 503))
        except Exception:                # a sink that raises must not stop the others being answered
            log.exception("could not answer a task after the engine stopped")

    def _drain(self, block: bool) -> None:
        if not block and self._inbox.empty():     # the common case mid-generation: no exception raised and caught
            return
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None or not self._inbox.empty():
            if item is not None:
                self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break

    def _handle(self, item) -> None:
        """One task from the inbox; a failure answers that task with an error and the engine goes on."""
        try:
            self._handle_one(item)
        except Exception as e:
            log.exception("task %r failed", type(item).__name__)
            sink = getattr(item, "sink", None)
            if sink is not None and not isinstance(item, CompletionTask):
                sink(ErrorResult(getattr(item, "id", 0), 0, f"{type(e).__name__}: {e}"))

    def _handle_one(self, item) -> None:
        if self._needs_model(item):      # a metrics scrape neither wakes the engine nor keeps it awake
            self._last_task = time.monotonic()
            if self.sleeping and not self._wake():
                self._answer_unloaded(item)
                return
        if isinstance(item, WakeTask):
            item.sink(None)
        elif isinstance(item, CompletionTask):
            self._waiting.append(item)
        elif isinstance(item, CancelTask):
            self._cancel(item.task_id)
        elif isinstance(item, QueryTask):
            item.sink(self._query(item.kind))
        elif isinstance(item, SlotActionTask):
            item.sink(self._slot_action(item))
        elif isinstance(item, EmbedTask):
            item.sink(self._embed(item))

    def _embed(self, task: EmbedTask):
        """On the engine thread (it owns the backend); the slots wait meanwhile, as llama-server's batch does."""
        from ..embedding import embed
        try:
            return [embed(self.model, p, task.pooling, task.norm, self.cfg.n_ubatch) for p in task.prompts]
        except Exception as e:          # e.g. the device is out of memory for this prompt: this request fails
            log.exception("embedding failed")
            return ErrorResult(0, 0, str(e), "server_error", 500)

    def _cancel(self, task_id: int) -> None:
        self._waiting = [t for t in self._waiting if t.id != task_id]
        for slot in self.slots:
            if slot.task is not None and slot.task.id == task_id:
                self._release(slot)

    # -- admission ----------------------------------------------------------------------------------------------
    def _assign_waiting(self) -> None:
        still = []
        for task in self._waiting:
            slot = None
            try:
                slot = self._pick_slot(task)
                if slot is None:
                    still.append(task)
                    continue
                self._load_prompt(slot, task)
                if slot.busy:
                    self._cache_idle_slots()
            except Exception as e:
                log.exception("failed to start task %d", task.id)
                task.sink(ErrorResult(task.id, task.index, str(e), "server_error", 500))
                if slot is not None:
                    self._release(slot)
        self.metrics.n_requests_deferred = len(still)
        self._waiting = still

    def _cache_idle_slots(self) -> None:
        """--cache-idle-slots, after a task is launched: each idle slot's state goes to the host cache (unless
        held there already), and with -kvu the slot is cleared, as llama-server 0c1e570 does. Clearing frees no
        device memory here (each slot keeps its own buffers); it makes the next request find that history in
        the host cache, as llama-server's does."""
        if not self.cfg.cache_idle_slots:
            return
        for slot in self.slots:
            if slot.busy:
                continue
            slot_log.slot_debug("process_single_task", slot.id, -1, "saving idle slot to prompt cache")
            if self._save_to_host(slot):
                slot_log.slot_debug("process_single_task", slot.id, -1, "__TEST_TAG_CACHE_IDLE_SLOT__")
            if self.cfg.kv_unified and slot.cache.tokens:
                slot_log.slot_debug("prompt_clear", slot.id, -1,
                                    f"clearing prompt with {len(slot.cache.tokens)} tokens")
                self._reset(slot)

    def _pick_slot(self, task: CompletionTask) -> Optional[Slot]:
        """id_slot when given; else the idle slot sharing the longest prefix (similarity > -sps), else LRU."""
        idle = [s for s in self.slots if not s.busy]
        want = task.params.id_slot
        if want >= 0:                    # out-of-range ids wrap around, as llama.cpp's get_slot_by_id does
            return next((s for s in idle if s.id == want % len(self.slots)), None)
        if not idle:
            return None
        if task.params.cache_prompt and task.prompt:
            best = max(idle, key=lambda s: s.cache.plan(task.prompt).lcp)
            lcp = best.cache.plan(task.prompt).lcp
            if lcp / len(task.prompt) > self.cfg.slot_prompt_similarity:
                slot_log.slot_info("get_available_slot", best.id, -1,
                                   f"selected slot by LCP similarity, sim_best = {lcp / len(task.prompt):.3f} "
                                   f"(> {self.cfg.slot_prompt_similarity:.3f} thold), "
                                   f"f_keep = {lcp / max(1, len(best.cache.tokens)):.3f}")
                return best
        lru = min(idle, key=lambda s: s.last_used)
        slot_log.slot_info("get_available_slot", lru.id, -1, "selected slot by LRU, t_last = "
                           f"{int(lru.last_used * 1e6) if lru.last_used else -1}")
        return lru

    def _load_prompt(self, slot: Slot, task: CompletionTask) -> None:
        if not task.prompt or len(task.prompt) >= self.cfg.n_ctx_slot:
            self._reject(task)
            return
        point = self._resume(slot, task)
        sampler = task.params.sampler or Sampler(task.params.sampling, self.tokenizer.eog_ids,
                                                 vocab=SamplerVocab(self.tokenizer, self.lm.cfg.n_ctx_train))
        decoder = self.tokenizer.stream_decoder(special=task.params.special)
        grammar = self.grammars.matcher(task.params.grammar) if task.params.grammar is not None else None
        slot.begin(task, sampler, decoder, self._checkpoint_plan(task, slot.state.n_past), grammar)
        # --spec-synth-*: a generator of its own per request, seeded with the request's seed (as llama-server)
        slot.synth = synth_acceptor(self.cfg.spec, sampler.seed, self.tokenizer.eog_ids) if self.spec else None
        if self.spec is not None:      # (its head's prompt work and lone graphs: _prompt_end)
            self.spec.start(slot.mtp)
        slot.last_used = time.monotonic()
        slot_log.slot_info("launch_slot_with_task", slot.id, task.id, "processing task, is_child = 0")
        slot_log.slot_info("update_slots", slot.id, task.id, f"new prompt, n_ctx_slot = {self.cfg.n_ctx_slot}, "
                           f"n_keep = {task.params.n_keep}, task.n_tokens = {len(task.prompt)}")
        slot_log.slot_info("update_slots", slot.id, task.id,
                           f"n_tokens = {point.pos}, memory_seq_rm [{point.pos}, end)")
        if task.params.stream and task.params.return_progress:
            task.sink(slot.progress())  # llama-server's first update: nothing evaluated yet, processed == cache
        if point.logits is not None:     # the whole prompt is cached with its logits: sample right away
            if self.spec is not None:
                self._prompt_end(slot)
            self._prompt_done(slot)
            self._sample(slot, point.logits)

    def _alone(self, slot: Slot) -> bool:
        """Whether `slot` has the engine to itself as far as it can tell: no other slot busy, no other request
        waiting for a slot or still in the inbox. Requests that arrive together are assigned one by one, so the first
        found the other slots idle when it was assigned (12 draft graphs of a slot prepared under the other auto
        head at the start of mtp_streams.py's measured 4 streams: numpy replay, 2026-12-03); asked at its
        prompt's end (_prompt_end), the others are there."""
        return (not any(s.busy for s in self.slots if s is not slot) and all(t is slot.task for t in self._waiting)
                and self._inbox.empty())

    def _prompt_end(self, slot: Slot) -> None:
        """MTP: the slot's last prompt chunk is launched; alone and drafting, its head's prompt work and its lone
        graphs run now, in the prompt's time; else they wait (Speculator.prompt_end)."""
        alone = self._speculates(slot) and self._alone(slot)
        self.spec.prompt_end(slot.state, slot.mtp, alone, stop=lambda: not self._inbox.empty())

    def _spec_spent(self) -> tuple[float, float]:
        """The Speculator's host seconds in prompts' head work and lone captures so far (the start timeline)."""
        return (self.spec.prompt_head_s, self.spec.prompt_graphs_s) if self.spec is not None else (0.0, 0.0)

    def _prompt_done(self, slot: Slot) -> None:
        """The prompt is evaluated (or was all in the cache): its timings close and /metrics counts what the cache
        gave, on both paths (a fully cached prompt was left out of prompt_tokens_cached_total before)."""
        slot.finish_prompt_timing()
        self.metrics.n_prompt_tokens_cached_total += slot.n_cached
        slot_log.start_timeline(slot.id, slot.task.id, slot.marks)

    def _reject(self, task: CompletionTask) -> None:
        if not task.prompt:
            task.sink(ErrorResult(task.id, task.index, "empty prompt", "invalid_request_error", 400))
            return
        n, n_ctx = len(task.prompt), self.cfg.n_ctx_slot
        task.sink(ErrorResult(task.id, task.index,
                              f"request ({n} tokens) exceeds the available context size ({n_ctx} tokens), "
                              "try increasing it", "exceed_context_size_error", 400,
                              {"n_prompt_tokens": n, "n_ctx": n_ctx}))

    def _resume(self, slot: Slot, task: CompletionTask) -> ResumePoint:
        """Move the slot's state to the best cached position for this prompt (slot cache or host cache)."""
        if not task.params.cache_prompt:
            self._save_to_host(slot)
            self._reset(slot)
            return ResumePoint(0, None, None, 0)
        point = slot.cache.plan(task.prompt)
        key, host_point = self.host_cache.best(task.prompt) if self.host_cache.enabled else (None, point)
        if key is not None and host_point.pos > point.pos:
            t0 = self._cache_update_begins()
            host = self.host_cache.take(key)     # before saving this slot: that put() may evict entries
            self._save_to_host(slot)
            restore_from_host(self.ops, slot.state, slot.cache, host, host_point)
            self._spec_reset(slot)
            self._cache_update_ends(t0)
            return host_point
        if point.pos < len(slot.cache.tokens):
            # keep the slot's history in host RAM only when the new prompt drops most of it (llama.cpp's
            # f_keep < 0.5): a rollback to a checkpoint inside the shared prefix (an agent's next turn, whose
            # re-rendered reply differs in its last tokens) must not copy the whole context and every checkpoint
            # to the host each turn -- that copy grew with the context (issue 21)
            if point.lcp < len(slot.cache.tokens) // 2 and self.host_cache.enabled:
                t0 = self._cache_update_begins()
                self._save_to_host(slot)
                self._cache_update_ends(t0)
            self._rewind(slot, point)
        return point

    @staticmethod
    def _cache_update_begins() -> float:
        """llama-server's trace lines around a host-cache save/load when a slot is picked (get_available_slot)."""
        slot_log.srv_debug("get_available_slot", "updating prompt cache")
        return time.perf_counter()

    @staticmethod
    def _cache_update_ends(t0: float) -> None:
        slot_log.srv_debug("get_available_slot", f"prompt cache update took {(time.perf_counter() - t0) * 1e3:.2f} ms")

    def _rewind(self, slot: Slot, point: ResumePoint) -> None:
        if point.pos == 0 and point.lcp > 0:
            log.info("slot %d: forcing full prompt re-processing due to lack of cache data", slot.id)
        rewind(self.ops, slot.state, slot.cache, point)
        self._spec_reset(slot)

    def _reset(self, slot: Slot) -> None:
        self.ops.reset(slot.state)
        slot.cache.clear()
        self._spec_reset(slot)

    def _spec_reset(self, slot: Slot) -> None:
        """The slot's state was moved (rewind, reset, restore): the MTP head's memory of it starts over."""
        if self.spec is not None:
            self.spec.reset(slot.mtp, slot.state.n_past)

    def _save_to_host(self, slot: Slot) -> bool:
        """Before a slot's history is overwritten, keep it in the host-RAM cache (-cram); False when nothing was
        stored (no cache, a short history, or one the cache can already resume in full)."""
        c = slot.cache
        if not self.host_cache.enabled or len(c.tokens) < 16 or self.host_cache.holds(c.tokens):
            return False
        return self.host_cache.put(self.ops.save_host(slot.state, c.tokens, c.last_logits, list(c.checkpoints)))

    def _checkpoint_plan(self, task: CompletionTask, start: int) -> list[int]:
        """Positions to snapshot during prefill: hints from the handler (e.g. where the reply starts), a few
        tokens before the prompt end, every -cpent tokens, and the prompt end itself."""
        n = len(task.prompt)
        if self.cfg.ctx_checkpoints <= 0:
            return []
        plan = set(task.checkpoint_hints) | {n - self.cfg.checkpoint_tail, n}
        every = self.cfg.checkpoint_every
        if every > 0:
            plan |= set(range(every, n, every))
        return [p for p in plan if start < p <= n]

    # -- one step -----------------------------------------------------------------------------------------------
    def _step(self) -> None:
        """One decode step for every generating slot (a CUDA graph per set of slots on that backend), then prompt
        chunks, each slot's in its own forward, up to n_batch tokens in all. Decode rows never share a forward
        with prompt rows, and prompt chunks never with another slot's: a slot's arithmetic does not depend on
        what the others are doing (a mixed batch would take the tiled GEMM, which sums in another order)."""
        t_start = time.perf_counter()
        gen = [s for s in self.slots if s.phase == GENERATE]
        spec = [s for s in gen if self._speculates(s)]
        # beside a prompt chunk nothing drafts: the step waits for the chunk anyway, and drafting there would add
        # MTP work (drafts, the verify's rows, a new shape's eager round and captures) to the prompt's time to
        # its first token; nor is the step timed for the policy (_prompt_queued)
        beside_prompt = self._prompt_queued or any(s.phase == PREFILL for s in self.slots)
        if spec and beside_prompt:
            self.spec.beside_prompt([s.mtp for s in spec])
        left = min(s.tokens_left() for s in spec) if spec else 0
        n = self.spec.plan([s.mtp for s in spec], len(gen) - len(spec), left) if spec and not beside_prompt else 0
        clocked = bool(gen) and not (n or beside_prompt)    # a plain step of every generating slot
        if not clocked:
            self.clock.broken()
        if n:
            self._speculate(spec, n)
            drafting = set(map(id, spec))       # (by identity: a Slot's == compares every field)
            gen = [s for s in gen if id(s) not in drafting]
        if gen:
            t0, events = time.perf_counter(), self.decoder.events
            logits, h = self.decoder.decode_hidden([s.state for s in gen], [s.next_token for s in gen])
            t_launched = time.perf_counter()
            self._book_forward(len(gen), t0)
            self._flush()                # the previous results go out while the device runs this step
            timing = None
            if self.spec is not None:
                timing = self._observe_plain(gen, [] if n else spec, h, t0, events)
                if beside_prompt:
                    timing = None
                elif spec and not n:     # the next round's lengths, weighed while the device runs this step
                    self.spec.plan_ahead([s.mtp for s in spec], len(gen) - len(spec), left - 1)
            if clocked:
                timing = self._clocked(len(gen), t_start, t_launched, timing)
            self._after_forward(gen, [[s.next_token] for s in gen], logits, t0, timing)
        budget = self.cfg.n_batch - len(gen)
        ran = bool(gen)
        self._prompt_queued = False
        for s in sorted((s for s in self.slots if s.phase == PREFILL), key=lambda s: s.task.id):
            chunk = s.next_chunk(self._chunk_size(budget if ran else self.cfg.n_batch))
            if ran and len(chunk) > budget:
                break
            t0, spent = time.perf_counter(), self._spec_spent()
            try:
                logits = s.prefill(self.decoder, chunk, self.spec)
                if self.spec is not None and s.prompt_done():
                    self._prompt_end(s)
            except Exception as e:       # e.g. out of device memory for this prompt: fail this request only
                log.exception("slot %d: prefill failed", s.id)
                s.task.sink(ErrorResult(s.task.id, s.task.index, f"prompt processing failed: {e}"))
                self._reset(s)
                self._release(s)
                continue
            s.marks.chunk(t0, spent, self._spec_spent())
            self._book_forward(len(chunk), t0)
            self._flush()
            self._after_forward([s], [chunk], logits, t0)
            # a chunk that drew no token (not the prompt's last) may still run on the device when the next step
            # starts: that step waits for it, so it is one beside a prompt even if this slot stops prefilling
            # (cancelled) meanwhile
            self._prompt_queued |= s.phase == PREFILL
            budget -= len(chunk)
            ran = True
            self.clock.broken()

    def _clocked(self, S: int, t_start: float, t_launched: float, timing):
        """The drawn hook of a plain step of S rows with nothing else in it: the policy's timing (None: none),
        then the step clock's record (perf.StepClock), its host work beside the forward ending now."""
        t_overlapped = time.perf_counter()

        def drawn() -> None:
            if timing is not None:
                timing()
            self.clock.step(S, t_start, t_launched, t_overlapped, time.perf_counter())
        return drawn

    def _speculates(self, slot: Slot) -> bool:
        """Whether this generating slot takes a draft-and-verify step: MTP on, and nothing that needs each row's
        logits on the host or a token forced (grammar, n_probs, reasoning budget), no image before it (the head
        reads text positions only), room for a draft in the context."""
        p = slot.task.params
        return (self.spec is not None and slot.grammar is None and not slot.forced and p.n_probs <= 0
                and not slot.state.rope_shift and slot.state.n_past + 2 <= slot.state.n_ctx)

    def _observe_plain(self, gen: list[Slot], spec: list[Slot], h, t0: float, events: int):
        """`gen`'s plain decode step was launched: the heads of the slots in `spec` (which could have drafted)
        queue it -> what _after_forward calls once the step's tokens are drawn: the draft policy's timing of a plain
        step of that many slots (None when the step captured a graph or ran a graphed list eagerly). The timing
        ends when the ids are on the host, as a drafting round's does (its argmax is in its graph) and as the
        bench's plain step's (one graph with its argmax, one wait); it used to wait for the device before the
        draw, a second host wait a step with the device idle between."""
        may = set(map(id, spec))                # (by identity: a Slot's == compares every field)
        self.spec.observe_plain([(s.state, s.mtp, s.next_token, i) for i, s in enumerate(gen) if id(s) in may], h)
        if self.decoder.events != events:
            return None
        return lambda: self.spec.time_plain(len(gen), time.perf_counter() - t0)

    def _speculate(self, slots: list[Slot], n: int) -> None:
        """One draft-and-verify step of n drafts for these slots: drafts for all in one MTP forward per round,
        verification of all in one target forward; then each slot's tokens through _emit's rules, and the rewind."""
        t0 = time.perf_counter()
        sp = self.spec
        # the previous results go out while the device runs the round (timed with it, as a plain step's flush)
        _, logits, h, verified = sp.step([(s.state, s.mtp, s.next_token) for s in slots], n, self._flush)
        if self.cfg.sync_forwards:
            self.decoder.sync()
        self.perf.add_verified(len(slots), (time.perf_counter() - t0) * 1e3)   # + the accepted drafts, below
        self.metrics.n_decode_total += 1
        self.metrics.n_busy_slots_total += len(slots)
        for slot, v in zip(slots, verified):
            slot.cache.tokens.append(v.t0)
            slot.cache.last_logits = None
            last = [v.t0]

            def take(tok: int, slot=slot, v=v, last=last) -> bool:
                row = LogitsRow(self.backend, logits, v.row + len(last) - 1)
                slot.state.n_past = v.pos + len(last)    # as the plain path has it when this token is drawn
                last.append(tok)
                return self._emit_one(slot, tok, row)
            try:
                j = accept_tokens(self.backend, logits, v, slot.sampler, take, slot.synth)
            except Exception as e:       # one request's bad settings must not fail its neighbours
                log.exception("slot %d failed", slot.id)
                slot.task.sink(ErrorResult(slot.task.id, slot.task.index, f"sampling failed: {e}"))
                sp.commit(v, h, 1)
                self._release(slot)
                continue
            sp.commit(v, h, j)
            self.perf.add_verified(j - 1, 0.0)
            for stats in (slot.timings.draft, self.perf.draft):    # j - 1 drafts taken, then the target's token
                stats.count(len(v.drafts), j - 1)
            slot.cache.tokens.extend(v.drafts[:j - 1])
            self.metrics.t_tokens_generation_total += (time.perf_counter() - t0) * 1e3
            if slot.stopped:
                self._finish(slot, LogitsRow(self.backend, logits, v.row + j - 1))
            else:
                slot.next_token = last[-1]

    def _emit_one(self, slot: Slot, tok: int, row) -> bool:
        """_emit's accounting and streaming of one verified token, without finishing the request (the caller
        rewinds first) -> whether the slot goes on."""
        text = slot.accept(tok, row, self.cfg.n_ctx_slot)
        self.metrics.n_tokens_predicted_total += 1
        if slot.task.params.stream:
            slot.task.sink(slot.partial(text, tok))
        return not slot.stopped and not slot.forced
    def _book_forward(self, n_tokens: int, t0: float) -> None:
        if self.cfg.sync_forwards:
            self.decoder.sync()
        self.perf.add_forward(n_tokens, (time.perf_counter() - t0) * 1e3)

    def _chunk_size(self, room: int) -> int:
        """Prompt tokens one slot may add in one forward: n_ubatch; a layer split (llamacmp/split/) takes as many
        whole n_ubatch pieces as fit in `room` (at most n_batch) and pipelines them over its GPUs. The pieces are
        the same n_ubatch cuts either way (from the chunk start, which is the last cut or checkpoint), so a
        slot's arithmetic does not change."""
        ub = self.cfg.n_ubatch
        if not self.model.splits_batches:
            return ub
        return ub * max(1, min(room, self.cfg.n_batch) // ub)

    def _after_forward(self, slots: list[Slot], toks: list[list[int]], logits, t0: float, drawn_hook=None) -> None:
        """Book the step, then draw every row that wants a token in one go on the backend (row i is slots[i]);
        drawn_hook: called right after the draw (the draft policy's plain-step timing)."""
        self.metrics.n_decode_total += 1
        self.metrics.n_busy_slots_total += len(slots)
        rows = [LogitsRow(self.backend, logits, r) for r in range(len(slots))]
        want = []
        for slot, t, row in zip(slots, toks, rows):
            slot.cache.tokens.extend(t)
            slot.cache.last_logits = None      # a host copy is taken only when a request ends (_finish)
            if slot.phase == PREFILL:
                if slot.state.n_past in slot.checkpoint_at:
                    self._checkpoint(slot, row)
                if slot.task.params.stream and slot.task.params.return_progress:
                    slot.task.sink(slot.progress())
            want.append(slot.phase == GENERATE or slot.prompt_done())
        t_draw = now_ms()
        drawn = self._draw([s if w else None for s, w in zip(slots, want)], logits, rows) if any(want) else []
        if drawn_hook is not None:
            drawn_hook()
        self.perf.add_sample(sum(d is not None for d in drawn), now_ms() - t_draw)
        dt = (time.perf_counter() - t0) * 1e3       # after the draw: the device work is done
        for slot, t in zip(slots, toks):
            if slot.phase == PREFILL:
                self.metrics.n_prompt_tokens_processed_total += len(t)
                self.metrics.t_prompt_processing_total += dt
            else:
                self.metrics.t_tokens_generation_total += dt
        for slot, row, w, tok in zip(slots, rows, want, drawn or [None] * len(slots)):
            if not w:
                continue
            try:
                if slot.phase == PREFILL:
                    slot_log.slot_info("update_slots", slot.id, slot.task.id, "prompt processing done, "
                                       f"n_tokens = {slot.state.n_past}, batch.n_tokens = {len(t)}")
                    self._prompt_done(slot)
                self._emit(slot, tok, row)
            except Exception as e:       # one request's bad settings must not fail its neighbours
                log.exception("slot %d failed", slot.id)
                slot.task.sink(ErrorResult(slot.task.id, slot.task.index, f"sampling failed: {e}"))
                self._release(slot)

    def _draw(self, slots: list[Optional[Slot]], logits, rows: list[LogitsRow]) -> list[Optional[int]]:
        """The next token for each slot from its row of logits (row i: slots[i]; None: no token wanted): forced
        tokens (reasoning budget) as they are, rows with a grammar or n_probs from a host copy of the row, the
        rest on the backend in one call (engine/decode.py), so only their ids cross."""
        def on_backend(slot) -> bool:
            p = slot.task.params
            return p.n_predict != 0 and not slot.forced and slot.grammar is None and p.n_probs <= 0
        samplers = [s.sampler if s is not None and on_backend(s) else None for s in slots]
        got = draw_tokens(self.backend, logits, samplers) if any(x is not None for x in samplers) else \
            [None] * len(slots)
        out: list[Optional[int]] = []
        for r, slot in enumerate(slots):
            if slot is None or slot.task.params.n_predict == 0:
                out.append(None)
            elif got[r] is not None:
                out.append(got[r])
            elif slot.forced:
                out.append(slot.draw(None))
            else:                        # grammar mask or n_probs: this row's logits come to the host
                out.append(slot.draw(rows[r].host()))
        return out

    def _sample(self, slot: Slot, row) -> None:
        """Draw from host logits (a prompt whose logits the cache kept) and emit."""
        t0 = now_ms()
        tok = None if slot.task.params.n_predict == 0 else slot.draw(row)
        self.perf.add_sample(int(tok is not None), now_ms() - t0)
        self._emit(slot, tok, row)

    def _emit(self, slot: Slot, tok: Optional[int], row) -> None:
        """`tok` drawn from `row` (host array or LogitsRow): accept it, stream it, finish the request if it ends."""
        task = slot.task
        if task.params.n_predict == 0:
            slot.stop_type = "limit"
            self._finish(slot, row)
            return
        text = slot.accept(tok, row, self.cfg.n_ctx_slot)
        self.metrics.n_tokens_predicted_total += 1
        if slot_log.log.isEnabledFor(logging.DEBUG):
            left = task.params.n_predict - len(slot.generated) if task.params.n_predict >= 0 else -1
            slot_log.slot_debug("process_token", slot.id, task.id, f"n_decoded = {len(slot.generated)}, "
                                f"n_remaining = {left}, next token: {tok:5d} "
                                f"'{self.tokenizer.token_to_piece(tok).decode('utf-8', 'replace')}'")
        if task.params.stream:
            task.sink(slot.partial(text, tok))
        if slot.stopped:
            self._finish(slot, row)
        else:
            slot.next_token = tok

    def _finish(self, slot: Slot, row) -> None:
        slot.task.sink(slot.final())
        slot_log.slot_debug("process_token", slot.id, slot.task.id, {
            "eos": "stopped by EOS", "word": f"stopped by word '{slot.stopping_word}'"}.get(
            slot.stop_type, f"stopped by limit, n_decoded = {len(slot.generated)}, "
                            f"n_predict = {slot.task.params.n_predict}"))
        slot_log.print_timings(slot.id, slot.task.id, slot.timings)
        d = slot.timings.draft
        self.metrics.n_draft_tokens_total += d.n
        self.metrics.n_draft_accepted_total += d.accepted
        self.metrics.n_draft_steps_total += d.steps
        # the row's own host copy when it came from the device (one 1 MB copy on the real vocabulary, not three)
        slot.cache.last_logits = row.host() if isinstance(row, LogitsRow) else np.array(row, np.float32)
        # keep the end of this exchange: a follow-up that appends to prompt + reply resumes here
        if not slot.cache.has_checkpoint(slot.state.n_past) and self.cfg.ctx_checkpoints > 0:
            self._checkpoint(slot, slot.cache.last_logits)
        self.metrics.n_tokens_max = max(self.metrics.n_tokens_max, slot.state.n_past)
        self._release(slot)

    def _checkpoint(self, slot: Slot, logits) -> None:
        """Keep a copy of the slot's state at its position. No device room for the copy (the memory plan does not
        count checkpoints) costs only a longer re-evaluation later, never the request."""
        try:
            slot.cache.add_checkpoint(self.ops.snapshot(slot.state, logits))
        except MemoryError:
            log.info("slot %d: no memory for a checkpoint at %d; going on without it", slot.id, slot.state.n_past)

    def _release(self, slot: Slot) -> None:
        if slot.task is not None:
            slot_log.slot_info("release", slot.id, slot.task.id, f"stop processing: n_tokens = "
                               f"{slot.state.n_past}, truncated = {int(slot.truncated)}")
        slot.release()
        if not self._waiting and not any(s.busy for s in self.slots):
            slot_log.all_idle()

    def _fail_busy_slots(self, message: str) -> None:
        for slot in self.slots:
            if slot.busy:
                task = slot.task
                try:
                    task.sink(ErrorResult(task.id, task.index, message))
                    self._reset(slot)
                finally:
                    self._release(slot)

    # -- queries (answered on the engine thread, so they see a consistent picture) ------------------------------
    def _query(self, kind: str):
        if kind == "slots":
            return [self._slot_json(s) for s in self.slots]
        if kind == "metrics":
            m = self.metrics
            now = {k: getattr(m, k) for k in m.__slots__}
            # the throughput gauges cover the window since the previous scrape (0c1e570's metrics buckets, reset by
            # each scrape): nothing ran since -- e.g. asleep -- reads 0
            window = {f"window_{k}": now[k] - self._metrics_mark.get(k, 0) for k in self.WINDOW}
            self._metrics_mark = {k: now[k] for k in self.WINDOW}
            return {**now, **window,
                    "spec_rounds": self.spec.round_counts() if self.spec is not None else {},
                    "spec_vocab": self.spec.vocab_state() if self.spec is not None else {},
                    "plain_steps": self.clock.snapshot(),
                    "requests_processing": sum(s.busy for s in self.slots),
                    "requests_deferred": len(self._waiting),
                    "host_cache_bytes": self.host_cache.nbytes, "host_cache_entries": len(self.host_cache.entries)}
        return None

    def _slot_json(self, s: Slot) -> dict:
        head = {"id": s.id, "n_ctx": self.cfg.n_ctx_slot, "speculative": self.spec is not None, "is_processing": s.busy}
        task_id, p = (s.task.id, s.task.params) if s.task else s.last_task or (None, None)
        if p is None:                   # never used: llama-server has no task to describe either
            return head
        return {**head, "id_task": task_id,      # the running task, or the last one (llama-server's task_prev)
                "params": {"n_predict": p.n_predict, "stop": p.stop, "n_probs": p.n_probs,
                           "temperature": p.sampling.temp, "top_k": p.sampling.top_k, "top_p": p.sampling.top_p,
                           "min_p": p.sampling.min_p, "seed": p.sampling.seed, "stream": p.stream,
                           "cache_prompt": p.cache_prompt},
                "next_token": [self._next_token_json(s, p)],
                "prompt": self.tokenizer.decode([t for t in (s.prompt if s.busy else s.cache.tokens) if t >= 0]),
                "generated": s.text,
                "n_tokens_cached": len(s.cache.tokens), "n_checkpoints": len(s.cache.checkpoints)}

    @staticmethod
    def _next_token_json(s: Slot, p) -> dict:
        """A slot's generation state; an idle one shows none, as llama-server 0c1e570 resets a slot when it
        releases it (b8462 kept the finished task's n_remain and n_decoded until the next task)."""
        if not s.busy:
            return {"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}
        return {"has_next_token": True, "has_new_line": "\n" in s.text,
                "n_remain": (p.n_predict - len(s.generated)) if p.n_predict >= 0 else -1,
                "n_decoded": len(s.generated)}

    def _slot_action(self, task: SlotActionTask):
        """erase, save (to task.filepath), restore (from it); the handler has checked the file name."""
        if not 0 <= task.id_slot < len(self.slots):
            return ErrorResult(0, 0, "Invalid slot ID", "invalid_request_error", 400)
        slot = self.slots[task.id_slot]
        if slot.busy:
            return ErrorResult(0, 0, "Slot is busy", "unavailable_error", 503)
        t0 = time.perf_counter()
        if task.action == "erase":
            n = len(slot.cache.tokens)
            self._reset(slot)
            return {"id_slot": slot.id, "n_erased": n}
        if task.action == "save":
            c = slot.cache
            try:
                n_bytes = write_host_state(task.filepath,
                                           self.ops.save_host(slot.state, c.tokens, c.last_logits, []))
            except IsADirectoryError:
                return ErrorResult(0, 0, f"Unable to save slot: '{task.filename}' is a directory",
                                   "invalid_request_error", 400)
            except OSError as e:         # missing folder, disk full, no permission: the operator's to fix
                log.error("slot %d: cannot save %s: %s", slot.id, task.filepath, e)
                return ErrorResult(0, 0, f"Unable to save slot to '{task.filename}': {e.strerror or e}")
            return {"id_slot": slot.id, "filename": task.filename, "n_saved": len(c.tokens), "n_written": n_bytes,
                    "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}
        return self._restore_slot(slot, task, t0)

    def _restore_slot(self, slot: Slot, task: SlotActionTask, t0: float):
        try:
            host, n_bytes = read_host_state(task.filepath, slot.state)
        except Exception as e:           # not a zip, not an npz, wrong arrays: np.load raises many kinds
            log.warning("slot %d: cannot restore %s: %s", slot.id, task.filepath, e)
            return ErrorResult(0, 0, "Unable to restore slot, no available space in KV cache or invalid slot save "
                               "file", "invalid_request_error", 400)
        self._save_to_host(slot)
        self.ops.load_host(slot.state, host, None)
        self._spec_reset(slot)
        slot.cache.clear()
        slot.cache.tokens, slot.cache.last_logits = list(host.tokens), host.logits
        return {"id_slot": slot.id, "filename": task.filename, "n_restored": len(host.tokens), "n_read": n_bytes,
                "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}
