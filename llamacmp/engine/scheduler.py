"""The engine thread: owns the backend and the slots, and runs continuous batching.

Every step builds ONE StepBatch holding one decode token for each generating slot and a prompt chunk for each
slot still prefilling, runs the forward pass once, then samples per slot with that slot's own sampler.
HTTP handlers talk to it only through `submit` / `cancel` / `query` (thread-safe queue of typed tasks); results
go back through each task's `sink`.

Prompt chunks are cut per slot (at n_ubatch and at planned checkpoints), never by what other slots are doing,
so a request's arithmetic does not depend on its neighbours: N concurrent greedy streams give the same tokens
as each run alone.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..backends.base import StepBatch
from ..sampling import Sampler
from .checkpoints import read_host_state, state_ops_for, write_host_state
from .grammar import GrammarCompiler
from .prompt_cache import HostCache, ResumePoint, SlotCache, restore_from_host
from .slot import GENERATE, PREFILL, Slot
from .tasks import CancelTask, CompletionTask, ErrorResult, QueryTask, SlotActionTask

log = logging.getLogger("llamacmp.engine")


@dataclass(slots=True)
class EngineConfig:
    n_slots: int = 4
    n_ctx_slot: int = 4096
    n_batch: int = 2048                  # most tokens in one step (decode tokens first, then prompt chunks)
    n_ubatch: int = 512                  # most prompt tokens one slot adds in one step
    kv_type: str = "f16"
    cache_ram_mib: int = 8192            # -cram: -1 no limit, 0 off
    ctx_checkpoints: int = 32            # -ctxcp
    checkpoint_every: int = 8192         # -cpent: also one every N prompt tokens (-1 off)
    checkpoint_tail: int = 4             # one this many tokens before the prompt end (llama.cpp PR #20288)
    slot_prompt_similarity: float = 0.10 # -sps


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


class Engine:
    def __init__(self, lm, cfg: EngineConfig):
        self.lm, self.cfg = lm, cfg
        self.model, self.backend, self.tokenizer = lm.model, lm.backend, lm.tokenizer
        self.ops = state_ops_for(self.backend)
        self.slots = [Slot(i, self.backend.new_state(lm.cfg, cfg.n_ctx_slot, cfg.kv_type),
                           SlotCache(cfg.ctx_checkpoints)) for i in range(cfg.n_slots)]
        self.host_cache = HostCache(cfg.cache_ram_mib)
        self.grammars = GrammarCompiler(self.tokenizer)   # used by handlers (compile) and here (matchers)
        self.metrics = EngineMetrics()
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: list[CompletionTask] = []
        self._cancelled: set[int] = set()
        self._next_id = 1
        self._id_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- thread-safe API (called from HTTP handlers) ----------------------------------------------------------
    def new_task_id(self) -> int:
        with self._id_lock:
            self._next_id += 1
            return self._next_id - 1

    def submit(self, task) -> int:
        if isinstance(task, CompletionTask) and task.id == 0:
            task.id = self.new_task_id()
        self._inbox.put(task)
        return getattr(task, "id", 0)

    def cancel(self, task_id: int) -> None:
        self._inbox.put(CancelTask(task_id))

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
        while not self._stop.is_set():
            busy = any(s.busy for s in self.slots)
            self._drain(block=not busy and not self._waiting)
            self._assign_waiting()
            if any(s.busy for s in self.slots):
                try:
                    self._step()
                except Exception as e:  # a failed step must not take the server down: fail its requests
                    log.exception("engine step failed")
                    self._fail_busy_slots(f"engine error: {e}")

    def _drain(self, block: bool) -> None:
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
        if isinstance(item, CompletionTask):
            self._waiting.append(item)
        elif isinstance(item, CancelTask):
            self._cancel(item.task_id)
        elif isinstance(item, QueryTask):
            item.sink(self._query(item.kind))
        elif isinstance(item, SlotActionTask):
            item.sink(self._slot_action(item))

    def _cancel(self, task_id: int) -> None:
        self._waiting = [t for t in self._waiting if t.id != task_id]
        for slot in self.slots:
            if slot.task is not None and slot.task.id == task_id:
                self._release(slot)

    # -- admission ----------------------------------------------------------------------------------------------
    def _assign_waiting(self) -> None:
        still = []
        for task in self._waiting:
            slot = self._pick_slot(task)
            if slot is None:
                still.append(task)
                continue
            try:
                self._load_prompt(slot, task)
            except Exception as e:
                log.exception("failed to start task %d", task.id)
                task.sink(ErrorResult(task.id, task.index, str(e), "server_error", 500))
                self._release(slot)
        self.metrics.n_requests_deferred = len(still)
        self._waiting = still

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
                return best
        return min(idle, key=lambda s: s.last_used)

    def _load_prompt(self, slot: Slot, task: CompletionTask) -> None:
        if not task.prompt or len(task.prompt) >= self.cfg.n_ctx_slot:
            self._reject(task)
            return
        point = self._resume(slot, task)
        sampler = Sampler(task.params.sampling, self.tokenizer.eog_ids)
        decoder = self.tokenizer.stream_decoder(special=task.params.special)
        grammar = self.grammars.matcher(task.params.grammar) if task.params.grammar is not None else None
        slot.begin(task, sampler, decoder, self._checkpoint_plan(task, slot.state.n_past), grammar)
        slot.last_used = time.monotonic()
        log.info("slot %d: task %d, prompt %d tokens, %d from cache (lcp %d)", slot.id, task.id,
                 len(task.prompt), point.pos, point.lcp)
        if point.logits is not None:     # the whole prompt is cached with its logits: sample right away
            slot.finish_prompt_timing()
            self._sample(slot, point.logits)

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
            host = self.host_cache.take(key)     # before saving this slot: that put() may evict entries
            self._save_to_host(slot)
            restore_from_host(self.ops, slot.state, slot.cache, host, host_point)
            return host_point
        if point.pos < len(slot.cache.tokens):
            if point.pos < point.lcp or point.lcp < len(slot.cache.tokens) // 2:
                self._save_to_host(slot)
            self._rewind(slot, point)
        return point

    def _rewind(self, slot: Slot, point: ResumePoint) -> None:
        if point.ckpt is not None:
            self.ops.restore(slot.state, point.ckpt)
        elif point.pos == 0:
            self.ops.reset(slot.state)
        if point.pos == 0 and point.lcp > 0:
            log.info("slot %d: forcing full prompt re-processing due to lack of cache data", slot.id)
        slot.cache.truncate(point.pos)
        slot.cache.last_logits = point.ckpt.logits if point.ckpt is not None else None

    def _reset(self, slot: Slot) -> None:
        self.ops.reset(slot.state)
        slot.cache.clear()

    def _save_to_host(self, slot: Slot) -> None:
        """Before a slot's history is overwritten, keep it in the host-RAM cache (-cram)."""
        c = slot.cache
        if self.host_cache.enabled and len(c.tokens) >= 16:
            self.host_cache.put(self.ops.save_host(slot.state, c.tokens, c.last_logits, list(c.checkpoints)))

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
        items = self._batch_items()
        if not items:
            return
        batch = StepBatch.build([(s.state, toks) for s, toks in items])
        t0 = time.perf_counter()
        logits = self.backend.to_host(self.model.forward(batch))
        dt = (time.perf_counter() - t0) * 1e3
        self.metrics.n_decode_total += 1
        self.metrics.n_busy_slots_total += len(items)
        for (slot, toks), row in zip(items, logits):
            try:
                self._after_forward(slot, toks, row, dt)
            except Exception as e:       # one request's bad settings must not fail its neighbours
                log.exception("slot %d failed", slot.id)
                slot.task.sink(ErrorResult(slot.task.id, slot.task.index, f"sampling failed: {e}"))
                self._release(slot)

    def _batch_items(self) -> list[tuple[Slot, list[int]]]:
        items = [(s, [s.next_token]) for s in self.slots if s.phase == GENERATE]
        budget = self.cfg.n_batch - len(items)
        prefilling = sorted((s for s in self.slots if s.phase == PREFILL), key=lambda s: s.task.id)
        for s in prefilling:
            chunk = s.next_chunk(self.cfg.n_ubatch)
            if items and len(chunk) > budget:
                break
            items.append((s, chunk))
            budget -= len(chunk)
        return items

    def _after_forward(self, slot: Slot, toks: list[int], row, dt_ms: float) -> None:
        slot.cache.tokens.extend(toks)
        # `row` is a view into this step's [R, n_vocab] logits: keep a copy only when a request ends (_finish),
        # not every step (32 slots x 248k logits would pin and copy ~1 GB of batches)
        slot.cache.last_logits = None
        if slot.phase == PREFILL:
            self.metrics.n_prompt_tokens_processed_total += len(toks)
            self.metrics.t_prompt_processing_total += dt_ms
            if slot.state.n_past in slot.checkpoint_at:
                slot.cache.add_checkpoint(self.ops.snapshot(slot.state, row))
            if slot.task.params.stream and slot.task.params.return_progress:
                slot.task.sink(slot.progress())
            if not slot.prompt_done():
                return
            slot.finish_prompt_timing()
            self.metrics.n_prompt_tokens_cached_total += slot.n_cached
        else:
            self.metrics.t_tokens_generation_total += dt_ms
        self._sample(slot, row)

    def _sample(self, slot: Slot, row) -> None:
        task = slot.task
        if task.params.n_predict == 0:
            slot.stop_type = "limit"
            self._finish(slot, row)
            return
        tok = slot.draw(row)
        text = slot.accept(tok, row, self.tokenizer.is_eog(tok), self.cfg.n_ctx_slot)
        self.metrics.n_tokens_predicted_total += 1
        if task.params.stream:
            task.sink(slot.partial(text, tok))
        if slot.stopped:
            self._finish(slot, row)
        else:
            slot.next_token = tok

    def _finish(self, slot: Slot, row) -> None:
        slot.task.sink(slot.final())
        slot.cache.last_logits = np.array(row, np.float32)
        # keep the end of this exchange: a follow-up that appends to prompt + reply resumes here
        if not slot.cache.has_checkpoint(slot.state.n_past) and self.cfg.ctx_checkpoints > 0:
            slot.cache.add_checkpoint(self.ops.snapshot(slot.state, slot.cache.last_logits))
        self.metrics.n_tokens_max = max(self.metrics.n_tokens_max, slot.state.n_past)
        self._release(slot)

    def _release(self, slot: Slot) -> None:
        slot.release()

    def _fail_busy_slots(self, message: str) -> None:
        for slot in self.slots:
            if slot.busy:
                slot.task.sink(ErrorResult(slot.task.id, slot.task.index, message))
                self._reset(slot)
                self._release(slot)

    # -- queries (answered on the engine thread, so they see a consistent picture) ------------------------------
    def _query(self, kind: str):
        if kind == "slots":
            return [self._slot_json(s) for s in self.slots]
        if kind == "metrics":
            m = self.metrics
            return {**{k: getattr(m, k) for k in m.__slots__},
                    "requests_processing": sum(s.busy for s in self.slots),
                    "requests_deferred": len(self._waiting),
                    "host_cache_bytes": self.host_cache.nbytes, "host_cache_entries": len(self.host_cache.entries)}
        return None

    def _slot_json(self, s: Slot) -> dict:
        p = s.task.params if s.task else None
        return {"id": s.id, "n_ctx": self.cfg.n_ctx_slot, "speculative": False, "is_processing": s.busy,
                "id_task": s.task.id if s.task else -1,
                "params": ({"n_predict": p.n_predict, "stop": p.stop, "n_probs": p.n_probs,
                            "temperature": p.sampling.temp, "top_k": p.sampling.top_k, "top_p": p.sampling.top_p,
                            "min_p": p.sampling.min_p, "seed": p.sampling.seed, "stream": p.stream,
                            "cache_prompt": p.cache_prompt} if p else {}),
                "next_token": [{"has_next_token": s.busy, "has_new_line": "\n" in s.text,
                                "n_remain": (p.n_predict - len(s.generated)) if p and p.n_predict >= 0 else -1,
                                "n_decoded": len(s.generated)}],
                "prompt": self.tokenizer.decode(s.cache.tokens) if not s.busy else self.tokenizer.decode(s.prompt),
                "generated": s.text,
                "n_tokens_cached": len(s.cache.tokens), "n_checkpoints": len(s.cache.checkpoints)}

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
            n_bytes = write_host_state(task.filepath, self.ops.save_host(slot.state, c.tokens, c.last_logits, []))
            return {"id_slot": slot.id, "filename": task.filename, "n_saved": len(c.tokens), "n_written": n_bytes,
                    "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}
        return self._restore_slot(slot, task, t0)

    def _restore_slot(self, slot: Slot, task: SlotActionTask, t0: float):
        try:
            host, n_bytes = read_host_state(task.filepath, slot.state)
        except (OSError, ValueError, KeyError) as e:
            log.warning("slot %d: cannot restore %s: %s", slot.id, task.filepath, e)
            return ErrorResult(0, 0, "Unable to restore slot, no available space in KV cache or invalid slot save "
                               "file", "invalid_request_error", 400)
        self._save_to_host(slot)
        self.ops.load_host(slot.state, host, None)
        slot.cache.clear()
        slot.cache.tokens, slot.cache.last_logits = list(host.tokens), host.logits
        return {"id_slot": slot.id, "filename": task.filename, "n_restored": len(host.tokens), "n_read": n_bytes,
                "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}
