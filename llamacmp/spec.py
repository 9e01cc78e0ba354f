"""Speculative decoding settings (llama.cpp's --spec-* options), parsed once at the edge into a typed object.

Only `draft-mtp` (the model's own multi-token-prediction head) is run; other spec types are refused where the
options are parsed. The `synth_*` fields are llama.cpp's benchmarking knobs (--spec-synth-len / --spec-synth-rates):
acceptance decided synthetically instead of by comparing tokens, so a run measures the cost of a given acceptance.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpecConfig:
    type: str = "none"                    # "none" | "draft-mtp"
    n_max: int = 3                        # --spec-draft-n-max: most tokens drafted per step
    n_min: int = 0                        # --spec-draft-n-min
    p_min: float = 0.0                    # --spec-draft-p-min: stop drafting below this draft probability
    synth_len: float | None = None        # --spec-synth-len L: mean accepted length (benchmarks only)
    synth_rates: tuple[float, ...] = ()   # --spec-synth-rates P0,P1,..: acceptance probability per draft position

    @property
    def enabled(self) -> bool:
        return self.type != "none"
