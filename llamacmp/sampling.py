"""SamplingParams and llama.cpp's sampler chain, on host numpy: the reference the device kernels must match.

A chain step works on a `Candidates` set (token ids + logits, possibly already cut down), like llama.cpp's
llama_token_data_array. Order of a draw (common/sampling.cpp): logit bias, then the `--samplers` sequence
(default penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature), then a seeded categorical draw.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

# `--samplers` names and `--sampling-seq` letters (common/common.cpp); the ones we implement are in STEPS below.
SAMPLER_LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p",
                   "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature"}
SAMPLER_ALIASES = {"top-k": "top_k", "top-p": "top_p", "min-p": "min_p", "nucleus": "top_p",
                   "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p",
                   "temp": "temperature", "top-n-sigma": "top_n_sigma", "top-nsigma": "top_n_sigma"}
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")


@dataclass(slots=True)
class SamplingParams:
    """llama.cpp's common_params_sampling fields we honour, with its defaults."""
    seed: int = -1                      # -1: random, reported as 4294967295
    temp: float = 0.80
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typ_p: float = 1.00
    min_keep: int = 0
    penalty_last_n: int = 64            # -1: the whole context
    penalty_repeat: float = 1.00
    penalty_freq: float = 0.00
    penalty_present: float = 0.00
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logit_bias: dict[int, float] = field(default_factory=dict)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        unknown = [s for s in self.samplers if s not in DEFAULT_SAMPLERS]
        if unknown:
            raise ValueError(f"unknown sampler name(s): {', '.join(unknown)}")

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0


def parse_sampler_names(text: str) -> tuple[str, ...]:
    """`--samplers "top_k;temperature"` (llama.cpp also splits on ',' when no ';' is present)."""
    sep = ";" if ";" in text else ","
    names = [n.strip() for n in text.split(sep) if n.strip()]
    out = tuple(SAMPLER_ALIASES.get(n, n) for n in names)
    unknown = [n for n in out if n not in DEFAULT_SAMPLERS]
    if unknown:
        raise ValueError(f"unknown sampler name(s): {', '.join(unknown)}")
    return out


def parse_sampler_letters(text: str) -> tuple[str, ...]:
    """`--sampling-seq edkypmxt`: unknown letters are ignored, as llama.cpp does."""
    return tuple(SAMPLER_LETTERS[c] for c in text if c in SAMPLER_LETTERS)


@dataclass(slots=True)
class Candidates:
    ids: np.ndarray        # [n] int64
    logits: np.ndarray     # [n] float64

    def keep(self, mask_or_index) -> None:
        self.ids, self.logits = self.ids[mask_or_index], self.logits[mask_or_index]

    def sort_desc(self) -> None:
        # stable so that equal logits keep the lower token id first (llama.cpp's partial_sort is not stable,
        # so ties are a documented place where the two may pick differently)
        order = np.argsort(-self.logits, kind="stable")
        self.keep(order)

    def probs(self) -> np.ndarray:
        z = self.logits - self.logits.max()
        e = np.exp(z)
        return e / e.sum()


# -- chain steps (each: candidates, params, history) --------------------------------------------------------

def apply_penalties(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    """Repeat penalty divides positive logits / multiplies negative ones; frequency and presence subtract."""
    if p.penalty_last_n == 0 or (p.penalty_repeat == 1.0 and p.penalty_freq == 0.0 and p.penalty_present == 0.0):
        return
    window = history if p.penalty_last_n < 0 else history[-p.penalty_last_n:]
    if not window:
        return
    counts: dict[int, int] = {}
    for t in window:
        counts[t] = counts.get(t, 0) + 1
    index = {int(t): i for i, t in enumerate(c.ids)}
    for tok, n in counts.items():
        i = index.get(tok)
        if i is None:
            continue
        x = c.logits[i]
        x = x * p.penalty_repeat if x <= 0 else x / p.penalty_repeat
        c.logits[i] = x - n * p.penalty_freq - p.penalty_present


def apply_top_k(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    if p.top_k <= 0:
        return
    k = min(max(p.top_k, p.min_keep), len(c.ids))
    c.sort_desc()
    c.keep(slice(0, k))


def apply_typical(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    """Locally typical sampling: keep the tokens whose surprisal is closest to the entropy, up to mass typ_p."""
    if p.typ_p >= 1.0:
        return
    probs = c.probs()
    logp = np.log(np.maximum(probs, 1e-300))
    entropy = -(probs * logp).sum()
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    cum = np.cumsum(probs[order])
    last = int(np.searchsorted(cum, p.typ_p, side="left")) + 1   # first index where cum >= p, inclusive
    last = max(last, p.min_keep, 1)
    c.keep(order[:last])


def apply_top_p(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    if p.top_p >= 1.0:
        return
    c.sort_desc()
    cum = np.cumsum(c.probs())
    last = int(np.searchsorted(cum, p.top_p, side="left")) + 1
    c.keep(slice(0, max(last, p.min_keep, 1)))


def apply_min_p(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    """Keep tokens with prob >= min_p * max prob, compared in logit space as llama.cpp does."""
    if p.min_p <= 0.0 or len(c.ids) == 0:
        return
    floor = c.logits.max() + np.log(p.min_p)
    mask = c.logits >= floor
    if mask.sum() < max(p.min_keep, 1):
        c.sort_desc()
        c.keep(slice(0, max(p.min_keep, 1)))
        return
    c.keep(mask)


def apply_temperature(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    """temp <= 0 keeps only the best logit (llama.cpp's temp sampler does the same), so the draw is argmax."""
    if p.temp <= 0.0:
        best = int(np.argmax(c.logits))        # argmax takes the lowest id among ties
        c.keep(slice(best, best + 1))
        return
    c.logits = c.logits / p.temp


def apply_unimplemented(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    """dry, top_n_sigma and xtc are off at their defaults; args.py refuses non-default values for them."""


STEPS = {"penalties": apply_penalties, "dry": apply_unimplemented, "top_n_sigma": apply_unimplemented,
         "top_k": apply_top_k, "typ_p": apply_typical, "top_p": apply_top_p, "min_p": apply_min_p,
         "xtc": apply_unimplemented, "temperature": apply_temperature}


class Sampler:
    """One sequence's sampler: the params, a seeded RNG and the token history the penalties look at."""

    def __init__(self, params: SamplingParams, eog_ids: frozenset[int] = frozenset(), history_cap: int = 1 << 16):
        self.params = params
        self.eog_ids = eog_ids
        self.seed = params.seed if params.seed >= 0 else int(np.random.SeedSequence().entropy % (1 << 32))
        self.rng = np.random.Generator(np.random.MT19937(self.seed))
        self.history: deque[int] = deque(maxlen=history_cap)
        self.n_accepted = 0            # llama.cpp's chain counts accepts (prompt included) as its "runs"
        self._bias: dict[int, float] | None = None

    def bias_by_id(self) -> dict[int, float]:
        """The logit bias `candidates` applies, by token id, with ignore_eos's -inf for the EOG ids (built once:
        the device draw reads it every step). Callers must not change it."""
        if self._bias is None:
            bias = {int(t): float(v) for t, v in self.params.logit_bias.items()}
            if self.params.ignore_eos:
                bias.update({int(t): -np.inf for t in self.eog_ids})
            self._bias = bias
        return self._bias

    def accept(self, token: int) -> None:
        """Record a prompt or generated token (llama.cpp feeds the prompt into the penalty window too)."""
        self.history.append(int(token))
        self.n_accepted += 1

    def reset(self) -> None:
        self.history.clear()

    def candidates(self, logits: np.ndarray) -> Candidates:
        """Full-vocabulary candidates with logit bias and ignore_eos applied."""
        x = np.asarray(logits, dtype=np.float64).copy()
        for tok, bias in self.params.logit_bias.items():
            if 0 <= tok < x.shape[0]:
                x[tok] += bias
        if self.params.ignore_eos:
            for tok in self.eog_ids:
                if tok < x.shape[0]:
                    x[tok] = -np.inf
        return Candidates(np.arange(x.shape[0], dtype=np.int64), x)

    def chain(self, logits: np.ndarray, skip: tuple[str, ...] = ()) -> Candidates:
        """logits [n_vocab] -> the candidates the chain leaves (the steps named in `skip` left out)."""
        c = self.candidates(logits)
        history = list(self.history)
        for name in self.params.samplers:
            if name not in skip:
                STEPS[name](c, self.params, history)
        return c

    def post_sampling_probs(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n], probs [n]) of the distribution the draw uses, most probable first: llama.cpp's
        post_sampling_probs. temp <= 0 keeps every candidate the earlier steps left, the best at 1 and the rest
        at 0, as llama.cpp's temperature step does (it masks them rather than dropping them)."""
        greedy = self.params.temp <= 0.0
        c = self.chain(logits, skip=("temperature",) if greedy else ())
        c.sort_desc()
        if greedy:
            return c.ids, (np.arange(len(c.ids)) == 0).astype(np.float64)
        return c.ids, c.probs()

    def sample(self, logits: np.ndarray) -> int:
        """logits [n_vocab] -> the next token id (not yet accepted)."""
        c = self.chain(logits)
        if len(c.ids) == 1:
            return int(c.ids[0])
        return int(c.ids[self.rng.choice(len(c.ids), p=c.probs())])
