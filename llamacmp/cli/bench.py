"""llamacmp-bench: llama-bench's flags, tests and output formats (md, json, jsonl, csv) on the llamacmp engine.

    llamacmp-bench -m MODEL.gguf [-p 512] [-n 128] [-pg 512,128] [-d 0] [-b 2048] [-ub 512] [-ctk f16] [-ctv f16]
                   [-ngl 99] [-fa 0] [-r 5] [-o md|json|jsonl|csv]

As in llama-bench, every test flag takes comma-separated lists (or repeats), ranges `first-last`, `first-last+step`
and `first-last*mult`; the cartesian product of the values makes the test instances. Tests: ppN (a prompt of N
random tokens processed in chunks of min(-b, -ub) rows), tgN (N single-token decode steps), ppN+tgM (-pg; both,
timed together); with -d D each repetition first fills the context with D tokens (untimed) and the test name gains
" @ dD". t/s is tokens / seconds per repetition, reported as mean ± standard deviation over -r repetitions after
one untimed warm-up.

On the CUDA backend tg replays the decode step captured once as a CUDA graph (CapturedStep) with the greedy argmax
inside the graph: the logits never leave the device, and each step moves one token id to the host (which is also
the per-token synchronisation llama-bench has). -ngl 0 runs the numpy reference backend (what CI can run); any
other -ngl keeps every layer on the GPU (llamacmp has no partial offload). -fa is accepted and reported: llamacmp's
attention is always the fused online-softmax kernel.

Speculative decoding (llamacmp's extension: llama-bench 0c1e570 takes no --spec-* flag): --spec-type none,draft-mtp,
--spec-draft-n-max N, --spec-synth-len L (lists, like every test flag) and --spec-synth-rates P0,P1,.. (one rate list
per flag) make tg rows with the model's MTP head drafting (the engine's draft-and-verify loop, greedy; with a
synthetic length the acceptance is drawn as llama.cpp's --spec-synth-len does, seed 0). The loop drafts adaptively
as the server does (engine/draft_policy.py: plain steps where drafting does not pay, probes now and then; the
repetitions of a row share its cost table, the warm-up included). Those rows carry a "spec" column (md: the setting,
then the mean tokens per verify "len" and the share of rounds that drafted "dr") and spec_* / draft_n /
draft_n_accepted / spec_draft_share / spec_probes fields (json, csv); without --spec-* the output is llama-bench's.
pp tests do not draft and are run once.

Option parsing: llama-bench has its own parser (list values, ranges, its own usage text) unlike the common option
table of llama-cli/-server, so this tool keeps its small table (bench_options.py) and reuses args.py's value parsers
(arg_values.to_int, choice) instead of adding rows to llamacmp.args.

The tool by concept: bench_options.py (the option table, parsing), bench_rows.py (test instances, results and their
fields), bench_printing.py (md / json / jsonl / csv), bench_runner.py (the model on its backend, the timed pp / tg /
spec runs); this file drives them.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from ..args import version_text
from .bench_options import BenchError, parse_bench_args, usage_text
from .bench_printing import make_printer
from .bench_rows import Instance, Result, instances, spec_label
from .bench_runner import Runner, load_runner, make_backend


__all__ = ["BenchError", "Instance", "Result", "Runner", "instances", "main", "parse_bench_args", "spec_label",
           "usage_text"]


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    argv = sys.argv[1:] if argv is None else argv
    try:
        s = parse_bench_args(argv)
    except BenchError as e:
        err.write(f"{e}\n{usage_text()}")
        return 1
    if s.get("help"):
        out.write(usage_text())
        return 0
    if s.get("version"):
        err.write(version_text())
        return 0
    for note in s["notes"]:
        err.write(note + "\n")
    try:
        return _run_all(s, out, err)
    except BenchError as e:
        err.write(f"{e}\n")
        return 1


def _run_all(s: dict, out: TextIO, err: TextIO) -> int:
    insts = instances(s)
    printers = [make_printer(s["output"], out, s)]
    if s["output_err"]:
        printers.append(make_printer(s["output_err"], err, s))
    for p in printers:
        p.header()
    loaded: dict[tuple[str, bool], tuple[Runner, str, str]] = {}
    for n, inst in enumerate(insts):
        use_gpu = inst.n_gpu_layers != 0
        key = (inst.model, use_gpu)
        if key not in loaded:
            loaded.clear()                 # one model in memory at a time, as llama-bench
            be, backend, gpu = make_backend(inst.n_gpu_layers, err, s["hw_route"])
            loaded[key] = (load_runner(inst.model, be, backend == "CUDA"), backend, gpu)
        runner, backend, gpu = loaded[key]
        if s["progress"]:
            err.write(f"llamacmp-bench: test {n + 1}/{len(insts)}: {inst.name}\n")
        res = Result(inst, runner.info, backend, gpu, test_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     probe=runner.be.probe_report)
        try:
            if not s["no_warmup"]:
                runner.run(inst, warmup=True)
            for _ in range(s["reps"]):
                res.samples_ns.append(max(1, runner.run(inst, warmup=False, draft=res.draft, use=res.use)))
                if s["delay"]:
                    time.sleep(s["delay"])
        except ValueError as e:         # what the backend refuses (a KV type, a context it cannot hold)
            raise BenchError(f"error: {inst.name}: {e}") from None
        for p in printers:
            p.row(res)
    for p in printers:
        p.footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
