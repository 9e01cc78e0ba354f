"""Where an MTP drafting round's time goes, phase by phase and kernel by kernel (issue 19).

At synthetic length 2.5 a round of the 9B costs ~1.7 plain decode steps where its parts suggest ~1.4 (H200).

    python3 benchmarks/profile_spec.py MODEL.gguf [--spec-synth-len 2.5] [-n 64] [--depth 0] [--top 12] [--no-pdl]
        [--spec-draft-coarse K] [-ngl 0]

Runs llamacmp-bench's own tg rows (cli/bench_runner.Runner: the engine's Speculator, its draft policy, the CUDA
graphs, the synthetic acceptor with seed 0; draft n-max 3, the whole vocabulary, --spec-draft-coarse K) in passes of
about n drafting rounds each, after the bench's warm-up:

  1. MTP off and on unprofiled: ms per plain token and per drafting round, tokens per drafting round, the ratio;
  2. on, instrumented: a device sync at the end of each phase (inside it) and before its start (apart: "syncs at
     starts", device work launched between phases), so each phase's host wall time holds its device work:
       plan     the draft policy's choice (host)
       draft    the MTP rounds (graph: token / position uploads, the h rows copied in, one replay)
       verify   the main forward (graph: uploads, the drafted ids copied on the device, one replay)
       read     the verified and the drafted ids to the host (one read on the graph path)
       accept   the acceptance rule (host)
       commit   the head's queue (one copy of the kept rows), without restore
       restore  the GDN states' rewind (restore_steps: one copy launch where a draft was rejected)
       plain    the policy's plain rounds (probes), if any: left out of the per-round figures
     host gaps: the loop's Python between them (the round's wall minus the phases);
  3. on CUDA, pass 2 again under torch.profiler: device kernels, copies and memsets per drafting round, each put in
     the phase whose time range holds its start (record_function ranges; the syncs keep work inside its phase).
Kernel spans overlap where launched with programmatic dependent launch (see profile_decode.py); --no-pdl turns it
off. Needs torch with CUDA for part 3 (the H200 image has it); parts 1-2 run on the numpy backend too (-ngl 0).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from bisect import bisect_right
from collections import Counter, defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamacmp.backends import spec_graphs  # noqa: E402
from llamacmp.cli.bench_options import parse_bench_args  # noqa: E402
from llamacmp.cli.bench_rows import SpecUse, instances  # noqa: E402
from llamacmp.cli.bench_runner import Runner, load_runner, make_backend  # noqa: E402
from llamacmp.engine import speculative  # noqa: E402
from llamacmp.engine.tasks import DraftStats  # noqa: E402
from llamacmp.spec import SpecConfig, synth_mean_len  # noqa: E402

N_MAX = 3                   # --spec-draft-n-max of issue 19's rows
SYNCS = "syncs at starts"
PHASES = ("plan", "draft", "verify", "read", "accept", "commit", "restore", "plain", SYNCS)
RANGE = "spec:"             # the profiler ranges' name prefix
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class PhaseClock:
    """Host seconds and calls per phase, each without the phases called inside it. sync: run at a phase's end
    (inside it) and before its start (apart: "syncs at starts"); annotate: a context per call, named RANGE + phase
    (torch.profiler.record_function). timing False: only what the loop times itself (add) is kept."""

    def __init__(self, sync=None, annotate=None, timing: bool = True):
        self.s, self.calls = defaultdict(float), defaultdict(int)
        self.sync, self.annotate, self.timing, self._inner = sync, annotate, timing, []

    def wrap(self, phase: str, fn):
        if not self.timing:
            return fn

        def timed(*args, **kwargs):
            t_pre = time.perf_counter()
            if self.sync is not None:
                self.sync()
            t0 = time.perf_counter()
            self._inner.append(0.0)
            try:
                with self.annotate(RANGE + phase) if self.annotate is not None else nullcontext():
                    out = fn(*args, **kwargs)
                    if self.sync is not None:
                        self.sync()
                return out
            finally:
                t1 = time.perf_counter()
                self.s[phase] += t1 - t0 - self._inner.pop()
                self.s[SYNCS] += t0 - t_pre
                self.calls[phase] += 1
                if self._inner:
                    self._inner[-1] += t1 - t_pre
        return timed

    def add(self, phase: str, seconds: float) -> None:
        self.s[phase] += seconds
        self.calls[phase] += 1


@contextmanager
def patched(changes):
    """(object, attribute, new value) each, put back afterwards (an attribute the object did not hold itself, as a
    bound method on an instance, is deleted again)."""
    saved = [(obj, name, vars(obj).get(name)) for obj, name, _ in changes]
    for obj, name, new in changes:
        setattr(obj, name, new)
    try:
        yield
    finally:
        for obj, name, old in reversed(saved):
            if old is None:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


@contextmanager
def instrumented(runner: Runner, clock: PhaseClock, lengths: Counter):
    """The runner's Speculators, the spec graphs, the backend's rewind and the loop's acceptance rule timed by
    `clock`; lengths counts the drafting rounds by draft length."""
    make, w = runner._speculator, clock.wrap

    def speculator(inst, n_ctx):
        sp, ms = make(inst, n_ctx)
        step, time_plain = sp.step, sp.time_plain

        def counted(items, n=None, *args, **kwargs):
            lengths[sp.n_max if n is None else n] += 1
            return step(items, n, *args, **kwargs)

        def plain(rows: int, seconds: float) -> None:     # the loop's own timing of a plain step
            clock.add("plain", seconds)
            time_plain(rows, seconds)
        sp.step, sp.time_plain, sp.observe_plain = counted, plain, w("plain", sp.observe_plain)
        for name, phase in (("plan", "plan"), ("_draft", "draft"), ("_verify", "verify"), ("commit", "commit")):
            setattr(sp, name, w(phase, getattr(sp, name)))
        return sp, ms
    D, V, be = spec_graphs.CapturedDraft, spec_graphs.CapturedVerify, runner.be
    with patched([(runner, "_speculator", speculator), (be, "restore_steps", w("restore", be.restore_steps)),
                  (D, "launch", w("draft", D.launch)), (D, "read", w("read", D.read)),
                  (V, "launch_after", w("verify", V.launch_after)), (V, "run", w("verify", V.run)),
                  (V, "read_ids", w("read", V.read_ids)),
                  (speculative, "accept_tokens", w("accept", speculative.accept_tokens))]):
        yield


@dataclass
class Pass:
    """One tg repetition: the timed part's seconds, its tokens, drafting and plain rounds."""
    seconds: float
    tokens: int
    rounds: int = 0
    plain: int = 0
    plain_s: float = 0.0        # the plain rounds' steps as the loop timed them
    lengths: Counter = field(default_factory=Counter)

    @property
    def tokens_per_round(self) -> float:
        """Tokens per drafting round (the plain rounds' one token each left out)."""
        return (self.tokens - self.plain) / self.rounds


def bench_rows(model: str, rounds: int, synth_len: float, coarse: int, depth: int = 0, ngl: int = 99):
    """llamacmp-bench's tg rows MTP off and on (draft n-max 3, the whole vocabulary) as its options make them, of
    about `rounds` drafting rounds: rounds x the synthetic mean length tokens."""
    n_gen = round(rounds * synth_mean_len(SpecConfig("draft-mtp", N_MAX, synth_len=synth_len)))
    return instances(parse_bench_args([
        "-m", model, "-p", "0", "-n", str(n_gen), "-d", str(depth), "-ngl", str(ngl), "--spec-type", "none,draft-mtp",
        "--spec-draft-n-max", str(N_MAX), "--spec-synth-len", f"{synth_len:g}", "--spec-draft-vocab", "0",
        "--spec-draft-coarse", str(coarse)]))


def run_pass(runner: Runner, inst, clock: PhaseClock | None = None) -> Pass:
    """One of the bench's repetitions of inst (Runner.run: a fresh context, the -d fill and graph captures untimed);
    clock: its phases timed (default: none, only the plain rounds' own timing kept)."""
    draft, use, lengths = DraftStats(), SpecUse(), Counter()
    clock = clock if clock is not None else PhaseClock(timing=False)
    with instrumented(runner, clock, lengths):
        ns = runner.run(inst, draft=draft, use=use)
    return Pass(ns / 1e9, inst.n_gen, draft.steps, use.plain, clock.s["plain"], lengths)


def phase_rows(p: Pass, clock: PhaseClock) -> list[tuple[str, float, float | None]]:
    """(phase, ms per drafting round, calls per round) of an instrumented pass, then the host gaps and the round's
    wall. The policy's plain rounds are taken off the wall: their steps and queueing ("plain") and their plan()."""
    R, plan = p.rounds, clock.s["plan"] / max(1, clock.calls["plan"])
    rows = [(ph, 1e3 * plan, 1.0) if ph == "plan" else (ph, 1e3 * clock.s[ph] / R, None if ph == SYNCS
                                                        else clock.calls[ph] / R)
            for ph in PHASES if ph in clock.s and ph != "plain"]
    wall = 1e3 * (p.seconds - clock.s["plain"] - p.plain * plan) / R
    return rows + [("host gaps", wall - sum(ms for _, ms, _ in rows), None), ("round", wall, None)]


def device_by_phase(events: list[dict]) -> dict[str, dict[str, list]]:
    """A Chrome trace's device events (kernels, copies, memsets) -> {phase: {name: [count, µs]}}: each in the
    innermost RANGE range holding its start, "gap" outside them; events before the first range (the -d fill, the
    graph captures' uploads) are left out."""
    ranges = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"][len(RANGE):]) for e in events
                    if e.get("cat") == "user_annotation" and e.get("name", "").startswith(RANGE))
    starts = [r[0] for r in ranges]
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for e in events:
        if e.get("cat") not in DEVICE_CATS or "dur" not in e:
            continue
        ts, i = float(e["ts"]), bisect_right(starts, float(e["ts"])) - 1
        if i < 0:
            continue
        # ranges nest (restore in commit, read in a graph's run): the latest-starting one holding ts is innermost
        phase = next((r[2] for r in reversed(ranges[max(0, i - 4):i + 1]) if r[1] >= ts), "gap")
        name = e["name"].replace("(anonymous namespace)::", "").split("(")[0].strip()
        out[phase][name][0] += 1
        out[phase][name][1] += float(e["dur"])
    return out


def profile_pass(runner: Runner, inst, be, torch_profiler):
    """Pass 2 under torch.profiler -> (Pass, device_by_phase of its trace)."""
    profile, record_function = torch_profiler.profile, torch_profiler.record_function
    ProfilerActivity = torch_profiler.ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        p = run_pass(runner, inst, PhaseClock(be.synchronize, record_function))
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        events = json.loads((Path(tmp) / "trace.json").read_text()).get("traceEvents", [])
    return p, device_by_phase(events)


def print_kernels(by_phase: dict, rounds: int, top: int) -> None:
    if not by_phase:
        raise SystemExit("the profiler saw no device work (CUPTI unavailable?)")
    print("\n| phase | kernel / copy | launches/round | µs/round (spans) | µs/launch |\n|---|---|---:|---:|---:|")
    for phase in [p for p in PHASES + ("gap",) if p in by_phase]:
        names = by_phase[phase]
        c, us = sum(v[0] for v in names.values()), sum(v[1] for v in names.values())
        print(f"| **{phase}** | all | {c / rounds:.1f} | {us / rounds:.1f} | |")
        for name, (c, us) in sorted(names.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"| {phase} | {name[:70]} | {c / rounds:.2f} | {us / rounds:.1f} | {us / c:.2f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--spec-synth-len", type=float, default=2.5, help="synthetic mean accepted length (1 .. 4)")
    ap.add_argument("-n", type=int, default=64, help="drafting rounds per pass (about: the pass generates n x the "
                                                     "synthetic length tokens)")
    ap.add_argument("--depth", type=int, default=0, help="tokens in the context before each pass (-d)")
    ap.add_argument("--top", type=int, default=12, help="kernels shown per phase")
    ap.add_argument("--no-pdl", action="store_true", help="launch without programmatic dependent launch")
    ap.add_argument("--spec-draft-coarse", type=int, default=SpecConfig().draft_coarse,
                    help="the draft's coarse head: its K best rescored (0: the exact head)")
    ap.add_argument("-ngl", type=int, default=99, help="0: the numpy reference backend (no kernel table)")
    args = ap.parse_args(argv)
    try:                        # (imported before the device is set up, as profile_decode.py does)
        import torch.profiler as torch_profiler
    except ImportError:
        torch_profiler = None
    off, on = bench_rows(args.model, args.n, args.spec_synth_len, args.spec_draft_coarse, args.depth, args.ngl)
    n_gen = on.n_gen
    be, backend, gpu = make_backend(args.ngl, sys.stderr)
    if backend == "CUDA" and args.no_pdl:
        be.gemv_pdl = be.launch_pdl = False
    runner = load_runner(args.model, be, backend == "CUDA")
    for inst in (off, on):
        runner.run(inst, warmup=True)
    base, plain, clock = run_pass(runner, off), run_pass(runner, on), PhaseClock(be.synchronize)
    timed = run_pass(runner, on, clock)
    t_plain = base.seconds / base.tokens
    if not plain.rounds or not timed.rounds:
        raise SystemExit(f"the draft policy drafted no round at L{args.spec_synth_len:g}: nothing to profile")
    print(f"{gpu or backend}; {Path(args.model).name}; depth {args.depth}; L{args.spec_synth_len:g} n{N_MAX} V0 "
          f"C{args.spec_draft_coarse}{'; no PDL' if args.no_pdl else ''}; {n_gen} tokens a pass")
    print(f"MTP off: {1e3 * t_plain:.3f} ms a token ({1 / t_plain:.1f} t/s)")
    round_ms = 1e3 * (plain.seconds - plain.plain_s) / plain.rounds
    print(f"MTP on, unprofiled: {plain.tokens / plain.seconds:.1f} t/s ({t_plain * plain.tokens / plain.seconds:.2f}x "
          f"off); {round_ms:.3f} ms a drafting round = {1e-3 * round_ms / t_plain:.2f} plain tokens, "
          f"{plain.tokens_per_round:.2f} tokens a round; rounds {plain.rounds} drafting (by length "
          f"{dict(sorted(plain.lengths.items())) or '-'}), {plain.plain} plain")
    print(f"\nInstrumented pass (syncs at phase ends): {timed.rounds} drafting rounds (by length "
          f"{dict(sorted(timed.lengths.items()))}), {timed.plain} plain, {timed.tokens_per_round:.2f} tokens a round")
    print("| phase | ms/round | calls/round | % of the round |\n|---|---:|---:|---:|")
    rows = phase_rows(timed, clock)
    for name, ms, calls in rows:
        print(f"| {name} | {ms:.3f} | {'' if calls is None else f'{calls:.2f}'} | {100 * ms / rows[-1][1]:.1f}% |")
    print(f"(the syncs' cost and the launch overlap they remove: {rows[-1][1] - round_ms:+.3f} ms a round against "
          "the unprofiled pass)")
    if backend != "CUDA":
        return 0
    if torch_profiler is None:
        raise SystemExit("no torch: no kernel table (torch with CUDA profiles the kernels)")
    prof, by_phase = profile_pass(runner, on, be, torch_profiler)
    print(f"\nProfiled pass (as the instrumented one, under torch.profiler): {prof.rounds} drafting rounds "
          f"({prof.plain} plain: their steps' kernels in the gap), {1e3 * prof.seconds / prof.rounds:.3f} ms a round")
    print_kernels(by_phase, prof.rounds, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
