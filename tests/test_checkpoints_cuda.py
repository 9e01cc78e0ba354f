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



def _owner(a: np.ndarray) -> np.ndarray:
    while a.base is not None:
        a = a.base
    return a


def _saved(lm, ops):
    """A state of 32 tokens with a device checkpoint at 25, and its host copy."""
    a = lm.backend.new_state(lm.cfg, 128, "f16")
    _feed(lm, a, list(range(40, 65)))
    ck = ops.snapshot(a, None)
    _feed(lm, a, list(range(65, 72)))
    return a, ck, ops.save_host(a, list(range(40, 72)), None, [ck])


def _assert_host_copy_exact(be, a, ck, host):
    want = be.state_to_host(a)
    host.ready()
    for got, w in zip(host.k + host.v, want["k"] + want["v"]):
        assert got.dtype == np.float16 and got.shape == w.shape
        np.testing.assert_array_equal(got.astype(np.float32), w)
    for got, w in zip(host.conv + host.ssm, want["conv"] + want["ssm"]):
        np.testing.assert_array_equal(got, w)
    (hc,) = host.checkpoints
    for got, t in zip(hc.conv + hc.ssm, ck.conv + ck.ssm):
        np.testing.assert_array_equal(got, be.to_host(t))


def test_host_copy_is_the_device_bytes_in_one_buffer_per_group(lm):
    """save_host's copies go in one batch through a pinned staging block and reach the arrays on a worker thread
    (HostState.ready()): each array then equals the device's bytes read alone; the state's arrays share one host
    buffer and the checkpoint's another (a checkpoint a slot keeps holds only its own); later saves reuse the two
    staging blocks; a checkpoint already on the host is kept as it is."""
    be, ops = lm.backend, state_ops_for(lm.backend)
    a, ck, host = _saved(lm, ops)
    _assert_host_copy_exact(be, a, ck, host)
    own = {id(_owner(x)) for x in host.k + host.v + host.conv + host.ssm}
    ckpt = {id(_owner(x)) for x in host.checkpoints[0].conv + host.checkpoints[0].ssm}
    assert len(own) == 1 and len(ckpt) == 1 and own != ckpt
    b = be.new_state(lm.cfg, 128, "f16")
    ops.load_host(b, host, None)
    staging = set()
    for _ in range(3):
        again = ops.save_host(b, host.tokens, None, host.checkpoints).ready()
        staging |= {blk.ptr for blk in be.host_copies.blocks if blk.ptr}
        assert all(x is y for x, y in zip(again.checkpoints[0].ssm, host.checkpoints[0].ssm))
        for x, y in zip(again.k + again.conv + again.ssm, host.k + host.conv + host.ssm):
            np.testing.assert_array_equal(x, y)
    assert 1 <= len(staging) <= be.host_copies.BLOCKS


def test_host_copy_without_pinned_memory_is_the_same(lm, monkeypatch):
    """Where pinned memory is short (no staging block) the copies go to the host buffers directly: same bytes."""
    monkeypatch.setattr(lm.backend.host_copies, "_staging", lambda k, nbytes: 0)
    a, ck, host = _saved(lm, state_ops_for(lm.backend))
    assert host.filled is None
    _assert_host_copy_exact(lm.backend, a, ck, host)

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
