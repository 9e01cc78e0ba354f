"""The host's critical path of an MTP drafting round (issue 19): from the verified ids reaching the host to the next
round's draft launch the GPU has nothing to run, so every microsecond of it is a microsecond of the round (a plain
decode step has only an upload, a launch and a read there).

Runs llamacmp-bench's own tg row (cli/bench_runner.Runner: the engine's Speculator, the spec graphs, the synthetic
acceptor with seed 0; draft n-max 3, one sequence) on the CUDA backend's Python over a no-op library (NoopNative:
every libcmpkern call returns at once and is counted, the ids read back are zeros), with the draft policy's costs
frozen at the H200's (mtp_plain_host.h200_costs) so that it drafts as there. Per drafting round it reports

  path     host time from the verify's ids on the host (the first device-to-host read after a verify launch) to
           the next draft graph's launch: median and mean us, and the library calls made in it by name (each a
           CUDA API call on the GPU: a few us of driver time this measurement cannot see);
  pieces   the Python parts on that path timed alone (perf_counter around each call, in a second pass): the ids'
           reads, accept_tokens (with the synthetic acceptor's draws), commit (restore_steps and the head's queue
           inside it), plan, and step() from its call to the draft launch;
  round    the host time of the whole round (all drafting rounds' host time over their number).

The Python is the CUDA path's own (the tensors, copies, uploads and graph launches are CudaBackend's and
spec_graphs'); what is not measured is the library's side of each call. The model is the tiny MTP fixture: on the
CUDA path the host's per-round work does not depend on the model's sizes (a copy of D floats is one call whatever D).

    python3 benchmarks/spec_host_path.py [-n 1000] [-r 3] [--spec-synth-len 2.5] [-m FILE]
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llamacmp.backends import spec_graphs  # noqa: E402
from llamacmp.backends.cuda import CudaBackend  # noqa: E402
from llamacmp.cli.bench_options import parse_bench_args  # noqa: E402
from llamacmp.cli.bench_rows import instances  # noqa: E402
from llamacmp.cli.bench_runner import load_runner  # noqa: E402
from llamacmp.engine import speculative  # noqa: E402
from llamacmp.lib._native import SIGNATURES, Native  # noqa: E402
from llamacmp import spec  # noqa: E402

from mtp_plain_host import h200_costs  # noqa: E402
from profile_spec import patched  # noqa: E402

PIECES = ("read", "accept", "synth draws", "commit", "restore_steps", "plan", "step to launch")


class NoopNative(Native):
    """libcmpkern's interface, every call a no-op that is counted (and logged with its time while `log` is a list);
    device pointers are made up, reads back to the host write zeros."""

    def __init__(self):                     # (no library loaded)
        self.counts, self.log, self._next = Counter(), None, 1 << 40
        for name in SIGNATURES:
            setattr(self, name, self._call(name))

    def _call(self, name):
        counts, tick = self.counts, time.perf_counter

        def call(*args):
            counts[name] += 1
            if self.log is not None:
                self.log.append((name, tick(), args[0] if args else None))
            if name in ("cmp_memcpy_d2h", "cmp_memcpy_d2h_async"):
                ctypes.memset(args[0], 0, args[2])
        return call

    def malloc(self, nbytes: int) -> int:
        p, self._next = self._next, self._next + (nbytes + 8191) // 4096 * 4096
        return p

    def graph_end(self) -> int:
        self._next += 256
        return self._next

    def host_alloc(self, nbytes: int) -> int:     # pinned host memory: real host memory here
        buf = ctypes.create_string_buffer(nbytes)
        self._pinned = getattr(self, "_pinned", []) + [buf]
        return ctypes.addressof(buf)

    def mem_info(self) -> tuple[int, int]:
        return 64 << 30, 80 << 30

    def set_pdl(self, device: int, on: bool) -> bool:
        return bool(on)

    def device_name(self) -> str:
        return "no-op library"

    def kv_row_bytes(self, kv_type: str, head_dim: int) -> int:
        return head_dim * (2 if kv_type == "f16" else 4)


class FrozenTables(dict):
    """Runner.costs whose every cost table is the H200's, frozen."""

    def setdefault(self, key, default=None):
        return super().setdefault(key, h200_costs())


def tg_row(model: str, n_gen: int, synth_len: float):
    """llamacmp-bench's MTP-on tg row: -p 0 -n n_gen, draft n-max 3, the whole vocabulary."""
    (on,) = instances(parse_bench_args(["-m", model, "-p", "0", "-n", str(n_gen), "--spec-type", "draft-mtp",
                                        "--spec-draft-n-max", "3", "--spec-synth-len", f"{synth_len:g}",
                                        "--spec-draft-vocab", "0"]))
    return on


class Kinds:
    """Which graph each exec handle is: 'D' a draft graph, 'V' a verify graph (the runner's Speculators' caches)."""

    def __init__(self, runner):
        self.sps, make = [], runner._speculator

        def speculator(inst, n_ctx):
            sp, ms = make(inst, n_ctx)
            self.sps.append(sp)
            return sp, ms
        runner._speculator = speculator

    def table(self) -> dict:
        out = {}
        for sp in self.sps:
            out.update({g.graph.exec: "D" for g in sp.graphs._draft.values()})
            out.update({g.graph.exec: "V" for g in sp.graphs._verify.values()})
        return out


@dataclass
class Round:
    """One drafting round in the library's log, from its verify launch to the next draft launch."""
    reads: int = 0              # device-to-host reads after the verify launch
    path: float | None = None   # seconds from the first of them to the next draft launch (None: no draft followed)
    calls: Counter = field(default_factory=Counter)    # the library calls in that time


def drafting_rounds(log: list, kinds: dict) -> list[Round]:
    """The library log of a run -> its drafting rounds (a plain step's graph launch ends a round's path)."""
    out, cur, start = [], None, None
    for name, t, arg in log:
        if name == "cmp_graph_launch" and kinds.get(arg) == "V":
            cur, start = Round(), None
            out.append(cur)
        elif cur is None:
            continue
        elif name == "cmp_graph_launch":
            if kinds.get(arg) == "D" and start is not None:
                cur.path = t - start
            cur = None
        elif name == "cmp_memcpy_d2h":
            cur.reads += 1
            if start is None:
                start = t
                continue
        if cur is not None and start is not None:
            cur.calls[name] += 1
    return out


def timed_pieces(runner, sink: dict):
    """Wrappers that add each piece's host seconds to sink (piece -> list of seconds per call)."""
    tick = time.perf_counter
    mark = {}

    def wrap(piece, fn):
        def run(*args, **kwargs):
            t0 = tick()
            try:
                return fn(*args, **kwargs)
            finally:
                sink.setdefault(piece, []).append(tick() - t0)
        return run

    D, V, S = spec_graphs.CapturedDraft, spec_graphs.CapturedVerify, speculative.Speculator
    step, launch = S.step, spec_graphs.RecordedGraph.launch

    def step_timed(self, *args, **kwargs):
        mark["step"] = tick()
        return step(self, *args, **kwargs)

    def launch_timed(self):
        if self is getattr(mark.get("draft"), "graph", None) and "step" in mark:
            sink.setdefault("step to launch", []).append(tick() - mark.pop("step"))
        return launch(self)

    def draft_launch(self, *args, _launch=D.launch, **kwargs):
        mark["draft"] = self
        return _launch(self, *args, **kwargs)
    changes = [(S, "step", step_timed), (spec_graphs.RecordedGraph, "launch", launch_timed),
               (D, "launch", draft_launch),
               (S, "commit", wrap("commit", S.commit)), (S, "plan", wrap("plan", S.plan)),
               (speculative, "accept_tokens", wrap("accept", speculative.accept_tokens)),
               (runner.be, "restore_steps", wrap("restore_steps", runner.be.restore_steps)),
               (spec.SynthRng, "uniform", wrap("synth draws", spec.SynthRng.uniform))]
    # the reads: the draft graph's and the verify's (next/combo13), or the verify's one (read_ids)
    for cls, name in ((D, "read"), (V, "read_ids") if hasattr(V, "read_ids") else (V, "read")):
        changes.append((cls, name, wrap("read", getattr(cls, name))))
    return patched(changes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="", help="a GGUF with an MTP head (default: the tiny fixture, q8_0)")
    ap.add_argument("-n", type=int, default=1000, help="tokens a repetition")
    ap.add_argument("-r", type=int, default=3, help="repetitions (each: a clean pass, then a pass with the pieces)")
    ap.add_argument("--spec-synth-len", type=float, default=2.5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            from llamacmp.fixtures.qwen_vocab import tiny_vocab
            from llamacmp.fixtures.writer import SHAPES, write_model
            model = str(write_model(Path(tmp) / "m.gguf", replace(SHAPES["tiny"], mtp=True), "q8_0", tiny_vocab()))
        nat = NoopNative()
        be = CudaBackend(native=nat)
        runner = load_runner(model, be, True)
        runner.costs = FrozenTables()
        kinds = Kinds(runner)
        inst = tg_row(model, args.n, args.spec_synth_len)
        runner.run(inst, warmup=True)
        print(f"{Path(model).name}: tg{args.n} L{args.spec_synth_len:g} n-max 3, CUDA backend's Python over a no-op "
              f"library, H200 costs frozen; per drafting round:")
        print("| rep | rounds | path median us | path mean us | host us a round | library calls on the path |\n"
              "|---|---:|---:|---:|---:|---|")
        pieces: dict = {}
        for rep in range(args.r):
            gc.collect()
            nat.log = []
            ns = runner.run(inst)
            log, nat.log = nat.log, None
            rounds = drafting_rounds(log, kinds.table())
            timed = [r for r in rounds if r.path is not None]
            paths, calls = [r.path for r in timed], sum((r.calls for r in timed), Counter())
            per = ", ".join(f"{k.removeprefix('cmp_')} {v / len(timed):.2f}" for k, v in calls.most_common())
            print(f"| {rep} | {len(rounds)} | {1e6 * statistics.median(paths):.1f} | "
                  f"{1e6 * statistics.mean(paths):.1f} | {ns / 1e3 / len(rounds):.1f} | {per} |")
            gc.collect()
            with timed_pieces(runner, pieces):
                runner.run(inst)
        print("\n| piece | calls a round | median us | mean us |\n|---|---:|---:|---:|")
        for piece in PIECES:
            if piece in pieces:
                t = pieces[piece]
                print(f"| {piece} | {len(t) / (args.r * len(rounds)):.2f} | {1e6 * statistics.median(t):.1f} | "
                      f"{1e6 * statistics.mean(t):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
