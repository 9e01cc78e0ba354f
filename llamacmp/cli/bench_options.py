"""llamacmp-bench's options: its own small table (llama-bench's list values, ranges and usage text), parsed into a
settings dict, and the --spec-* combinations checked as llama.cpp checks them."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

from .. import spec
from ..arg_values import CACHE_TYPES, Unsupported, choice, to_int
from ..args import CPU_THREADS, DENSE, DOWNLOAD, FIT, LOADING, PLACEMENT, split_mode
from ..backends.routes import HW_ROUTES
from ..kv_quant import KV_TYPES
from ..spec import AUTO, SpecConfig, SpecError


OUTPUT_FORMATS = ("md", "json", "jsonl", "csv")


class BenchError(Exception):
    """Printed to stderr; the tool exits with status 1."""


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


def draft_vocab_values(s: str) -> list[int | str]:
    """--spec-draft-vocab: a list of auto and llama-bench's int lists / ranges ('auto,0,32768')."""
    out: list[int | str] = []
    for part in strings(s):
        if part == AUTO:
            out.append(AUTO)
            continue
        try:
            ns = int_values(part)
        except ValueError:
            spec.parse_draft_vocab(part)            # raises, naming the values the flag takes
            raise
        out += [spec.parse_draft_vocab(str(v)) for v in ns]
    return out


def draft_coarse_values(s: str) -> list[int]:
    """--spec-draft-coarse: llama-bench's int lists / ranges of 0 (off) .. spec.COARSE_K_MAX ('16,0')."""
    return [spec.parse_draft_coarse(str(v)) for v in int_values(s)]


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
    Opt(("--spec-draft-vocab",), "spec_draft_vocab", "<auto|n>", "llamacmp: the MTP draft proposes only token ids "
        "0..n-1 (0: the whole vocabulary; auto: the first 32768 of a large vocabulary while the text stays in "
        "them)", draft_vocab_values),
    Opt(("--spec-draft-coarse",), "spec_draft_coarse", "<k>", "llamacmp: the MTP draft's argmax over a head of "
        "65536+ rows from a CQ2 copy of it, its k best ids rescored by the exact head (0: the exact head)",
        draft_coarse_values),
)
DEFAULTS = {"reps": 5, "delay": 0, "output": "md", "output_err": None, "verbose": False, "progress": False,
            "no_warmup": False, "model": [], "n_prompt": [512], "n_gen": [128], "pg": [], "n_depth": [0],
            "n_batch": [2048], "n_ubatch": [512], "type_k": ["f16"], "type_v": ["f16"], "n_threads": [1],
            "n_gpu_layers": [99], "flash_attn": ["0"], "hw_route": "auto", "spec_type": ["none"], "spec_n_max": [3],
            "spec_synth_len": [], "spec_synth_rates": [], "spec_draft_vocab": [AUTO],
            "spec_draft_coarse": [SpecConfig().draft_coarse]}
LIST_KEYS = {"model", "n_prompt", "n_gen", "pg", "n_depth", "n_batch", "n_ubatch", "type_k", "type_v",
             "n_threads", "n_gpu_layers", "flash_attn", "spec_type", "spec_n_max", "spec_synth_len",
             "spec_synth_rates", "spec_draft_vocab", "spec_draft_coarse"}
SPEC_KEYS = ("spec_type", "spec_n_max", "spec_synth_len", "spec_synth_rates", "spec_draft_vocab",
             "spec_draft_coarse")
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
    for t, n, (length, rates), v, c in itertools.product(s["spec_type"], s["spec_n_max"], synth,
                                                         s["spec_draft_vocab"], s["spec_draft_coarse"]):
        cfg = SpecConfig(t, n, synth_len=length, synth_rates=rates, draft_vocab=v, draft_coarse=c) \
            if t != "none" else SpecConfig()
        try:
            spec.check(cfg)
        except SpecError as e:
            raise BenchError(f"error: {e}") from None
        out.append(cfg)
    return list(dict.fromkeys(out))
