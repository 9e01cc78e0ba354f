"""The host work MTP adds to a plain decode step (issue 19: with 4 streams the draft policy steps plainly in ~510 of
~515 rounds, yet MTP on runs at 0.95-0.99x of off on the H200, where a step of 4 streams is ~4.7 ms: 1% = 47 us).

Runs the server's scheduler (engine/scheduler.py Engine, on this thread: run_pending) with S slots generating
greedily, MTP off and on, on the numpy reference and a fixture model with an MTP head, and times each plain step
(every slot generating, the policy's n = 0) on the host clock, in parts:

    before     the step's start to the decode call: what the host does while the device would be idle (MTP on:
               plan(), the draft policy's choice, and the list of slots that may draft)
      plan     Speculator.plan
    after      the decode call's return to the draw: the device would be running the step meanwhile (MTP on:
               the heads' queue, observe_plain, and where the tree has it the next round's weighing, plan_ahead)
      observe  Speculator.observe_plain, steps without a catch-up
      ahead    Speculator.plan_ahead
    hook       the plain step's timing for the policy (Speculator.time_plain, after the draw)
    draw..end  the draw to the step's end (the tokens' emit: the same with MTP off)
    catch-up   observe_plain's Speculator._catch_up: every pending_max plain steps in a row the head runs over
               pending_max x S queued rows (numpy's time here: on CUDA an eager Qwen35Model.mtp_fill over those
               rows; listed apart)

By default the draft policy decides from costs shaped like the H200's (9B Q8_0, RESULTS.md 2026-12-02: plain steps
of 1 and 4 sequences 3.07 / 4.74 ms, MTP off's 326 / 844 t/s; a round of one sequence drafting n (3.2 + 0.8 n) ms,
about the L2.5 round's 4.77 ms step + 0.37 ms commit at n = 3), frozen, so that it takes the paths it takes there: at 4 streams it explores nothing measured and skips drafting every round, at 1 stream (the
random head's drafts are rejected) it steps plainly with probes. --costs measured: numpy's own timings instead.
The decode call itself (numpy's forward) is left out. Medians and means in microseconds a step, MTP off and on, and
the difference on - off per part (the figure to weigh against 47 us). With --auto-prefix N the Speculator keeps
--spec-draft-vocab auto's window of committed tokens with that prefix (the real vocabulary's per-token work; the
tiny fixture's 571 ids are below auto's own 32768).

    python3 benchmarks/mtp_plain_host.py [--streams 1,4] [-n 600] [--reps 3] [--auto-prefix 128]
        [--costs h200|measured] [--no-gc] [-m FILE]
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamacmp.backends.numpy_ref import NumpyBackend  # noqa: E402
from llamacmp.engine.draft_policy import CostTable  # noqa: E402
from llamacmp.engine.draft_vocab import AutoVocab  # noqa: E402
from llamacmp.engine.scheduler import Engine, EngineConfig  # noqa: E402
from llamacmp.engine.speculative import Speculator  # noqa: E402
from llamacmp.engine.tasks import CompletionTask, FinalResult, GenParams  # noqa: E402
from llamacmp.loader import load_model  # noqa: E402
from llamacmp.sampling import SamplingParams  # noqa: E402
from llamacmp.spec import SpecConfig  # noqa: E402

PARTS = ("before", "plan", "after", "observe", "ahead", "hook", "draw..end")
H200_PLAIN = {1: 3.07e-3, 4: 4.74e-3}
H200_SPEC = {(1, 1): 4.0e-3, (1, 2): 4.8e-3, (1, 3): 5.6e-3}


class FrozenCosts(CostTable):
    """A cost table that keeps its figures (the H200's): numpy's timings reach it and change nothing."""

    @staticmethod
    def _add(table: dict, key, seconds: float) -> None:
        pass


def h200_costs() -> CostTable:
    heads = {h: dict(H200_SPEC) for h in ("fixed", "prefix", "whole")}
    return FrozenCosts(plain=dict(H200_PLAIN), spec=heads["fixed"], heads=heads)


class StepParts:
    """Wraps one Engine's step, decode call, draw and (MTP on) its Speculator's plan / observe_plain / time_plain /
    _catch_up with host timers; keeps one row of parts per step in which all S slots stepped plainly."""

    def __init__(self, engine: Engine, S: int):
        self.S, self.rows, self.catch_ups = S, [], []
        cur: dict = {}
        tick = time.perf_counter
        dec, real_step, real_draw = engine.decoder, engine._step, engine._draw
        real_decode = dec.decode_hidden

        def step():
            cur.clear()
            cur["start"] = tick()
            real_step()
            end = tick()
            if cur.get("n") == S and cur.get("plan", 0) == 0 and "catch" not in cur and "draw" in cur:
                self.rows.append((cur["launch"] - cur["start"], cur.get("t_plan", 0.0), cur["draw"] - cur["back"],
                                  cur.get("t_observe", 0.0), cur.get("t_ahead", 0.0), cur.get("t_hook", 0.0),
                                  end - cur["draw"]))

        def decode(states, tokens):
            cur["launch"], cur["n"] = tick(), len(states)
            out = real_decode(states, tokens)
            cur["back"] = tick()
            return out

        def draw(*a):
            cur.setdefault("draw", tick())
            return real_draw(*a)
        engine._step, engine._draw, dec.decode_hidden = step, draw, decode
        sp = engine.spec
        if sp is None:
            return

        def timed(name, fn, result=None):
            def run(*a, **k):
                t0 = tick()
                out = fn(*a, **k)
                cur[name] = cur.get(name, 0.0) + tick() - t0
                if result is not None:
                    cur[result] = out
                return out
            return run
        sp.plan = timed("t_plan", sp.plan, "plan")
        sp.time_plain = timed("t_hook", sp.time_plain)
        if hasattr(sp, "plan_ahead"):
            sp.plan_ahead = timed("t_ahead", sp.plan_ahead)
        real_catch_up = sp._catch_up

        def catch_up(seqs, keep):
            rows = sum(len(ms.pending) for ms in seqs if len(ms.pending) > keep)
            if not rows or "observing" not in cur:         # (a drafting round's catch-up: not a plain step's)
                return real_catch_up(seqs, keep)
            t0 = tick()
            real_catch_up(seqs, keep)
            dt = tick() - t0
            cur["catch"] = dt
            self.catch_ups.append((rows, dt))
        sp._catch_up = catch_up
        real_observe = sp.observe_plain

        def observe(items, h):
            t0 = tick()
            cur["observing"] = True
            real_observe(items, h)
            del cur["observing"]
            cur["t_observe"] = tick() - t0 - cur.get("catch", 0.0)
        sp.observe_plain = observe


def run_once(lm, S: int, mtp: bool, n: int, auto_prefix: int, costs: str) -> tuple[StepParts, Engine]:
    spec = SpecConfig(type="draft-mtp", n_max=3) if mtp else None
    engine = Engine(lm, EngineConfig(n_slots=S, n_ctx_slot=n + 64, spec=spec))
    if mtp:
        lm.model.set_draft_vocab(0)
        engine.spec = Speculator(lm.model, 3, auto=AutoVocab(prefix=auto_prefix) if auto_prefix else None,
                                 costs=h200_costs() if costs == "h200" else None, n_seqs=S)
        for slot in engine.slots:
            slot.mtp = engine.spec.new_seq(engine.cfg.n_ctx_slot)
    parts = StepParts(engine, S)
    rng = np.random.default_rng(0)
    done = []
    for i in range(S):
        prompt = [int(t) for t in rng.integers(0, min(256, lm.cfg.n_vocab), 24)]
        params = GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=n, cache_prompt=False)
        engine.submit(CompletionTask(prompt, params, lambda r: done.append(r) if isinstance(r, FinalResult) else None))
    engine.run_pending()
    assert len(done) == S
    return parts, engine


def us(a) -> str:
    return f"{1e6 * np.median(a):8.1f} {1e6 * np.mean(a):8.1f}" if len(a) else f"{'-':>8s} {'-':>8s}"


def report(S: int, off: list, on: list, catch_ups: list, counts: dict) -> None:
    off, on = np.array(off), np.array(on)
    print(f"\n{S} stream{'s' * (S > 1)}: {len(off)} plain steps off, {len(on)} on (median, mean us a step; "
          f"policy rounds at S={S}: {counts.get(S, {})})")
    print("| part | off median | off mean | on median | on mean | on - off (median) |\n|---|---:|---:|---:|---:|---:|")
    for i, part in enumerate(PARTS):
        a, b = off[:, i], on[:, i]
        d = 1e6 * (np.median(b) - np.median(a))
        print(f"| {part} | " + " | ".join(us(a).split() + us(b).split()) + f" | {d:+.1f} |")
    tot_off, tot_on = off[:, [0, 2, 5, 6]].sum(1), on[:, [0, 2, 5, 6]].sum(1)
    print("| host total (before + after + hook + draw..end) | " + " | ".join(us(tot_off).split() + us(tot_on).split())
          + f" | {1e6 * (np.median(tot_on) - np.median(tot_off)):+.1f} |")
    if catch_ups:
        rows = [r for r, _ in catch_ups]
        t = np.array([s for _, s in catch_ups])
        print(f"catch-ups: {len(t)} of {rows[0]} rows each, {1e3 * t.mean():.2f} ms each (numpy forward), "
              f"{1e6 * t.sum() / max(1, len(on) + len(t)):.1f} us a plain step amortized")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="", help="a GGUF with an MTP head (default: the tiny fixture, q8_0)")
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("-n", "--n-predict", type=int, default=600, help="tokens per stream (> 256: catch-ups run)")
    ap.add_argument("--reps", type=int, default=3, help="off / on runs per stream count, interleaved")
    ap.add_argument("--auto-prefix", type=int, default=128, help="auto's window with this prefix (0: none)")
    ap.add_argument("--costs", choices=("h200", "measured"), default="h200",
                    help="the draft policy's costs: the H200's, frozen (default), or numpy's own timings")
    ap.add_argument("--no-gc", action="store_true", help="collect before each run and not during it")
    a = ap.parse_args(argv)
    if a.model:
        path = Path(a.model)
    else:
        from llamacmp.fixtures.qwen_vocab import tiny_vocab
        from llamacmp.fixtures.writer import SHAPES, write_model
        path = write_model(Path(tempfile.mkdtemp()) / "tiny-mtp.gguf", replace(SHAPES["tiny"], mtp=True), "q8_0",
                           tiny_vocab())
    lm = load_model(path, NumpyBackend())
    print(f"model {path.name} (numpy), n_vocab {lm.cfg.n_vocab}, {a.n_predict} tokens a stream, auto prefix "
          f"{a.auto_prefix or 'off'}, {a.costs} costs, {a.reps} runs each")
    for S in (int(x) for x in a.streams.split(",")):
        off, on, catch_ups, counts = [], [], [], {}
        for _ in range(a.reps):
            for mtp in (False, True):
                if a.no_gc:
                    gc.collect()
                    gc.disable()
                try:
                    parts, engine = run_once(lm, S, mtp, a.n_predict, a.auto_prefix, a.costs)
                finally:
                    gc.enable()
                (on if mtp else off).extend(parts.rows)
                if mtp:
                    catch_ups += parts.catch_ups
                    for s, row in engine.spec.round_counts().items():
                        for k, v in row.items():
                            counts.setdefault(s, {})[k] = counts.get(s, {}).get(k, 0) + v
        report(S, off, on, catch_ups, counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
