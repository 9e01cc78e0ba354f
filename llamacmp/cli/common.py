"""What every CLI tool does the same way: find and load the model, build the sampler, print llama.cpp's perf lines."""
from __future__ import annotations

import io
import os
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from .. import memplan, progress, sparse_attn
from ..demo_model import BUNDLED_MODEL, BUNDLED_MTP_HEAD, DemoModelError, with_mtp_head
from ..args import apply_gguf_sampling
from ..engine.client import EngineError, SlotClient
from ..engine.perf import Perf
from ..engine.speculative import enabled_spec
from ..params import Params
from ..run_plan import RunPlan, RunPlanError, check_options, plan_run
from ..spec import synth_log_lines
from ..sampling import Sampler, SamplerVocab


class CliError(Exception):
    """Printed as is to stderr; the tool exits with status 1."""


@dataclass
class Loaded:
    lm: object                 # loader.LoadedModel
    run: RunPlan               # the one sequence's context, KV types and batch sizes
    t_load_ms: float

    @property
    def n_ctx(self) -> int:
        return self.run.n_ctx


def resolve_model(p: Params, err: TextIO) -> str:
    """-m, else the bundled demo model (said on stderr), else llama.cpp's error. With --spec-type draft-mtp the demo
    model is joined with its trained MTP head (demo_model.py); without, it stays default.gguf, the file llama.cpp
    b8462 loads too."""
    if p.model:
        return p.model
    if p.spec.enabled and BUNDLED_MODEL.exists() and BUNDLED_MTP_HEAD.exists():
        try:
            path = with_mtp_head()
        except DemoModelError as e:
            raise CliError(f"error: {e}") from None
        except OSError as e:             # the user cache is not writable, the disk is full, ...
            raise CliError(f"error: cannot write the demo model with its MTP head to the user cache "
                           f"($LLAMACMP_CACHE): {e}") from None
        err.write(f"no -m given: using the bundled demo model with its MTP head {path} "
                  f"({BUNDLED_MODEL.name} + {BUNDLED_MTP_HEAD.name})\n")
        return str(path)
    if BUNDLED_MODEL.exists():
        err.write(f"no -m given: using the bundled demo model {BUNDLED_MODEL}\n")
        return str(BUNDLED_MODEL)
    raise CliError("error: --model is required\n(no bundled demo model at llamacmp/data/default.gguf either)")


def check_engine_flags(p: Params) -> None:
    """Flags the engine cannot honour are refused here, before the model is opened, never ignored silently."""
    try:
        check_options(p)
    except RunPlanError as e:
        raise CliError(f"error: {e}") from None


def check_offload(p: Params, n_layer: int, backend, err: TextIO) -> None:
    """llama.cpp can keep some layers on the CPU; we run all of them on one backend, and say so."""
    if p.n_gpu_layers in ("auto", "all") or backend.device is None:
        return
    n = int(p.n_gpu_layers)
    if 0 < n < n_layer:
        err.write(f"warning: -ngl {n}: partial offload is not supported, all {n_layer} layers run on the GPU\n")


def load(p: Params, err: TextIO | None = None) -> Loaded:
    err = err or sys.stderr              # looked up now: log.setup may have wrapped it since import
    from ..backends.select import select_backends
    from ..gguf_file import GGUFError
    from ..loader import check_weight_types, load_placed, open_model
    check_engine_flags(p)
    path = resolve_model(p, err)
    quiet = p.log_disable or p.verbosity < 2
    try:
        backends, ratios = select_backends(p, err)
    except ValueError as e:          # -dev / -mg / -ts that cannot be honoured
        raise CliError(f"error: {e}") from None
    for be in backends:
        be.sparse = sparse_attn.config_from_params(p)
    t0 = time.perf_counter()
    try:
        mf = open_model(path, p.kv_overrides)   # the header, parsed once for the run plan, memory plan and loader
        check_weight_types(mf.gguf, backends)       # a type without kernels: refused before the memory plan
        run = plan_run(p, mf.cfg.n_ctx_train, mf)
        for line in synth_log_lines(run.spec):      # benchmarking only: said however quiet the run is
            err.write(line + "\n")
        if len(backends) == 1:       # a layer split plans each part in llamacmp/split/, not here
            run = memplan.planned_run(run, memplan.prepare_device(backends[0], mf, run, p.device_mem_cap,
                                                                  log=None if quiet else err))
        parts_log = io.StringIO()    # a split's per-part lines, written after the 'Loading model... done' line
        with progress.loading(err, enabled=not p.log_disable):   # llama-cli shows it at every verbosity
            lm = load_placed(mf, backends, ratios, p.split_bridge, p.n_ubatch, None if quiet else parts_log,
                             mtp=enabled_spec(run) is not None)
        err.write(parts_log.getvalue())
    except memplan.PlanError as e:
        raise CliError(f"error: {e}") from None
    except (GGUFError, OSError) as e:
        raise CliError(f"error: failed to load model '{path}': {e}") from None
    except ValueError as e:          # a split that cannot be made (--split-bridge peer without P2P, too few layers)
        raise CliError(f"error: {e}") from None
    backend = lm.backend
    t_load = (time.perf_counter() - t0) * 1e3
    check_offload(p, lm.cfg.n_layer, backend, err)
    changed = apply_gguf_sampling(p, lm.metadata)
    if changed and not quiet:
        err.write(f"using the model's sampling defaults for: {', '.join(changed)}\n")
    return Loaded(lm, run, t_load)


def new_client(loaded: Loaded) -> SlotClient:
    """The tool's one sequence: a slot of the scheduler the server uses (engine/client.py)."""
    return SlotClient(loaded.lm, loaded.run, loaded.t_load_ms)


def make_grammar(p: Params, client: SlotClient, after_think: bool = False):
    """--grammar / -j compiled (llguidance) for GenParams.grammar; None without them. Bad grammars are the user's
    error."""
    if not p.grammar and p.json_schema is None:
        return None
    from ..engine.grammar import GrammarError
    try:
        return client.grammars.compile(p.grammar, p.json_schema, after_think)
    except GrammarError as e:
        raise CliError(f"error: {e}") from None


def make_sampler(p: Params, lm) -> Sampler:
    vocab = SamplerVocab(lm.tokenizer, lm.cfg.n_ctx_train)        # (DRY's sequence breakers)
    return Sampler(p.sampling, frozenset(lm.tokenizer.eog_ids), vocab=vocab)


def perf_lines(t: Perf, sampler: Sampler | None, now_ms: float) -> str:
    """llama.cpp's common_perf_print block (sampling, then context figures), same labels and widths."""
    name = "common_perf_print"
    out = []
    if sampler is not None:
        out.append(f"{name}:    sampling time = {t.t_sample_ms:10.2f} ms")
        out.append(f"{name}:    samplers time = {t.t_sample_ms:10.2f} ms / {sampler.n_accepted:5d} tokens")
    total = now_ms - t.t_start_ms
    unacc = total - (t.t_sample_ms + t.t_p_eval_ms + t.t_eval_ms)
    out.append(f"{name}:        load time = {t.t_load_ms:10.2f} ms")
    out.append(f"{name}: prompt eval time = {t.t_p_eval_ms:10.2f} ms / {t.n_p_eval:5d} tokens "
               f"({_per(t.t_p_eval_ms, t.n_p_eval)} ms per token, {_rate(t.t_p_eval_ms, t.n_p_eval)} tokens per second)")
    out.append(f"{name}:        eval time = {t.t_eval_ms:10.2f} ms / {t.n_eval:5d} runs   "
               f"({_per(t.t_eval_ms, t.n_eval)} ms per token, {_rate(t.t_eval_ms, t.n_eval)} tokens per second)")
    if t.draft.n > 0:   # llamacmp's: llama-completion has no speculative decoding; llama-server's line for drafts
        out.append(f"{name}: {t.draft.acceptance_line()}")
    out.append(f"{name}:       total time = {total:10.2f} ms / {t.n_p_eval + t.n_eval:5d} tokens")
    out.append(f"{name}: unaccounted time = {unacc:10.2f} ms / {100.0 * unacc / total if total else 0.0:5.1f} %      "
               "(total - sampling - prompt eval - eval) / (total)")
    out.append(f"{name}:    graphs reused = {0:10d}")
    return "\n".join(out) + "\n"


def _per(ms: float, n: int) -> str:
    # C's printf of x/0 prints inf or nan; keep that look rather than raising
    return f"{ms / n:8.2f}" if n else f"{'nan' if ms == 0 else 'inf':>8}"


def _rate(ms: float, n: int) -> str:
    return f"{1e3 / ms * n:8.2f}" if ms else f"{'nan' if n == 0 else 'inf':>8}"


def run_tool(main_body) -> int:
    """Turn CliError into llama.cpp's 'print and exit 1'; Ctrl-C outside generation exits 130. Closed standard
    streams, a full disk or a closed pipe on stdout, and a template that raises are one-line errors too."""
    from ..chat import TemplateError
    if sys.stdin is None:                # started with stdin closed (<&-): read it as empty
        sys.stdin = open(os.devnull)
    if sys.stdout is None:
        sys.stderr.write("error: standard output is closed\n")
        return 1
    try:
        return main_body() or 0
    except CliError as e:
        sys.stderr.write(f"{e}\n")
        return 1
    except EngineError as e:             # a failed step or draw: the engine's message
        sys.stderr.write(f"error: {e}\n")
        return 1
    except TemplateError as e:
        sys.stderr.write(f"error: the chat template failed: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except OSError as e:                 # /dev/full, a closed pipe: the output cannot be written
        sys.stderr.write(f"error: {e.strerror or e}\n")
        _discard_stdout()
        return 1


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null so that the interpreter's last flush of unwritable output does not fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.__stdout__.fileno())
    except (OSError, AttributeError, ValueError):
        pass
