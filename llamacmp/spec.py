"""Speculative decoding settings (llama.cpp's --spec-* options), parsed once at the edge into a typed object.

Only `draft-mtp` (the model's own multi-token-prediction head) is run; other spec types are refused where the
options are parsed. The `synth_*` fields are llama.cpp's benchmarking knobs (--spec-synth-len / --spec-synth-rates):
acceptance decided synthetically instead of by comparing tokens, so a run measures the cost of a given acceptance.

The synthetic rule is llama.cpp 0c1e570's (common/speculative.cpp common_speculative_synth_rates_resolve,
tools/server/server-context.cpp server_sample_and_accept_synth): unconditional per-position rates r_i (given, or
r_i = p^(i+1) with p chosen so that 1 + sum(r_i) = L), turned into conditional probabilities r_i / r_(i-1); draft
position i is accepted when a uniform draw from the slot's mt19937 (seeded with the request's seed) is below its
probability and the drafted token is not end-of-generation; the first rejection ends the run of accepted tokens.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

import numpy as np

from .arg_values import Unsupported
from .backends.cq2_ref import CQ2_BYTES_PER_VALUE
from .gguf_file import QUANT_BLOCKS

# every --spec-type name llama.cpp 0c1e570 knows (common_speculative_type_from_name_map)
KNOWN_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
               "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
MTP_TENSOR = "blk.{}.nextn.eh_proj.weight"      # llama.cpp's test for an MTP head (common_speculative_types_from_gguf)


AUTO = "auto"                                   # --spec-draft-vocab auto (the default)

# The target's hidden-state rows (n_embd f32 each, 16 KB on the 9B) that one sequence's drafting keeps on the device
# (engine/speculative.py; memplan counts them per slot): the plain steps queued before the head runs over them
# (observe_plain: 160 MB a stream over 10K plainly decoded tokens unbounded, ~4 MB at 256), and the ring of the
# commits' kept rows (MtpSeq.kept: KEPT_ROUNDS rounds of n_max + 1 rows before it starts over).
PENDING_MAX = 256
KEPT_ROUNDS = 8


def hidden_rows(n_max: int) -> int:
    """The most such rows one sequence holds: a full queue plus the round that fills it past the bound (a commit
    queues up to n_max + 1), the ring, and h_last."""
    return PENDING_MAX + (n_max + 1) + KEPT_ROUNDS * (n_max + 1) + 1


# --spec-draft-coarse (llamacmp's own; models/qwen35.py set_draft_coarse, Backend.coarse_argmax): the MTP draft only
# needs the argmax of its LM head, so a head of many rows is read through a CQ2 copy (backends/cq2_ref.py: 2-bit
# codes, 0.3125 bytes a weight) whose COARSE_K best ids the exact head rescores. The verify keeps the exact head:
# outputs never change, only acceptance could (when the exact argmax is not among the K).
COARSE_TYPE = "CQ2"
COARSE_K_MAX = 32              # candidates the device kernels take (cuda_src/coarse_head.cu TOPK_MAX)
# Only heads of at least this many rows: the candidates' top-k and rescoring cost a few microseconds per draft
# step, which the bytes saved pay for from a few ten thousand rows of a 4096-wide Q8_0 head (the 9B's whole head:
# 1.08 GB -> 0.32 GB a step); auto's 32768-row prefix keeps its exact rows.
COARSE_MIN_ROWS = 65536
COARSE_MIN_SAVING = 4 / 3      # the head's bytes per row over the copy's at least this (Q3_K 1.38x: yes; Q2_K: no)


class SpecError(ValueError):
    """Settings that cannot run together; the message names the flags."""


@dataclass(frozen=True, slots=True)
class SpecConfig:
    type: str = "none"                    # "none" | "draft-mtp"
    n_max: int = 3                        # --spec-draft-n-max: most tokens drafted per step
    n_min: int = 0                        # --spec-draft-n-min
    p_min: float = 0.0                    # --spec-draft-p-min: stop drafting below this draft probability
    synth_len: float | None = None        # --spec-synth-len L: mean accepted length (benchmarks only)
    synth_rates: tuple[float, ...] = ()   # --spec-synth-rates P0,P1,..: acceptance probability per draft position
    draft_vocab: int | str = "auto"       # --spec-draft-vocab N: drafts only among token ids < N (0: all); "auto":
                                          # a prefix while the text stays in it (engine/draft_vocab.py)
    draft_coarse: int = 16                # --spec-draft-coarse K: the draft's argmax over a CQ2 copy of its LM
                                          # head, its K best rescored by the exact head (0: the exact head only)

    @property
    def enabled(self) -> bool:
        return self.type != "none"

    @property
    def synthetic(self) -> bool:
        return self.synth_len is not None or bool(self.synth_rates)


# -- parsing (args.py calls these; ValueError texts are llama.cpp's) ------------------------------------------------

def parse_type(value: str) -> str:
    """--spec-type a,b,..: "draft-mtp" or "none". An unknown name is llama.cpp's error; a known one llamacmp does
    not run is refused naming it (args.Unsupported)."""
    for name in value.split(","):       # in order, as common_speculative_types_from_names
        if name not in KNOWN_TYPES:
            raise ValueError(f"unknown speculative type: {name}")
        if name == "none":               # llama.cpp: "none" ends the list and adds nothing
            return "none"
        if name != "draft-mtp":
            raise Unsupported(f"error: --spec-type {name} is not supported: llamacmp runs only draft-mtp (the "
                              "model's own multi-token-prediction head); draft models, eagle3, dflash, dspark and "
                              "n-gram drafting are not supported")
    return "draft-mtp"


def parse_draft_vocab(value: str) -> int | str:
    """--spec-draft-vocab auto|N: "auto", or N >= 0 (0: the whole vocabulary). The ValueError's text follows the
    flag's name in the caller's message."""
    text = value.strip()
    if text == AUTO:
        return AUTO
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"expected auto, 0 (the whole vocabulary) or N >= 1 token ids, got '{value}'")
    return n


def parse_draft_coarse(value: str) -> int:
    """--spec-draft-coarse K: 0 (off) or 1 .. COARSE_K_MAX candidates."""
    try:
        k = int(value.strip())
    except ValueError:
        k = -1
    if not 0 <= k <= COARSE_K_MAX:
        raise ValueError(f"expected 0 (the exact head only) or 1 .. {COARSE_K_MAX} candidates, got '{value}'")
    return k


def _stod(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError("stod") from None


def parse_synth_len(value: str) -> float:
    x = _stod(value)
    if x == -1.0:                        # llama.cpp's "unset" marker is not a length
        raise ValueError("invalid value")
    return x


def parse_synth_rates(value: str) -> tuple[float, ...]:
    return tuple(_stod(x) for x in value.split(","))


# -- checks once the options are known (run_plan.py) --------------------------------------------------------------

def check(cfg: SpecConfig) -> SpecConfig:
    """The combinations llama.cpp refuses when it starts (common_speculative_synth_rates_resolve), same words."""
    if cfg.synthetic and not cfg.enabled:
        raise SpecError("--spec-synth-len / --spec-synth-rates need --spec-type draft-mtp (synthetic acceptance "
                        "requires an initialized speculative decoding context)")
    if cfg.n_max < 0:
        raise SpecError(f"--spec-draft-n-max must not be negative, got {cfg.n_max}")
    v = cfg.draft_vocab
    if v != AUTO and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise SpecError(f"--spec-draft-vocab must be auto, 0 (the whole vocabulary) or 1 .. n_vocab, got {v!r}")
    k = cfg.draft_coarse
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= COARSE_K_MAX:
        raise SpecError(f"--spec-draft-coarse must be 0 (the exact head only) or 1 .. {COARSE_K_MAX}, got {k!r}")
    if cfg.synthetic:
        synth_rates(cfg)
    return cfg


def synth_rates(cfg: SpecConfig) -> tuple[float, ...]:
    """The unconditional probability that draft position i is accepted, i < n_max; () without --spec-synth-*."""
    if not cfg.synthetic:
        return ()
    if cfg.synth_len is not None and cfg.synth_rates:
        raise SpecError("--spec-synth-len and --spec-synth-rates: synthetic acceptance length and rates are "
                        "mutually exclusive")
    n = cfg.n_max
    if n <= 0:
        raise SpecError("--spec-synth-*: synthetic acceptance requires at least one speculative token "
                        "(--spec-draft-n-max >= 1)")
    if cfg.synth_rates:
        r = cfg.synth_rates
        if len(r) != n:
            raise SpecError(f"--spec-synth-rates: synthetic acceptance rates must contain {n} values, got {len(r)}")
        if not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in r):
            raise SpecError("--spec-synth-rates: synthetic acceptance rates must be finite and within [0, 1]")
        if any(b > a for a, b in zip(r, r[1:])):
            raise SpecError("--spec-synth-rates: synthetic acceptance rates must be monotonically non-increasing")
        return r
    length = cfg.synth_len
    if not (math.isfinite(length) and 1.0 <= length <= n + 1):
        raise SpecError(f"--spec-synth-len: synthetic acceptance length must be finite and within [1, {n + 1}]")
    p = 1.0 if length == n + 1 else _geometric_p(length - 1.0, n) if length > 1.0 else 0.0
    rates, r = [], p
    for _ in range(n):                  # p, p*p, (p*p)*p, ... multiplied in llama.cpp's order
        rates.append(r)
        r *= p
    return tuple(rates)


def _geometric_p(target: float, n: int) -> float:
    """p with p + p^2 + .. + p^n = target, by llama.cpp's 32 bisection steps (so the rates match to the bit)."""
    lo, hi = 0.0, 1.0
    for _ in range(32):
        mid = 0.5 * (lo + hi)
        total, term = 0.0, mid
        for _ in range(n):
            total += term
            term *= mid
        lo, hi = (mid, hi) if total < target else (lo, mid)
    return 0.5 * (lo + hi)


def synth_probs(cfg: SpecConfig) -> tuple[float, ...]:
    """P(accept position i | positions < i accepted) = r_i / r_(i-1), 0 after a rate of 0."""
    out, prev = [], 1.0
    for r in synth_rates(cfg):
        out.append(r / prev if prev > 0.0 else 0.0)
        prev = r
    return tuple(out)


def synth_mean_len(cfg: SpecConfig) -> float:
    """1 + sum of the rates: the mean tokens per verification, target token included (llama.cpp logs it)."""
    return 1.0 + sum(synth_rates(cfg))


class SynthRng:
    """The per-slot generator of llama-server's synthetic acceptance: std::mt19937 seeded with the request's seed
    and std::uniform_real_distribution<double>(0, 1) as libstdc++ makes it (two 32-bit outputs, low word first,
    over 2^64), so a seeded run draws the same numbers as llama.cpp's."""

    BLOCK = 512         # 32-bit outputs taken from the generator at a time

    def __init__(self, seed: int):
        self._mt = np.random.RandomState(seed & 0xFFFFFFFF)   # int seeding is mt19937's init_genrand
        self._words, self._next = [], 0

    def uniform(self) -> float:
        # The outputs are taken in blocks (randint over the whole 32-bit range takes one output per value, so a
        # block is the sequence that draws of two give): a numpy call per draw was ~8 us, twice a round of the
        # bench's MTP rows on the host's critical path (the device idles between the verified ids and the next draft)
        if self._next == len(self._words):
            self._words, self._next = self._mt.randint(0, 1 << 32, size=self.BLOCK, dtype=np.uint32).tolist(), 0
        lo, hi = self._words[self._next], self._words[self._next + 1]
        self._next += 2
        u = float(lo + (hi << 32)) / 2.0 ** 64
        return u if u < 1.0 else math.nextafter(1.0, 0.0)


def synth_accepted(probs: Sequence[float], draft: Sequence[int], eog: Container[int], rng: SynthRng) -> int:
    """How many leading tokens of `draft` a synthetic verification accepts. probs: synth_probs(cfg), at least
    len(draft) of them; eog: the end-of-generation ids (a drafted one is never accepted: it would end the
    generation early). One draw per position looked at, as llama-server's."""
    for i, tok in enumerate(draft):
        if not (rng.uniform() < probs[i] and tok not in eog):
            return i
    return len(draft)


def synth_acceptor(cfg: SpecConfig, seed: int, eog: Container[int]) -> Callable[[Sequence[int]], int] | None:
    """For one request: drafts -> how many a synthetic verification accepts, drawing from its own generator
    seeded with the request's seed (llama-server: the sampling seed, else a random one); None without
    --spec-synth-*."""
    if not cfg.synthetic:
        return None
    probs = synth_probs(cfg)
    rng = SynthRng(seed if seed >= 0 else int(np.random.SeedSequence().entropy % (1 << 32)))
    return lambda draft: synth_accepted(probs, draft, eog, rng)


def synth_log_lines(cfg: SpecConfig) -> list[str]:
    """What llama.cpp logs at start when synthetic acceptance is on (common_speculative_init); [] when off."""
    rates = synth_rates(cfg)
    if not rates:
        return []
    return ["synthetic speculative acceptance is enabled for benchmarking; generated output is not valid",
            f"synthetic acceptance: n_max = {len(rates)}, mean length = {synth_mean_len(cfg):.6f}, "
            f"rates = [{', '.join(f'{r:.6g}' for r in rates)}]"]


# -- the model file -------------------------------------------------------------------------------------------------

def has_mtp_head(tensor_names: Container[str], block_count: int) -> bool:
    """llama.cpp's rule: the last block holds nextn.eh_proj."""
    return block_count > 0 and MTP_TENSOR.format(block_count - 1) in tensor_names


def check_draft_vocab(cfg: SpecConfig, n_vocab: int) -> None:
    """--spec-draft-vocab N drafts among the first N token ids: N above the model's vocabulary stops the start
    (auto picks its prefix per vocabulary)."""
    if cfg.draft_vocab != AUTO and cfg.draft_vocab > n_vocab:
        raise SpecError(f"--spec-draft-vocab {cfg.draft_vocab}: must be 1 .. {n_vocab} (the vocabulary), or 0 for "
                        "all of it")


@dataclass(frozen=True, slots=True)
class CoarseHead:
    """--spec-draft-coarse as a run applies it (engine/speculative.py Speculator.set_coarse): the k best ids of a CQ2
    copy of the head's first `rows` rows, rescored by the exact head, for every draft head of at least min_rows
    rows (tests inject a smaller min_rows than COARSE_MIN_ROWS, for the tiny fixtures' vocabularies)."""
    k: int
    rows: int
    min_rows: int = COARSE_MIN_ROWS

    def __post_init__(self):
        if not (1 <= self.k <= COARSE_K_MAX and self.rows >= 1 and self.min_rows >= 1):
            raise ValueError(f"CoarseHead: need 1 <= k <= {COARSE_K_MAX}, rows >= 1 and min_rows >= 1, got {self}")


def coarse_head(cfg: SpecConfig, n_vocab: int, n_embd: int, head_type: str) -> CoarseHead | None:
    """The coarse head a run makes (None: the draft reads the exact head): with --spec-type draft-mtp and
    --spec-draft-coarse K > 0, a CQ2 copy of the rows the draft may read (all of them for --spec-draft-vocab auto
    or 0, else the first N), when those are at least COARSE_MIN_ROWS, rows of 32-value blocks, and the head (GGUF
    type head_type, as the CUDA backend stores it) takes at least COARSE_MIN_SAVING times the copy's bytes."""
    if not cfg.enabled or cfg.draft_coarse <= 0 or n_embd % 32:
        return None
    rows = n_vocab if cfg.draft_vocab in (AUTO, 0) else min(int(cfg.draft_vocab), n_vocab)
    if rows < COARSE_MIN_ROWS or device_bytes_per_value(head_type) < COARSE_MIN_SAVING * CQ2_BYTES_PER_VALUE:
        return None
    return CoarseHead(cfg.draft_coarse, rows, COARSE_MIN_ROWS)


def device_bytes_per_value(type_name: str) -> float:
    """Bytes a weight of this GGUF type takes on the CUDA backend (memplan.tensor_bytes: F16 / BF16 widened to f32)."""
    if type_name == "Q8_0":
        return 34 / 32
    if type_name in QUANT_BLOCKS:
        values, nbytes = QUANT_BLOCKS[type_name]
        return nbytes / values
    return 4.0


def check_model(cfg: SpecConfig, path: str, tensor_names: Container[str], block_count: int) -> None:
    """--spec-type draft-mtp on a file without an MTP head stops the start, as llama-server 0c1e570 does ("context
    type MTP requested but model doesn't contain MTP layers", then "failed to create MTP context")."""
    if cfg.enabled and not has_mtp_head(tensor_names, block_count):
        raise SpecError(f"--spec-type draft-mtp: the model file '{path}' has no MTP layers (no "
                        f"{MTP_TENSOR.format(max(0, block_count - 1))}); drop --spec-type or use a GGUF converted "
                        "with its MTP head")
