"""Prompt-cache state ops and the engine on the CUDA backend: device checkpoints restore exactly, host-RAM copies
move between sequences, concurrent greedy streams equal each run alone, a follow-up turn re-prefills only its
suffix."""
from __future__ import annotations

import queue

import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.backends.cuda_state import CudaStateOps
from llamacmp.engine.checkpoints import state_ops_for
from llamacmp.engine.scheduler import Engine, EngineConfig
from llamacmp.engine.tasks import CompletionTask, ErrorResult, FinalResult, GenParams
from llamacmp.loader import load_model
from llamacmp.sampling import SamplingParams

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def lm(fixture_gguf, cuda_backend):
    return load_model(fixture_gguf("tiny", "q8_0"), cuda_backend)


def _feed(lm, state, toks):
    return lm.backend.to_host(lm.model.forward(StepBatch.build([(state, toks)])))[-1]


def test_state_ops_are_cuda_ops(lm):
    assert isinstance(state_ops_for(lm.backend), CudaStateOps)


def test_device_checkpoint_restores_exactly(lm):
    ops = state_ops_for(lm.backend)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, 256, 48)]
    fresh = lm.backend.new_state(lm.cfg, 128, "f16")
    _feed(lm, fresh, prompt[:30])
    want = _feed(lm, fresh, prompt[30:])
    st = lm.backend.new_state(lm.cfg, 128, "f16")
    _feed(lm, st, prompt[:30])
    ckpt = ops.snapshot(st, None)
    _feed(lm, st, [5, 6, 7, 8])
    ops.restore(st, ckpt)
    np.testing.assert_allclose(_feed(lm, st, prompt[30:]), want, rtol=0, atol=1e-6)


def test_host_copy_moves_between_states(lm):
    ops = state_ops_for(lm.backend)
    prompt = list(range(40, 80))
    a = lm.backend.new_state(lm.cfg, 128, "f16")
    _feed(lm, a, prompt[:25])
    ck = ops.snapshot(a, None)
    _feed(lm, a, prompt[25:32])
    host = ops.save_host(a, prompt[:32], None, [ck])
    b = lm.backend.new_state(lm.cfg, 128, "f16")
    ops.load_host(b, host, host.checkpoints[0])          # back to position 25 through a host checkpoint
    assert b.n_past == 25
    c = lm.backend.new_state(lm.cfg, 128, "f16")
    _feed(lm, c, prompt[:25])
    np.testing.assert_allclose(_feed(lm, b, prompt[25:]), _feed(lm, c, prompt[25:]), rtol=0, atol=1e-6)


def _run(engine, prompt, n=16):
    q: queue.Queue = queue.Queue()
    engine.submit(CompletionTask(list(prompt), GenParams(SamplingParams(temp=0), n_predict=n), q.put))
    return q


def _final(q):
    while True:
        r = q.get(timeout=120)
        if isinstance(r, (FinalResult, ErrorResult)):
            assert isinstance(r, FinalResult), r
            return r


def test_engine_on_cuda(lm):
    engine = Engine(lm, EngineConfig(n_slots=4, n_ctx_slot=512, checkpoint_every=32))
    engine.start()
    try:
        prompts = [[int(t) for t in np.random.default_rng(i).integers(0, 256, 20 + 7 * i)] for i in range(6)]
        alone = [_final(_run(engine, p)).tokens for p in prompts]
        together = [_final(q) for q in [_run(engine, p) for p in prompts]]
        assert [r.tokens for r in together] == alone
        first = together[0]
        follow = prompts[0] + first.tokens + [11, 12, 13]
        r = _final(_run(engine, follow))
        assert r.timings.cache_n >= len(prompts[0]) + len(first.tokens) - 1 - 32
        assert r.timings.prompt_n == len(follow) - r.timings.cache_n
    finally:
        engine.stop()
