"""llamacmp-bench's test instances (the cartesian product of the option lists) and their results: llama-bench's
JSON/CSV fields, the environment facts they carry (build commit, CPU)."""
from __future__ import annotations

import itertools
import math
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .. import BUILD_NUMBER
from ..engine.tasks import DraftStats
from ..spec import SpecConfig
from .bench_options import DEFAULT_MODEL


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
    vocab = f" V{cfg.draft_vocab}" if cfg.draft_vocab else ""           # (no V: the whole vocabulary)
    coarse = f" C{cfg.draft_coarse}" if cfg.draft_coarse != SpecConfig().draft_coarse else ""  # (no C: the default)
    return f"mtp n{cfg.n_max}{synth}{vocab}{coarse}"


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
                "spec_draft_vocab": sp.draft_vocab if sp.enabled else 0,
                "spec_draft_coarse": sp.draft_coarse if sp.enabled else 0,
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


@dataclass
class ModelInfo:
    desc: str          # "qwen35 9B Q8_0"
    size: int          # bytes of all tensors
    n_params: int


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
