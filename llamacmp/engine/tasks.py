"""Typed messages between the HTTP side and the engine thread.

Handlers build a task (prompt already tokenized, parameters already parsed) and hand it to the engine with a
`sink`: a callable the engine thread calls with each result. The engine never sees JSON; handlers never touch
slots or backend state (llama.cpp's server_task / server_task_result split, README-dev).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..sampling import Sampler, SamplingParams


@dataclass(slots=True)
class GenParams:
    """Per-request generation settings (llama.cpp's slot_params)."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1                 # -1: until EOG or the context is full
    n_keep: int = 0
    stop: list[str] = field(default_factory=list)
    n_probs: int = 0
    post_sampling_probs: bool = False
    cache_prompt: bool = True
    id_slot: int = -1
    return_tokens: bool = False
    timings_per_token: bool = False
    return_progress: bool = False       # streamed prompt_progress chunks while the prompt is processed
    special: bool = False               # render control tokens in the output text (--special)
    t_max_predict_ms: int = 0
    stream: bool = False
    # reasoning budget (--reasoning-budget / thinking_budget_tokens): after this many tokens inside <think>,
    # the reply is forced to `reasoning_end` (the budget message and the closing tag); -1 = unlimited
    reasoning_budget: int = -1
    reasoning_end: tuple[int, ...] = ()
    grammar: object = None              # engine.grammar.Grammar (compiled at the edge) or None
    # what the CLIs (engine/client.py) set differently from the server, as llama.cpp's tools differ:
    stop_window: Optional[int] = None   # llama-completion: stop strings only at the end of the text (turn.py)
    forced_spend_n_predict: bool = True # llama-cli's -n counts only sampled tokens, not forced ones
    sampler: Optional[Sampler] = None   # a caller's sampler that lives across requests (llama-completion's one
                                        # chain); it has seen what it should: the prompt is not fed into it


@dataclass(slots=True)
class CompletionTask:
    prompt: list[int]
    params: GenParams
    sink: Callable[[object], None]
    index: int = 0                      # position in a multi-prompt / n_cmpl request
    checkpoint_hints: tuple[int, ...] = ()   # prompt positions worth a checkpoint (e.g. where the reply starts)
    id: int = 0                         # set by Engine.submit
    # images in the prompt: start position -> vision.encoder.ImageEmbedding; the prompt holds its n_tokens
    # placeholder ids there (negative, from the image bytes' hash: vision/prompt.py), so caches tell images apart
    images: dict = field(default_factory=dict)
    t_queued: float = 0.0               # perf_counter when Engine.submit took it (the start timeline, -v)


@dataclass(slots=True)
class CancelTask:
    task_id: int


@dataclass(slots=True)
class QueryTask:
    """Ask the engine for a snapshot ("slots" or "metrics"); the answer goes to `sink` as a dict/list."""
    kind: str
    sink: Callable[[object], None]


@dataclass(slots=True)
class WakeTask:
    """Wake a sleeping engine (--sleep-idle-seconds) before a route that needs the model: `sink` gets None once the
    model is back, or an ErrorResult naming why it could not be loaded again."""
    sink: Callable[[object], None]


@dataclass(slots=True)
class EmbedTask:
    """/embedding, /v1/embeddings: each prompt's `embedding` field (embedding.py), or an ErrorResult."""
    prompts: list[list[int]]
    pooling: str
    norm: int
    sink: Callable[[object], None]


@dataclass(slots=True)
class SlotActionTask:
    """/slots/:id?action=save|restore|erase."""
    action: str
    id_slot: int
    filename: str
    sink: Callable[[object], None]
    filepath: str = ""                  # filename inside --slot-save-path (checked by the handler)


# -- results ------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class DraftStats:
    """One request's speculative decoding counters, as llama-server 0c1e570's server_slot_stats keeps them."""
    n: int = 0                          # draft tokens proposed (verified by the main model)
    accepted: int = 0                   # of those, accepted
    steps: int = 0                      # verification steps
    accepted_per_pos: list[int] = field(default_factory=list)   # [i]: steps that accepted draft position i

    def count(self, n_drafted: int, n_accepted: int) -> None:
        """One verification of `n_drafted` draft tokens of which the first `n_accepted` were accepted."""
        self.n += n_drafted
        self.accepted += n_accepted
        self.steps += 1
        if len(self.accepted_per_pos) < n_drafted:
            self.accepted_per_pos += [0] * (n_drafted - len(self.accepted_per_pos))
        for i in range(n_accepted):
            self.accepted_per_pos[i] += 1

    def since(self, earlier: "DraftStats") -> "DraftStats":
        """Counted after `earlier` (a copy()): one turn's figures."""
        per_pos = [a - (earlier.accepted_per_pos[i] if i < len(earlier.accepted_per_pos) else 0)
                   for i, a in enumerate(self.accepted_per_pos)]
        return DraftStats(self.n - earlier.n, self.accepted - earlier.accepted, self.steps - earlier.steps, per_pos)

    def copy(self) -> "DraftStats":
        return DraftStats(self.n, self.accepted, self.steps, list(self.accepted_per_pos))

    @property
    def mean_len(self) -> float:
        """Tokens per verification, the main model's own token included."""
        return 1.0 + self.accepted / self.steps if self.steps else 1.0

    def to_json(self) -> dict:
        """The response's timings fields: present only when something was drafted (llama-server's rule)."""
        return {"draft_n": self.n, "draft_n_accepted": self.accepted} if self.n > 0 else {}

    def acceptance_line(self) -> str:
        """llama-server 0c1e570's print_timings line for drafts ('' when nothing was drafted)."""
        if self.n <= 0:
            return ""
        return (f"draft acceptance = {self.accepted / self.n:0.5f} ({self.accepted:5d} accepted / {self.n:5d} "
                f"generated), mean len = {self.mean_len:5.2f}")


@dataclass(slots=True)
class Timings:
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft: DraftStats = field(default_factory=DraftStats)   # speculative decoding (the MTP loop counts)

    @property
    def gen_steps(self) -> int:
        """The decode steps of the generation, which its rates divide by as llama-server 0c1e570's (b8462: the
        tokens): the first token comes from the prompt's last logits and costs none, so one token has no rate."""
        return max(0, self.predicted_n - 1)

    def to_json(self) -> dict:
        def per(ms: float, n: int) -> tuple[float, float]:
            return (ms / n if n else 0.0), (1e3 * n / ms if ms > 0 else 0.0)
        p_tok, p_sec = per(self.prompt_ms, self.prompt_n)
        g_tok, g_sec = per(self.predicted_ms, self.gen_steps)
        return {"cache_n": self.cache_n, "prompt_n": self.prompt_n, "prompt_ms": self.prompt_ms,
                "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec,
                "predicted_n": self.predicted_n, "predicted_ms": self.predicted_ms,
                "predicted_per_token_ms": g_tok, "predicted_per_second": g_sec, **self.draft.to_json()}


@dataclass(slots=True)
class TokenProb:
    """One generated token's probabilities: the chosen token and the top-n alternatives (id, logprob)."""
    id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class PartialResult:
    task_id: int
    index: int
    id_slot: int
    text: str
    tokens: list[int]
    probs: list[TokenProb]
    n_predicted: int
    n_prompt: int
    timings: Optional[Timings] = None
    progress: Optional[dict] = None     # {total, cache, processed, time_ms}: a prompt-progress chunk, no token


@dataclass(slots=True)
class FinalResult:
    task_id: int
    index: int
    id_slot: int
    text: str                           # the whole generated text (after stop-string truncation)
    tokens: list[int]
    probs: list[TokenProb]
    stop_type: str                      # "eos" | "limit" | "word" | "none"
    stopping_word: str
    n_prompt: int
    n_cached: int
    n_predicted: int
    truncated: bool
    timings: Timings
    prompt_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class ErrorResult:
    task_id: int
    index: int
    message: str
    type: str = "server_error"
    code: int = 500
    extra: dict = field(default_factory=dict)
