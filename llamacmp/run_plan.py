"""The run plan: what a tool start will make (sequences, their context, KV cache formats, batch sizes), derived
once from the parsed options and the model file's header and validated before anything is allocated.

The memory plan (memplan.py), the engine's slots and every tool read this one value, so that the KV types and
context the memory plan counts are the ones the engine allocates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import spec
from .kv_quant import KV_TYPES
from .params import Params
from .spec import SpecConfig, SpecError

if TYPE_CHECKING:
    from .loader import ModelFile


class RunPlanError(ValueError):
    """An option the engine cannot honour; the message names the flag."""


@dataclass(frozen=True, slots=True)
class RunPlan:
    n_ctx: int              # positions of one sequence (a server slot's share of -c, or all of it when unified)
    n_slots: int            # sequences the engine keeps (1 for the CLIs)
    k_type: str             # -ctk
    v_type: str             # -ctv
    n_batch: int            # -b: most tokens one engine step takes
    n_ubatch: int           # -ub: most prompt tokens one sequence adds in one forward
    unified: bool = False   # server: every slot may use the whole context (-kvu, default with -np auto)
    all_logits: bool = False    # perplexity: every row's logits come back
    spec: SpecConfig = SpecConfig()     # --spec-*: checked; draft-mtp only with a file that has an MTP head

    @property
    def micro_batch(self) -> int:
        """Rows of one prefill forward."""
        return max(1, min(self.n_batch, self.n_ubatch))


def check_options(p: Params) -> None:
    """Options no tool can run with, refused before the model is opened."""
    if p.n_batch <= 0 or p.n_ubatch <= 0:
        raise RunPlanError("--batch-size and --ubatch-size must be positive")
    if p.n_ctx < 0:
        raise RunPlanError(f"invalid context size {p.n_ctx}")
    if p.split_mode == "row":
        raise RunPlanError("--split-mode row is not supported: llamacmp splits the model by layers "
                           "(-sm layer, the default) or keeps it on one GPU (-sm none)")
    for flag, t in (("--cache-type-k", p.cache_type_k), ("--cache-type-v", p.cache_type_v)):
        if t not in KV_TYPES:
            raise RunPlanError(f"{flag} {t} is not supported: llamacmp's KV caches are {', '.join(KV_TYPES)}")
    try:
        spec.check(p.spec)
    except SpecError as e:
        raise RunPlanError(str(e)) from None


def _checked_spec(p: Params, model: ModelFile | None) -> SpecConfig:
    if not p.spec.enabled:
        return p.spec
    if model is None:
        raise RunPlanError("--spec-type draft-mtp: the run plan needs the model file to check its MTP head")
    f = model.gguf
    try:
        spec.check_model(p.spec, model.path, f.names(), int(f.metadata[f"{f.architecture}.block_count"]))
        spec.check_draft_vocab(p.spec, model.cfg.n_vocab)
    except SpecError as e:
        raise RunPlanError(str(e)) from None
    return p.spec


def plan_run(p: Params, n_ctx_train: int, model: ModelFile | None = None) -> RunPlan:
    """p: the parsed options of any tool; n_ctx_train: the model's training context (what -c 0 means); model: the
    opened file, for what needs its tensors (--spec-type draft-mtp needs an MTP head)."""
    check_options(p)
    sp = _checked_spec(p, model)
    n_ctx = p.n_ctx if p.n_ctx > 0 else n_ctx_train
    if p.tool != "server":
        return RunPlan(n_ctx, 1, p.cache_type_k, p.cache_type_v, p.n_batch, p.n_ubatch,
                       all_logits=p.tool == "perplexity", spec=sp)
    n_slots = 4 if p.n_parallel < 0 else max(1, p.n_parallel)        # -np auto: 4 slots sharing the context
    unified = p.server.kv_unified if p.server.kv_unified is not None else p.n_parallel < 0
    return RunPlan(n_ctx if unified else max(1, n_ctx // n_slots), n_slots, p.cache_type_k, p.cache_type_v,
                   p.n_batch, p.n_ubatch, unified, spec=sp)
