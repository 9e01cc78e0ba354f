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
table of llama-cli/-server, so this tool keeps its small table here and reuses args.py's value parsers
(arg_values.to_int, choice) instead of adding rows to llamacmp.args.
"""
from __future__ import annotations

import itertools
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import numpy as np

from .. import BUILD_NUMBER
from ..arg_values import CACHE_TYPES, Unsupported, choice, to_int
from ..args import CPU_THREADS, DENSE, DOWNLOAD, FIT, LOADING, PLACEMENT, split_mode, version_text
from ..backends.routes import HW_ROUTES
from .. import spec
from ..engine.tasks import DraftStats
from ..kv_quant import KV_TYPES
from ..spec import SpecConfig, SpecError, synth_acceptor

OUTPUT_FORMATS = ("md", "json", "jsonl", "csv")
FILE_TYPES = {0: "all F32", 1: "F16", 7: "Q8_0"}
TYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "Q8_0": 34 / 32}      # bytes per element as stored in the GGUF


class BenchError(Exception):
    """Printed to stderr; the tool exits with status 1."""


# -- options -------------------------------------------------------------------------------------------------------

def int_values(s: str) -> list[int]:
    """'512', '128,256', '1-5', '64-512*2', '0-4096+1024' (llama-bench's list and range syntax)."""
    out: list[int] = []
    for part in (x for x in s.split(",") if x):
        if "-" in part[1:]:
            first, rest = part.split("-", 1) if not part.startswith("-") else ("-" + part[1:].split("-", 1)[0],
                                                                               part[1:].split("-", 1)[1])
            step, mult = 1, 0
            if "+" in rest:
                rest, step_s = rest.split("+", 1)
                step = to_int(step_s)
            elif "*" in rest:
                rest, mult_s = rest.split("*", 1)
                mult = to_int(mult_s)
            a, b = to_int(first), to_int(rest)
            if (mult and mult < 2) or (not mult and step < 1) or a > b:
                raise ValueError(f"invalid range '{part}'")
            x = a
            while x <= b:
                out.append(x)
                x = x * mult if mult else x + step
                if mult and x == 0:
                    break
        else:
            out.append(to_int(part))
    return out


def pg_values(s: str) -> list[tuple[int, int]]:
    """-pg 512,128 (one pair per flag, as llama-bench)."""
    parts = s.split(",")
    if len(parts) != 2:
        raise ValueError("expected <pp>,<tg>")
    return [(to_int(parts[0]), to_int(parts[1]))]


def kv_values(flag: str) -> Callable[[str], list[str]]:
    check = choice(flag, *CACHE_TYPES, *KV_TYPES)

    def parse(s: str) -> list[str]:
        vals = [check(x) for x in s.split(",") if x]
        bad = [v for v in vals if v not in KV_TYPES]
        if bad:
            raise BenchError(f"error: {flag} {bad[0]} is not supported: llamacmp's KV cache types are "
                             f"{', '.join(KV_TYPES)} (the CUDA backend: f16 or f32, the same for K and V)")
        return vals
    return parse


ONE_GPU = "llamacmp-bench runs on one GPU (or numpy with -ngl 0)"


def _only_zero(flag: str) -> Callable[[str], list[int]]:
    def parse(s: str) -> list[int]:
        values = int_values(s)
        if any(values):
            raise BenchError(f"error: {flag} {s} is not supported: {ONE_GPU}; pick the GPU with CUDA_VISIBLE_DEVICES")
        return values
    return parse


def fa_values(s: str) -> list[str]:
    names = {"0": "0", "off": "0", "false": "0", "1": "1", "on": "1", "true": "1", "auto": "auto", "-1": "auto"}
    out = []
    for x in (x for x in s.split(",") if x):
        if x not in names:
            raise ValueError(f"invalid flash attention value '{x}'")
        out.append(names[x])
    return out


def strings(s: str) -> list[str]:
    return [x for x in s.split(",") if x]


def spec_types(s: str) -> list[str]:
    out = []
    for x in strings(s):
        if x not in ("none", "draft-mtp"):
            raise BenchError(f"error: --spec-type {x} is not supported: llamacmp-bench runs none or draft-mtp")
        out.append(x)
    return out


def floats(s: str) -> list[float]:
    try:
        return [float(x) for x in strings(s)]
    except ValueError:
        raise ValueError(f"invalid number in '{s}'") from None


@dataclass(frozen=True)
class Opt:
    names: tuple[str, ...]
    key: str
    value: str
    help: str
    parse: Callable[[str], object] | None = None     # None: a flag without value
    unsupported: str = ""                            # refused with this reason, naming the flag
    noop: str = ""                                   # accepted, changes nothing: why (said on stderr)


OPTS: tuple[Opt, ...] = (
    Opt(("-h", "--help"), "help", "", "print this help and exit"),
    Opt(("-r", "--repetitions"), "reps", "<n>", "number of times to repeat each test", to_int),
    Opt(("--delay",), "delay", "<0...N> (seconds)", "delay between each test", to_int),
    Opt(("-o", "--output"), "output", "<csv|json|jsonl|md>", "output format printed to stdout",
        choice("-o", *OUTPUT_FORMATS)),
    Opt(("-oe", "--output-err"), "output_err", "<csv|json|jsonl|md>", "output format printed to stderr",
        choice("-oe", *OUTPUT_FORMATS)),
    Opt(("-v", "--verbose"), "verbose", "", "verbose output"),
    Opt(("--progress",), "progress", "", "print test progress indicators (to stderr)"),
    Opt(("--no-warmup",), "no_warmup", "", "skip the untimed warm-up run"),
    Opt(("-m", "--model"), "model", "<filename>", "model file (GGUF)", strings),
    Opt(("-p", "--n-prompt"), "n_prompt", "<n>", "prompt tokens (ppN test)", int_values),
    Opt(("-n", "--n-gen"), "n_gen", "<n>", "generated tokens (tgN test)", int_values),
    Opt(("-pg",), "pg", "<pp,tg>", "prompt then generation, timed together (ppN+tgM test)", pg_values),
    Opt(("-d", "--n-depth"), "n_depth", "<n>", "tokens already in the context before each test", int_values),
    Opt(("-b", "--batch-size"), "n_batch", "<n>", "logical batch size", int_values),
    Opt(("-ub", "--ubatch-size"), "n_ubatch", "<n>", "physical batch size (prompt chunk rows)", int_values),
    Opt(("-ctk", "--cache-type-k"), "type_k", "<t>", "KV cache type for K (" + ", ".join(KV_TYPES) + ")",
        kv_values("-ctk")),
    Opt(("-ctv", "--cache-type-v"), "type_v", "<t>", "KV cache type for V (" + ", ".join(KV_TYPES) + ")",
        kv_values("-ctv")),
    Opt(("-t", "--threads"), "n_threads", "<n>", "CPU threads (accepted; the engine's host side is one thread)",
        int_values, noop=CPU_THREADS),
    Opt(("-ngl", "--n-gpu-layers"), "n_gpu_layers", "<n>", "layers on the GPU (0: the numpy reference backend; "
        "any other value: all layers)", int_values),
    Opt(("-fa", "--flash-attn"), "flash_attn", "<0|1|auto>", "flash attention (accepted and reported: llamacmp's "
        "attention is always fused)", fa_values),
    Opt(("--version",), "version", "", "show version and build info"),
    Opt(("--offline",), "offline", "", "offline mode: llamacmp never downloads, so it is always offline"),
    Opt(("-sm", "--split-mode"), "split_mode", "<none|layer|row>", "split mode (llamacmp-bench runs on one GPU; "
        "row is refused)", lambda v: [split_mode(x) for x in strings(v)], noop=ONE_GPU),
    Opt(("-mg", "--main-gpu"), "main_gpu", "<i>", "main GPU: only 0 (llamacmp-bench runs on the first GPU)",
        _only_zero("-mg")),
    *(Opt(names, names[-1], value, f"accepted; changes nothing in llamacmp: {why}", strings, noop=why)
      for names, value, why in (
          (("-C", "--cpu-mask"), "<hex,hex>", CPU_THREADS), (("--cpu-strict",), "<0|1>", CPU_THREADS),
          (("--poll",), "<0...100>", CPU_THREADS), (("--prio",), "<-1|0|1|2|3>", CPU_THREADS),
          (("--numa",), "<distribute|isolate|numactl>", CPU_THREADS), (("-ncmoe", "--n-cpu-moe"), "<n>", DENSE),
          (("-nkvo", "--no-kv-offload"), "<0|1>", PLACEMENT), (("-ot", "--override-tensor"), "<pattern>=<type>",
                                                                  PLACEMENT),
          (("-nopo", "--no-op-offload"), "<0|1>", PLACEMENT), (("--no-host",), "<0|1>", PLACEMENT),
          (("--repack",), "<0|1>", "llamacmp has no CPU weight repacking"),
          (("-mmp", "--mmap"), "<0|1>", LOADING), (("-dio", "--direct-io"), "<0|1>", LOADING),
          (("-lm", "--load-mode"), "<mode>", LOADING), (("-lzm", "--lazy-mode"), "<on|auto|off>", LOADING),
          (("-fitt", "--fit-target"), "<MiB>", FIT), (("-fitc", "--fit-ctx"), "<n>", FIT),
          (("-hft", "--hf-token"), "<token>", "llamacmp does not download, so needs no token"))),
    *(Opt(names, names[-1], value, why, strings, unsupported=why) for names, value, why in (
        (("-hf", "-hfr", "--hf-repo"), "<user>/<model>[:quant]", DOWNLOAD), (("-hff", "--hf-file"), "<file>", DOWNLOAD),
        (("-dev", "--device"), "<dev0/dev1/...>", ONE_GPU + "; pick it with CUDA_VISIBLE_DEVICES"),
        (("-ts", "--tensor-split"), "<ts0/ts1/..>", ONE_GPU), (("-rpc", "--rpc"), "<servers>",
                                                               "ggml-rpc is not supported by llamacmp"),
        (("-embd", "--embeddings"), "<0|1>", "embeddings are not supported by llamacmp-bench"))),
    Opt(("--hw-route",), "hw_route", "<auto|dp4a|dp2a|imad|mma>", "llamacmp: which unit runs the quantized matmuls "
        "(docs/ROUTES.md; one value; the probe table and choice go to stderr and the JSON)",
        choice("--hw-route", *HW_ROUTES)),
    Opt(("--list-devices",), "list_devices", "", "not supported", unsupported="not supported by llamacmp yet: "
        "nvidia-smi -L lists the GPUs"),
    # llamacmp's own (llama-bench has no speculative decoding): tg rows with the MTP head drafting
    Opt(("--spec-type",), "spec_type", "<none|draft-mtp>", "llamacmp: speculative decoding for tg tests", spec_types),
    Opt(("--spec-draft-n-max",), "spec_n_max", "<n>", "llamacmp: most tokens drafted per step", int_values),
    Opt(("--spec-synth-len",), "spec_synth_len", "<L>", "llamacmp: synthetic mean acceptance length (llama.cpp's "
        "--spec-synth-len)", floats),
    Opt(("--spec-synth-rates",), "spec_synth_rates", "<P0,P1,...>", "llamacmp: synthetic acceptance rate per draft "
        "position (one list per flag)", lambda v: [tuple(floats(v))]),
)
DEFAULTS = {"reps": 5, "delay": 0, "output": "md", "output_err": None, "verbose": False, "progress": False,
            "no_warmup": False, "model": [], "n_prompt": [512], "n_gen": [128], "pg": [], "n_depth": [0],
            "n_batch": [2048], "n_ubatch": [512], "type_k": ["f16"], "type_v": ["f16"], "n_threads": [1],
            "n_gpu_layers": [99], "flash_attn": ["0"], "hw_route": "auto", "spec_type": ["none"], "spec_n_max": [3],
            "spec_synth_len": [], "spec_synth_rates": []}
LIST_KEYS = {"model", "n_prompt", "n_gen", "pg", "n_depth", "n_batch", "n_ubatch", "type_k", "type_v",
             "n_threads", "n_gpu_layers", "flash_attn", "spec_type", "spec_n_max", "spec_synth_len",
             "spec_synth_rates"}
SPEC_KEYS = ("spec_type", "spec_n_max", "spec_synth_len", "spec_synth_rates")
DEFAULT_MODEL = "models/7B/ggml-model-q4_0.gguf"


def usage_text() -> str:
    lines = ["usage: llamacmp-bench [options]", "", "options:"]
    for o in OPTS:
        head = ", ".join(o.names) + (f" {o.value}" if o.value else "")
        default = DEFAULTS.get(o.key)
        if isinstance(default, list):
            default = ",".join(f"{a[0]},{a[1]}" if isinstance(a, tuple) else str(a) for a in default) or \
                (DEFAULT_MODEL if o.key == "model" else "")
        shown = f" (default: {default})" if o.value and default is not None else ""
        lines.append(f"  {head:<40} {o.help}{shown}")
    lines += ["", "Multiple values can be given for each parameter by separating them with ','",
              "or by specifying the parameter multiple times. Ranges can be given as",
              "'first-last' or 'first-last+step' or 'first-last*mult'."]
    return "\n".join(lines) + "\n"


def parse_bench_args(argv: list[str]) -> dict:
    """argv -> settings (lists for the test parameters). Raises BenchError with llama-bench's wording."""
    by_name = {n: o for o in OPTS for n in o.names}
    given: dict[str, object] = {}
    noted: list[str] = []
    notes: list[str] = []               # one line per no-op option used, for stderr
    i = 0
    while i < len(argv):
        arg = argv[i]
        opt = by_name.get(arg)
        if opt is None:
            raise BenchError(f"error: invalid parameter for argument: {arg}")
        if opt.unsupported:
            raise BenchError(f"error: {arg} is not supported: {opt.unsupported}")
        if opt.noop and opt.names[0] not in noted:
            noted.append(opt.names[0])
            notes.append(f"llamacmp: {arg} changes nothing here: {opt.noop}")
        if opt.parse is None:
            given[opt.key] = True
            i += 1
            continue
        if i + 1 >= len(argv):
            raise BenchError(f"error: invalid parameter for argument: {arg}")
        try:
            value = opt.parse(argv[i + 1])
        except BenchError:
            raise
        except Unsupported as e:
            raise BenchError(str(e)) from None
        except ValueError as e:
            raise BenchError(f"error: invalid parameter for argument: {arg} ({str(e).strip()})") from None
        if opt.key in LIST_KEYS:
            given.setdefault(opt.key, [])
            given[opt.key] += value                   # type: ignore[operator]
        else:
            given[opt.key] = value
        i += 2
    s = {**DEFAULTS, **given, "notes": notes, "given": set(given)}
    if s["reps"] < 1:
        raise BenchError("error: -r must be at least 1")
    for key in ("n_prompt", "n_gen", "n_depth"):
        if any(v < 0 for v in s[key]):
            raise BenchError(f"error: negative value for {key}")
    if any(v < 1 for v in s["n_batch"] + s["n_ubatch"]):
        raise BenchError("error: -b and -ub must be at least 1")
    s["spec"] = spec_configs(s)
    return s


def spec_configs(s: dict) -> list[SpecConfig]:
    """The --spec-* combinations, each checked as llama.cpp checks its options at start."""
    synth = [(x, ()) for x in s["spec_synth_len"]] + [(None, r) for r in s["spec_synth_rates"]] or [(None, ())]
    if "draft-mtp" not in s["spec_type"]:
        given = [f"--{k.replace('_', '-').replace('spec-n-max', 'spec-draft-n-max')}" for k in SPEC_KEYS[1:]
                 if k in s["given"]]
        if given:
            raise BenchError(f"error: {', '.join(given)} need --spec-type draft-mtp")
    out = []                            # a "none" row is the MTP-off baseline: no synthetic setting applies
    for t, n, (length, rates) in itertools.product(s["spec_type"], s["spec_n_max"], synth):
        cfg = SpecConfig(t, n, synth_len=length, synth_rates=rates) if t != "none" else SpecConfig()
        try:
            spec.check(cfg)
        except SpecError as e:
            raise BenchError(f"error: {e}") from None
        out.append(cfg)
    return list(dict.fromkeys(out))


# -- instances and results ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instance:
    model: str
    n_prompt: int
    n_gen: int
    n_depth: int
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str
    n_threads: int
    n_gpu_layers: int
    flash_attn: str
    spec: SpecConfig = SpecConfig()      # llamacmp's: tg with the MTP head drafting

    @property
    def name(self) -> str:
        if self.n_prompt and self.n_gen:
            t = f"pp{self.n_prompt}+tg{self.n_gen}"
        elif self.n_prompt:
            t = f"pp{self.n_prompt}"
        else:
            t = f"tg{self.n_gen}"
        return t + (f" @ d{self.n_depth}" if self.n_depth else "")


def instances(s: dict) -> list[Instance]:
    """The cartesian product of the parameter lists, with -p and -n as separate tests and each -pg pair as one,
    in llama-bench's order (model outermost, tests innermost)."""
    out = []
    models = s["model"] or [DEFAULT_MODEL]
    for m, d, b, ub, tk, tv, nt, ngl, fa in itertools.product(
            models, s["n_depth"], s["n_batch"], s["n_ubatch"], s["type_k"], s["type_v"], s["n_threads"],
            s["n_gpu_layers"], s["flash_attn"]):
        base = dict(model=m, n_depth=d, n_batch=b, n_ubatch=ub, type_k=tk, type_v=tv, n_threads=nt,
                    n_gpu_layers=ngl, flash_attn=fa)
        tests = [(p, 0) for p in s["n_prompt"] if p > 0] + [(0, n) for n in s["n_gen"] if n > 0] + list(s["pg"])
        out += [Instance(n_prompt=p, n_gen=n, spec=sp if n else SpecConfig(), **base)
                for p, n in tests for sp in s["spec"]]
    return list(dict.fromkeys(out))        # a pp test does not draft: once, not once per --spec-* setting


@dataclass
class SpecUse:
    """How a spec row's timed repetitions drafted (the draft policy's rounds)."""
    spec: int = 0           # rounds that drafted (probes included)
    plain: int = 0          # plain decode steps
    probes: int = 0

    def add(self, policy) -> None:
        if policy is not None:
            self.spec += policy.n_spec
            self.plain += policy.n_plain
            self.probes += policy.n_probes

    @property
    def share(self) -> float:
        return self.spec / (self.spec + self.plain) if self.spec + self.plain else 0.0


def spec_label(cfg: SpecConfig) -> str:
    """The md "spec" cell: none, or the type with n_max and the synthetic acceptance."""
    if not cfg.enabled:
        return "none"
    synth = f" L{cfg.synth_len:g}" if cfg.synth_len is not None else \
        f" R{'/'.join(f'{r:g}' for r in cfg.synth_rates)}" if cfg.synth_rates else ""
    return f"mtp n{cfg.n_max}{synth}"


@dataclass
class Result:
    inst: Instance
    info: "ModelInfo"
    backend: str
    gpu_info: str
    samples_ns: list[int] = field(default_factory=list)
    test_time: str = ""
    probe: dict | None = None      # the backend's probe_report (CUDA): rates and routes
    draft: DraftStats = field(default_factory=DraftStats)     # over the timed repetitions (spec rows)
    use: SpecUse = field(default_factory=SpecUse)             # their rounds: drafted, plain, probes

    @property
    def n_tokens(self) -> int:
        return self.inst.n_prompt + self.inst.n_gen

    @property
    def samples_ts(self) -> list[float]:
        return [1e9 * self.n_tokens / ns for ns in self.samples_ns]

    @staticmethod
    def _mean_sd(xs: list[float]) -> tuple[float, float]:
        m = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
        return m, sd

    def fields(self) -> dict:
        """llama-bench's JSON/CSV fields (the ones llamacmp can fill)."""
        avg_ns, sd_ns = self._mean_sd([float(x) for x in self.samples_ns])
        avg_ts, sd_ts = self._mean_sd(self.samples_ts)
        i = self.inst
        return {
            "build_commit": build_commit(), "build_number": BUILD_NUMBER, "cpu_info": cpu_info(),
            "gpu_info": self.gpu_info, "backends": self.backend, "model_filename": i.model,
            "model_type": self.info.desc, "model_size": self.info.size, "model_n_params": self.info.n_params,
            "n_batch": i.n_batch, "n_ubatch": i.n_ubatch, "n_threads": i.n_threads, **FIXED_CPU,
            "type_k": i.type_k, "type_v": i.type_v, "n_gpu_layers": i.n_gpu_layers, **FIXED_PLACEMENT,
            "flash_attn": i.flash_attn, **FIXED_LOADING, "n_prompt": i.n_prompt, "n_gen": i.n_gen, "n_depth": i.n_depth, "test_time": self.test_time,
            "avg_ns": int(avg_ns), "stddev_ns": int(sd_ns), "avg_ts": avg_ts, "stddev_ts": sd_ts,
            "samples_ns": list(self.samples_ns), "samples_ts": self.samples_ts,
            **({"llamacmp_probe": self.probe} if self.probe else {}),
        }

    def spec_fields(self) -> dict:
        """llamacmp's fields for --spec-* runs (after llama-bench's, so its keys keep their order)."""
        sp = self.inst.spec
        return {"spec_type": sp.type, "spec_draft_n_max": sp.n_max if sp.enabled else 0,
                "spec_synth_len": sp.synth_len if sp.synth_len is not None else 0.0,
                "spec_synth_rates": ",".join(f"{r:g}" for r in sp.synth_rates),
                "draft_n": self.draft.n, "draft_n_accepted": self.draft.accepted,
                "spec_mean_len": self.draft.mean_len, "spec_draft_share": self.use.share,
                "spec_probes": self.use.probes}

    def spec_cell(self) -> str:
        """The md "spec" cell: the setting, and for a drafting row what it measured."""
        label = spec_label(self.inst.spec)
        if not self.inst.spec.enabled or not self.inst.n_gen:
            return label
        return f"{label} len {self.draft.mean_len:.2f} dr {100 * self.use.share:.0f}%"


# llama-bench's JSON/CSV fields for settings llamacmp has one value of (no CPU thread pinning or polling, no MoE,
# the whole model on the GPU(s), mmap'd GGUF): llama-bench's default values, so that scripts find every key
FIXED_CPU = {"cpu_mask": "0x0", "cpu_strict": False, "poll": 50}
FIXED_PLACEMENT = {"n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False}
FIXED_LOADING = {"devices": "auto", "tensor_split": "0.00", "tensor_buft_overrides": "none", "use_mmap": True,
                 "use_direct_io": False, "embeddings": False, "no_op_offload": 0, "no_host": False}


# -- printers --------------------------------------------------------------------------------------------------------

def _size_text(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.2f} MiB"


def _params_text(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.2f} K"


# column -> (header, width; negative = left-aligned). Optional columns appear only when a value differs from
# llama-bench's default, as llama-bench does.
MD_COLUMNS = {"model": ("model", -30), "size": ("size", 10), "params": ("params", 10), "backend": ("backend", -10),
              "n_gpu_layers": ("ngl", 3), "n_batch": ("n_batch", 7), "n_ubatch": ("n_ubatch", 8),
              "type_k": ("type_k", 6), "type_v": ("type_v", 6), "flash_attn": ("fa", 4), "spec": ("spec", -30),
              "test": ("test", 15), "t/s": ("t/s", 20)}
OPTIONAL = ("n_batch", "n_ubatch", "type_k", "type_v", "flash_attn")


class MarkdownPrinter:
    def __init__(self, out: TextIO, s: dict):
        self.out = out
        self.cols = ["model", "size", "params", "backend", "n_gpu_layers"]
        self.cols += [c for c in OPTIONAL if any(v != DEFAULTS[c][0] for v in s[c])]
        self.cols += ["spec"] if spec_given(s) else []
        self.cols += ["test", "t/s"]

    def _row(self, cells: list[str]) -> str:
        parts = []
        for c, text in zip(self.cols, cells):
            w = MD_COLUMNS[c][1]
            parts.append(text.ljust(-w) if w < 0 else text.rjust(w))
        return "| " + " | ".join(parts) + " |"

    def header(self) -> None:
        print(self._row([MD_COLUMNS[c][0] for c in self.cols]), file=self.out)
        seps = []
        for c in self.cols:
            w = MD_COLUMNS[c][1]
            seps.append("-" * abs(w) if w < 0 else "-" * (w - 1) + ":")
        print("| " + " | ".join(seps) + " |", file=self.out)

    def row(self, r: Result) -> None:
        f = r.fields()
        cell = {"model": r.info.desc, "size": _size_text(r.info.size), "params": _params_text(r.info.n_params),
                "backend": r.backend, "n_gpu_layers": str(r.inst.n_gpu_layers), "n_batch": str(r.inst.n_batch),
                "n_ubatch": str(r.inst.n_ubatch), "type_k": r.inst.type_k, "type_v": r.inst.type_v,
                "flash_attn": r.inst.flash_attn, "spec": r.spec_cell(), "test": r.inst.name,
                "t/s": f"{f['avg_ts']:.2f} ± {f['stddev_ts']:.2f}"}
        print(self._row([cell[c] for c in self.cols]), file=self.out)
        self.out.flush()

    def footer(self) -> None:
        print(f"\nbuild: {build_commit()} ({BUILD_NUMBER})", file=self.out)


def spec_given(s: dict) -> bool:
    return any(k in s.get("given", ()) for k in SPEC_KEYS)


def row_fields(r: Result, s: dict) -> dict:
    """llama-bench's fields, and llamacmp's spec fields when --spec-* was given."""
    return {**r.fields(), **(r.spec_fields() if spec_given(s) else {})}


class JsonPrinter:
    def __init__(self, out: TextIO, s: dict, lines: bool = False):
        self.out, self.lines, self.n, self.s = out, lines, 0, s

    def header(self) -> None:
        if not self.lines:
            print("[", file=self.out)

    def row(self, r: Result) -> None:
        if self.lines:
            print(json.dumps(row_fields(r, self.s)), file=self.out)
        else:
            text = json.dumps(row_fields(r, self.s), indent=2, ensure_ascii=False)
            # objects are separated as "},\n  {": the comma goes after the previous one, which ended unterminated
            self.out.write((",\n" if self.n else "") + "\n".join("  " + ln for ln in text.split("\n")))
        self.n += 1
        self.out.flush()

    def footer(self) -> None:
        if not self.lines:
            print(("\n" if self.n else "") + "]", file=self.out)


class CsvPrinter:
    SKIP = ("samples_ns", "samples_ts", "llamacmp_probe")

    def __init__(self, out: TextIO, s: dict):
        self.out, self.started, self.s = out, False, s

    def header(self) -> None:
        pass                     # the header needs the field names, printed with the first row

    @staticmethod
    def _quote(v) -> str:
        text = f"{v:.6f}" if isinstance(v, float) else str(v)
        return '"' + text.replace('"', '""') + '"'

    def row(self, r: Result) -> None:
        f = {k: v for k, v in row_fields(r, self.s).items() if k not in self.SKIP}
        if not self.started:
            print(",".join(f), file=self.out)
            self.started = True
        print(",".join(self._quote(v) for v in f.values()), file=self.out)
        self.out.flush()

    def footer(self) -> None:
        pass


def make_printer(fmt: str, out: TextIO, s: dict):
    if fmt == "md":
        return MarkdownPrinter(out, s)
    if fmt in ("json", "jsonl"):
        return JsonPrinter(out, s, lines=fmt == "jsonl")
    return CsvPrinter(out, s)


# -- environment facts ------------------------------------------------------------------------------------------

def build_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_info() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- the model and the timed runs ----------------------------------------------------------------------------------

@dataclass
class ModelInfo:
    desc: str          # "qwen35 9B Q8_0"
    size: int          # bytes of all tensors
    n_params: int


def model_info(f, n_params: int, size: int) -> ModelInfo:
    arch = f.architecture
    label = f.metadata.get("general.size_label")
    if not label:
        label = f"{n_params / 1e9:.0f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M" if n_params >= 1e6 \
            else f"{n_params / 1e3:.0f}K"
    ftype = FILE_TYPES.get(f.metadata.get("general.file_type"), "?")
    return ModelInfo(f"{arch} {label} {ftype}", size, n_params)


@dataclass
class Runner:
    """One loaded model on one backend, and the timed tests on it."""
    be: object
    cfg: object
    model: object
    info: ModelInfo
    is_cuda: bool
    rng: np.random.Generator
    path: str = ""
    mtp_head: bool = False              # the file has an MTP head (spec.has_mtp_head): --spec-type draft-mtp runs
    costs: dict = field(default_factory=dict)   # spec rows: the draft policy's CostTable per setting and depth

    def _ids(self, n: int) -> list[int]:
        return [int(i) for i in self.rng.integers(0, self.cfg.n_vocab, n)]

    def _sync(self) -> None:
        if self.is_cuda:
            self.be.synchronize()

    def _prefill(self, st, n: int, chunk: int, mtp=None) -> None:
        """n random tokens in chunks; mtp: (Speculator, its sequence), whose head then sees them too."""
        from ..backends.base import StepBatch
        ids = self._ids(n)
        for c0 in range(0, n, chunk):
            if mtp is None:
                self.model.forward(StepBatch.build([(st, ids[c0:c0 + chunk])]))
            else:
                mtp[0].prefill(st, mtp[1], ids[c0:c0 + chunk])
        self._sync()

    def _speculator(self, inst: Instance, n_ctx: int):
        """(the engine's draft-and-verify loop for this model, the sequence's head memory); a file without an MTP
        head is refused naming it, as llama.cpp refuses --spec-type draft-mtp there."""
        if not self.mtp_head:
            raise BenchError(f"error: {inst.name}: --spec-type draft-mtp: the model file '{self.path}' has no MTP "
                             "layers")
        from ..engine.draft_policy import CostTable
        from ..engine.speculative import Speculator
        costs = self.costs.setdefault((inst.spec, inst.n_depth, inst.type_k, inst.type_v), CostTable())
        sp = Speculator.from_spec(self.model, inst.spec, self.path, costs)
        return sp, sp.new_seq(n_ctx, inst.type_k, inst.type_v)

    def _spec_decoder(self, st, inst: Instance, mtp, draft: DraftStats | None):
        """-> step(n): n greedy tokens by draft (MTP head) and verify (one forward of the main model) or a plain
        step, as the draft policy chooses each round (the engine's loop), from a random first token; the synthetic
        acceptance of --spec-synth-* draws with seed 0. draft: counts the drafted and accepted tokens."""
        from types import SimpleNamespace
        from ..engine.decode import Decoder, draw_tokens
        from ..engine.speculative import accept_tokens
        from ..sampling import Sampler, SamplingParams
        sp, ms = mtp
        greedy = Sampler(SamplingParams(temp=0.0, seed=0))
        synth = synth_acceptor(inst.spec, 0, frozenset())
        first = self._ids(1)[0]
        sp.prepare([(st, ms)])      # CUDA graphs captured here, untimed, as _decoder's (nothing runs)
        if self.is_cuda:            # plain rounds: _decoder's greedy step graph, also giving the head's input h
            from ..backends.cuda_graphs import CapturedStep
            graph = CapturedStep(self.be, self.model, [st], greedy=True, hidden=True)

            def plain(tok: int) -> int:
                t0 = time.perf_counter()
                graph.set_tokens([tok])
                nxt = int(graph.step_greedy()[0])                   # (the id crossing waits for the step)
                sp.time_plain(1, time.perf_counter() - t0)
                sp.observe_plain([(st, ms, tok, 0)], graph.h)
                return nxt
        else:
            dec = Decoder(SimpleNamespace(model=self.model, backend=self.be), graphs=False, hidden=True)

            def plain(tok: int) -> int:
                t0 = time.perf_counter()
                logits, h = dec.decode_hidden([st], [tok])
                nxt = draw_tokens(self.be, logits, [greedy])[0]
                sp.time_plain(1, time.perf_counter() - t0)
                sp.observe_plain([(st, ms, tok, 0)], h)
                return nxt

        def step(n: int) -> None:
            tok, left = first, n
            while left > 0:
                k = sp.plan([ms])
                if k == 0:
                    tok, left = plain(tok), left - 1
                    continue
                (drafts,), logits, h, (v,) = sp.step([(st, ms, tok)], k)
                out: list[int] = []
                j = accept_tokens(self.be, logits, v, greedy, lambda t: out.append(t) or len(out) < left, synth)
                sp.commit(v, h, j)
                if draft is not None:
                    draft.count(min(len(drafts), left - 1), j - 1)    # (drafts past the last token: not counted)
                tok, left = out[-1], left - j
        return step

    def _decoder(self, st):
        """-> step(n): n greedy decode steps from a random first token. On CUDA the step graph is captured here
        (untimed: the capture runs nothing, and replays read the state's n_past when they run, so a prompt may
        still be processed between capture and the first step)."""
        from ..backends.base import StepBatch
        first = self._ids(1)[0]
        if self.is_cuda:
            from ..backends.cuda_graphs import CapturedStep
            graph = CapturedStep(self.be, self.model, [st], greedy=True)

            def step(n: int) -> None:
                graph.set_tokens([first])
                for _ in range(n):
                    graph.step_greedy()        # one int32 to the host per token: the per-token sync
            return step

        def step(n: int) -> None:
            tok = first
            for _ in range(n):
                logits = self.model.forward(StepBatch.build([(st, [tok])]))
                tok = int(np.argmax(self.be.to_host(logits)[-1]))
        return step

    def run(self, inst: Instance, warmup: bool = False, draft: DraftStats | None = None,
            use: SpecUse | None = None) -> int:
        """One repetition on a fresh context -> nanoseconds of the timed part (the -d fill and the graph capture
        are not timed). warmup: a short prompt or one decode step instead, untimed (llama-bench's warm-up; with
        --spec-type one full draft-and-verify step). draft, use: the spec rows' counters."""
        chunk = max(1, min(inst.n_batch, inst.n_ubatch))
        # + n_max: room for a full verify at the last step, so the spec rows replay graphs to the end
        n_ctx = inst.n_depth + inst.n_prompt + inst.n_gen + 1 + (inst.spec.n_max if inst.spec.enabled else 0)
        st = self.be.new_state(self.cfg, n_ctx, inst.type_k, inst.type_v)
        mtp = self._speculator(inst, n_ctx) if inst.spec.enabled else None
        if inst.n_depth:
            self._prefill(st, inst.n_depth, chunk, mtp)
        if not inst.n_gen:
            decode = None
        elif mtp is not None:
            decode = self._spec_decoder(st, inst, mtp, None if warmup else draft)
        else:
            decode = self._decoder(st)
        if warmup:
            if inst.n_prompt:
                self._prefill(st, min(inst.n_prompt, chunk), chunk, mtp)
            else:
                decode(min(inst.n_gen, inst.spec.n_max + 1) if mtp is not None else 1)
            return 0
        self._sync()
        t0 = time.perf_counter_ns()
        if inst.n_prompt:
            self._prefill(st, inst.n_prompt, chunk, mtp)
        if decode is not None:
            decode(inst.n_gen)
        self._sync()
        ns = time.perf_counter_ns() - t0
        if mtp is not None and use is not None:
            use.add(mtp[0].policy)
        return ns


def make_backend(ngl: int, err: TextIO, hw_route: str = "auto"):
    """-> (backend, backend column text, gpu_info); the backend's routes picked (--hw-route), the probe table on err."""
    from ..backends.numpy_ref import NumpyBackend
    from ..backends.routes import RouteError
    be, text, gpu = NumpyBackend(), "numpy", ""
    if ngl != 0:
        from ..backends.select import cuda_backend_or_none
        cuda = cuda_backend_or_none()
        if cuda is not None:
            be, text, gpu = cuda, "CUDA", cuda.native.device_name()
        else:
            err.write("warning: no CUDA GPU or libcmpkern.so found: using the numpy reference backend (slow)\n")
    try:
        for line in be.pick_routes(hw_route):
            err.write(line + "\n")
    except RouteError as e:
        raise BenchError(f"error: {e}") from None
    return be, text, gpu


def load_runner(path: str, be, is_cuda: bool) -> Runner:
    from ..config import ModelConfig
    from ..gguf_file import GGUFError, GGUFFile
    from ..models import model_class
    from ..weights import load_weights
    try:
        f = GGUFFile(path)
    except (OSError, GGUFError) as e:
        raise BenchError(f"error: failed to load model '{path}': {e}") from None
    n_vocab = f.info("token_embd.weight").shape[0]
    cfg = ModelConfig.from_metadata(f.metadata, n_vocab=n_vocab, tied=not f.has("output.weight"))
    n_params = sum(math.prod(f.info(n).shape) for n in f.names())
    size = int(sum(math.prod(f.info(n).shape) * TYPE_BYTES.get(f.info(n).type_name, 4) for n in f.names()))
    model = model_class(f.architecture)(cfg, load_weights(f, cfg), be)
    mtp_head = spec.has_mtp_head(f.names(), int(f.metadata.get(f"{f.architecture}.block_count", 0)))
    return Runner(be, cfg, model, model_info(f, n_params, size), is_cuda, np.random.default_rng(0), path, mtp_head)


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
