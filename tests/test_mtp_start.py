"""From a request's arrival to its first token with MTP on (issue 19: 4 concurrent streams' start took 35-45 ms more
than MTP off on the H200), on the numpy reference with the tiny MTP fixture: the head's part of the prompt and the
lone graphs run at the prompt's end and only for a request alone (Speculator.prompt_end); requests arriving
together leave both to their rounds, whose first catch-up runs every prompt's pairs in one forward. Greedy output
equals MTP off either way. The -v 'start timeline' line says where each request's time went."""
from __future__ import annotations

import logging

from llamacmp.engine.scheduler import Engine, EngineConfig
from llamacmp.engine.speculative import Speculator
from llamacmp.engine.tasks import CompletionTask, FinalResult, GenParams
from llamacmp.sampling import SamplingParams
from llamacmp.spec import SpecConfig

from test_mtp import PROMPTS, EagerSpecGraphs, ScriptedPolicy, _engine_run, lm, mtp_path  # noqa: F401

PARAMS = GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=16)


def _watched(lm, monkeypatch, n_slots: int, n_ubatch: int = 512):
    """An engine (MTP on, eager graphs, plain and drafting rounds in turn) -> (it, a list of what ran, in order:
    ('target', rows) target forwards, ('head', rows) MTP forwards and fills, ('prepare',) graph preparations,
    ('first', task) first tokens, {task id: tokens})."""
    ev, got = [], {}
    fwd = lm.model.forward_hidden
    monkeypatch.setattr(lm.model, "forward_hidden",
                        lambda batch, *a, **k: ev.append(("target", len(batch.tokens))) or fwd(batch, *a, **k))
    for name in ("mtp_forward", "mtp_fill"):
        head = getattr(lm.model, name)
        monkeypatch.setattr(lm.model, name, lambda batch, *a, head=head, **k: ev.append(("head", len(batch.tokens)))
                            or head(batch, *a, **k))

    class Graphs(EagerSpecGraphs):
        def prepare(self, *a, **k):
            ev.append(("prepare",))
            super().prepare(*a, **k)
    engine = Engine(lm, EngineConfig(n_slots=n_slots, n_ctx_slot=128, n_ubatch=n_ubatch,
                                     spec=SpecConfig(type="draft-mtp", n_max=3)))
    engine.spec.graphs = Graphs(lm.model, 3)
    engine.spec.policy = ScriptedPolicy(3, script=(0, 3))
    done = engine._prompt_done
    monkeypatch.setattr(engine, "_prompt_done", lambda slot: ev.append(("first", slot.task.id)) or done(slot))
    return engine, ev, got


def _submit(engine, got, prompt) -> int:
    return engine.submit(CompletionTask(prompt, PARAMS, lambda r: got.__setitem__(r.task_id, r.tokens)
                                        if isinstance(r, FinalResult) else None))


def test_requests_arriving_together_run_no_head_before_every_first_token(lm, monkeypatch):
    """Three requests in one drain of the inbox: none is alone at its prompt's end, so before the last first token
    only target forwards ran (no MTP forward, no graph captured); the first drafting round's catch-up runs the three
    prompts' pairs in one MTP forward. Each output equals MTP off."""
    prompts = [lm.tokenizer.encode(p) for p in PROMPTS[:3]]
    off, _ = _engine_run(lm, None, [(p, PARAMS) for p in prompts])
    engine, ev, got = _watched(lm, monkeypatch, 3)
    ids = [_submit(engine, got, p) for p in prompts]
    engine.run_pending()
    assert [got[i] for i in ids] == off
    last_first = max(i for i, e in enumerate(ev) if e[0] == "first")
    assert {e[0] for e in ev[:last_first]} == {"target", "first"}
    assert ("prepare",) not in ev
    heads = [e[1] for e in ev if e[0] == "head"]
    assert heads and heads[0] >= sum(map(len, prompts))        # every prompt's pairs in the first catch-up


def test_a_lone_request_runs_its_prompt_head_once_at_the_prompt_end(lm, monkeypatch):
    """A request alone, its prompt in several chunks (n_ubatch 4): the head runs once over the whole prompt after
    its last chunk, then its lone graphs are prepared, then the first token; not when it was assigned a slot.
    Its output equals MTP off."""
    prompt = lm.tokenizer.encode(PROMPTS[1] * 2)
    (off,), _ = _engine_run(lm, None, [(prompt, PARAMS)])
    engine, ev, got = _watched(lm, monkeypatch, 2, n_ubatch=4)
    task = _submit(engine, got, prompt)
    engine.run_pending()
    assert got[task] == off
    before = ev[:ev.index(("first", task))]
    targets = [e for e in before if e[0] == "target"]
    assert len(targets) > 2 and sum(e[1] for e in targets) == len(prompt)
    assert before[len(targets):] == [("head", len(prompt)), ("prepare",)]


def test_a_deferred_prompt_queues_at_most_pending_max_pairs(lm):
    """prefill(defer=True) leaves the head's part in the queue until it holds more than pending_max pairs, then runs
    them all; without defer (llamacmp-bench, the tests' own drivers) the head runs over each chunk at once."""
    sp = Speculator(lm.model, 3)
    sp.pending_max = 6
    st, ms = lm.backend.new_state(lm.cfg, 64), sp.new_seq(64)
    toks = lm.tokenizer.encode(PROMPTS[2] * 2)[:12]
    sp.prefill(st, ms, toks[:4], defer=True)
    assert (ms.state.n_past, len(ms.pending)) == (0, 4)
    sp.prefill(st, ms, toks[4:8], defer=True)
    assert (ms.state.n_past, len(ms.pending)) == (8, 0)
    sp.prefill(st, ms, toks[8:12])
    assert (ms.state.n_past, len(ms.pending)) == (12, 0)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _timeline_lines(lm, monkeypatch, level: int, n: int) -> list[str]:
    logger, handler = logging.getLogger("llamacmp.engine"), _Lines()
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        engine, _, got = _watched(lm, monkeypatch, n)
        for p in PROMPTS[:n]:
            _submit(engine, got, lm.tokenizer.encode(p))
        engine.run_pending()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return [x for x in handler.lines if "start timeline" in x]


def test_start_timeline_at_debug_only(lm, monkeypatch):
    """-v (DEBUG): one 'start timeline' line per request at its first token, in slot_log's heads; at the default
    INFO none. benchmarks/mtp_streams.py --timeline reads them back."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import mtp_streams
    assert _timeline_lines(lm, monkeypatch, logging.INFO, 2) == []
    lines = _timeline_lines(lm, monkeypatch, logging.DEBUG, 2)
    assert len(lines) == 2 and all(x.startswith("slot  first_token: id ") for x in lines)
    rows = mtp_streams.start_timelines("\n".join(lines), 2)
    assert len(rows) == 2 and rows[0]["queued"] == 0.0
    for r in rows:      # together: neither ran the head over its prompt nor captured graphs before its first token
        assert r["chunks"] == 2 and r["head"] == 0.0 and r["graphs"] == 0.0
        assert r["queued"] <= r["assigned"] <= r["prompt0"] <= r["prompt1"] <= r["first"]
