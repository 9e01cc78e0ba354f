"""MTP speculative decoding on the CUDA backend against the numpy reference: the rewind kernels (conv and gdn with
per-token states kept on the device), concat, the head's forward, and greedy output with MTP on == off."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cuda_helpers import rel, up
from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model
from test_mtp import PROMPTS, _greedy

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def lms(tmp_path_factory, tiny_vocab, cuda_backend):
    made = {}

    def get(shape="tiny"):
        if shape not in made:
            path = write_model(tmp_path_factory.mktemp("mtpc") / f"{shape}.gguf", replace(SHAPES[shape], mtp=True),
                               "q8_0", tiny_vocab)
            made[shape] = (load_model(path, NumpyBackend()), load_model(path, cuda_backend))
        return made[shape]
    return get


@pytest.mark.parametrize("axis", [0, 1])
def test_concat(cuda_backend, axis):
    rng = np.random.default_rng(axis)
    shapes = [(3, 64), (3, 32), (3, 1)] if axis else [(1, 40), (5, 40), (2, 40)]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = cuda_backend.to_host(cuda_backend.concat([up(cuda_backend, x) for x in xs], axis))
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))


@pytest.mark.parametrize("shape", ["tiny", "small"])
@pytest.mark.parametrize("L,k", [(1, 1), (4, 1), (4, 3), (4, 4), (5, 2)])
def test_keep_steps_and_restore_equal_numpy(lms, shape, L, k):
    """A keep_steps batch on both backends, then restore_steps(k): conv and ssm states equal the reference's, and
    equal (bit for bit on CUDA) feeding only the first k tokens one at a time through the decode path."""
    ref, dev = lms(shape)
    prompt, more = [3, 14, 15, 92, 6], [65, 35, 89, 79, 32][:L]
    states = []
    for lm in (ref, dev):
        st = lm.backend.new_state(lm.cfg, 32)
        lm.model.forward(StepBatch.build([(st, prompt)]))
        b = StepBatch.build([(st, more)], all_logits=True)
        b.keep_steps = True
        lm.model.forward(b)
        lm.backend.restore_steps(st, k)
        st.n_past = len(prompt) + k
        states.append(lm.backend.state_to_host(st))
    alone = dev.backend.new_state(dev.cfg, 32)
    dev.model.forward(StepBatch.build([(alone, prompt)]))
    for t in more[:k]:
        dev.model.forward(StepBatch.build([(alone, [t])]))
    alone = dev.backend.state_to_host(alone)
    for name in ("conv", "ssm"):
        for a, b, c in zip(states[0][name], states[1][name], alone[name]):
            assert rel(b, a) < 1e-4, name
            np.testing.assert_array_equal(b, c)


def test_mtp_forward_equals_numpy(lms):
    ref, dev = lms("small")
    toks = [5, 9, 200, 31, 77]
    h = np.random.default_rng(3).standard_normal((len(toks), ref.cfg.n_embd)).astype(np.float32)
    out = []
    for lm in (ref, dev):
        st = lm.model.mtp_state(16)
        logits, h_out = lm.model.mtp_forward(StepBatch.build([(st, toks)], all_logits=True),
                                             lm.backend.upload_vector(h))
        out.append((lm.backend.to_host(logits), lm.backend.to_host(h_out)))
    assert rel(out[1][0], out[0][0]) < 2e-2 and rel(out[1][1], out[0][1]) < 2e-2


@pytest.mark.parametrize("n_max", [1, 2, 3, 4])
def test_greedy_mtp_on_equals_off_cuda(lms, n_max):
    """Token for token on the CUDA backend, with the real head and with oracle drafts (long accepted runs,
    rejections mid-batch rewound on the device)."""
    _, dev = lms("small")
    for seed, prompt in enumerate(PROMPTS):
        off, _ = _greedy(dev, prompt, 40)
        on, _ = _greedy(dev, prompt, 40, n_max)
        assert on == off, prompt
        on, c = _greedy(dev, prompt, 40, n_max, [dev.tokenizer.encode(prompt) + off], seed)
        assert on == off, prompt
        assert c.engine.spec.n_accepted > 0
