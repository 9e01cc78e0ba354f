"""The one option table for every tool, with llama.cpp's spelling, env vars, defaults and scope (common/arg.cpp).

Parsing follows llama.cpp: LLAMA_ARG_* variables first, then argv (a CLI flag over a set variable warns);
`_` reads as `-` in long options; errors print llama.cpp's messages and the tool exits with status 1.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from . import BUILD_NUMBER, __version__
from .arg_values import (CACHE_TYPES, ArgError, Unsupported, choice, device_list, gpu_layers, json_object,
                         kv_overrides, logit_bias, on_off_auto, process_escapes, read_text, tensor_split, to_bool,
                         to_count, to_float, to_int, to_port, to_seed)
from .kv_quant import KV_TYPES
from .split.bridges import BRIDGES as SPLIT_BRIDGES
from .backends.routes import HW_ROUTES
from .params import Params, tool_defaults
from .server.agent.mcp_config import McpConfig, parse_mcp_text
from .sampling import parse_sampler_letters, parse_sampler_names
from .spec import parse_draft_coarse, parse_draft_vocab, parse_synth_len, parse_synth_rates
from .spec import parse_type as parse_spec_type

ALL = frozenset({"cli", "completion", "server", "perplexity", "bench"})
KC = frozenset({"cli", "completion"})
KCS = frozenset({"cli", "completion", "server"})
NOT_S = ALL - {"server"}
TOK = frozenset({"tokenize"})


# -- the table ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]
    help: str
    dest: str = ""                       # Params field; "sampling.x" for SamplingParams.x
    value: str = ""                      # value hint ("N", "FNAME"); empty for flags
    parse: Callable[[str], Any] | None = None
    neg: tuple[str, ...] = ()            # names that set the negated value
    env: str = ""
    env_old: str = ""                    # b8462's name for the same variable, still read (current's `env` wins)
    tools: frozenset = ALL
    const: Any = True                    # what a positive flag stores
    append: bool = False                 # repeatable value collected into a list
    apply: Callable[[Params, Any], None] | None = None  # custom store
    unsupported: str = ""                # why llamacmp refuses it (said when used)
    noop: str = ""                       # accepted, changes nothing here: why (said once in the log when used)
    gguf_key: str = ""                   # general.sampling.<key> that may replace the default

    def usage(self) -> str:
        """One entry of --help, laid out as llama.cpp's common_arg::to_string."""
        names = list(self.names) + list(self.neg)
        head = names[0] if len(names) == 1 else (names[0] + ", ").ljust(7) + ", ".join(names[1:])
        if self.value:
            head += " " + self.value
        head = head + "\n" + " " * 40 if len(head) > 37 else head.ljust(40)
        text = self.help + (f"\n(env: {self.env})" if self.env else "")
        return head + ("\n" + " " * 40).join(text.split("\n")) + "\n"


def _set_file_prompt(p: Params, path: str) -> None:
    p.prompt, p.prompt_file = read_text(path), path


def _set_system_file(p: Params, path: str) -> None:
    p.system_prompt = read_text(path).rstrip("\n")


def _set_seq(p: Params, v: tuple) -> None:
    p.sampling.samplers = v


def _add_bias(p: Params, v: tuple[int, float]) -> None:
    p.sampling.logit_bias[v[0]] = v[1]


def _set_template_file(p: Params, path: str) -> None:
    p.chat_template, p.chat_template_file = read_text(path), path


def _set_kwargs(p: Params, v: dict) -> None:
    p.chat_template_kwargs.update(v)


def _set_interactive_first(p: Params, v: bool) -> None:
    p.interactive_first = v


def _set_verbose(p: Params, v: bool) -> None:
    p.verbosity = 99


def _dry_base(s: str) -> float:
    """llama.cpp keeps the old base when given one below 1 (DRY needs base >= 1); llamacmp says so instead."""
    x = to_float(s)
    if not x >= 1.0:
        raise ArgError(f"error: --dry-base must be at least 1.0, got {s}")
    return x


def _last_n(name: str) -> Callable[[str], int]:
    def parse(s: str) -> int:
        x = to_int(s)
        if x < -1:
            raise ArgError(f"error: invalid {name} = {x}\n")
        return x
    return parse


def _mirostat(s: str) -> int:
    """0, 1 or 2 (llama.cpp aborts on any other version when it builds the chain)."""
    x = to_int(s)
    if x not in (0, 1, 2):
        raise ArgError(f"error: --mirostat takes 0, 1 or 2, got {x}")
    return x


def _breaker(s: str) -> str:
    if s == "":
        raise ArgError("error: --dry-sequence-breaker takes a non-empty string (\"none\" for no breakers)")
    return s


def _add_breaker(p: Params, v: str) -> None:
    """The first --dry-sequence-breaker replaces the default breakers; `none` empties the list (llama.cpp)."""
    kept = p.sampling.dry_sequence_breakers if "--dry-sequence-breaker" in p.user_set else ()
    p.sampling.dry_sequence_breakers = () if v == "none" else (*kept, v)


def _cache_type(flag: str) -> Callable[[str], str]:
    """llama.cpp's names plus our tq3; the ones kv_quant does not implement yet are refused by name."""
    check = choice(flag, *CACHE_TYPES, "tq3")

    def parse(s: str) -> str:
        s = check(s)
        if s not in KV_TYPES:
            raise Unsupported(f"error: {flag} {s} is not supported: llamacmp's KV caches are {', '.join(KV_TYPES)}")
        return s
    return parse


def _fraction(flag: str) -> Callable[[str], float]:
    def parse(s: str) -> float:
        x = to_float(s)
        if not 0.0 < x <= 1.0:
            raise ValueError(f"{flag} must be in (0, 1], got {s}")
        return x
    return parse


SPLIT_ROW_REFUSAL = ("--split-mode row is not supported: llamacmp splits the model by layers (-sm layer, the "
                     "default) or keeps it on one GPU (-sm none)")


def split_mode(s: str) -> str:
    """-sm for every tool (llamacmp-bench too): row is refused at parse time, with one message."""
    s = choice("--split-mode", "none", "layer", "row")(s)
    if s == "row":
        raise Unsupported("error: " + SPLIT_ROW_REFUSAL)
    return s


def _mem_cap(s: str) -> int:
    from .memplan import parse_gib
    return parse_gib(s)


def _comma_list(s: str) -> list[str]:
    return [x for x in s.split(",") if x]


def _name_set(s: str) -> list[str]:
    # llama.cpp keeps aliases and tags in a std::set: stripped, unique, sorted (the first alias names the model)
    return sorted({x.strip() for x in s.split(",") if x.strip()})


def _add_images(p: Params, files: list[str]) -> None:
    p.image.extend(files)


def _media_dir(path: str) -> str:
    if not os.path.isdir(path):
        raise ArgError(f"not a directory: {path}")
    return path if path.endswith(os.sep) else path + os.sep


def _add_api_key_file(p: Params, path: str) -> None:
    keys = [line.strip() for line in read_text(path).splitlines() if line.strip()]
    p.server.api_keys.extend(keys)


S = frozenset({"server"})
CS = frozenset({"cli", "server"})
CMP = frozenset({"completion"})
PPL = frozenset({"perplexity"})

# Why a llama.cpp flag changes nothing in llamacmp (said once on stderr when used).
CPU_THREADS = "llamacmp's host side is one Python thread; the GPU (or numpy) does the arithmetic"
PLACEMENT = ("llamacmp keeps every weight and the KV cache on the GPU (or in numpy); placement changes speed and "
             "memory, not results, and the memory plan refuses what does not fit")
LOADING = "llamacmp maps the GGUF read-only with numpy.memmap and copies the weights to the device once"
DENSE = "the qwen35 models llamacmp runs are dense: there are no expert weights to place"
DOWNLOAD = "llamacmp does not download: download the GGUF and pass -m, or -hf for one already in the local cache"
PRESET = "this preset downloads a model; " + DOWNLOAD
ROUTER = ("llamacmp's router mode (no -m) loads no model yet: a request naming one gets llama-server's "
          "'model not found'; start one server per model with -m")
FIT = ("llamacmp never adjusts unset options to fit: its memory plan checks -c, -ctk/-ctv, -np and -ub before "
       "loading and refuses with what to change (docs/CLI.md)")
CLI_ONE_CONVERSATION = ("llamacmp-cli keeps one conversation's state; context checkpoints and the prompt cache are "
                        "llamacmp-server's")
NO_VIDEO = "llamacmp takes no video input (--video is refused)"
PPL_ONLY = "llamacmp-perplexity computes perplexity only; this benchmark is not supported yet"


def _noop(*names: str, why: str, value: str = "", tools=ALL, env: str = "", neg: tuple[str, ...] = ()) -> Option:
    return Option(names=names, help=f"accepted; changes nothing in llamacmp: {why}", value=value, tools=tools,
                  env=env, neg=neg, parse=str if value else None, apply=lambda p, v: None, noop=why)


def _default_only(*names: str, default: str, why: str, value: str = "N", tools=ALL, env: str = "",
                  parse: Callable[[str], Any] = to_float, accept: Callable[[Any], bool] | None = None) -> Option:
    """Accepted where it changes nothing (llama.cpp's default, or what `accept` allows); other values are refused
    naming the flag."""
    ok = accept or (lambda x: x == parse(default))

    def check(s: str) -> Any:
        if not ok(parse(s)):
            raise Unsupported(f"error: {names[-1]} {s} is not supported: {why}")
        return s
    return Option(names=names, help=f"only {default}, the default: {why}", value=value, tools=tools, env=env,
                  parse=check, apply=lambda p, v: None, noop=f"accepted at its default ({default}); other values "
                  f"are refused: {why}")


def _rope_scaling(s: str) -> str:
    s = choice("--rope-scaling", "none", "linear", "yarn")(s)
    if s == "yarn":
        raise Unsupported("error: --rope-scaling yarn is not supported: YaRN is not supported by llamacmp yet")
    return s


def _set_binary_prompt(p: Params, path: str) -> None:
    """-bf: the file's bytes as they are (llama.cpp reads it in binary mode)."""
    try:
        with open(path, "rb") as f:
            p.prompt = f.read().decode("utf-8", errors="replace")
    except OSError:
        raise ValueError(f"error: failed to open file '{path}'\n") from None
    p.prompt_file = path


def _api_prefix(s: str) -> str:
    if s and not s.startswith("/"):
        raise ValueError(f"--api-prefix must start with '/', got {s}")
    return s.rstrip("/")


def _mcp_json(s: str) -> McpConfig:
    return parse_mcp_text(s, "--mcp-servers-json")


def _mcp_file(path: str) -> McpConfig:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"failed to open MCP config file: {path} ({e.strerror})") from None
    return parse_mcp_text(text, path)


def _tool_names(s: str) -> list[str]:
    from .server.agent.builtin import NAMES        # the names are checked here, not when the server starts
    names = [x.strip() for x in s.split(",") if x.strip()]
    for name in names:
        if name != "all" and name not in NAMES:
            raise ValueError(f"unknown tool \"{name}\". available tools: {', '.join(NAMES)}")
    return names


def _tools_runtime(s: str) -> str:
    from .server.agent.runtime import check_spec
    return check_spec(s)


def _agent(p: Params, v) -> None:
    """-ag: every built-in tool and the MCP CORS proxy (--cors-origins is narrowed after parsing, _cors_default)."""
    if not v:                           # LLAMA_ARG_AGENT=0
        return _no_agent(p, v)
    p.server.tools, p.server.ui_mcp_proxy = ["all"], True


def _no_agent(p: Params, v) -> None:
    p.server.tools.clear()
    p.server.ui_mcp_proxy = False


def _cors_default(p: Params) -> list[str]:
    """Tools or MCP servers enabled and no --cors-origins: only localhost pages may call the server (0c1e570's
    common/arg.cpp; an MCP flag counts when given, even if it names no server)."""
    mcp = "server.mcp_file" in p.user_set or "server.mcp_json" in p.user_set
    if p.tool != "server" or not (p.server.tools or mcp) or "server.cors_origins" in p.user_set:
        return []
    p.server.cors_origins = "localhost"
    return ["warn: server tools or MCP servers are enabled, using localhost as default CORS origin (change via "
            "--cors-origins)"]


def _sleep_seconds(s: str) -> int:
    n = to_int(s)
    if n == 0 or n < -1:             # 0c1e570's words (common/arg.cpp)
        raise ValueError("invalid value: cannot be 0 or less than -1")
    return n


def _min_step(s: str) -> int:
    n = to_int(s)
    if n < 0:
        raise ValueError("checkpoint-min-step must be non-negative")
    if n == 0:
        raise Unsupported("error: --checkpoint-min-step 0 is not supported: llamacmp spaces checkpoints by at "
                          "least one token count (use -cpent -1 to turn them off)")
    return n


def _set_reasoning_effort(p: Params, level: str) -> None:
    if level != "default":
        p.chat_template_kwargs["reasoning_effort"] = level


def O(*names: str, **kw) -> Option:  # noqa: E743 - short constructor keeps the table readable
    return Option(names=names, **kw)


def _unsup(*names: str, why: str, value: str = "", tools=ALL, env: str = "", env_old: str = "") -> Option:
    return Option(names=names, help=why, value=value, tools=tools, env=env, env_old=env_old, unsupported=why)


# -- speculative decoding: 0c1e570's --spec-* names, b8462's --draft-* where 0c1e570 dropped them ------------------

DRAFT_FILES = ("llamacmp drafts only with the model's own MTP head (--spec-type draft-mtp); separate draft model "
               "files are not supported")
NGRAM = "n-gram speculative decoding is not supported by llamacmp (--spec-type draft-mtp is)"
DRAFT_CPU = CPU_THREADS + "; the MTP head runs with the main model"


def _set_spec(name: str) -> Callable[[Params, Any], None]:
    def apply(p: Params, v: Any) -> None:
        p.spec = replace(p.spec, **{name: v})
    return apply


def _add_spec_type(p: Params, v: str) -> None:
    """llama.cpp appends each --spec-type list to the types already set: a later `none` turns nothing off."""
    if v != "none":
        p.spec = replace(p.spec, type=v)


def _n_max(s: str) -> int:
    n = to_int(s)
    if n < 0:
        raise ValueError("invalid value")
    return n


def _spec_without_type(p: Params) -> list[str]:
    """--spec-draft-* settings change nothing while no --spec-type turns drafting on (llama.cpp is silent; we say
    it, so that a forgotten --spec-type is not mistaken for a slow draft)."""
    if p.spec.enabled:
        return []
    return [f"llamacmp: {o.names[0]} changes nothing here: no --spec-type draft-mtp" for o in SPEC_OPTIONS
            if o.names[0].startswith("--spec-draft-n")
            or o.names[0] in ("--spec-draft-p-min", "--spec-draft-vocab", "--spec-draft-coarse")
            if (o.dest or o.names[-1]) in p.user_set]


SPEC_OPTIONS: tuple[Option, ...] = (
    O("--spec-type", value="[none|draft-mtp]", parse=parse_spec_type, apply=_add_spec_type, env="LLAMA_ARG_SPEC_TYPE",
      tools=KCS, help="comma-separated list of types of speculative decoding to use (default: none)\nllamacmp runs "
      "draft-mtp, the model's own multi-token-prediction head; llama.cpp's other types are refused by name"),
    O("--spec-draft-n-max", "--draft", "--draft-n", "--draft-max", value="N", parse=_n_max, apply=_set_spec("n_max"),
      env="LLAMA_ARG_SPEC_DRAFT_N_MAX", env_old="LLAMA_ARG_DRAFT_MAX", tools=KCS,
      help="number of tokens to draft for speculative decoding (default: 3)\n--draft, --draft-n, --draft-max: "
      "b8462's names (0c1e570 removed them)"),
    O("--spec-draft-n-min", "--draft-min", "--draft-n-min", value="N", parse=to_int, apply=_set_spec("n_min"),
      env="LLAMA_ARG_SPEC_DRAFT_N_MIN", env_old="LLAMA_ARG_DRAFT_MIN", tools=KCS,
      help="minimum number of draft tokens to use for speculative decoding (default: 0)"),
    O("--spec-draft-p-min", "--draft-p-min", value="P", parse=to_float, apply=_set_spec("p_min"),
      env="LLAMA_ARG_SPEC_DRAFT_P_MIN", env_old="LLAMA_ARG_DRAFT_P_MIN", tools=KCS,
      help="minimum speculative decoding probability (greedy) (default: 0.00)"),
    O("--spec-draft-vocab", value="auto|N", parse=parse_draft_vocab, apply=_set_spec("draft_vocab"),
      env="LLAMA_ARG_SPEC_DRAFT_VOCAB", tools=KCS,
      help="llamacmp: the MTP draft proposes only token ids 0..N-1 (BPE ids are roughly most frequent first), so "
      "each draft step reads N rows of the LM head instead of all; the verify keeps the full vocabulary, so "
      "outputs do not change, only acceptance may. auto: on a vocabulary of 131072+ ids, the first 32768 while "
      "the generated text stays in them (the whole vocabulary once more than 16 of the last 128 tokens lie outside, "
      "back below 6); smaller vocabularies draft from all of it. 0 = the whole vocabulary (default: auto)"),
    O("--spec-draft-coarse", value="K", parse=parse_draft_coarse, apply=_set_spec("draft_coarse"),
      env="LLAMA_ARG_SPEC_DRAFT_COARSE", tools=KCS,
      help="llamacmp: where the MTP draft reads an LM head of 65536+ rows (the 248K vocabulary: 1.08 GB of Q8_0 a "
      "draft step), it takes its argmax from a 2-bit CQ2 copy of the head made at start (0.32 GB more device memory) "
      "and rescores that copy's K best ids with the exact head: the exact argmax whenever it is among them. The "
      "verify keeps the exact head, so outputs do not change, only acceptance may. 0 = off, the exact head "
      "(default: 16)"),
    O("--spec-synth-len", value="L", parse=parse_synth_len, apply=_set_spec("synth_len"),
      env="LLAMA_ARG_SPEC_SYNTH_LEN", tools=KCS,
      help="target mean synthetic acceptance length, including the target token (benchmarking only)"),
    O("--spec-synth-rates", value="P0,P1,...", parse=parse_synth_rates, apply=_set_spec("synth_rates"),
      env="LLAMA_ARG_SPEC_SYNTH_RATES", tools=KCS,
      help="comma-separated unconditional per-position synthetic acceptance probabilities (benchmarking only)"),
    _noop("--spec-draft-p-split", "--draft-p-split", value="P", env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT", tools=KCS,
          why="llama-server and llama-cli do not read it either (only llama.cpp's tree-speculative example does)"),
    _noop("--spec-draft-backend-sampling", neg=("--no-spec-draft-backend-sampling",), tools=KCS,
          env="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING",
          why="llamacmp has no separate draft sampler: the engine picks the draft tokens on its own backend"),
    *(_noop(*names, value=value, tools=KCS, why=DRAFT_CPU) for names, value in (
        (("--spec-draft-threads", "-td", "--threads-draft"), "N"),
        (("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"), "N"),
        (("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"), "M"),
        (("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"), "M"),
        (("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"), "lo-hi"),
        (("--spec-draft-cpu-range-batch", "-Crbd", "--cpu-range-batch-draft"), "lo-hi"),
        (("--spec-draft-cpu-strict", "--cpu-strict-draft"), "<0|1>"),
        (("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"), "<0|1>"),
        (("--spec-draft-poll", "--poll-draft"), "<0|1>"), (("--spec-draft-poll-batch", "--poll-batch-draft"), "<0|1>"),
        (("--spec-draft-prio", "--prio-draft"), "N"), (("--spec-draft-prio-batch", "--prio-batch-draft"), "N"))),
    _noop("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", value="N", tools=KCS,
          env="LLAMA_ARG_N_GPU_LAYERS_DRAFT", why=PLACEMENT),
    _noop("--spec-draft-override-tensor", "-otd", "--override-tensor-draft", tools=KCS,
          value="<tensor name pattern>=<buffer type>,...", why=PLACEMENT),
    _noop("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft", env="LLAMA_ARG_SPEC_DRAFT_CPU_MOE", tools=KCS,
          why=DENSE),
    _noop("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft", value="N", tools=KCS,
          env="LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE", why=DENSE),
    *(_default_only(*names, default="f16", value="TYPE", parse=str,
                    why="llamacmp has no separate KV cache type for the draft")
      for names in (("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"),
                    ("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"))),
    _unsup("--spec-draft-model", "-md", "--model-draft", value="FNAME", env="LLAMA_ARG_SPEC_DRAFT_MODEL",
           env_old="LLAMA_ARG_MODEL_DRAFT", tools=KCS, why=DRAFT_FILES),
    _unsup("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft", value="<user>/<model>[:quant]",
           env="LLAMA_ARG_SPEC_DRAFT_HF_REPO", why=DRAFT_FILES),
    _unsup("-cd", "--ctx-size-draft", value="N", env="LLAMA_ARG_CTX_SIZE_DRAFT", tools=KCS, why=DRAFT_FILES),
    _unsup("--spec-replace", value="TARGET DRAFT", tools=KCS, why=DRAFT_FILES),
    _unsup("--spec-draft-device", "-devd", "--device-draft", value="<dev1,dev2,..>", tools=KCS,
           why="the MTP head runs on the main model's device(s); a separate draft device list is not supported"),
    _unsup("--spec-default", tools=KCS, why=NGRAM),
    *(_unsup(name, value="N", tools=KCS, why=NGRAM) for name in (
        "--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits", "--spec-ngram-simple-size-n",
        "--spec-ngram-simple-size-m", "--spec-ngram-simple-min-hits", "--spec-ngram-map-k-size-n",
        "--spec-ngram-map-k-size-m", "--spec-ngram-map-k-min-hits", "--spec-ngram-map-k4v-size-n",
        "--spec-ngram-map-k4v-size-m", "--spec-ngram-map-k4v-min-hits", "--spec-ngram-mod-n-match",
        "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max")),
    _unsup("-lcs", "--lookup-cache-static", value="FNAME", tools=KCS, why=NGRAM),
    _unsup("-lcd", "--lookup-cache-dynamic", value="FNAME", tools=KCS, why=NGRAM),
)


OPTIONS: tuple[Option, ...] = (
    O("-h", "--help", "--usage", help="print usage and exit", dest="_help"),
    O("--version", help="show version and build info", dest="_version"),
    O("-m", "--model", value="FNAME", dest="model", parse=str, env="LLAMA_ARG_MODEL",
      tools=ALL | TOK, help="model path to load"),
    O("-p", "--prompt", value="PROMPT", dest="prompt", parse=str, tools=NOT_S | TOK,
      help="prompt to start generation with; for system message, use -sys"),
    O("-f", "--file", value="FNAME", parse=str, apply=_set_file_prompt, tools=NOT_S | TOK,
      help="a file containing the prompt (default: none)"),
    O("-sys", "--system-prompt", value="PROMPT", dest="system_prompt", parse=str, tools=KC,
      help="system prompt to use with model (if applicable, depending on chat template)"),
    O("-sysf", "--system-prompt-file", value="FNAME", parse=str, apply=_set_system_file, tools=KC,
      help="a file containing the system prompt (default: none)"),
    O("-n", "--predict", "--n-predict", value="N", dest="n_predict", parse=to_int, env="LLAMA_ARG_N_PREDICT",
      help="number of tokens to predict (default: -1, -1 = infinity)"),
    O("-c", "--ctx-size", value="N", dest="n_ctx", parse=to_count, env="LLAMA_ARG_CTX_SIZE",
      help="size of the prompt context (default: 0, 0 = loaded from model)"),
    O("-b", "--batch-size", value="N", dest="n_batch", parse=to_int, env="LLAMA_ARG_BATCH",
      help="logical maximum batch size (default: 2048)"),
    O("-ub", "--ubatch-size", value="N", dest="n_ubatch", parse=to_int, env="LLAMA_ARG_UBATCH",
      help="physical maximum batch size (default: 512)"),
    O("--keep", value="N", dest="n_keep", parse=to_int,
      help="number of tokens to keep from the initial prompt (default: 0, -1 = all)"),
    O("-t", "--threads", value="N", dest="threads", parse=to_int, env="LLAMA_ARG_THREADS", noop=CPU_THREADS,
      help="number of CPU threads to use during generation (default: -1)"),
    O("-ngl", "--gpu-layers", "--n-gpu-layers", value="N", dest="n_gpu_layers", parse=gpu_layers,
      env="LLAMA_ARG_N_GPU_LAYERS", help="max. number of layers to store in VRAM, either an exact number, "
      "'auto', or 'all' (default: auto)"),
    O("-fa", "--flash-attn", value="[on|off|auto]", dest="flash_attn", parse=on_off_auto("--flash-attn"),
      env="LLAMA_ARG_FLASH_ATTN", help="set Flash Attention use ('on', 'off', or 'auto', default: 'auto')"),
    O("-ctk", "--cache-type-k", value="TYPE", dest="cache_type_k", parse=_cache_type("--cache-type-k"),
      env="LLAMA_ARG_CACHE_TYPE_K", help="KV cache data type for K\nallowed values: " + ", ".join(KV_TYPES)
      + "\n(default: f16)"),
    O("-ctv", "--cache-type-v", value="TYPE", dest="cache_type_v", parse=_cache_type("--cache-type-v"),
      env="LLAMA_ARG_CACHE_TYPE_V", help="KV cache data type for V\nallowed values: " + ", ".join(KV_TYPES)
      + "\n(default: f16)"),
    # llamacmp's own long-context options (issue 7; llama.cpp has no equivalent: its --fit/-fitt keep a margin of
    # whatever memory is free, which cannot stand for a smaller card on a bigger one)
    O("--sparse-prefill", dest="sparse_prefill", neg=("--no-sparse-prefill",),
      help="block-sparse attention for long prompts: per head and prompt chunk, the key blocks chosen by a probe "
      "estimate (A-shape, vertical-slash or block-sparse) within --sparse-budget; dense below --sparse-min-len "
      "keys (default: disabled)"),
    O("--sparse-budget", value="F", dest="sparse_budget", parse=_fraction("--sparse-budget"),
      help="fraction of the causal key blocks each head may visit with --sparse-prefill (default: 0.25)"),
    O("--sparse-min-len", value="N", dest="sparse_min_len", parse=to_int,
      help="prompt chunks that see fewer keys than this stay dense with --sparse-prefill (default: 16384)"),
    O("--device-mem-cap", value="GiB", dest="device_mem_cap", parse=_mem_cap,
      help="most device memory the model, its KV cache and buffers may take, in GiB (or with a unit: 15500MiB); "
      "the memory plan is checked against it before loading (default: the GPU's free memory less 512 MiB)"),
    O("--hw-route", value="{auto,dp4a,dp2a,imad,mma}", dest="hw_route", parse=choice("--hw-route", *HW_ROUTES),
      tools=ALL - {"bench"},
      help="llamacmp: which unit runs the quantized matmuls (docs/ROUTES.md): auto = what the probe measures fastest\n"
      "on this card; dp4a, dp2a, imad force that int8 dot for decode and prefill; mma forces tensor cores for the\n"
      "prefill families only (decode stays dp4a). A route the card cannot run is refused (default: auto)"),
    O("-ts", "--tensor-split", value="N0,N1,N2,...", dest="tensor_split", parse=tensor_split,
      env="LLAMA_ARG_TENSOR_SPLIT", help="fraction of the model to offload to each GPU, comma-separated list of "
      "proportions, e.g. 3,1"),
    O("-sm", "--split-mode", value="{none,layer,row}", dest="split_mode", parse=split_mode,
      env="LLAMA_ARG_SPLIT_MODE",
      help="how to split the model across multiple GPUs (default: layer)"),
    O("-mg", "--main-gpu", value="INDEX", dest="main_gpu", parse=to_int, env="LLAMA_ARG_MAIN_GPU",
      help="the GPU to use for the model (with split-mode = none) (default: 0)"),
    O("-dev", "--device", value="<dev1,dev2,..>", dest="devices", parse=device_list, env="LLAMA_ARG_DEVICE",
      help="comma-separated list of devices to use for offloading (none = don't offload)\n"
      "(CUDA0, CUDA1, ... or indices; default: every visible GPU; llamacmp: the same device twice runs two\n"
      "split parts on one GPU)"),
    O("--split-bridge", value="{auto,host,peer}", dest="split_bridge", parse=choice("--split-bridge", *SPLIT_BRIDGES),
      help="llamacmp: how the hidden state crosses between GPUs with --split-mode layer: peer copies (P2P),\n"
      "pinned host memory (for cards without P2P), or auto = peer where P2P works (default: auto)"),
    O("-np", "--parallel", value="N", dest="n_parallel", parse=to_int, env="LLAMA_ARG_N_PARALLEL",
      help="number of parallel sequences to decode (default: 1)"),
    O("--mmap", dest="mmap", neg=("--no-mmap",), env="LLAMA_ARG_MMAP", noop=LOADING,
      help="whether to memory-map model (default: enabled)"),
    O("--mlock", dest="mlock", env="LLAMA_ARG_MLOCK", noop=LOADING + "; the host copy is not locked",
      help="force system to keep model in RAM"),
    O("-kvo", "--kv-offload", dest="kv_offload", neg=("-nkvo", "--no-kv-offload"), env="LLAMA_ARG_KV_OFFLOAD",
      noop=PLACEMENT, help="whether to enable KV cache offloading (default: enabled)"),
    O("--warmup", dest="warmup", neg=("--no-warmup",), noop="llamacmp runs no warm-up pass (its CUDA graphs are "
      "captured on the first decode)", help="whether to perform warmup with an empty run"),
    # sampling (seed..penalties carry the GGUF general.sampling.* key that may replace their default)
    O("-s", "--seed", value="SEED", dest="sampling.seed", parse=to_seed,
      help="RNG seed (default: -1, use random seed for -1)"),
    O("--samplers", value="SAMPLERS", parse=parse_sampler_names, apply=_set_seq, gguf_key="sequence",
      help="samplers that will be used for generation in the order, separated by ';'\n(default: "
      "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)"),
    O("--sampling-seq", "--sampler-seq", value="SEQUENCE", parse=parse_sampler_letters, apply=_set_seq,
      gguf_key="sequence", help="simplified sequence for samplers that will be used (default: edskypmxt)"),
    O("--ignore-eos", dest="sampling.ignore_eos",
      help="ignore end of stream token and continue generating (implies --logit-bias EOS-inf)"),
    O("--temp", "--temperature", value="N", dest="sampling.temp", parse=to_float, gguf_key="temp",
      help="temperature (default: 0.80)"),
    O("--top-k", value="N", dest="sampling.top_k", parse=to_int, env="LLAMA_ARG_TOP_K", gguf_key="top_k",
      help="top-k sampling (default: 40, 0 = disabled)"),
    O("--top-p", value="N", dest="sampling.top_p", parse=to_float, gguf_key="top_p",
      help="top-p sampling (default: 0.95, 1.0 = disabled)"),
    O("--min-p", value="N", dest="sampling.min_p", parse=to_float, gguf_key="min_p",
      help="min-p sampling (default: 0.05, 0.0 = disabled)"),
    O("--typical", "--typical-p", value="N", dest="sampling.typ_p", parse=to_float,
      help="locally typical sampling, parameter p (default: 1.00, 1.0 = disabled)"),
    O("--min-keep", value="N", dest="sampling.min_keep", parse=to_int,
      help="minimum number of tokens each sampler must keep (default: 0)"),
    O("--repeat-last-n", value="N", dest="sampling.penalty_last_n", parse=to_int, gguf_key="penalty_last_n",
      help="last n tokens to consider for penalize (default: 64, 0 = disabled, -1 = ctx_size)"),
    O("--repeat-penalty", value="N", dest="sampling.penalty_repeat", parse=to_float, gguf_key="penalty_repeat",
      help="penalize repeat sequence of tokens (default: 1.00, 1.0 = disabled)"),
    O("--presence-penalty", value="N", dest="sampling.penalty_present", parse=to_float,
      help="repeat alpha presence penalty (default: 0.00, 0.0 = disabled)"),
    O("--frequency-penalty", value="N", dest="sampling.penalty_freq", parse=to_float,
      help="repeat alpha frequency penalty (default: 0.00, 0.0 = disabled)"),
    O("-l", "--logit-bias", value="TOKEN_ID(+/-)BIAS", parse=logit_bias, apply=_add_bias,
      help="modifies the likelihood of token appearing in the completion,\ni.e. `--logit-bias 15043+1` to "
      "increase likelihood of token ' Hello',\nor `--logit-bias 15043-1` to decrease likelihood of token ' Hello'"),
    O("--dry-multiplier", value="N", dest="sampling.dry_multiplier", parse=to_float,
      help="set DRY sampling multiplier (default: 0.00, 0.0 = disabled)"),
    O("--dry-base", value="N", dest="sampling.dry_base", parse=_dry_base,
      help="set DRY sampling base value (default: 1.75)"),
    O("--dry-allowed-length", value="N", dest="sampling.dry_allowed_length", parse=to_int,
      help="set allowed length for DRY sampling (default: 2)"),
    O("--dry-penalty-last-n", value="N", dest="sampling.dry_penalty_last_n", parse=_last_n("dry-penalty-last-n"),
      help="set DRY penalty for the last n tokens (default: -1, 0 = disable, -1 = context size)"),
    O("--dry-sequence-breaker", value="STRING", parse=_breaker, apply=_add_breaker,
      help="add sequence breaker for DRY sampling, clearing out default breakers ('\\n', ':', '\"', '*') in the "
      "process; use \"none\" to not use any sequence breakers"),
    O("--xtc-probability", value="N", dest="sampling.xtc_probability", parse=to_float, gguf_key="xtc_probability",
      help="xtc probability (default: 0.00, 0.0 = disabled)"),
    O("--xtc-threshold", value="N", dest="sampling.xtc_threshold", parse=to_float, gguf_key="xtc_threshold",
      help="xtc threshold (default: 0.10, 1.0 = disabled)"),
    O("--top-nsigma", "--top-n-sigma", value="N", dest="sampling.top_n_sigma", parse=to_float,
      help="top-n-sigma sampling (default: -1.00, -1.0 = disabled)"),
    O("--dynatemp-range", value="N", dest="sampling.dynatemp_range", parse=to_float,
      help="dynamic temperature range (default: 0.00, 0.0 = disabled)"),
    O("--dynatemp-exp", value="N", dest="sampling.dynatemp_exponent", parse=to_float,
      help="dynamic temperature exponent (default: 1.00)"),
    O("--mirostat", value="N", dest="sampling.mirostat", parse=_mirostat, gguf_key="mirostat",
      help="use Mirostat sampling.\nTop K, Nucleus and Locally Typical samplers are ignored if used.\n"
      "(default: 0, 0 = disabled, 1 = Mirostat, 2 = Mirostat 2.0)"),
    O("--mirostat-lr", value="N", dest="sampling.mirostat_eta", parse=to_float, gguf_key="mirostat_eta",
      help="Mirostat learning rate, parameter eta (default: 0.10)"),
    O("--mirostat-ent", value="N", dest="sampling.mirostat_tau", parse=to_float, gguf_key="mirostat_tau",
      help="Mirostat target entropy, parameter tau (default: 5.00)"),
    O("--override-kv", value="KEY=TYPE:VALUE,...", parse=kv_overrides, apply=lambda p, v: p.kv_overrides.update(v),
      help="advanced option to override model metadata by key. to specify multiple overrides, either use\n"
      "comma-separated values.\ntypes: int, float, bool, str. example: --override-kv "
      "tokenizer.ggml.add_bos_token=bool:false,tokenizer.ggml.add_eos_token=bool:false"),
    O("--grammar", value="GRAMMAR", dest="grammar", parse=str,
      help="BNF-like grammar to constrain generations (see samples in grammars/ dir) (default: '')"),
    O("--grammar-file", value="FNAME", dest="grammar", parse=read_text, help="file to read grammar from"),
    O("-j", "--json-schema", value="SCHEMA", dest="json_schema", parse=json_object,
      help="JSON schema to constrain generations (https://json-schema.org/), e.g. `{}` for any JSON object"),
    O("-jf", "--json-schema-file", value="FILE", dest="json_schema", parse=lambda path: json_object(read_text(path)),
      help="File containing a JSON schema to constrain generations"),
    # conversation and display
    O("-cnv", "--conversation", dest="conversation", neg=("-no-cnv", "--no-conversation"), tools=KC,
      help="whether to run in conversation mode:\n- does not print special tokens and suffix/prefix\n"
      "- interactive mode is also enabled\n(default: auto enabled if chat template is available)"),
    O("-i", "--interactive", dest="interactive", tools=frozenset({"completion"}),
      help="run in interactive mode"),
    O("-if", "--interactive-first", dest="interactive_first", tools=frozenset({"completion"}),
      apply=_set_interactive_first, help="run in interactive mode and wait for input right away"),
    O("-r", "--reverse-prompt", value="PROMPT", dest="antiprompt", parse=str, append=True, tools=KCS,
      help="halt generation at PROMPT, return control in interactive mode"),
    O("-st", "--single-turn", dest="single_turn", tools=KC,
      help="run conversation for a single turn only, then exit when done"),
    O("-mli", "--multiline-input", dest="multiline_input", tools=KC,
      help="allows you to write or paste multiple lines without ending each in '\\'"),
    O("--in-prefix-bos", dest="input_prefix_bos", tools=frozenset({"completion"}),
      help="prefix BOS to user inputs, preceding the `--in-prefix` string"),
    O("--in-prefix", value="STRING", dest="input_prefix", parse=str, tools=frozenset({"completion"}),
      help="string to prefix user inputs with (default: empty)"),
    O("--in-suffix", value="STRING", dest="input_suffix", parse=str, tools=frozenset({"completion"}),
      help="string to suffix after user inputs with (default: empty)"),
    O("-sp", "--special", dest="special", tools=KCS, help="special tokens output enabled (default: false)"),
    O("-e", "--escape", dest="escape", neg=("--no-escape",), tools=ALL | TOK,
      help="process escapes sequences (\\n, \\r, \\t, \\', \\\", \\\\) (default: true)"),
    O("--display-prompt", dest="display_prompt", neg=("--no-display-prompt",), tools=KC,
      help="whether to print prompt at generation (default: true)"),
    O("--verbose-prompt", dest="verbose_prompt", help="print a verbose prompt before generation (default: false)"),
    O("--simple-io", dest="simple_io", tools=KC,
      help="use basic IO for better compatibility in subprocesses and limited consoles"),
    O("--show-timings", dest="show_timings", neg=("--no-show-timings",), env="LLAMA_ARG_SHOW_TIMINGS",
      tools=frozenset({"cli"}), help="whether to show timing information after each response (default: true)"),
    O("-co", "--color", value="[on|off|auto]", dest="color", parse=on_off_auto("--color"), tools=KC,
      help="Colorize output to distinguish prompt and user input from generations"),
    # chat template and reasoning
    O("--jinja", dest="use_jinja", neg=("--no-jinja",), env="LLAMA_ARG_JINJA", tools=KCS,
      help="whether to use jinja template engine for chat (default: enabled for cli and server)"),
    O("--chat-template", value="JINJA_TEMPLATE", dest="chat_template", parse=str, env="LLAMA_ARG_CHAT_TEMPLATE",
      tools=KCS, help="set custom jinja chat template (default: template taken from model's metadata)"),
    O("--chat-template-file", value="JINJA_TEMPLATE_FILE", parse=str, apply=_set_template_file,
      env="LLAMA_ARG_CHAT_TEMPLATE_FILE", tools=KCS, help="set custom jinja chat template file"),
    O("--chat-template-kwargs", value="STRING", parse=json_object, apply=_set_kwargs,
      env="LLAMA_CHAT_TEMPLATE_KWARGS", tools=frozenset({"cli", "server"}),
      help="sets additional params for the json template parser, must be a valid json object string, "
      "e.g. '{\"key1\":\"value1\",\"key2\":\"value2\"}'"),
    O("--reasoning-format", value="FORMAT", dest="reasoning_format", env="LLAMA_ARG_THINK", tools=KCS,
      parse=choice("--reasoning-format", "none", "deepseek", "deepseek-legacy", "auto"),
      help="controls whether thought tags are allowed and/or extracted from the response (default: auto)"),
    O("-rea", "--reasoning", value="[on|off|auto]", dest="reasoning", parse=on_off_auto("--reasoning"),
      env="LLAMA_ARG_REASONING", tools=KCS, help="use reasoning/thinking in the chat ('on', 'off', or 'auto', "
      "default: 'auto' (detect from template))"),
    O("--reasoning-budget", value="N", dest="reasoning_budget", parse=to_int, env="LLAMA_ARG_THINK_BUDGET",
      tools=KCS, help="token budget for thinking: -1 for unrestricted, 0 for immediate end, N>0 for token budget"),
    O("--reasoning-budget-message", value="MESSAGE", dest="reasoning_budget_message", parse=str,
      env="LLAMA_ARG_THINK_BUDGET_MESSAGE", tools=KCS,
      help="message injected before the end-of-thinking tag when reasoning budget is exhausted"),
    # logging
    O("--log-disable", dest="log_disable", tools=ALL | TOK, help="Log disable"),
    O("--log-file", value="FNAME", dest="log_file", parse=str, env="LLAMA_LOG_FILE", help="Log to file"),
    O("-v", "--verbose", "--log-verbose", apply=_set_verbose, dest="_verbose",
      help="Set verbosity level to infinity (i.e. log all messages, useful for debugging)"),
    O("-lv", "--verbosity", "--log-verbosity", value="N", dest="verbosity", parse=to_int,
      env="LLAMA_LOG_VERBOSITY", help="Set the verbosity threshold. Messages with a higher verbosity will be "
      "ignored."),
    # multimodal (tools/mtmd): the vision projector and images
    O("-mm", "--mmproj", value="FILE", dest="mmproj", parse=str, env="LLAMA_ARG_MMPROJ", tools=frozenset({"cli", "server"}),
      help="path to a multimodal projector file. see tools/mtmd/README.md\nnote: if -hf is used, this argument can be "
      "omitted"),
    O("--mmproj-auto", dest="mmproj_auto", neg=("--no-mmproj", "--no-mmproj-auto"), env="LLAMA_ARG_MMPROJ_AUTO",
      tools=frozenset({"cli", "server"}),
      help="whether to use multimodal projector file (if available), useful when using -hf (default: enabled)"),
    O("--image", value="FILE", dest="image", parse=_comma_list, tools=frozenset({"cli"}), apply=_add_images,
      help="path to an image or audio file. use with multimodal models, use comma-separated values for multiple "
      "files\n"),
    O("--image-min-tokens", value="N", dest="image_min_tokens", parse=to_int, env="LLAMA_ARG_IMAGE_MIN_TOKENS",
      tools=frozenset({"cli", "server"}), help="minimum number of tokens each image can take, only used by vision "
      "models with dynamic resolution (default: read from model)"),
    O("--image-max-tokens", value="N", dest="image_max_tokens", parse=to_int, env="LLAMA_ARG_IMAGE_MAX_TOKENS",
      tools=frozenset({"cli", "server"}), help="maximum number of tokens each image can take, only used by vision "
      "models with dynamic resolution (default: read from model)"),
    O("--media-path", value="PATH", dest="server.media_path", parse=_media_dir, tools=frozenset({"server"}),
      help="directory for loading local media files; files can be accessed via file:// URLs using relative paths "
      "(default: disabled)"),
    # llama-server
    O("--host", value="HOST", dest="server.host", parse=str, env="LLAMA_ARG_HOST", tools=S,
      help="ip address to listen, or bind to an UNIX socket if the address ends with .sock (default: 127.0.0.1)"),
    O("--port", value="PORT", dest="server.port", parse=to_port, env="LLAMA_ARG_PORT", tools=S,
      help="port to listen (default: 8080)"),
    O("--api-key", value="KEY", dest="server.api_keys", parse=_comma_list, env="LLAMA_API_KEY", tools=S,
      help="API key to use for authentication, multiple keys can be provided as a comma-separated list "
      "(default: none)"),
    O("--api-key-file", value="FNAME", parse=str, apply=_add_api_key_file, tools=S,
      help="path to file containing API keys (default: none)"),
    O("-a", "--alias", value="STRING", dest="server.aliases", parse=_name_set, env="LLAMA_ARG_ALIAS", tools=S,
      help="set model name aliases, comma-separated (to be used by API)"),
    O("-to", "--timeout", value="N", dest="server.timeout", parse=to_int, env="LLAMA_ARG_TIMEOUT", tools=S,
      help="server read/write timeout in seconds (default: 600)"),
    O("--threads-http", value="N", dest="server.threads_http", parse=to_int, env="LLAMA_ARG_THREADS_HTTP",
      tools=S, noop="llamacmp-server answers HTTP on one asyncio event loop", help="number of threads used to process HTTP requests (default: -1)"),
    O("--metrics", dest="server.endpoint_metrics", env="LLAMA_ARG_ENDPOINT_METRICS", tools=S,
      help="enable prometheus compatible metrics endpoint (default: disabled)"),
    O("--slots", dest="server.endpoint_slots", neg=("--no-slots",), env="LLAMA_ARG_ENDPOINT_SLOTS", tools=S,
      help="expose slots monitoring endpoint (default: enabled)"),
    O("--props", dest="server.endpoint_props", env="LLAMA_ARG_ENDPOINT_PROPS", tools=S,
      help="enable changing global properties via POST /props (default: disabled)"),
    O("--embedding", "--embeddings", dest="server.embedding", env="LLAMA_ARG_EMBEDDINGS", tools=S,
      help="restrict to only support embedding use case; use only with dedicated embedding models (default: "
           "disabled)"),
    O("--pooling", value="{none,mean,cls,last,rank}", dest="server.pooling", env="LLAMA_ARG_POOLING", tools=S,
      parse=choice("--pooling", "none", "mean", "cls", "last"),
      help="pooling type for embeddings, use model default if unspecified (rank: reranking, not supported)"),
    O("--embd-normalize", value="N", dest="server.embd_normalize", parse=to_int, tools=S,
      help="normalisation for embeddings (default: 2) (-1=none, 0=max absolute int16, 1=taxicab, 2=euclidean, "
      ">2=p-norm)\nllamacmp-server: the default of a request's embd_normalize"),
    O("-cb", "--cont-batching", dest="server.cont_batching", neg=("-nocb", "--no-cont-batching"),
      env="LLAMA_ARG_CONT_BATCHING", tools=S, noop="llamacmp's scheduler always batches the slots continuously",
      help="enable continuous batching (default: enabled)"),
    O("-kvu", "--kv-unified", dest="server.kv_unified", neg=("-no-kvu", "--no-kv-unified"),
      env="LLAMA_ARG_KV_UNIFIED", tools=S, help="use single unified KV buffer shared across all sequences "
      "(default: enabled if number of slots is auto)"),
    O("--cache-prompt", dest="server.cache_prompt", neg=("--no-cache-prompt",), env="LLAMA_ARG_CACHE_PROMPT",
      tools=S, help="whether to enable prompt caching (default: enabled)"),
    O("-cram", "--cache-ram", value="N", dest="server.cache_ram_mib", parse=to_int, env="LLAMA_ARG_CACHE_RAM",
      tools=S, help="set the maximum cache size in MiB (default: 8192, -1 - no limit, 0 - disable)"),
    O("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", value="N", dest="server.ctx_checkpoints",
      parse=to_int, env="LLAMA_ARG_CTX_CHECKPOINTS", tools=S,
      help="max number of context checkpoints to create per slot (default: 32)"),
    O("-cpent", "--checkpoint-every-n-tokens", value="N", dest="server.checkpoint_every", parse=to_int,
      env="LLAMA_ARG_CHECKPOINT_EVERY_NT", tools=S,
      help="create a checkpoint every n tokens during prefill (processing), -1 to disable (default: 8192)"),
    O("-sps", "--slot-prompt-similarity", value="SIMILARITY", dest="server.slot_prompt_similarity",
      parse=to_float, tools=S, help="how much the prompt of a request must match the prompt of a slot in order "
      "to use that slot (default: 0.10, 0.0 = disabled)"),
    O("--prefill-assistant", dest="server.prefill_assistant", neg=("--no-prefill-assistant",),
      env="LLAMA_ARG_PREFILL_ASSISTANT", tools=S,
      help="whether to prefill the assistant's response if the last message is an assistant message "
      "(default: enabled)"),
    O("--slot-save-path", value="PATH", dest="server.slot_save_path", parse=str, tools=S,
      help="path to save slot kv cache (default: disabled)"),
    O("--ui", "--webui", dest="server.webui", neg=("--no-ui", "--no-webui"), env="LLAMA_ARG_UI",
      env_old="LLAMA_ARG_WEBUI", tools=S, help="whether to enable the Web UI (default: enabled)\nllamacmp: its own "
      "chat page (llamacmp/server/webui.html), not llama.cpp's"),
    O("--path", value="PATH", dest="server.public_path", parse=str, env="LLAMA_ARG_STATIC_PATH", tools=S,
      help="path to serve static files from (default: )"),
    # perplexity
    O("--chunks", value="N", dest="n_chunks", parse=to_int, tools=frozenset({"perplexity"}),
      help="max number of chunks to process (default: -1, -1 = all)"),
    O("--ppl-stride", value="N", dest="ppl_stride", parse=to_int, tools=frozenset({"perplexity"}),
      help="stride for perplexity calculation (default: 0)"),
    O("--ppl-output-type", value="<0|1>", dest="ppl_output_type", parse=to_int, tools=frozenset({"perplexity"}),
      help="output type for perplexity calculation (default: 0)"),
    # llama-tokenize's own options
    O("--ids", dest="ids_only", tools=TOK, help="if given, only print numerical token IDs, and not token strings."),
    O("--stdin", dest="read_stdin", tools=TOK, help="read prompt from standard input."),
    O("--no-bos", dest="no_bos", tools=TOK, help="do not ever add a BOS token to the prompt."),
    O("--no-parse-special", dest="no_parse_special", tools=TOK, help="do not parse control tokens."),
    O("--show-count", dest="show_count", tools=TOK, help="print the total number of tokens."),
    # ---- llama.cpp flags (b8462 and 0c1e570) that change nothing in llamacmp: accepted, said once on stderr ----
    _noop("-tb", "--threads-batch", value="N", env="LLAMA_ARG_THREADS_BATCH", why=CPU_THREADS),
    _noop("-C", "--cpu-mask", value="M", why=CPU_THREADS),
    _noop("-Cr", "--cpu-range", value="lo-hi", why=CPU_THREADS),
    _noop("--cpu-strict", value="<0|1>", why=CPU_THREADS),
    _noop("--prio", value="N", why=CPU_THREADS),
    _noop("--poll", value="<0...100>", why=CPU_THREADS),
    _noop("-Cb", "--cpu-mask-batch", value="M", why=CPU_THREADS),
    _noop("-Crb", "--cpu-range-batch", value="lo-hi", why=CPU_THREADS),
    _noop("--cpu-strict-batch", value="<0|1>", why=CPU_THREADS),
    _noop("--prio-batch", value="N", why=CPU_THREADS),
    _noop("--poll-batch", value="<0|1>", why=CPU_THREADS),
    _noop("--numa", value="TYPE", why=CPU_THREADS),
    _noop("-ot", "--override-tensor", value="<tensor name pattern>=<buffer type>,...", why=PLACEMENT),
    _noop("-ncffn", "--n-cpu-ffn", value="N", why=PLACEMENT),
    _noop("--no-host", why=PLACEMENT),
    _noop("--op-offload", neg=("-nopo", "--no-op-offload"), why=PLACEMENT),
    _noop("-cmoe", "--cpu-moe", env="LLAMA_ARG_CPU_MOE", why=DENSE),
    _noop("-ncmoe", "--n-cpu-moe", value="N", env="LLAMA_ARG_N_CPU_MOE", why=DENSE),
    _noop("--repack", neg=("-nr", "--no-repack"), why="llamacmp has no CPU weight repacking"),
    _noop("-lm", "--load-mode", value="MODE", env="LLAMA_ARG_LOAD_MODE", why=LOADING),
    _noop("-lzm", "--lazy-mode", value="MODE", why=LOADING),
    _noop("-dio", "--direct-io", neg=("-ndio", "--no-direct-io"), env="LLAMA_ARG_DIO", why=LOADING),
    _noop("-fit", "--fit", value="[on|off]", env="LLAMA_ARG_FIT", why=FIT),
    _noop("-fitt", "--fit-target", value="MiB0,MiB1,...", env="LLAMA_ARG_FIT_TARGET", why=FIT),
    _noop("-fitc", "--fit-ctx", value="N", env="LLAMA_ARG_FIT_CTX", why=FIT),
    _noop("--swa-full", env="LLAMA_ARG_SWA_FULL", why="qwen35 has no sliding-window attention layers"),
    _noop("-dt", "--defrag-thold", value="N", env="LLAMA_ARG_DEFRAG_THOLD",
          why="deprecated in llama.cpp too; llamacmp's KV cache never needs defragmenting"),
    _noop("--check-tensors", why="llamacmp checks every tensor's type, shape and size at load but does not scan the "
          "values for NaN/inf"),
    _noop("-bs", "--backend-sampling", why="llamacmp samples on the host from the logits; the tokens are the same"),
    _noop("--perf", neg=("--no-perf",), env="LLAMA_ARG_PERF", why="llamacmp always measures the timings"),
    _noop("-hft", "--hf-token", value="TOKEN", env="HF_TOKEN", why="llamacmp does not download, so needs no token"),
    O("--adaptive-target", value="N", dest="sampling.adaptive_target", parse=to_float,
      help="adaptive-p: select tokens near this probability (valid range 0.0 to 1.0; negative = disabled)\n"
      "(default: -1.00; the sampler runs where --samplers names adaptive_p, as in llama.cpp)"),
    O("--adaptive-decay", value="N", dest="sampling.adaptive_decay", parse=to_float,
      help="adaptive-p: decay rate for target adaptation over time. lower values are more reactive, higher\n"
      "values are more stable. (valid range 0.0 to 0.99) (default: 0.90)"),
    _default_only("--rope-freq-base", default="0", why="llamacmp uses the model's RoPE settings (0 = from model)"),
    _default_only("--rope-freq-scale", default="0", accept=lambda x: x in (0, 1),
                  why="llamacmp uses the model's RoPE settings (0 = from model)"),
    _default_only("--rope-scale", default="1", why="RoPE context scaling is not supported by llamacmp yet"),
    _default_only("--yarn-orig-ctx", default="0", why="YaRN is not supported by llamacmp yet"),
    _default_only("--yarn-ext-factor", default="-1", why="YaRN is not supported by llamacmp yet"),
    _default_only("--yarn-attn-factor", default="-1", why="YaRN is not supported by llamacmp yet"),
    _default_only("--yarn-beta-slow", default="-1", why="YaRN is not supported by llamacmp yet"),
    _default_only("--yarn-beta-fast", default="-1", why="YaRN is not supported by llamacmp yet"),
    O("--rope-scaling", value="{none,linear,yarn}", parse=_rope_scaling, apply=lambda p, v: None,
      env="LLAMA_ARG_ROPE_SCALING_TYPE", noop="none and linear (at --rope-scale 1) leave RoPE as the model has it; "
      "yarn is refused", help="RoPE frequency scaling method, defaults to linear unless specified by the model"),
    O("--no-context-shift", apply=lambda p, v: None, dest="_no_context_shift", tools=KCS | PPL,
      help="disables context shift on infinite text generation: llamacmp's only behaviour (recurrent layers)"),
    O("--offline", apply=lambda p, v: None, dest="_offline", env="LLAMA_ARG_OFFLINE", tools=ALL | TOK,
      help="offline mode: llamacmp never downloads anything, so it is always offline"),
    # logging (llama.cpp's common/log.cpp switches; llamacmp/log.py applies them)
    O("--log-colors", value="[on|off|auto]", dest="log_colors", parse=on_off_auto("--log-colors"),
      env="LLAMA_LOG_COLORS", help="Set colored logging ('on', 'off', or 'auto', default: 'auto')"),
    O("--log-prefix", dest="log_prefix", neg=("--no-log-prefix",), env="LLAMA_LOG_PREFIX",
      help="Enable prefix in log messages"),
    O("--log-timestamps", dest="log_timestamps", neg=("--no-log-timestamps",), env="LLAMA_LOG_TIMESTAMPS",
      help="Enable timestamps in log messages"),
    O("--no-log-jsonl", apply=lambda p, v: None, dest="_no_log_jsonl", help="plain-text log lines (the default)"),
    _unsup("--log-jsonl", why="JSON-lines logs are not supported by llamacmp yet"),
    # the CLIs
    O("-bf", "--binary-file", value="FNAME", parse=str, apply=_set_binary_prompt, tools=KC | PPL,
      help="binary file containing the prompt (default: none)"),
    _default_only("-gan", "--grp-attn-n", default="1", parse=to_int, tools=CMP,
                  why="self-extend (group attention) is not supported by llamacmp"),
    _default_only("-gaw", "--grp-attn-w", default="512", parse=to_int, tools=CMP,
                  why="self-extend (group attention) is not supported by llamacmp"),
    _default_only("-ptc", "--print-token-count", default="-1", parse=to_int, tools=CMP,
                  why="periodic token counts are not printed by llamacmp"),
    _noop("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", "-cram", "--cache-ram", "-cpent",
          "--checkpoint-every-n-tokens", value="N", tools=frozenset({"cli"}), why=CLI_ONE_CONVERSATION),
    _noop("-kvu", "--kv-unified", neg=("-no-kvu", "--no-kv-unified"), tools=PPL,
          why="llamacmp-perplexity scores one chunk at a time"),
    # llama-server
    O("--api-prefix", value="PREFIX", dest="server.api_prefix", parse=_api_prefix, env="LLAMA_ARG_API_PREFIX",
      tools=S, help="prefix path the server serves from, without the trailing slash (default: )"),
    O("--ssl-key-file", value="FNAME", dest="server.ssl_key_file", parse=str, env="LLAMA_ARG_SSL_KEY_FILE", tools=S,
      help="path to file a PEM-encoded SSL private key"),
    O("--ssl-cert-file", value="FNAME", dest="server.ssl_cert_file", parse=str, env="LLAMA_ARG_SSL_CERT_FILE",
      tools=S, help="path to file a PEM-encoded SSL certificate"),
    _noop("--cache-reuse", value="N", env="LLAMA_ARG_CACHE_REUSE", tools=S,
          why="reusing chunks by KV shifting is impossible with recurrent (hybrid) layers; llama-server turns it "
          "off for them too"),
    O("-cms", "--checkpoint-min-step", value="N", dest="server.checkpoint_every", parse=_min_step,
      env="LLAMA_ARG_CHECKPOINT_MIN_STEP", tools=S,
      help="minimum spacing between context checkpoints in tokens (default: 8192): llamacmp's checkpoint spacing"),
    O("--cache-idle-slots", dest="server.cache_idle_slots", neg=("--no-cache-idle-slots",),
      env="LLAMA_ARG_CACHE_IDLE_SLOTS", tools=S,
      help="save idle slots to the prompt cache on new task, and clear them when using unified KV (default: "
      "enabled, requires cache-ram)\nllamacmp-server: off by default. Each slot has its own device memory, so "
      "clearing an idle slot frees nothing; saving it costs a copy of its state over PCIe at every launch (~50 MB "
      "for a 9B model: 0.2 s on a PCIe Gen1 x1 card), and the slot's next request copies it back"),
    _unsup("--kv-unified-per-slot", value="N", tools=S, why="a per-slot context limit is not supported by llamacmp "
           "yet: size the context with -c and the slots with -np"),
    O("--sleep-idle-seconds", value="SECONDS", dest="server.sleep_idle_seconds", parse=_sleep_seconds, tools=S,
      help="number of seconds of idleness after which the server will sleep: the model, its device memory and "
      "the slots' prompt caches are freed and loaded again by the next request (default: -1; -1 = disabled)"),
    _default_only("--sse-ping-interval", default="-1", parse=to_int, tools=S,
                  why="llamacmp-server sends no SSE pings (-1 = disabled; llama-server's default is 30)"),
    O("--tags", value="STRING", dest="server.tags", parse=_name_set, env="LLAMA_ARG_TAGS", tools=S,
      help="set model tags, comma-separated (informational, not used for routing)"),
    _noop("--mtmd-batch-max-tokens", value="N", tools=S, why="llamacmp encodes each image whole"),
    _unsup("--reuse-port", tools=S, why="SO_REUSEPORT listening is not supported by llamacmp"),
    O("--cors-origins", value="ORIGINS", dest="server.cors_origins", parse=str, env="LLAMA_ARG_CORS_ORIGINS",
      tools=S, help="comma-separated list of allowed origins for CORS (default: *)\nif set to special value "
      "'localhost', reflect the Origin header only if it is localhost"),
    O("--cors-methods", value="METHODS", dest="server.cors_methods", parse=str, env="LLAMA_ARG_CORS_METHODS",
      tools=S, help="comma-separated list of allowed methods for CORS (default: GET, POST, DELETE, OPTIONS)"),
    O("--cors-headers", value="HEADERS", dest="server.cors_headers", parse=str, env="LLAMA_ARG_CORS_HEADERS",
      tools=S, help="comma-separated list of allowed headers for CORS (default: *)"),
    O("--cors-credentials", dest="server.cors_credentials", neg=("--no-cors-credentials",),
      env="LLAMA_ARG_CORS_CREDENTIALS", tools=S, help="whether to allow credentials for CORS (default: enabled)\n"
      "note: if this is enabled and --cors-origins is set to * (default), the Origin header will be echoed back, "
      "and credentials will always be allowed"),
    O("--tools", value="TOOL1,TOOL2,...", dest="server.tools", parse=_tool_names, env="LLAMA_ARG_TOOLS", tools=S,
      help="experimental: whether to enable built-in tools for AI agents - do not enable in untrusted environments "
      "(default: no tools)\nspecify \"all\" to enable all tools\navailable tools: read_file, file_glob_search, "
      "grep_search, exec_shell_command, write_file, edit_file, get_info\nnote: for security reasons, this will "
      "limit --cors-origins to localhost by default"),
    O("--tools-runtime", value="OPTION", dest="server.tools_runtime", parse=_tools_runtime,
      env="LLAMA_ARG_TOOLS_RUNTIME", tools=S,
      help="experimental: run tools in a separate runtime environment (default: none, use host environment)\n"
      "available options:\n  'docker:<image>', 'podman:<image>': spin up a new container and reuse it for all "
      "invocations, clean up on server exit\n  'docker-container:<id>', 'podman-container:<id>': use an existing "
      "container by ID, won't stop on server exit\n  'ssh:<target>': run tools on a remote POSIX host over SSH, "
      "key-based auth and a trusted host key are required"),
    O("-ag", "--agent", dest="_agent", apply=_agent, env="LLAMA_ARG_AGENT", tools=S,
      help="whether to enable CORS proxy and all built-in tools - do not enable in untrusted environments (default: "
      "disabled)\nnote: for security reasons, this will limit --cors-origins to localhost by default"),
    O("-no-ag", "--no-agent", dest="_no_agent", apply=_no_agent, tools=S,
      help="no built-in agent tools (clears --tools) and no MCP CORS proxy: the default"),
    O("--mcp-servers-config", value="PATH", dest="server.mcp_file", parse=_mcp_file, tools=S,
      env="LLAMA_ARG_MCP_SERVERS_CONFIG", help="experimental: path to JSON file with MCP server definitions "
      "(Cursor-compatible format) - do not enable in untrusted environments (default: none)"),
    O("--mcp-servers-json", value="JSON", dest="server.mcp_json", parse=_mcp_json, tools=S,
      env="LLAMA_ARG_MCP_SERVERS_JSON", help="experimental: inline JSON with MCP server definitions "
      "(Cursor-compatible format) - do not enable in untrusted environments (default: none)"),
    _unsup("--spm-infill", tools=S, why="llamacmp builds infill prompts prefix/suffix/middle only"),
    _unsup("--models-dir", value="PATH", tools=S, why=ROUTER),
    _unsup("--models-preset", value="PATH", tools=S, why=ROUTER),
    O("--models-max", value="N", dest="server.models_max", parse=to_int, env="LLAMA_ARG_MODELS_MAX", tools=S,
      help="for router server, maximum number of models to load simultaneously (default: 4, 0 = unlimited)\n"
      f"llamacmp: reported by the router's /props; {ROUTER}"),
    O("--models-autoload", dest="server.models_autoload", neg=("--no-models-autoload",),
      env="LLAMA_ARG_MODELS_AUTOLOAD", tools=S,
      help="for router server, whether to automatically load models (default: enabled)\n"
      f"llamacmp: reported by the router's /props; {ROUTER}"),
    _unsup("--lora-init-without-apply", tools=S, why="LoRA adapters are not supported by llamacmp yet"),
    # chat and reasoning (0c1e570)
    O("--reasoning-effort", value="LEVEL", parse=str, apply=_set_reasoning_effort, tools=KCS,
      help="reasoning effort level given to the chat template: 'default' to keep the template default, or a level "
      "such as 'low', 'medium', 'high' (default: default)"),
    _noop("--reasoning-preserve", neg=("--no-reasoning-preserve",), tools=KCS,
          why="the qwen35 chat template decides which turns keep their reasoning; llamacmp passes each message's "
          "reasoning_content to it as received"),
    _unsup("--skip-chat-parsing", tools=KCS, why="llamacmp always parses replies with the template's format "
           "(use --reasoning-format none for the raw text)"),
    _noop("--no-skip-chat-parsing", tools=KCS, why="the default"),
    # multimodal extras
    _noop("-mmdev", "--mmproj-device", value="<dev>", tools=CS, why=PLACEMENT),
    _noop("--mmproj-offload", neg=("--no-mmproj-offload",), env="LLAMA_ARG_MMPROJ_OFFLOAD", tools=CS, why=PLACEMENT),
    _unsup("--video", value="FILE", tools=frozenset({"cli"}), why="video input is not supported by llamacmp"),
    _noop("--video-fps", value="N", tools=CS, why=NO_VIDEO),
    _noop("--video-timestamp-interval", value="N", tools=CS, why=NO_VIDEO),
    _noop("--video-ffmpeg-dir", value="PATH", tools=CS, why=NO_VIDEO),
    # refused: llama.cpp features llamacmp does not have
    _unsup("--control-vector", value="FNAME", why="control vectors are not supported by llamacmp"),
    _unsup("--control-vector-scaled", value="FNAME SCALE", why="control vectors are not supported by llamacmp"),
    _unsup("--control-vector-layer-range", value="START END", why="control vectors are not supported by llamacmp"),
    _unsup("--rpc", value="SERVERS", env="LLAMA_ARG_RPC", why="ggml-rpc is not supported by llamacmp"),
    _unsup("--completion-bash", why="llamacmp prints no bash completion script"),
    _unsup("-cl", "--cache-list", why="llamacmp lists no cache: it resolves -hf from the local caches only"),
    _unsup("--list-devices", why="not supported by llamacmp yet: nvidia-smi -L lists the GPUs"),
    _unsup("--license", why="llamacmp prints no license text"),
    _unsup("-dr", "--docker-repo", value="[<repo>/]<model>[:quant]", env="LLAMA_ARG_DOCKER_REPO", why=DOWNLOAD),
    _unsup("-hfv", "-hfrv", "--hf-repo-v", value="<user>/<model>[:quant]", why="vocoder models are not supported"),
    _unsup("-hffv", "--hf-file-v", value="FILE", why="vocoder models are not supported"),
    _unsup("-mv", "--model-vocoder", value="FNAME", tools=S, why="vocoder models are not supported"),
    _unsup("--tts-use-guide-tokens", tools=S, why="vocoder models are not supported"),
    _unsup("--log-prompts-dir", value="PATH", tools=CS, why="prompt logging to a folder is not supported by llamacmp"),
    _unsup("--server-base", value="URL", tools=frozenset({"cli"}), why="llamacmp-cli runs the model itself"),
    _unsup("-o", "--output", "--output-file", value="FNAME", tools=frozenset({"cli"}),
           why="writing the conversation to a file is not supported by llamacmp-cli yet"),
    _unsup("--prompt-cache-all", tools=CMP, why="session files (--prompt-cache) are not supported by llamacmp yet"),
    _unsup("--prompt-cache-ro", tools=CMP, why="session files (--prompt-cache) are not supported by llamacmp yet"),
    _unsup("--hellaswag", tools=PPL, why=PPL_ONLY), _unsup("--hellaswag-tasks", value="N", tools=PPL, why=PPL_ONLY),
    _unsup("--winogrande", tools=PPL, why=PPL_ONLY), _unsup("--winogrande-tasks", value="N", tools=PPL, why=PPL_ONLY),
    _unsup("--multiple-choice", tools=PPL, why=PPL_ONLY),
    _unsup("--multiple-choice-tasks", value="N", tools=PPL, why=PPL_ONLY),
    _unsup("--kl-divergence", tools=PPL, why=PPL_ONLY),
    _unsup("--save-all-logits", "--kl-divergence-base", value="FNAME", tools=PPL, why=PPL_ONLY),
    _unsup("--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default", "--fim-qwen-7b-default",
           "--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default", tools=S, why=PRESET),
    _unsup("--gpt-oss-20b-default", "--gpt-oss-120b-default", "--vision-gemma-4b-default",
           "--vision-gemma-12b-default", tools=CS, why=PRESET),
    *SPEC_OPTIONS,
    # known llama.cpp flags we refuse, so that nobody's script silently does something else
    O("-hf", "-hfr", "--hf-repo", value="<user>/<model>[:quant]", dest="hf_repo", parse=str, env="LLAMA_ARG_HF_REPO",
      tools=ALL | TOK, help="Hugging Face model repository; quant is optional, case-insensitive, default to Q4_K_M, "
      "or falls back to the first file in the repo if Q4_K_M doesn't exist.\nllamacmp: taken from the local "
      "caches only (llamacmp/hf_cache.py); it never downloads"),
    O("-hff", "--hf-file", value="FILE", dest="hf_file", parse=str, env="LLAMA_ARG_HF_FILE", tools=ALL | TOK,
      help="Hugging Face model file. If specified, it will override the quant in --hf-repo"),
    _unsup("-mu", "--model-url", value="MODEL_URL", env="LLAMA_ARG_MODEL_URL",
           why="downloading models is not supported by llamacmp: download the GGUF and pass -m"),
    _unsup("--lora", value="FNAME", why="LoRA adapters are not supported by llamacmp yet"),
    _unsup("--lora-scaled", value="FNAME SCALE", why="LoRA adapters are not supported by llamacmp yet"),
    _unsup("-mmu", "--mmproj-url", value="URL", env="LLAMA_ARG_MMPROJ_URL", tools=frozenset({"cli", "server"}),
           why="downloading models is not supported by llamacmp: download the mmproj GGUF and pass -mm"),
    _unsup("--audio", value="FILE", tools=frozenset({"cli"}),
           why="audio input is not supported by llamacmp (images are: --image)"),
    _unsup("--prompt-cache", value="FNAME", tools=frozenset({"completion"}),
           why="session files (--prompt-cache) are not supported by llamacmp yet"),
    _unsup("--context-shift", env="LLAMA_ARG_CONTEXT_SHIFT", tools=KCS | PPL,
           why="context shift is not possible with recurrent (hybrid) models"),
)


# llama-server's web page settings and reranking (refused by name), its MCP proxy
OPTIONS += (
    _unsup("--webui-config", "--ui-config", value="JSON", env="LLAMA_ARG_UI_CONFIG", tools=S,
           why="settings for llama.cpp's own web page are not supported: llamacmp serves a page of its own"),
    _unsup("--webui-config-file", "--ui-config-file", value="PATH", env="LLAMA_ARG_UI_CONFIG_FILE", tools=S,
           why="settings for llama.cpp's own web page are not supported: llamacmp serves a page of its own"),
    O("--ui-mcp-proxy", "--webui-mcp-proxy", dest="server.ui_mcp_proxy", neg=("--no-ui-mcp-proxy",
      "--no-webui-mcp-proxy"), env="LLAMA_ARG_UI_MCP_PROXY", tools=S, help="experimental: whether to enable MCP "
      "CORS proxy (/cors-proxy fetches any http(s) URL a client names) - do not enable in untrusted environments "
      "(default: disabled)"),
    _unsup("--rerank", "--reranking", env="LLAMA_ARG_RERANKING", tools=S,
           why="reranking is not supported by llamacmp yet"),
)


def options_for(tool: str) -> list[Option]:
    """The options `tool` accepts: its own, and for llamacmp-tokenize every common one as a no-op (current
    llama-tokenize parses with common/arg.cpp and loads the vocabulary only)."""
    own = [o for o in OPTIONS if tool in o.tools]
    if tool != "tokenize":
        return own
    return own + [replace(o, tools=TOK, unsupported="", noop=TOKENIZE_IGNORED, apply=lambda p, v: None,
                          parse=str if o.value else None, dest="", help=TOKENIZE_IGNORED)
                  for o in OPTIONS if {"completion", "perplexity"} <= o.tools and "tokenize" not in o.tools]


TOKENIZE_IGNORED = "llamacmp-tokenize loads only the tokenizer, as llama-tokenize does"


# -- parsing -----------------------------------------------------------------------------------------------------

def _store(p: Params, opt: Option, value: Any) -> None:
    if opt.apply is not None:
        opt.apply(p, value)
    elif opt.append:
        getattr(p, opt.dest).append(value)
    elif "." in opt.dest:               # "sampling.temp", "server.port": a field of a nested dataclass
        group, name = opt.dest.split(".", 1)
        setattr(getattr(p, group), name, value)
    elif not opt.dest.startswith("_"):
        setattr(p, opt.dest, value)
    p.user_set.add(opt.dest or opt.names[-1])


def _apply(p: Params, opt: Option, raw: str | None, positive: bool, given: str = "") -> None:
    """raw is None for flags; positive is False for the negated spelling; given: the spelling used (for messages)."""
    if opt.unsupported:
        raise Unsupported(f"error: {given or opt.names[-1]} is not supported: {opt.unsupported}")
    if opt.value:
        _store(p, opt, opt.parse(raw))
    elif opt.apply is not None:
        opt.apply(p, positive)
        p.user_set.add(opt.dest)
    else:
        _store(p, opt, opt.const if positive else False)


def _env_names(opt: Option) -> list[tuple[str, bool]]:
    """(variable, sets the positive value) for each environment variable that `opt` reads, in reading order."""
    out = []
    for env in (opt.env_old, opt.env):
        if env:
            out.append((env, True))
            if opt.neg:
                out.append((env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_"), False))
    return out


def _apply_env(p: Params, opts: list[Option], environ: dict) -> None:
    for opt in opts:
        for name, positive in _env_names(opt):
            if name not in environ:
                continue
            raw = environ[name]
            try:
                if opt.value:
                    _apply(p, opt, raw, True, name)
                else:
                    value = to_bool(raw)
                    _apply(p, opt, None, value if positive else not value, name)
            except Unsupported:
                raise
            except (ValueError, json.JSONDecodeError) as e:
                raise ArgError(f"error while handling environment variable \"{name}\": {e}\n\n") from None


@dataclass
class Parsed:
    params: Params
    show_help: bool = False
    show_version: bool = False
    warnings: tuple[str, ...] = ()


def parse_args(tool: str, argv: list[str], environ: dict | None = None) -> Parsed:
    """argv without the program name. Raises ArgError with llama.cpp's text on bad input."""
    environ = dict(os.environ if environ is None else environ)
    opts = options_for(tool)
    table = {n: (o, True) for o in opts for n in o.names} | {n: (o, False) for o in opts for n in o.neg}
    p = tool_defaults(tool)
    _apply_env(p, opts, environ)
    env_set = set(p.user_set)
    warnings: list[str] = []
    noted: set[str] = set()             # no-op options already explained (once each)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            arg = arg.replace("_", "-")
        if arg not in table:
            raise ArgError(f"error: invalid argument: {arg}")
        opt, positive = table[arg]
        if opt.env and (opt.dest or opt.names[-1]) in env_set:
            warnings.append(f"warn: {opt.env} environment variable is set, but will be overwritten by command "
                            f"line argument {arg}")
        raw = None
        if opt.value:
            if i + 1 >= len(argv):
                raise ArgError("expected value for argument")
            i += 1
            raw = argv[i]
        if opt.noop and opt.names[0] not in noted:
            noted.add(opt.names[0])
            warnings.append(f"llamacmp: {arg} changes nothing here: {opt.noop}")
        try:
            _apply(p, opt, raw, positive, arg)
        except Unsupported:
            raise
        except (ValueError, json.JSONDecodeError) as e:
            raise ArgError(f"error while handling argument \"{arg}\": {e}\n\nusage:\n{opt.usage()}\n"
                           "to show complete usage, run with -h") from None
        i += 1
    if p.escape:
        p.prompt = process_escapes(p.prompt)
        p.antiprompt = [process_escapes(a) for a in p.antiprompt]
        p.input_prefix, p.input_suffix = process_escapes(p.input_prefix), process_escapes(p.input_suffix)
    if p.interactive_first:
        p.interactive = True
    warnings += _spec_without_type(p)
    warnings += _cors_default(p)
    if p.chat_template:
        _check_chat_template(p)
    return Parsed(p, "_help" in p.user_set, "_version" in p.user_set, tuple(warnings))


def _check_chat_template(p: Params) -> None:
    from .chat import TemplateError, check_override      # jinja2 loads only when a template was given
    try:
        check_override(p.chat_template, p.use_jinja)
    except TemplateError as e:
        raise ArgError(str(e)) from None


# -- GGUF sampling defaults ----------------------------------------------------------------------------------------

GGUF_SAMPLING = {"top_k": ("top_k", int), "top_p": ("top_p", float), "min_p": ("min_p", float),
                 "xtc_probability": ("xtc_probability", float), "xtc_threshold": ("xtc_threshold", float),
                 "temp": ("temp", float), "penalty_last_n": ("penalty_last_n", int),
                 "penalty_repeat": ("penalty_repeat", float), "mirostat": ("mirostat", int),
                 "mirostat_tau": ("mirostat_tau", float), "mirostat_eta": ("mirostat_eta", float)}


def apply_gguf_sampling(p: Params, metadata: dict) -> list[str]:
    """general.sampling.* replace llama.cpp's defaults unless the user set that sampler; returns what changed."""
    user_keys = {o.gguf_key for o in OPTIONS if o.gguf_key and (o.dest or o.names[-1]) in p.user_set}
    changed = []
    for key, (field_name, cast) in GGUF_SAMPLING.items():
        value = metadata.get(f"general.sampling.{key}")
        if value is None or key in user_keys:
            continue
        setattr(p.sampling, field_name, cast(value))
        changed.append(key)
    seq = metadata.get("general.sampling.sequence")
    if seq is not None and "sequence" not in user_keys:
        p.sampling.samplers = parse_sampler_letters(str(seq))
        changed.append("sequence")
    return changed


# -- help and version ----------------------------------------------------------------------------------------------

def build_commit() -> str:
    """The short hex commit of this checkout, as llama.cpp's LLAMA_COMMIT; "unknown" outside git (as llama.cpp)."""
    import subprocess
    try:
        out = subprocess.run(["git", "rev-parse", "--short=9", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else "unknown"


def version_text() -> str:
    """llama.cpp's two lines: `version: N (<hex commit>)` and what it was built with (llamacmp's version there)."""
    return f"version: {BUILD_NUMBER} ({build_commit()})\nbuilt with Python {sys.version.split()[0]} " \
           f"for {sys.platform} (llamacmp {__version__})\n"


def usage_text(tool: str) -> str:
    body = "".join(o.usage() for o in options_for(tool))
    return f"----- llamacmp-{tool} params -----\n\n{body}"


def parse_or_exit(tool: str, argv: list[str] | None = None) -> Params:
    """Entry-point helper: prints help/version/errors as llama.cpp does and exits where it would."""
    argv = sys.argv[1:] if argv is None else argv
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)   # see llamacmp._quiet_interrupt
    try:
        parsed = parse_args(tool, argv)
    except ArgError as e:
        sys.stderr.write(f"{e}\n")
        raise SystemExit(1) from None
    if parsed.show_version:
        sys.stderr.write(version_text())
        raise SystemExit(0)
    if parsed.show_help:
        sys.stdout.write(usage_text(tool))
        raise SystemExit(0)
    from .log import setup
    setup(parsed.params)
    for w in parsed.warnings:
        sys.stderr.write(w + "\n")
    resolve_hf_or_exit(parsed.params)
    return parsed.params


def resolve_hf_or_exit(p: Params) -> None:
    """-hf: -m becomes the cached file (said on stderr); a miss prints where it looked and exits 1."""
    if not p.hf_repo or p.model:
        return
    from .hf_cache import HfCacheError, resolve
    try:
        p.model = resolve(p.hf_repo, p.hf_file)
    except HfCacheError as e:
        sys.stderr.write(f"{e}\n")
        raise SystemExit(1) from None
    sys.stderr.write(f"-hf {p.hf_repo}: using {p.model} from the local cache\n")
