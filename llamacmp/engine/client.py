"""The CLIs' way into the engine: one slot of the server's scheduler (scheduler.py), driven on the caller's thread.

llama-cli and llama-completion hold one conversation. `SlotClient.history` is its tokens (decoded or still
pending); each generate() is one CompletionTask over all of them, so the slot's prompt cache resumes at the live
state, or at a checkpoint where the caller said the prompt will change (a chat's reply start). What the CLIs need
beyond the server is set per task (GenParams: stop_window, forced_spend_n_predict, a sampler of their own) or here:
each token's piece goes out as soon as it is accepted (the sink runs on this thread), Ctrl-C between two tokens
cancels the task, and the engine's `perf` holds llama.cpp's counters (each forward waited for:
EngineConfig.sync_forwards).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

from ..sampling import Sampler, SamplingParams
from .perf import Perf
from .scheduler import Engine, EngineConfig
from .speculative import enabled_spec
from .tasks import CompletionTask, ErrorResult, FinalResult, GenParams, PartialResult

# checkpoints a CLI keeps: a turn's prompt end, its reply end and its hint (a chat's reply start, which the next
# turn resumes from when the re-rendered reply differs)
CLI_CHECKPOINTS = 3


class ContextFull(Exception):
    """The sequence has no room for what was asked (llama.cpp has no context shift for recurrent memory either)."""


class EngineError(Exception):
    """The engine answered a task with an error; the message is its."""


@dataclass(slots=True)
class Generation:
    text: str
    tokens: list[int]
    stop: str                    # "eog" | "limit" | "stop" | "interrupted" | "context"
    stop_string: str = ""


def _stop_kind(r: FinalResult) -> str:
    if r.stop_type == "eos":
        return "eog"
    if r.stop_type == "word":
        return "stop"
    return "context" if r.truncated else "limit"


class SlotClient:
    def __init__(self, lm, run, t_load_ms: float = 0.0):
        """run: the run_plan.RunPlan of the tool (its one sequence's context, KV types, batch sizes)."""
        cfg = EngineConfig(n_slots=1, n_ctx_slot=run.n_ctx, n_batch=run.n_batch, n_ubatch=run.micro_batch,
                           k_type=run.k_type, v_type=run.v_type, cache_ram_mib=0, ctx_checkpoints=CLI_CHECKPOINTS,
                           checkpoint_every=-1, checkpoint_tail=0, max_graphs=1, sync_forwards=True,
                           spec=enabled_spec(run))
        self.engine = Engine(lm, cfg)
        self.engine.perf.t_load_ms = t_load_ms
        self.eog_ids = lm.tokenizer.eog_ids
        self.history: list[int] = []
        self._prompt_only = Sampler(SamplingParams(), self.eog_ids)    # feed() draws nothing: no prompt to see

    @property
    def n_ctx(self) -> int:
        return self.engine.cfg.n_ctx_slot

    @property
    def perf(self) -> Perf:
        return self.engine.perf

    @property
    def grammars(self):
        """The engine's GrammarCompiler: GenParams.grammar is compiled by it."""
        return self.engine.grammars

    def feed(self, tokens: list[int]) -> None:
        """Append tokens and evaluate them now, as llama.cpp does before it waits for input."""
        self.history.extend(int(t) for t in tokens)
        self._run(GenParams(n_predict=0, sampler=self._prompt_only), lambda r: None, lambda: False, (), {})

    def generate(self, params: GenParams, on_token: Optional[Callable[[int], None]] = None,
                 on_text: Optional[Callable[[str], None]] = None, should_stop: Callable[[], bool] = lambda: False,
                 checkpoint_hints: tuple[int, ...] = (), images: Optional[dict] = None) -> Generation:
        """One turn over the whole history: its tokens are appended to it (an end-of-generation token is not:
        llama.cpp never decodes it either). on_token sees each id, then on_text its piece; should_stop is asked
        after each token (True: the turn ends there, "interrupted"). images: prompt position -> ImageEmbedding,
        whose placeholder ids the history holds there (vision/prompt.py)."""
        if should_stop():                # asked before the first token too
            return Generation("", [], "interrupted")
        n_prompt = len(self.history)
        texts: list[str] = []

        def on_piece(r: PartialResult) -> None:
            for t in r.tokens:
                if on_token:
                    on_token(t)
            texts.append(r.text)
            if r.text and on_text:
                on_text(r.text)
        tokens, final = self._run(replace(params, stream=True), on_piece, should_stop,
                                  checkpoint_hints, images or {})
        if final is None:
            self.history.extend(tokens)
            return Generation("".join(texts), tokens, "interrupted")
        gen = Generation(final.text, list(final.tokens), _stop_kind(final), final.stopping_word)
        sampling = params.sampler.params if params.sampler is not None else params.sampling
        kept = gen.tokens
        if gen.stop == "context" or (gen.stop == "eog" and kept and kept[-1] in self.eog_ids
                                     and not sampling.ignore_eos):
            kept = kept[:-1]             # never decoded: no room for it, or the end of generation
        self.history = self.history[:n_prompt] + kept
        return gen

    def _run(self, params: GenParams, on_piece, should_stop, hints, images) -> tuple[list[int], Optional[FinalResult]]:
        """Submit one task over the history and run the engine until it is answered -> (tokens streamed, the
        final result or None when it was cancelled)."""
        if len(self.history) >= self.n_ctx:
            raise ContextFull(f"context full ({len(self.history)} tokens, n_ctx {self.n_ctx})")
        tokens: list[int] = []
        answer: list = []

        def sink(r) -> None:
            if isinstance(r, PartialResult):
                tokens.extend(r.tokens)
                on_piece(r)
                if should_stop():
                    self.engine.cancel(task.id)
            else:
                answer.append(r)
        task = CompletionTask(list(self.history), params, sink, checkpoint_hints=tuple(hints), images=images)
        self.engine.submit(task)
        self.engine.run_pending()
        if answer and isinstance(answer[0], ErrorResult):
            raise EngineError(answer[0].message)
        return tokens, (answer[0] if answer else None)
