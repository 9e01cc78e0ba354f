"""llamacmp-bench's timed runs: the model loaded on its backend, and one repetition of a pp / tg / pp+tg test
(with --spec-type, tg by the engine's MTP draft-and-verify loop)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from .. import memplan, spec
from ..gguf_file import file_type_name
from ..engine.tasks import DraftStats
from ..spec import synth_acceptor
from .bench_options import BenchError
from .bench_rows import Instance, ModelInfo, SpecUse



def model_info(f, n_params: int, size: int) -> ModelInfo:
    arch = f.architecture
    label = f.metadata.get("general.size_label")
    if not label:
        label = f"{n_params / 1e9:.0f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M" if n_params >= 1e6 \
            else f"{n_params / 1e3:.0f}K"
    return ModelInfo(f"{arch} {label} {file_type_name(f.metadata)}", size, n_params)


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
    tensors: list = field(default_factory=list)   # memplan.TensorDesc of the file's tensors
    costs: dict = field(default_factory=dict)   # spec rows: the draft policy's CostTable per setting and depth
    pooled: dict = field(default_factory=dict)  # and the verifies pooled over the repetitions (a request's prior)

    def _ids(self, n: int) -> list[int]:
        return [int(i) for i in self.rng.integers(0, self.cfg.n_vocab, n)]

    def _sync(self) -> None:
        if self.is_cuda:
            self.be.synchronize()

    def _size_gemm_workspace(self, n_ubatch: int) -> None:
        """The block-quantized GEMM's workspace as the memory plan sizes it for the CLI and server (a layer's largest
        run of expanded weights in one pass, memplan.quant_work_bytes) where the device has that room beyond the
        80 MiB piece; the bench plans no memory (as llama-bench)."""
        work = memplan.quant_work_bytes(self.tensors, n_ubatch, self.be.gemm_work_bytes)
        if work > memplan.QUANT_WORK_PIECE and work - memplan.QUANT_WORK_PIECE > self.be.device_memory()[0]:
            work = memplan.QUANT_WORK_PIECE
        if work:
            self.be.plan_quant_work(work)

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
        from ..engine.draft_policy import Acceptance, CostTable
        from ..engine.speculative import Speculator
        key = (inst.spec, inst.n_depth, inst.type_k, inst.type_v)
        sp = Speculator.from_spec(self.model, inst.spec, self.path, self.costs.setdefault(key, CostTable()),
                                  pooled=self.pooled.setdefault(key, Acceptance()))
        ms = sp.new_seq(n_ctx, inst.type_k, inst.type_v)
        sp.start(ms)                # (a repetition starts as a server's request does)
        return sp, ms

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

            def greedy_step(tok: int):
                graph.set_tokens([tok])
                return int(graph.step_greedy()[0]), graph.h      # (the id crossing waits for the step)
        else:
            dec = Decoder(SimpleNamespace(model=self.model, backend=self.be), graphs=False, hidden=True)

            def greedy_step(tok: int):
                logits, h = dec.decode_hidden([st], [tok])
                return draw_tokens(self.be, logits, [greedy])[0], h

        def plain(tok: int) -> int:
            """One plain step, timed for the draft policy, whose head then sees its hidden state."""
            t0 = time.perf_counter()
            nxt, h = greedy_step(tok)
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
        if self.is_cuda:
            self._size_gemm_workspace(chunk)
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
    size = sum(f.nbytes(n) for n in f.names())          # as stored, as llama-bench's model size
    model = model_class(f.architecture)(cfg, load_weights(f, cfg), be)
    mtp_head = spec.has_mtp_head(f.names(), int(f.metadata.get(f"{f.architecture}.block_count", 0)))
    return Runner(be, cfg, model, model_info(f, n_params, size), is_cuda, np.random.default_rng(0), path, mtp_head,
                  memplan.tensors_of(f))
