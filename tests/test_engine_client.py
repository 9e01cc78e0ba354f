"""engine/client.py: the CLIs' one slot of the scheduler, driven on the caller's thread (numpy backend, tiny model).

Expected tokens come from a plain greedy loop over engine/sequence.py, not from the engine itself."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.engine.client import ContextFull, SlotClient
from llamacmp.engine.sequence import Sequence
from llamacmp.engine.tasks import GenParams
from llamacmp.loader import load_model
from llamacmp.run_plan import RunPlan
from llamacmp.sampling import Sampler, SamplingParams

PLAN = RunPlan(64, 1, "f32", "f32", 2048, 512)
PROMPT = [5, 17, 42, 99, 7, 3]


@pytest.fixture(scope="module")
def lm(fixture_gguf):
    return load_model(fixture_gguf("tiny", "f32"), NumpyBackend())


def greedy(lm, prompt: list[int], n: int) -> list[int]:
    s, out = Sequence(lm, 64, kv_type="f32"), []
    logits = s.feed(prompt)
    for _ in range(n):
        x = np.array(logits, np.float32)
        x[list(lm.tokenizer.eog_ids)] = -np.inf
        out.append(int(np.argmax(x)))
        logits = s.feed([out[-1]])
    return out


def params(n: int, **kw) -> GenParams:
    return GenParams(SamplingParams(temp=0, ignore_eos=True), n, **kw)


def test_generate_matches_a_plain_greedy_loop_and_counts_like_llama_cpp(lm):
    c = SlotClient(lm, PLAN)
    c.history = list(PROMPT)
    g = c.generate(params(8))
    assert g.tokens == greedy(lm, PROMPT, 8) and g.stop == "limit"
    assert c.history == PROMPT + g.tokens                 # the last token is pending: decoded with the next input
    assert (c.perf.n_p_eval, c.perf.n_eval, c.perf.n_sample) == (len(PROMPT), 7, 8)
    assert c.perf.t_eval_ms > 0 and c.perf.t_sample_ms > 0


def test_feed_then_generate_continues_the_sequence(lm):
    """llama-completion's turns: the prompt evaluated before input, the user's tokens appended, then a reply."""
    c = SlotClient(lm, PLAN)
    c.feed(PROMPT[:4])
    assert c.engine.slots[0].state.n_past == 4 and c.perf.n_p_eval == 4
    c.feed(PROMPT[4:])
    g = c.generate(params(5))
    assert g.tokens == greedy(lm, PROMPT, 5)
    assert c.perf.n_p_eval == len(PROMPT)                 # nothing evaluated twice


def test_callers_sampler_is_not_fed_the_prompt_and_lives_across_turns(lm):
    own = Sampler(SamplingParams(temp=0, ignore_eos=True), lm.tokenizer.eog_ids)
    c = SlotClient(lm, PLAN)
    c.history = list(PROMPT)
    c.generate(params(3, sampler=own))
    c.generate(params(2, sampler=own))
    assert own.n_accepted == 5 and list(own.history) == c.history[len(PROMPT):]
    fresh = SlotClient(lm, PLAN)                          # without one, each task's chain sees its prompt
    fresh.history = list(PROMPT)
    fresh.generate(params(3))
    assert fresh.engine.slots[0].sampler.n_accepted == len(PROMPT) + 3      # (a released slot keeps its turn)


def test_should_stop_interrupts_between_tokens_and_the_next_turn_resumes(lm):
    c = SlotClient(lm, PLAN)
    c.history = list(PROMPT)
    shown = []
    g = c.generate(params(-1), on_token=shown.append, should_stop=lambda: len(shown) >= 3)
    assert g.stop == "interrupted" and g.tokens == shown == greedy(lm, PROMPT, 3)
    assert c.history == PROMPT + shown and not c.engine.slots[0].busy
    assert c.generate(params(2)).tokens == greedy(lm, PROMPT, 5)[3:]


def test_context_full_stops_as_llama_completion_does(lm):
    """A token is drawn while the sequence has room to decode it and another position after it; the last one is
    shown but never decoded (llama-completion: n_past + 1 >= n_ctx stops)."""
    c = SlotClient(lm, RunPlan(12, 1, "f32", "f32", 2048, 512))
    c.history = list(PROMPT)
    g = c.generate(params(-1))
    assert g.stop == "context" and len(g.tokens) == 12 - len(PROMPT)
    assert c.history == PROMPT + g.tokens[:-1] and c.engine.slots[0].state.n_past == 11
    c.history = list(range(12))
    with pytest.raises(ContextFull, match="n_ctx 12"):
        c.generate(params(1))


def test_no_memory_for_a_checkpoint_costs_the_checkpoint_not_the_turn(lm):
    """The old CLI Session skipped a checkpoint the device had no room for; the scheduler does too (for the server's
    slots as well): the turn completes, only the cache point is missing."""
    c = SlotClient(lm, PLAN)
    ops = c.engine.ops

    class Full:
        def __getattr__(self, name):
            return getattr(ops, name)

        def snapshot(self, state, logits):
            raise MemoryError("no room")
    c.engine.ops = Full()
    c.history = list(PROMPT)
    assert c.generate(params(4)).tokens == greedy(lm, PROMPT, 4)
    assert c.engine.slots[0].cache.checkpoints == []
