"""The decode path of the scheduler (every generation) and of sequence.py (scoring): running the model and drawing tokens
with as little as possible crossing from the device.

`Decoder` runs prefill chunks eagerly (one sequence per forward) and decode steps (one token for each of a list
of sequences) through CUDA graphs on the CUDA backend (backends/cuda_graphs.py), eagerly elsewhere.

`draw_tokens` draws one token per logits row on the backend (`sample_rows`): greedy rows take the argmax (also
with biases that only lower tokens, e.g. ignore_eos, unless the argmax is a lowered id), other
rows llama.cpp's chain as llamacmp/sampling.py runs it, each with its own settings, drawn at the number the row's
own seeded generator gives; only the ids cross to the host. Rows the device chain does not do sample on the host
from a copy of their row alone: a non-default sampler order, typical-p, top-n-sigma, XTC, dynamic temperature,
Mirostat, adaptive-p, DRY beside penalties (Sampler.device_bias: DRY alone joins the bias), top-k off or above
SAMPLE_MAX_K (at temp > 0), a penalty window above SAMPLE_MAX_WINDOW. Rows that need the host row anyway (a grammar's token
mask, n_probs probabilities) are the caller's: it passes None for them and draws from `LogitsRow.host()`.
"""
from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from itertools import islice
from typing import Optional, Sequence

import numpy as np

from ..backends.base import RowSample, SeqState, StepBatch
from ..sampling import DEFAULT_SAMPLERS, Sampler

log = logging.getLogger("llamacmp.engine")
_BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))


class LogitsRow:
    """Row `row` of a step's logits [R, N] wherever they live, copied to the host only when asked (np.asarray,
    `host()`): a grammar mask, n_probs, a checkpoint, the end of a request. Valid until the next step."""
    __slots__ = ("be", "logits", "row", "_host")

    def __init__(self, be, logits, row: int):
        self.be, self.logits, self.row, self._host = be, logits, row, None

    def host(self) -> np.ndarray:
        """float32 [N] (one copy, kept)."""
        if self._host is None:
            self._host = self.be.row_to_host(self.logits, self.row)
        return self._host

    def __array__(self, dtype=None, copy=None):
        a = self.host()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a        # (a row is 1 MB on the real vocabulary: no second copy unasked)


@dataclass(slots=True)
class _Plan:
    kind: str                           # "argmax" | "chain" | "host"
    spec: Optional[RowSample] = None    # "chain": the draw
    rng_state: object = None            # the generator before u was drawn (rng_mark; given back if no draw was needed)
    lowered: Optional[dict] = None      # "argmax" of a row whose bias only lowers ids: that bias (if the argmax is
                                        # one of them, the row's chain decides)


def _penalty_window(sampler: Sampler) -> list[int]:
    p = sampler.params
    if p.penalty_last_n == 0 or (p.penalty_repeat == 1.0 and p.penalty_freq == 0.0 and p.penalty_present == 0.0):
        return []
    hist = sampler.history
    if p.penalty_last_n < 0 or p.penalty_last_n >= len(hist):
        return list(hist)
    # the newest penalty_last_n only: the history holds the whole prompt, so copying it all costs O(context) a step
    return list(islice(reversed(hist), p.penalty_last_n))[::-1]


MT19937_STATE_BYTES = 624 * 4 + 4      # numpy's mt19937_state struct: uint32_t key[624], int pos


def rng_mark(rng: np.random.Generator):
    """The generator's position, to give back (rng_restore) a number drawn for nothing. For MT19937 (Sampler's)
    its state struct copied through the address numpy publishes (bit_generator.ctypes.state_address; 2.5 kB, a few
    us): reading and writing `bit_generator.state` as a dict took ~60 + ~120 us per sampled row and step. Other
    bit generators: the state dict."""
    bg = rng.bit_generator
    if type(bg) is np.random.MT19937:
        mark = ctypes.create_string_buffer(MT19937_STATE_BYTES)
        ctypes.memmove(mark, bg.ctypes.state_address, MT19937_STATE_BYTES)
        return mark
    return bg.state


def rng_restore(rng: np.random.Generator, mark) -> None:
    bg = rng.bit_generator
    if isinstance(mark, ctypes.Array):
        ctypes.memmove(bg.ctypes.state_address, mark, MT19937_STATE_BYTES)
    else:
        bg.state = mark


def plan_row(sampler: Sampler, n_vocab: int, max_k: int, max_window: int) -> _Plan:
    """How the backend draws this sampler's next token; a "chain" plan has already taken u from its generator."""
    p = sampler.params
    if tuple(p.samplers) != DEFAULT_SAMPLERS or p.typ_p < 1.0:
        return _Plan("host")
    window = _penalty_window(sampler)
    if len(window) > max_window:
        return _Plan("host")
    bias = sampler.device_bias()
    if bias is None:
        return _Plan("host")
    if p.temp <= 0.0:
        if not window and not bias:
            return _Plan("argmax")
        if not window and all(v <= 0.0 for v in bias.values()):
            # Biases that only lower tokens (ignore_eos, bans): the plain argmax is the answer unless it is one of
            # the lowered ids, since every other logit stays <= its raw value (lower ids < it): one argmax launch
            # for all rows instead of a chain launch per row; the rare row whose argmax is lowered runs the chain.
            return _Plan("argmax", lowered=bias)
        return _Plan("chain", greedy_spec(sampler, window, bias))
    k = min(max(p.top_k, p.min_keep), n_vocab) if p.top_k > 0 else n_vocab
    if not 1 <= k <= max_k:
        return _Plan("host")
    state = rng_mark(sampler.rng)
    u = min(float(np.float32(sampler.rng.random())), _BELOW_ONE)   # what rng.choice in Sampler.sample draws
    return _Plan("chain", RowSample(p.temp, k, p.top_p, p.min_p, p.min_keep, p.penalty_repeat, p.penalty_freq,
                                    p.penalty_present, np.asarray(window, np.int32), bias, u), state)


def greedy_spec(sampler: Sampler, window: list[int], bias: dict[int, float]) -> RowSample:
    """temp <= 0 through the chain: the best biased, penalised logit (top-k 1), no draw."""
    p = sampler.params
    return RowSample(0.0, 1, 1.0, 0.0, 0, p.penalty_repeat, p.penalty_freq, p.penalty_present,
                     np.asarray(window, np.int32), bias, 0.0)


def draw_tokens(be, logits, samplers: Sequence[Optional[Sampler]]) -> list[Optional[int]]:
    """logits [R, N] (backend tensor); samplers [R]: the row's sampler, or None for a row the caller draws itself
    -> the drawn id per row (None for those rows). Nothing is accepted into the samplers."""
    R = len(samplers)
    N = int(logits.shape[-1])
    plans = [None if s is None else plan_row(s, N, be.SAMPLE_MAX_K, be.SAMPLE_MAX_WINDOW) for s in samplers]
    ids = n_left = None
    if any(p is not None and p.kind != "host" for p in plans):
        ids, n_left = be.sample_rows(logits, [p.spec if p is not None and p.kind == "chain" else None for p in plans])
        tripped = [r for r, p in enumerate(plans) if p is not None and p.lowered is not None
                   and p.lowered.get(int(ids[r]), 0.0) < 0.0]
        if tripped:                     # the argmax landed on a lowered id: those rows run their chain
            again, _ = be.sample_rows(logits, [greedy_spec(samplers[r], [], plans[r].lowered) if r in tripped
                                               else None for r in range(R)])
            for r in tripped:
                ids[r] = again[r]
    out: list[Optional[int]] = []
    for r in range(R):
        s, p = samplers[r], plans[r]
        if p is None:
            out.append(None)
        elif p.kind == "host":
            out.append(int(s.sample(be.row_to_host(logits, r))))
        else:
            if p.rng_state is not None and n_left[r] <= 1:
                rng_restore(s.rng, p.rng_state)          # the host chain would not have drawn
            out.append(int(ids[r]))
    return out


class Decoder:
    """Runs the model: `prefill` one sequence's chunk eagerly, `decode` one token for each of several sequences
    (on CUDA through DecodeGraphs). Both return the backend's logits tensor, valid until the next call."""

    def __init__(self, lm, graphs: bool = True, max_graphs: int = 8, hidden: bool = False):
        """hidden: decode_hidden() is used (MTP drafting: the head reads the target's hidden state of plain steps
        too); its graphs then also give that state."""
        self.model, self.be, self.hidden = lm.model, lm.backend, hidden
        self.graphs = self.be.decode_graphs(self.model, max_graphs, hidden) if graphs else None

    def prefill(self, state: SeqState, tokens: Sequence[int], all_logits: bool = False):
        """tokens at state.n_past.. -> logits [1, N] of the last (or [len(tokens), N] of every) token."""
        return self.model.forward(StepBatch.build([(state, list(tokens))], all_logits=all_logits))

    def decode(self, states: Sequence[SeqState], tokens: Sequence[int]):
        """One token per state -> logits [len(states), N]. Pass the states in a stable order (graphs are per list).
        Sequences that follow an image (rope_shift != 0: rotary position != cache row) decode eagerly: a captured
        graph rotates at the cache rows it uploads."""
        return self.decode_hidden(states, tokens)[0]

    def decode_hidden(self, states: Sequence[SeqState], tokens: Sequence[int]):
        """decode -> (logits, h [len(states), D]: the hidden state the MTP head reads; None unless made with
        hidden=True). The logits are decode's to the bit (the same fused head op)."""
        if self.graphs is not None and not any(getattr(s, "rope_shift", 0) for s in states):
            for s in states:
                if s.n_past + 1 > s.n_ctx:
                    raise ValueError(f"sequence needs {s.n_past + 1} positions, its context is {s.n_ctx}")
            try:
                if self.hidden:
                    return self.graphs.step_hidden(states, tokens)
                return self.graphs.step(states, tokens), None
            except (ValueError, MemoryError):
                raise
            except Exception as e:   # a capture the device refuses: nothing ran, the states did not move
                log.warning("decode graphs off (capturing a step failed: %s); decoding eagerly", e)
                self.graphs = None
        batch = StepBatch.build([(s, [int(t)]) for s, t in zip(states, tokens)])
        return self.model.forward_hidden(batch) if self.hidden else (self.model.forward(batch), None)

    @property
    def events(self) -> int:
        """Graph captures and eager steps of graphed lists so far: a step during which they changed is not timed
        (engine/draft_policy.py)."""
        g = self.graphs
        return 0 if g is None else getattr(g, "n_captured", 0) + getattr(g, "n_eager", 0)


    def sync(self) -> None:
        """Wait for the device (timings); nothing to wait for on the host backend."""
        self.be.synchronize()

    def forget(self, state: SeqState) -> None:
        """The caller drops `state`: release the graphs that hold it."""
        if self.graphs is not None:
            self.graphs.forget(state)
