"""What every handler needs: the loaded model, the engine bridge, the chat template and the server's defaults.

Built in two phases: `ServerContext` exists from the start (so /health can say 503 while loading); `load()`
fills in the model and starts the engine thread.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import string
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

from .. import BUILD_NUMBER
from ..chat import BuiltinTemplate, ChatTemplate, select_template
from ..engine.scheduler import Engine, EngineConfig
from ..engine.speculative import enabled_spec
from ..params import Params, ServerParams
from . import prep_cancel
from ..spec import SpecConfig
from .errors import ClientGone
from .schemas import ServerDefaults
from .worker import EngineBridge

log = logging.getLogger("llamacmp.server")
PREP_THREADS = max(2, min(4, os.cpu_count() or 1))


def random_id(n: int = 32) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


@dataclass
class ServerContext:
    params: Params
    lm: object = None
    engine: Optional[Engine] = None
    bridge: Optional[EngineBridge] = None
    template: Optional[ChatTemplate | BuiltinTemplate] = None
    defaults: Optional[ServerDefaults] = None
    n_slots: int = 1
    n_ctx_slot: int = 0
    spec: SpecConfig = SpecConfig()     # --spec-*, as the run plan checked it
    created: int = field(default_factory=lambda: int(time.time()))
    load_error: str = ""
    vision: object = None               # vision.projector.VisionProjector when -mm is given (read-only per request)
    template_caps: Optional[dict] = None    # /props chat_template_caps, found once (server/template_caps.py)
    on_fatal: Optional[Callable[[str], None]] = None   # called if the engine thread stops for good (app.main)
    # templating, tokenizing and grammar compiling run here, off the event loop (a long prompt must not stall
    # other streams), on a few threads so that one slow request (a big grammar) does not hold up the others (the
    # tokenizer and llguidance may be used from several threads)
    prep_pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(PREP_THREADS, "llamacmp-prep"))

    async def prep(self, fn, *args, request=None):
        """fn(*args) on the prep pool. With `request`: if its client leaves first, a job still queued never runs, one
        running stops at its next step (prep_cancel.step) and the handler ends with ClientGone."""
        left = threading.Event()
        job = asyncio.get_running_loop().run_in_executor(self.prep_pool,
                                                         functools.partial(prep_cancel.run, left, fn, *args))
        while request is not None:
            done, _ = await asyncio.wait([job], timeout=0.25)
            if done:
                break
            if await request.is_disconnected():
                left.set()
                job.cancel()
                raise ClientGone()
        return await job

    @property
    def ready(self) -> bool:
        return self.engine is not None

    @property
    def opts(self) -> ServerParams:
        return self.params.server

    @property
    def model_name(self) -> str:
        return self.opts.aliases[0] if self.opts.aliases else os.path.basename(self.params.model)

    @property
    def build_info(self) -> str:
        return f"b{BUILD_NUMBER}-llamacmp"

    @property
    def tokenizer(self):
        return self.lm.tokenizer

    @property
    def n_vocab(self) -> int:
        return self.lm.cfg.n_vocab

    def load(self, backend, ratios=None) -> None:
        """Load the model, build the template and start the engine (runs off the event loop). backend: one backend,
        or a list (several: a layer split with -ts `ratios`, see llamacmp/split/)."""
        import sys
        from .. import memplan, progress, sparse_attn
        from ..log import LineLogger
        from ..loader import check_weight_types, load_placed, open_model
        from ..run_plan import plan_run
        from ..spec import synth_log_lines
        from . import startup_log
        out = LineLogger(log)
        p = self.params
        backends = list(backend) if isinstance(backend, (list, tuple)) else [backend]
        for be in backends:
            be.sparse = sparse_attn.config_from_params(p)
        mf = open_model(p.model, p.kv_overrides)
        check_weight_types(mf.gguf, backends)       # a type without kernels: refused before the memory plan
        run = plan_run(p, mf.cfg.n_ctx_train, mf)
        for line in synth_log_lines(run.spec):
            log.warning("%s", line)
        if len(backends) == 1:       # the memory plan of the slots the engine will make (refused here if too big)
            run = memplan.planned_run(run, memplan.prepare_device(backends[0], mf, run, p.device_mem_cap, log=out))
        log.info("%s", startup_log.srv("load_model", f"loading model '{p.model}'"))
        with progress.loading(sys.stderr, enabled=log.isEnabledFor(logging.INFO)):
            lm = load_placed(mf, backends, ratios, p.split_bridge, p.n_ubatch, out, mtp=enabled_spec(run) is not None)
        _log_lines(startup_log.model_lines(lm.gguf, lm.cfg.n_ctx_train))
        self.n_slots, self.n_ctx_slot, self.spec = run.n_slots, run.n_ctx, run.spec
        # args.py already read --chat-template-file into chat_template
        self.template = select_template(lm.metadata, lm.tokenizer.tokens, p.chat_template, p.use_jinja)
        _log_lines(startup_log.context_lines(lm.cfg, run.n_slots, run.n_ctx, run.unified, run.n_batch,
                                             run.n_ubatch, run.k_type, run.v_type))
        self.defaults = ServerDefaults(p.sampling, p.n_predict, p.n_keep, tuple(p.antiprompt),
                                       self.opts.cache_prompt, p.special, self.n_ctx_slot)
        cfg = EngineConfig(n_slots=run.n_slots, n_ctx_slot=run.n_ctx, n_batch=run.n_batch, n_ubatch=run.n_ubatch,
                           k_type=run.k_type, v_type=run.v_type,
                           cache_ram_mib=self.opts.cache_ram_mib, ctx_checkpoints=self.opts.ctx_checkpoints,
                           checkpoint_every=self.opts.checkpoint_every,
                           slot_prompt_similarity=self.opts.slot_prompt_similarity,
                           spec=enabled_spec(run), sleep_idle_s=self.opts.sleep_idle_seconds,
                           cache_idle_slots=self.opts.cache_idle_slots, kv_unified=run.unified)
        if p.mmproj_path:           # a bad projector fails the start, as llama-server does
            from ..vision.projector import VisionProjector
            self.vision = VisionProjector(p.mmproj_path, lm, min_tokens=p.image_min_tokens,
                                          max_tokens=p.image_max_tokens)
        engine = Engine(lm, cfg, Reloader(p, backends, ratios, run) if cfg.sleep_idle_s > 0 else None)
        _log_lines(startup_log.slot_lines(run.n_slots, run.n_ctx, self.opts.cache_ram_mib))
        _log_lines(startup_log.template_lines(self.template, p.chat_template, p.chat_template_file,
                                              p.enable_thinking and self.template.supports_thinking))
        if self.on_fatal is not None:
            engine.on_fatal(self.on_fatal)
        engine.start()
        self.lm, self.bridge = lm, EngineBridge(engine)
        self.engine = engine            # last: from here on the server answers
        log.info("model loaded: %s, %d slots, n_ctx_slot %d, -ctk %s -ctv %s", p.model, run.n_slots, run.n_ctx,
                 run.k_type, run.v_type)


@dataclass
class Reloader:
    """What the engine needs to sleep (--sleep-idle-seconds): load the model again from the same file with the same
    plan as at start, and give the backends' memory back while it sleeps. Called on the engine thread."""
    params: Params
    backends: list
    ratios: object
    run: object

    def load(self):
        from .. import memplan
        from ..loader import load_placed, open_model
        p = self.params
        mf = open_model(p.model, p.kv_overrides)   # the file may have changed or gone: refused here with the load error
        # the plan again, and its reservation, when the arena gave its memory back; an arena that kept its chunks
        # (a tensor outlived the sleep, see CudaBackend.release_memory) has the model's blocks in its free lists
        if len(self.backends) == 1 and not getattr(self.backends[0].arena, "reserved", 0):
            memplan.prepare_device(self.backends[0], mf, self.run, p.device_mem_cap)
        return load_placed(mf, self.backends, self.ratios, p.split_bridge, p.n_ubatch,
                           mtp=enabled_spec(self.run) is not None)

    def release(self) -> None:
        for be in self.backends:
            be.release_memory()


def _log_lines(lines: list[str]) -> None:
    for line in lines:
        log.info("%s", line)
