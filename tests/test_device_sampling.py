"""The decode path's sampling (engine/decode.py + Backend.sample_rows) against the host reference chain.

NumpyBackend.sample_rows runs cuda_src/sampling.cu's algorithm in float32 (numpy_ref.sample_row_f32); the engine
draws every row through it (on CUDA through the kernel). Seeded streams must give the very tokens
llamacmp/sampling.py's Sampler gives, including its use of the generator (no number drawn when one candidate is
left), for every setting the device chain takes.
"""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.backends.base import RowSample
from llamacmp.backends.numpy_ref import NumpyBackend, sample_row_f32
from llamacmp.engine.decode import draw_tokens, plan_row, rng_mark, rng_restore
from llamacmp.sampling import Sampler, SamplingParams

SETTINGS = [
    dict(),                                                         # llama.cpp's defaults
    dict(temp=1.0, top_k=0 + 5, top_p=1.0, min_p=0.0),
    dict(temp=0.7, top_k=200, top_p=0.9, min_p=0.02, min_keep=3),
    dict(temp=1.3, top_k=1024, top_p=0.5, min_p=0.0),
    dict(temp=0.9, top_k=40, min_p=0.6),                            # often one candidate: no draw
    dict(temp=0.8, penalty_repeat=1.3, penalty_freq=0.4, penalty_present=0.2, penalty_last_n=16),
    dict(temp=0.8, penalty_repeat=1.1, penalty_last_n=-1, logit_bias={3: 5.0, 7: -np.inf}),
    dict(temp=0.0),                                                 # greedy: argmax on the backend
    dict(temp=0.0, penalty_repeat=1.5, penalty_last_n=8, logit_bias={1: 2.0}),   # greedy through the chain, k=1
    dict(temp=0.6, ignore_eos=True),
    dict(temp=0.0, ignore_eos=True),                                # greedy, lowered ids: argmax with a guard
    dict(temp=0.0, logit_bias={2: -1.5, 5: -np.inf, 6: 0.0}),
]


def _logits(rng, n_vocab: int) -> np.ndarray:
    x = rng.normal(0, 2.5, n_vocab).astype(np.float32)
    x[rng.integers(0, n_vocab, 4)] = x.max()                     # ties at the top: the lower id goes first
    return x


@pytest.mark.parametrize("n_vocab", [1, 2, 97, 1025, 4099])
@pytest.mark.parametrize("setting", range(len(SETTINGS)))
def test_seeded_stream_equals_host_sampler(setting, n_vocab):
    kw = SETTINGS[setting]
    if n_vocab < 8 and "logit_bias" in kw:
        kw = {k: v for k, v in kw.items() if k != "logit_bias"}
    params = SamplingParams(seed=1234 + setting, **kw)
    eog = frozenset({0, n_vocab - 1}) if n_vocab > 2 else frozenset()   # never every token an EOG
    host, dev = Sampler(params, eog), Sampler(params, eog)
    rng = np.random.default_rng(n_vocab * 31 + setting)
    be = NumpyBackend()
    for t in rng.integers(0, n_vocab, 12):                          # a prompt in the penalty window
        host.accept(int(t))
        dev.accept(int(t))
    for step in range(40):
        x = _logits(rng, n_vocab)
        want = host.sample(x)
        got = draw_tokens(be, x[None], [dev])[0]
        assert got == want, f"step {step}: device chain {got}, host chain {want}"
        host.accept(want)
        dev.accept(got)
    # the generators are in the same place: both streams used the same numbers
    assert host.rng.random() == dev.rng.random()


def test_rows_keep_their_own_settings_in_one_call():
    rng = np.random.default_rng(5)
    be = NumpyBackend()
    N = 300
    x = np.stack([_logits(rng, N) for _ in range(len(SETTINGS))])
    host = [Sampler(SamplingParams(seed=i, **kw)) for i, kw in enumerate(SETTINGS)]
    dev = [Sampler(SamplingParams(seed=i, **kw)) for i, kw in enumerate(SETTINGS)]
    for _ in range(10):
        want = [s.sample(x[i]) for i, s in enumerate(host)]
        # one row left to its caller (None): the others must not shift
        got = draw_tokens(be, x, dev[:3] + [None] + dev[4:])
        assert got[3] is None
        assert [g for i, g in enumerate(got) if i != 3] == [w for i, w in enumerate(want) if i != 3]
        for i in range(len(SETTINGS)):
            if i != 3:
                host[i].accept(want[i])
                dev[i].accept(got[i])
        x = x[::-1].copy()


def test_plan_routes_rows():
    N = 5000
    def plan(**kw):
        return plan_row(Sampler(SamplingParams(seed=1, **kw)), N, 1024, 4096)
    assert plan(temp=0).kind == "argmax"
    greedy_pen = plan(temp=0, penalty_present=0.5)
    assert greedy_pen.kind == "argmax"                  # penalties with an empty history change nothing
    assert plan(temp=0, logit_bias={5: 1.0}).spec.top_k == 1
    assert plan().kind == "chain" and plan().spec.top_k == 40 and 0 <= plan().spec.u < 1
    assert plan(top_k=0).kind == "host"                 # the whole vocabulary: more than the device keeps
    assert plan(top_k=2000).kind == "host"
    assert plan(typ_p=0.5).kind == "host"
    assert plan(samplers=("top_k", "temperature")).kind == "host"
    s = Sampler(SamplingParams(seed=1, penalty_repeat=1.1, penalty_last_n=-1))
    for t in range(5000):
        s.accept(t)
    assert plan_row(s, N, 1024, 4096).kind == "host"    # a penalty window longer than the device takes


def test_guarded_argmax_falls_back_to_the_chain():
    """Greedy rows whose biases only lower tokens take one argmax for all rows; where the argmax is a lowered id
    (here the EOG of an ignore_eos row, or a banned id tied at the top) the row's chain picks the answer."""
    N = 64
    eog = frozenset({7})
    assert plan_row(Sampler(SamplingParams(temp=0, ignore_eos=True), eog), N, 1024, 4096).lowered == {7: -np.inf}
    assert plan_row(Sampler(SamplingParams(temp=0, logit_bias={3: 0.5, 4: -1.0})), N, 1024, 4096).kind == "chain"
    x = np.zeros((4, N), np.float32)
    x[:, 7], x[:, 9], x[:, 11] = 5.0, 4.0, 4.0       # the EOG first, then a tie: the lower id wins
    x[2, 7] = 1.0                                     # row 2: the argmax is not lowered
    x[3, 3] = 9.0                                     # row 3: a banned id is the argmax, then the EOG (not banned)
    rows = [Sampler(SamplingParams(temp=0, ignore_eos=True), eog), Sampler(SamplingParams(temp=0), eog),
            Sampler(SamplingParams(temp=0, ignore_eos=True), eog),
            Sampler(SamplingParams(temp=0, logit_bias={3: -8.5}), eog)]
    want = [int(s.sample(x[i])) for i, s in enumerate(rows)]
    assert want == [9, 7, 9, 7]
    assert draw_tokens(NumpyBackend(), x, rows) == want


def test_rng_mark_gives_back_draws():
    """rng_mark / rng_restore (MT19937: numpy's state struct copied by address) give drawn numbers back exactly,
    also across the 624-word regeneration, and the struct is the state numpy reports (key, pos)."""
    rng = np.random.Generator(np.random.MT19937(7))
    rng.random()
    st = rng.bit_generator.state["state"]
    mark = rng_mark(rng)
    assert bytes(mark) == st["key"].astype(np.uint32).tobytes() + np.int32(st["pos"]).tobytes()
    first = [rng.random() for _ in range(700)]
    rng_restore(rng, mark)
    assert [rng.random() for _ in range(700)] == first
    pcg = np.random.Generator(np.random.PCG64(3))         # another bit generator: through the state dict
    mark = rng_mark(pcg)
    x = pcg.random()
    rng_restore(pcg, mark)
    assert pcg.random() == x


def test_f32_chain_edges():
    x = np.array([1.0, np.nan, 3.0, 3.0, -np.inf], np.float32)
    spec = RowSample(1.0, 5, 1.0, 0.0, 0, 1.0, 0.0, 0.0, np.zeros(0, np.int32), {}, 0.0)
    assert sample_row_f32(x, spec) == (2, 5)            # u = 0: the first candidate; NaN counted as -inf
    spec.u = float(np.nextafter(np.float32(1), np.float32(0)))
    tok, n = sample_row_f32(x, spec)
    assert (tok, n) == (0, 5)                           # the last candidate with any mass (-inf weighs 0)
    spec.temp = 0.0
    assert sample_row_f32(x, spec) == (2, 1)            # greedy: the lower id among the tied best


class _NoBreakers:
    """A vocabulary of empty token texts: DRY without sequence breakers."""
    def __init__(self, n: int):
        self.n_vocab = n

    def token_to_piece(self, t: int, special: bool = True) -> bytes:
        return b""

    def encode(self, text: str, parse_special: bool = False, add_special: bool = False) -> list[int]:
        return []


@pytest.mark.parametrize("kw", [dict(temp=0.9, top_k=8), dict(temp=0.0), dict(temp=0.0, logit_bias={1: 3.0}),
                                dict(temp=0.7, top_k=20, top_p=0.9, ignore_eos=True)])
def test_dry_alone_draws_on_the_device_chain(kw):
    """DRY with the penalties off joins the logit bias (Sampler.device_bias): no row crosses to the host, and the
    stream is the host chain's; with a penalty on, or another extra sampler, the row goes to the host."""
    from llamacmp.sampling import SamplerVocab
    n = 64
    vocab = SamplerVocab(_NoBreakers(n), 4096)
    params = SamplingParams(seed=7, dry_multiplier=1.5, dry_allowed_length=1, **kw)
    host, dev = Sampler(params, frozenset({0}), vocab=vocab), Sampler(params, frozenset({0}), vocab=vocab)
    rng = np.random.default_rng(11)
    be = NumpyBackend()
    for t in [5, 6, 7, 5, 6, 7, 5, 6]:
        host.accept(t)
        dev.accept(t)
    penalised = 0
    for step in range(60):
        x = _logits(rng, n)
        x[5:9] += 4.0                                                # the repeated tokens would win without DRY
        mark = rng_mark(dev.rng)
        assert plan_row(dev, n, be.SAMPLE_MAX_K, be.SAMPLE_MAX_WINDOW).kind != "host"
        rng_restore(dev.rng, mark)                                   # (a chain plan takes its number)
        penalised += bool(dev._dry_penalties(list(dev.history)))
        want = host.sample(x)
        got = draw_tokens(be, x[None], [dev])[0]
        assert got == want, f"step {step}: device chain {got}, host chain {want}"
        host.accept(want)
        dev.accept(got)
    assert penalised > 30
    for other in (dict(penalty_repeat=1.1), dict(top_n_sigma=1.0)):
        s = Sampler(SamplingParams(dry_multiplier=1.5, **other), vocab=vocab)
        assert plan_row(s, n, be.SAMPLE_MAX_K, be.SAMPLE_MAX_WINDOW).kind == "host"
