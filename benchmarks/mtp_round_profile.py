"""Where an MTP round's time goes, on the host's clock (issue 19: at synthetic length 2.5 a round of the 9B costs
~1.7 decode steps for ~2.45 tokens, where its parts suggest ~1.5). Runs llamacmp-bench's own loop (the tg rows of
cli/bench_runner.Runner, the engine's Speculator) with a timer around each part of a round:

    plan     the draft policy's choice
    step     draft + verify (on CUDA both graphs back to back), until the verified ids are on the host
    accept   the acceptance rule over the verified rows (host)
    commit   the rewind of the recurrent state and the head's queue (restore_steps: launches per GDN layer)
    plain    a round that steps plainly: the decode step that also gives the head its input h
    observe  that round's queueing of h for the head

and prints, per tg row, the mean milliseconds of each part per drafting or plain round and per generated token,
beside the row's whole time. The parts are host wall time; what is not in them (the loop's own Python, the bench's
bookkeeping) is the rest.

    python3 benchmarks/mtp_round_profile.py -m FILE --spec-type none,draft-mtp --spec-draft-n-max 3
        --spec-synth-len 1,2.5 [-n 128] [-r 3] [any llamacmp-bench option]
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamacmp.cli.bench_options import parse_bench_args  # noqa: E402
from llamacmp.cli.bench_rows import instances, spec_label  # noqa: E402
from llamacmp.cli.bench_runner import Runner, load_runner, make_backend  # noqa: E402
from llamacmp.engine import speculative  # noqa: E402

PARTS = ("plan", "step", "accept", "commit", "plain", "observe")


class Clock:
    """Seconds and calls per part, summed over a row's timed repetitions."""

    def __init__(self):
        self.s, self.calls, self.on = defaultdict(float), defaultdict(int), False

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.s[part] += time.perf_counter() - t0
                self.calls[part] += 1
        return timed


@contextmanager
def instrumented(runner: Runner, clock: Clock):
    """The runner's Speculators and the bench loop's acceptance rule, timed (the loop imports accept_tokens when
    it builds a row's step, so the module's name is replaced meanwhile, and put back after)."""
    make = runner._speculator

    def speculator(inst, n_ctx):
        sp, ms = make(inst, n_ctx)
        for part in ("plan", "step", "commit"):
            setattr(sp, part, clock.wrap(part, getattr(sp, part)))
        sp.observe_plain = clock.wrap("observe", sp.observe_plain)
        time_plain = sp.time_plain

        def plain(rows: int, seconds: float) -> None:    # the loop's own timing of its plain step
            if clock.on:
                clock.s["plain"] += seconds
                clock.calls["plain"] += 1
            time_plain(rows, seconds)
        sp.time_plain = plain
        return sp, ms
    runner._speculator = speculator
    accept = speculative.accept_tokens
    speculative.accept_tokens = clock.wrap("accept", accept)
    try:
        yield
    finally:
        speculative.accept_tokens = accept


def report(label: str, clock: Clock, seconds: float, tokens: int) -> None:
    print(f"\n{label}: {tokens / seconds:.1f} t/s, {1e3 * seconds / tokens:.3f} ms a token")
    if not clock.calls:
        print("  (MTP off: every round one plain decode step)")
        return
    print(f"  rounds: {clock.calls['step']} drafting, {clock.calls['plain']} plain")
    accounted = 0.0
    for part in PARTS:
        s, n = clock.s[part], clock.calls[part]
        if not n:
            continue
        accounted += s
        print(f"  {part:8s} {1e3 * s / n:8.3f} ms a call ({n} calls)   {1e3 * s / tokens:8.3f} ms a token")
    print(f"  rest     {'':8s}{'':22s}   {1e3 * (seconds - accounted) / tokens:8.3f} ms a token")


def main(argv: list[str]) -> int:
    s = parse_bench_args(argv)
    for inst in instances(s):
        if not inst.n_gen:
            continue
        be, backend, _ = make_backend(inst.n_gpu_layers, sys.stderr, s["hw_route"])
        runner = load_runner(inst.model, be, backend == "CUDA")
        clock, total = Clock(), 0.0
        with instrumented(runner, clock):
            runner.run(inst, warmup=True)
            clock.on = True
            for _ in range(s["reps"]):
                total += runner.run(inst) / 1e9
            clock.on = False
        report(f"{Path(inst.model).name} tg{inst.n_gen} {spec_label(inst.spec)}", clock, total, inst.n_gen * s["reps"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
