"""SamplingParams and llama.cpp's sampler chain, on host numpy: the reference the device kernels must match.

A chain step works on a `Candidates` set (token ids + logits, possibly already cut down), like llama.cpp's
llama_token_data_array. Order of a draw (common/sampling.cpp): logit bias, then the `--samplers` sequence
(default penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature), then a seeded categorical draw.
With --mirostat 1 or 2 the chain is instead logit bias, temperature, then Mirostat's own truncation and draw (the
`--samplers` sequence is not used, as in llama.cpp).

The device chain (engine/decode.py) runs the default sequence with penalties, top-k/p, min-p and temperature; DRY,
top-n-sigma, XTC, dynamic temperature and Mirostat (SamplingParams.plain is False) run here, on a host copy of the
row.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from . import dry

# `--samplers` names and `--sampling-seq` letters (common/common.cpp); the ones we implement are in STEPS below.
SAMPLER_LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p",
                   "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature", "a": "adaptive_p"}
SAMPLER_ALIASES = {"top-k": "top_k", "top-p": "top_p", "min-p": "min_p", "nucleus": "top_p",
                   "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p",
                   "temp": "temperature", "top-n-sigma": "top_n_sigma", "top-nsigma": "top_n_sigma",
                   "adaptive-p": "adaptive_p"}
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
# adaptive-p, where the sequence names it, replaces the final draw (llama.cpp adds it last, wherever it is named)
KNOWN_SAMPLERS = DEFAULT_SAMPLERS + ("adaptive_p",)
DRY_BREAKERS = ("\n", ":", "\"", "*")     # common_params_sampling.dry_sequence_breakers
MIROSTAT_M = 100                          # Mirostat 1's tokens for its estimate of s (common/sampling.cpp)
ADAPTIVE_WIDTH, ADAPTIVE_PEAK, ADAPTIVE_SHARPNESS = 0.3, 5.0, 10.0   # adaptive-p's transform (llama-sampler.cpp)


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
    dry_multiplier: float = 0.0         # DRY (llamacmp/dry.py): 0 = off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1        # -1: the model's n_ctx_train (llama-server: the slot's context)
    dry_sequence_breakers: tuple[str, ...] = DRY_BREAKERS
    top_n_sigma: float = -1.0           # <= 0: off
    xtc_probability: float = 0.0        # 0 = off
    xtc_threshold: float = 0.10         # > 0.5 = off
    dynatemp_range: float = 0.0         # 0 = off
    dynatemp_exponent: float = 1.0
    mirostat: int = 0                   # 0 = off, 1 = Mirostat, 2 = Mirostat 2.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    adaptive_target: float = -1.0       # adaptive-p (named in `samplers`): < 0 = an ordinary draw
    adaptive_decay: float = 0.90
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logit_bias: dict[int, float] = field(default_factory=dict)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        unknown = [s for s in self.samplers if s not in KNOWN_SAMPLERS]
        if unknown:
            raise ValueError(f"unknown sampler name(s): {', '.join(unknown)}")
        if self.mirostat not in (0, 1, 2):
            raise ValueError(f"mirostat must be 0, 1 or 2, got {self.mirostat}")

    @property
    def greedy(self) -> bool:
        """The draw is the argmax of the chain's logits: no temperature, and none that dynamic temperature adds."""
        return self.temp <= 0.0 and self.temp + max(self.dynatemp_range, 0.0) <= 0.0

    @property
    def dry_on(self) -> bool:
        return self.dry_multiplier != 0.0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0

    @property
    def xtc_on(self) -> bool:
        return self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5

    @property
    def extras(self) -> frozenset[str]:
        """The samplers on beyond the device chain's steps (penalties, top-k/p, min-p, typical, temperature)."""
        on = {"dry": self.dry_on, "xtc": self.xtc_on, "top_n_sigma": self.top_n_sigma > 0.0,
              "dynatemp": self.dynatemp_range > 0.0, "mirostat": self.mirostat != 0, "adaptive_p": self.adaptive_on}
        return frozenset(k for k, v in on.items() if v)

    @property
    def plain(self) -> bool:
        """Only the steps the device chain runs: no DRY, top-n-sigma, XTC, dynamic temperature, Mirostat or
        adaptive-p."""
        return not self.extras

    @property
    def penalties_off(self) -> bool:
        return self.penalty_last_n == 0 or (self.penalty_repeat == 1.0 and self.penalty_freq == 0.0
                                            and self.penalty_present == 0.0)

    @property
    def adaptive_on(self) -> bool:
        """adaptive-p draws (named in the sequence; Mirostat replaces the whole chain, adaptive-p included)."""
        return "adaptive_p" in self.samplers and not self.mirostat

    @property
    def random_chain(self) -> bool:
        """The draw's distribution is not the chain's softmax of the logits and history alone (XTC's coin,
        Mirostat's target and adaptive-p's average, updated by each draw); speculative verification then draws
        from the target itself."""
        return self.xtc_on or self.mirostat != 0 or self.adaptive_on


def parse_sampler_names(text: str) -> tuple[str, ...]:
    """`--samplers "top_k;temperature"` (llama.cpp also splits on ',' when no ';' is present)."""
    sep = ";" if ";" in text else ","
    names = [n.strip() for n in text.split(sep) if n.strip()]
    out = tuple(SAMPLER_ALIASES.get(n, n) for n in names)
    unknown = [n for n in out if n not in KNOWN_SAMPLERS]
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

    def find(self, toks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """toks: sorted unique token ids -> (positions of the candidates that are one of them, each one's index in
        toks). Vectorised: a dict over the whole vocabulary cost ~50 ms a token on the host path."""
        hit = np.flatnonzero(np.isin(self.ids, toks))
        return hit, np.searchsorted(toks, self.ids[hit])

    def subtract(self, amounts: dict[int, float]) -> None:
        """Lower the logit of each token id in `amounts` (those still candidates) by its amount."""
        toks = np.fromiter(amounts, dtype=np.int64, count=len(amounts))
        vals = np.fromiter(amounts.values(), dtype=np.float64, count=len(amounts))
        order = np.argsort(toks)
        hit, at = self.find(toks[order])
        self.logits[hit] -= vals[order][at]

    def keep_top(self, k: int) -> None:
        """Keep the first k of sort_desc's order, in that order, without sorting the whole set: the values above the
        k-th largest, then the earliest of those equal to it (a stable sort puts them first)."""
        n = len(self.ids)
        if k >= n or 4 * k >= n:
            self.sort_desc()
            self.keep(slice(0, k))
            return
        v = np.partition(self.logits, n - k)[n - k]
        gt = np.flatnonzero(self.logits > v)
        idx = np.sort(np.concatenate([gt, np.flatnonzero(self.logits == v)[:k - len(gt)]]))
        self.keep(idx[np.argsort(-self.logits[idx], kind="stable")])

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
    toks, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    hit, at = c.find(toks)
    x = c.logits[hit]
    x = np.where(x <= 0, x * p.penalty_repeat, x / p.penalty_repeat)
    c.logits[hit] = x - counts[at] * p.penalty_freq - p.penalty_present


def apply_top_k(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    if p.top_k <= 0:
        return
    c.keep_top(min(max(p.top_k, p.min_keep), len(c.ids)))


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


def apply_top_n_sigma(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    """Keep the logits within top_n_sigma standard deviations of the best (over the finite ones: a -inf bias is
    left out of the mean and the deviation, as llama.cpp does)."""
    if p.top_n_sigma <= 0.0 or len(c.ids) <= 1:
        return
    finite = c.logits[np.isfinite(c.logits)]
    if finite.size == 0:
        return
    floor = finite.max() - p.top_n_sigma * finite.std()
    c.keep(c.logits >= floor)


def scale_temperature(c: Candidates, temp: float) -> None:
    """llama_sampler_temp_impl: temp <= 0 keeps only the best logit (so the draw is the argmax), else divides."""
    if temp <= 0.0:
        best = int(np.argmax(c.logits))        # argmax takes the lowest id among ties
        c.keep(slice(best, best + 1))
        return
    c.logits = c.logits / temp


def apply_temperature(c: Candidates, p: SamplingParams, history: list[int]) -> None:
    """llama.cpp's temp-ext: with dynatemp_range > 0 the temperature moves within temp +- range with the
    distribution's normalised entropy (min_temp + (max_temp - min_temp) * H_norm ** exponent), else it is temp."""
    if p.dynatemp_range <= 0.0:
        scale_temperature(c, p.temp)
        return
    n = len(c.ids)
    if n <= 1:
        return
    lo, hi = max(0.0, p.temp - p.dynatemp_range), p.temp + p.dynatemp_range
    probs = c.probs()
    nz = probs[probs > 0.0]
    h_norm = float(-(nz * np.log(nz)).sum()) / math.log(n)
    scale_temperature(c, lo + (hi - lo) * h_norm ** p.dynatemp_exponent)


def apply_xtc(c: Candidates, p: SamplingParams, coin: float) -> None:
    """Exclude Top Choices: when coin <= xtc_probability, drop every token at or above xtc_threshold but the least
    probable of them (if that leaves at least min_keep)."""
    if not p.xtc_on or len(c.ids) < 2 or coin > p.xtc_probability:
        return
    c.sort_desc()
    above = int(np.count_nonzero(np.cumprod(c.probs() >= p.xtc_threshold)))
    last = above - 1
    if last > 0 and len(c.ids) - last >= p.min_keep:
        c.keep(slice(last, None))


STEPS = {"penalties": apply_penalties, "top_n_sigma": apply_top_n_sigma, "top_k": apply_top_k,
         "typ_p": apply_typical, "top_p": apply_top_p, "min_p": apply_min_p, "temperature": apply_temperature}
# "dry" and "xtc" read the Sampler's own state (the vocabulary's breakers, XTC's coin): Sampler.chain runs them.


@dataclass(frozen=True)
class SamplerVocab:
    """What DRY needs of the model: its tokenizer (the breakers' tokens) and n_ctx_train (DRY's longest window)."""
    tokenizer: object
    n_ctx_train: int


class Sampler:
    """One sequence's sampler: the params, a seeded RNG and the token history the penalties look at; with DRY the
    vocabulary's breakers, with XTC its coin's generator, with Mirostat its running target surprise mu."""

    def __init__(self, params: SamplingParams, eog_ids: frozenset[int] = frozenset(), history_cap: int = 1 << 16,
                 vocab: Optional[SamplerVocab] = None):
        if params.mirostat not in (0, 1, 2):     # (a field set after construction: general.sampling.mirostat)
            raise ValueError(f"mirostat must be 0, 1 or 2, got {params.mirostat}")
        self.params = params
        self.eog_ids = eog_ids
        self.seed = params.seed if params.seed >= 0 else int(np.random.SeedSequence().entropy % (1 << 32))
        self.rng = np.random.Generator(np.random.MT19937(self.seed))
        self.xtc_rng = np.random.Generator(np.random.MT19937(self.seed))   # XTC's own, as llama.cpp's xtc sampler
        self.mu = 2.0 * params.mirostat_tau                                 # Mirostat's target surprise, updated
        self._adaptive_reset()
        self.dry: Optional[tuple[dry.DryBreakers, int]] = None              # (breakers, n_ctx_train) with DRY on
        if params.dry_on:
            if vocab is None:
                raise ValueError("DRY sampling needs the model's vocabulary (SamplerVocab)")
            self.dry = (dry.breakers(vocab.tokenizer, tuple(params.dry_sequence_breakers)), vocab.n_ctx_train)
            window = vocab.n_ctx_train if params.dry_penalty_last_n < 0 else params.dry_penalty_last_n
            history_cap = max(history_cap, window)
        self.history: deque[int] = deque(maxlen=history_cap)
        self.n_accepted = 0            # llama.cpp's chain counts accepts (prompt included) as its "runs"
        self._bias: dict[int, float] | None = None
        self._drawn: Optional[tuple[np.ndarray, np.ndarray]] = None   # a coin-tossing chain's last draw's distribution

    def bias_by_id(self) -> dict[int, float]:
        """The logit bias `candidates` applies, by token id, with ignore_eos's -inf for the EOG ids (built once:
        the device draw reads it every step). Callers must not change it."""
        if self._bias is None:
            bias = {int(t): float(v) for t, v in self.params.logit_bias.items()}
            if self.params.ignore_eos:
                bias.update({int(t): -np.inf for t in self.eog_ids})
            self._bias = bias
        return self._bias

    def device_bias(self) -> Optional[dict[int, float]]:
        """The logit bias the device chain draws this token with, or None where the chain must run on the host.
        Plain params: the sampler's own. DRY as the only extra, with the penalties off: its penalties for this draw
        join the bias (bias, neutral penalties, then DRY's subtraction are x + b - d: the same logits up to float
        rounding, which the device chain and this one already differ by), so no row crosses to the host."""
        p = self.params
        if p.plain:
            return self.bias_by_id()
        if p.extras != {"dry"} or not p.penalties_off:
            return None
        pen = self._dry_penalties(list(self.history))
        if not pen:
            return self.bias_by_id()
        bias = dict(self.bias_by_id())
        for tok, d in pen.items():
            bias[tok] = bias.get(tok, 0.0) - d
        return bias

    def accept(self, token: int) -> None:
        """Record a prompt or generated token (llama.cpp feeds the prompt into the penalty window too)."""
        self.history.append(int(token))
        self.n_accepted += 1
        self._drawn = None
        if self._pending is not None and self._pending[0] == int(token):
            # adaptive-p's average of the drawn tokens' probabilities before its transform
            self._ada_sum = self._pending[1] + self._decay * self._ada_sum
            self._ada_weight = 1.0 + self._decay * self._ada_weight
        self._pending = None

    def reset(self) -> None:
        self.history.clear()
        self.mu = 2.0 * self.params.mirostat_tau
        self._drawn = None
        self._adaptive_reset()

    def _adaptive_reset(self) -> None:
        p = self.params
        self._decay = min(max(p.adaptive_decay, 0.0), 0.99)
        self._ada_sum = p.adaptive_target / (1.0 - self._decay)
        self._ada_weight = 1.0 / (1.0 - self._decay)
        self._pending: Optional[tuple[int, float]] = None     # (token, its probability) of adaptive-p's last draw

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
        """logits [n_vocab] -> the candidates the chain leaves (the steps named in `skip` left out). With Mirostat:
        the logit bias and the temperature (its truncation is part of the draw: mirostat_draw)."""
        c = self.candidates(logits)
        p = self.params
        if p.mirostat:
            if "temperature" not in skip:
                scale_temperature(c, p.temp)
            return c
        history = list(self.history)
        for name in p.samplers:
            if name in skip or name == "adaptive_p":        # (adaptive-p is the draw: _adaptive)
                continue
            if name == "dry":
                self._apply_dry(c, history)
            elif name == "xtc":
                # the coin is tossed only where XTC could act (llama.cpp returns before drawing otherwise)
                if p.xtc_on and len(c.ids) >= 2:
                    apply_xtc(c, p, float(np.float32(self.xtc_rng.random())))
            else:
                STEPS[name](c, p, history)
        return c

    def _apply_dry(self, c: Candidates, history: list[int]) -> None:
        pen = self._dry_penalties(history)
        if pen:
            c.subtract(pen)

    def _dry_penalties(self, history: list[int]) -> dict[int, float]:
        if self.dry is None:
            return {}
        p = self.params
        brk, n_ctx_train = self.dry
        return dry.penalties(history, p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n,
                             n_ctx_train, brk)

    def post_sampling_probs(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n], probs [n]) of the distribution the draw uses, most probable first: llama.cpp's
        post_sampling_probs. Greedy keeps every candidate the earlier steps left, the best at 1 and the rest
        at 0, as llama.cpp's temperature step does (it masks them rather than dropping them). Called between a
        draw and its accept, a chain that tosses coins (XTC, Mirostat) gives the distribution that draw used."""
        if self._drawn is not None:
            return self._drawn
        if self.params.mirostat:
            return self._mirostat(logits)
        if self.params.adaptive_on:
            return _most_probable_first(*self._adaptive(logits)[:2])
        return self._distribution(logits)

    def _distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        greedy = self.params.greedy
        c = self.chain(logits, skip=("temperature",) if greedy else ())
        c.sort_desc()
        if greedy:
            return c.ids, (np.arange(len(c.ids)) == 0).astype(np.float64)
        return c.ids, c.probs()

    def sample(self, logits: np.ndarray) -> int:
        """logits [n_vocab] -> the next token id (not yet accepted)."""
        p = self.params
        if p.mirostat:
            ids, probs = self._drawn = self._mirostat(logits)
            pick = int(self.rng.choice(len(ids), p=probs)) if len(ids) > 1 else 0
            self.mu -= p.mirostat_eta * (-math.log2(probs[pick]) - p.mirostat_tau)
            return int(ids[pick])
        if p.adaptive_on:
            ids, probs, before = self._adaptive(logits)
            pick = int(self.rng.choice(len(ids), p=probs)) if len(ids) > 1 else 0
            self._pending = (int(ids[pick]), float(before[pick]))
            self._drawn = _most_probable_first(ids, probs)
            return int(ids[pick])
        if p.random_chain:     # one run of the chain (one XTC coin) serves the draw and its post-sampling probs
            ids, probs = self._drawn = self._distribution(logits)
            return int(ids[0]) if len(ids) == 1 or p.greedy else int(ids[self.rng.choice(len(ids), p=probs)])
        c = self.chain(logits)
        if len(c.ids) == 1:
            return int(c.ids[0])
        return int(c.ids[self.rng.choice(len(c.ids), p=c.probs())])

    def _adaptive(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """adaptive-p (llama.cpp PR 17927): the chain's candidates -> (ids, the probabilities it draws from, those
        before its transform). It aims the draw at tokens whose probability is near a target, the target moved
        against the recent average of the drawn tokens' probabilities: each finite logit becomes
        5 - 10 d^2 / (1 + d), d = |p - target'| / 0.3."""
        c = self.chain(logits)
        before = c.probs()
        target = self.params.adaptive_target
        if target < 0.0 or len(c.ids) == 0:
            return c.ids, before, before
        target = min(max(target, 0.0), 1.0)
        aim = target if self._ada_weight == 0.0 else min(max(2.0 * target - self._ada_sum / self._ada_weight, 0.0), 1.0)
        d = np.abs(before - aim) / ADAPTIVE_WIDTH
        c.logits = np.where(np.isfinite(c.logits), ADAPTIVE_PEAK - ADAPTIVE_SHARPNESS * d * d / (1.0 + d), c.logits)
        return c.ids, c.probs(), before

    def _mirostat(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mirostat's truncation at the current mu: (ids, probs) most probable first. Version 1 keeps the top k,
        k from the Zipf exponent s estimated on the best MIROSTAT_M tokens; version 2 keeps the tokens whose
        surprise (-log2 p) is at most mu (at least one)."""
        p = self.params
        c = self.chain(logits)                  # logit bias and temperature
        n = len(c.ids)
        if p.mirostat == 1 and n > 1:
            head = Candidates(c.ids, c.logits.copy())
            head.keep_top(min(MIROSTAT_M, n))
            i = np.arange(len(head.ids) - 1)
            t = np.log((i + 2) / (i + 1))
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                # log(p_i / p_(i+1)) is the logits' difference: the normalisation cancels
                s_hat = float((t * (head.logits[i] - head.logits[i + 1])).sum() / (t * t).sum())
                eps = s_hat - 1.0
                k = ((eps * 2.0 ** self.mu) / (1.0 - float(len(logits)) ** -eps)) ** (1.0 / s_hat)
            c.keep_top(max(int(min(k, n)), 1) if math.isfinite(k) else n)
        elif p.mirostat == 2 and n > 1:
            with np.errstate(divide="ignore"):
                kept = -np.log2(c.probs()) <= self.mu     # the sorted order's prefix, found without the sort
            if kept.any():
                c.keep(kept)
                c.sort_desc()
            else:
                c.keep_top(1)
        else:
            c.sort_desc()
        return c.ids, c.probs()


def _most_probable_first(ids: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-probs, kind="stable")
    return ids[order], probs[order]
