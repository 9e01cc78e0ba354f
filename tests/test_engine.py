"""The engine under the server: checkpoints, prompt-cache reuse, continuous batching, cancellation.

Checkpoint arithmetic is tested directly on the numpy backend; the rest over real HTTP, counting evaluated
tokens with `timings.prompt_n` / `cache_n`.
"""
from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.engine.checkpoints import NumpyStateOps
from llamacmp.engine.prompt_cache import HostCache, SlotCache, best_resume, common_prefix
from llamacmp.loader import load_model
from server_harness import LiveServer, write_tiny_model

CPENT = 32


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


@pytest.fixture(scope="module")
def lm(model):
    return load_model(model, NumpyBackend())


@pytest.fixture(scope="module")
def srv(model):
    with LiveServer(model, "-c", "8192", "-np", "4", "-n", "12", "-cpent", str(CPENT), "--metrics") as s:
        yield s


# -- checkpoints -----------------------------------------------------------------------------------------------------

def _feed(lm, state, toks):
    return lm.backend.to_host(lm.model.forward(StepBatch.build([(state, toks)])))[-1]


def test_restore_checkpoint_equals_fresh_prefill(lm):
    ops = NumpyStateOps()
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 256, 40)]
    fresh = lm.backend.new_state(lm.cfg, 128)
    _feed(lm, fresh, prompt[:25])                     # the same chunking, so the arithmetic is identical
    want = _feed(lm, fresh, prompt[25:])

    state = lm.backend.new_state(lm.cfg, 128)
    _feed(lm, state, prompt[:25])
    ckpt = ops.snapshot(state, None)
    _feed(lm, state, [7, 8, 9, 10, 11])               # a different continuation moves the state on
    ops.restore(state, ckpt)
    assert state.n_past == 25
    got = _feed(lm, state, prompt[25:])
    np.testing.assert_array_equal(got, want)
    whole = _feed(lm, lm.backend.new_state(lm.cfg, 128), prompt)
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-5)   # one 40-token chunk: same up to rounding


def test_host_state_moves_between_states(lm):
    ops = NumpyStateOps()
    prompt = list(range(30, 60))
    a = lm.backend.new_state(lm.cfg, 128)
    _feed(lm, a, prompt[:20])
    host = ops.save_host(a, prompt[:20], None, [])
    b = lm.backend.new_state(lm.cfg, 128)
    ops.load_host(b, host, None)
    np.testing.assert_array_equal(_feed(lm, b, prompt[20:]), _feed(lm, a, prompt[20:]))


def test_best_resume_rules():
    class C:  # a checkpoint stand-in: only pos and logits matter to the planner
        def __init__(self, pos, logits=None):
            self.pos, self.logits = pos, logits
    held = list(range(100))
    cks = [C(10), C(40), C(70)]
    assert common_prefix(held, held[:50] + [999]) == 50
    assert best_resume(held, cks, None, held[:50] + [999]).pos == 40       # newest checkpoint <= common prefix
    assert best_resume(held, cks, None, held + [5]).pos == 100             # the live state itself
    assert best_resume(held, cks, None, held).pos == 70                    # one token must be re-evaluated ...
    assert best_resume(held, cks, np.zeros(3), held).pos == 100            # ... unless its logits are kept
    assert best_resume(held, cks, None, [999] + held).pos == 0


def test_slot_cache_limit_and_host_cache_lru():
    cache = SlotCache(max_checkpoints=2)
    for pos in (10, 20, 30):
        cache.add_checkpoint(type("C", (), {"pos": pos, "logits": None, "nbytes": 0})())
    assert [c.pos for c in cache.checkpoints] == [20, 30]
    assert HostCache(0).enabled is False and HostCache(-1).enabled is True


# -- continuous batching ---------------------------------------------------------------------------------------------------

PROMPTS = ["The quick brown fox", "def main():\n    print", "recurrent state updates with", "Numbers 0123",
           "the server streams every answer", "weights are quantized into blocks"]


def _stream(url: str, prompt: str, n: int = 24) -> list[int]:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "stream": True, "cache_prompt": False}
    toks = []
    with httpx.stream("POST", url + "/completion", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                toks += json.loads(line[6:])["tokens"]
    return toks


def test_concurrent_greedy_streams_equal_alone(srv):
    alone = [_stream(srv.url, p) for p in PROMPTS]
    results: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i, p=p: results.__setitem__(i, _stream(srv.url, p)))
               for i, p in enumerate(PROMPTS)]               # 6 requests on 4 slots: two wait for a free slot
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(PROMPTS))] == alone
    metrics = httpx.get(srv.url + "/metrics").text
    per_decode = float(next(line.split()[1] for line in metrics.splitlines()
                            if line.startswith("llamacpp:n_busy_slots_per_decode")))
    assert per_decode > 1.0                                 # the streams really shared forward passes


# -- prompt cache across turns ------------------------------------------------------------------------------------------------

def _chat(url: str, messages: list[dict], slot: int) -> dict:
    return httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 12, "temperature": 0,
                                                          "id_slot": slot}, timeout=120).json()


def _n_tokens(url: str, messages: list[dict], gen: bool = True) -> int:
    prompt = httpx.post(url + "/apply-template", json={"messages": messages, "add_generation_prompt": gen}).json()
    return len(httpx.post(url + "/tokenize", json={"content": prompt["prompt"]}).json()["tokens"])


def _reply(r: dict) -> dict:
    m = r["choices"][0]["message"]
    return {"role": "assistant", "content": m["content"] or "", "reasoning_content": m.get("reasoning_content", "")}


def test_three_turn_chat_and_history_edit_reprefill_only_the_suffix(srv):
    """Turn k+1 re-evaluates only what follows turn k's reply start (the checkpoint taken where the history
    ended); an agent that edits its last message resumes from the newest checkpoint before the edit."""
    url, slot = srv.url, 3
    httpx.post(url + "/slots/3?action=erase", json={})
    sys_msg = {"role": "system", "content": "You are a helpful assistant. " * 8}
    msgs = [sys_msg, {"role": "user", "content": "Tell me about the quick brown fox."}]
    figures = []
    for turn, question in enumerate(["And the lazy dog?", "What about the forest?", None]):
        r = _chat(url, msgs, slot)
        t, usage = r["timings"], r["usage"]
        assert t["prompt_n"] + t["cache_n"] == usage["prompt_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == t["cache_n"]
        if turn > 0:
            history = _n_tokens(url, prev, gen=False)      # the previous turn's prompt up to its reply
            # the whole history up to the previous reply is reused ...
            assert t["cache_n"] >= history - CPENT and t["cache_n"] > 0
            # ... so only the re-rendered previous reply + the new user message + generation prompt are evaluated
            assert t["prompt_n"] < usage["prompt_tokens"] - history + CPENT
        figures.append((usage["prompt_tokens"], t["cache_n"], t["prompt_n"]))
        if question is not None:
            prev, msgs = msgs, msgs + [_reply(r), {"role": "user", "content": question}]
    # agent-style edit: rewrite the last user message; the shared prefix ends inside it
    edited = msgs[:-1] + [{"role": "user", "content": "What about the forest? Answer briefly, please."}]
    r = _chat(url, edited, slot)
    t = r["timings"]
    figures.append(("edit", r["usage"]["prompt_tokens"], t["cache_n"], t["prompt_n"]))
    shared = _n_tokens(url, prev, gen=False)
    assert t["cache_n"] >= shared - CPENT and t["prompt_n"] <= r["usage"]["prompt_tokens"] - shared + CPENT
    # an agent that truncates history back to turn 1 resumes from a checkpoint inside that history
    truncated = msgs[:2]
    r = _chat(url, truncated, slot)
    assert r["timings"]["cache_n"] >= _n_tokens(url, msgs[:2], gen=False) - CPENT
    figures.append(("truncate", r["usage"]["prompt_tokens"], r["timings"]["cache_n"], r["timings"]["prompt_n"]))
    print("prompt-cache figures (prompt_tokens, cache_n, prompt_n):", figures)


def test_host_ram_cache_restores_an_evicted_conversation(model):
    with LiveServer(model, "-c", "2048", "-np", "1", "-n", "4") as s:
        a = {"prompt": "The quick brown fox jumps over the lazy dog. " * 4, "temperature": 0}
        b = {"prompt": "def main():\n    print('hello, world')\n    return 0\n" * 3, "temperature": 0}
        httpx.post(s.url + "/completion", json=a, timeout=60)
        httpx.post(s.url + "/completion", json=b, timeout=60)      # evicts a's state from the only slot
        again = httpx.post(s.url + "/completion", json={**a, "prompt": a["prompt"] + "Again"}, timeout=60).json()
        assert again["timings"]["cache_n"] >= again["tokens_evaluated"] - 8


# -- cancellation ---------------------------------------------------------------------------------------------------------------

def _busy(url: str) -> list[bool]:
    return [s["is_processing"] for s in httpx.get(url + "/slots").json()]


def _wait_idle(url: str, timeout: float = 5.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(_busy(url)):
            return True
        time.sleep(0.05)
    return False


def test_disconnect_frees_the_slot(srv):
    assert _wait_idle(srv.url)
    body = {"prompt": "The quick brown fox", "n_predict": 100000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", srv.url + "/completion", json=body, timeout=60) as r:
        n = 0
        for line in r.iter_lines():
            n += line.startswith("data: ")
            if n == 3:
                assert any(_busy(srv.url))
                break                                    # leaving the block closes the connection
    assert _wait_idle(srv.url), "a disconnected stream kept its slot"
    # same for a non-streamed request whose client gives up
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/completion", json={**body, "stream": False}, timeout=0.5)
    assert _wait_idle(srv.url), "an abandoned request kept its slot"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/completion"])   # routes that take ignore_eos
def test_non_streamed_client_gone_is_handled_without_a_traceback(srv, path, caplog):
    """A non-streamed request whose client goes away: its task is cancelled, one log line, no IndexError on the
    empty result list (chat_api._merged_usage / results[0] before)."""
    assert _wait_idle(srv.url)
    caplog.set_level(logging.INFO, logger="llamacmp")
    body = {"messages": [{"role": "user", "content": "Tell me a long story"}], "prompt": "The quick brown fox",
            "max_tokens": 100000, "n_predict": 100000, "ignore_eos": True, "n": 1}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + path, json=body, timeout=0.7)
    assert _wait_idle(srv.url), "an abandoned request kept its slot"
    deadline = time.time() + 5
    while not any("client disconnected" in r.getMessage() for r in caplog.records):
        assert time.time() < deadline, "the disconnect was not handled"
        time.sleep(0.05)
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


def test_disconnect_while_queued_frees_the_queue(srv):
    """A streaming request still waiting for a slot is dropped as soon as its client goes."""
    assert _wait_idle(srv.url)
    body = {"prompt": "The quick brown fox", "n_predict": 100000, "ignore_eos": True, "stream": True}
    streams = [httpx.stream("POST", srv.url + "/completion", json=body, timeout=60) for _ in range(4)]
    try:
        for s in streams:
            s.__enter__()                                  # headers arrive with the first token: slot taken
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/completion", json=body, timeout=1.0)   # queued, then abandoned
        deadline = time.time() + 5
        while "llamacpp:requests_deferred 0" not in httpx.get(srv.url + "/metrics").text:
            assert time.time() < deadline, "the abandoned request stayed queued"
            time.sleep(0.05)
        assert all(_busy(srv.url))
    finally:
        for s in streams:
            s.__exit__(None, None, None)
    assert _wait_idle(srv.url)


def test_host_cache_entry_survives_saving_the_slot_it_replaces(lm):
    """Restoring from -cram saves the slot's current history first; that save may evict entries, so the entry
    being restored is taken out before (found by benchmarks/server_stress.py with a small -cram)."""
    import queue as q_
    from llamacmp.engine.scheduler import Engine, EngineConfig
    from llamacmp.engine.tasks import CompletionTask, FinalResult, GenParams
    from llamacmp.sampling import SamplingParams
    engine = Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=512))
    engine.start()

    def run(prompt):
        out: q_.Queue = q_.Queue()
        engine.submit(CompletionTask(prompt, GenParams(SamplingParams(temp=0), n_predict=2), out.put))
        while True:
            r = out.get(timeout=60)
            if not hasattr(r, "text") or isinstance(r, FinalResult):
                return r
    try:
        a, b = list(range(10, 60)), list(range(100, 150))
        run(a)
        run(b)                                            # a's history goes to the host cache
        (entry,) = engine.host_cache.entries.values()
        engine.host_cache.limit = entry.nbytes + 16       # room for one entry only
        r = run(a + [7])                                  # restores a, saving b first (which evicts a)
        assert isinstance(r, FinalResult) and r.timings.cache_n >= len(a)
    finally:
        engine.stop()


def test_agent_turn_rollback_copies_nothing_to_the_host(lm):
    """An agent's next turn re-sends prompt + reply whose last tokens differ (a re-rendered template): the slot rolls
    back to a checkpoint in the shared prefix and evaluates only the rest, and does not copy the whole context and
    every checkpoint to the host-RAM cache on the way (that copy grew with the context: 0.48 s a turn at 3K tokens,
    1.28 s at 7.5K on the H200; benchmarks/agent_turns.py)."""
    import queue as q_
    from llamacmp.engine.scheduler import Engine, EngineConfig
    from llamacmp.engine.tasks import CompletionTask, FinalResult, GenParams
    from llamacmp.sampling import SamplingParams
    engine = Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=2048))
    saves = []
    save_host = engine.ops.save_host
    engine.ops.save_host = lambda *a: saves.append(a) or save_host(*a)
    engine.start()

    def run(prompt):
        out: q_.Queue = q_.Queue()
        params = GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=12)
        engine.submit(CompletionTask(prompt, params, out.put))
        while not isinstance(r := out.get(timeout=60), FinalResult):
            pass
        return r
    try:
        prompt = list(range(10, 300))
        for turn in range(4):
            r = run(prompt)
            if turn:
                assert r.timings.cache_n >= len(prompt) - 12 - 16 - 4, "did not resume from a checkpoint"
                assert r.timings.prompt_n <= 12 + 16 + 4
            prompt = prompt + list(r.tokens)[:-2] + list(range(400 + 16 * turn, 416 + 16 * turn))
        assert saves == [], f"{len(saves)} whole-context copies to the host cache on the rollback path"
        run(list(range(300, 500)))                     # another conversation: the old one is kept in host RAM
        assert len(saves) == 1
    finally:
        engine.stop()


def test_results_held_until_flush_all_go_out(lm):
    """A sink that holds its results until the engine's flush (as the server's bridge does) gets every one of them:
    the engine flushes after each forward it launches and when it runs out of work, so nothing is left behind
    (a stream's last token and its final result included), and the tokens equal the direct sink's."""
    from llamacmp.engine.scheduler import Engine, EngineConfig
    from llamacmp.engine.tasks import CompletionTask, FinalResult, GenParams
    from llamacmp.sampling import SamplingParams
    engine = Engine(lm, EngineConfig(n_slots=3, n_ctx_slot=128))
    held, out, lock, n_flush = [], [], threading.Lock(), [0]

    def flush():
        with lock:
            out.extend(held)
            held.clear()
        n_flush[0] += 1
    engine.on_results_flush(flush)
    engine.start()
    try:
        prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [17] * 9, [3, 4]]       # four requests on three slots
        for i, p in enumerate(prompts):
            def sink(r, i=i):
                with lock:
                    held.append((i, r))
            engine.submit(CompletionTask(p, GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=4 + i,
                                                      cache_prompt=False, stream=True), sink))
        deadline = time.time() + 60
        while time.time() < deadline:
            with lock:
                if sum(isinstance(r, FinalResult) for _, r in out) == len(prompts):
                    break
            time.sleep(0.02)
        with lock:
            finals = {i: r for i, r in out if isinstance(r, FinalResult)}
            assert sorted(finals) == [0, 1, 2, 3] and not held
            for i, r in finals.items():         # every streamed token reached the sink, in order
                streamed = [t for j, x in out if j == i and not isinstance(x, FinalResult) for t in x.tokens]
                assert streamed == r.tokens and len(r.tokens) == 4 + i
        assert n_flush[0] >= engine.metrics.n_decode_total
    finally:
        engine.stop()
    direct = []
    for i, p in enumerate(prompts):            # the same requests, alone, with a direct sink
        done = threading.Event()
        engine2 = Engine(lm, EngineConfig(n_slots=1, n_ctx_slot=128))
        engine2.start()
        try:
            engine2.submit(CompletionTask(p, GenParams(SamplingParams(temp=0, ignore_eos=True), n_predict=4 + i,
                                                       cache_prompt=False),
                                          lambda r: (direct.append(r.tokens), done.set())
                                          if isinstance(r, FinalResult) else None))
            assert done.wait(60)
        finally:
            engine2.stop()
    assert [finals[i].tokens for i in range(4)] == direct
