"""Which unit each op family runs on (issue 20): chosen per device by the probe (or forced by --hw-route) and read
by the backend when it dispatches. The numpy reference has no routes; every route matches it within tolerance."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Routes:
    matmul_prefill: str = "dp4a"    # quantized GEMM (T > 16): dp4a | dp2a | imad | mma (int8 mma.sync / f16 HMMA)
    matmul_decode: str = "dp4a"     # quantized GEMV (T <= 16): dp4a | dp2a | imad
    attn_prefill: str = "fp32"      # fp32 (FFMA) | mma (f16 mma.sync over f16 caches; others keep fp32)
    attn_decode: str = "fp32"       # fp32


DEFAULT = Routes()
