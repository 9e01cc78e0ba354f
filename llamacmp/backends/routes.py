"""Which unit each op family runs on (issue 20): chosen per device by the probe (or forced by --hw-route) and read
by the backend when it dispatches. The numpy reference has no routes; every route matches it within tolerance.

The rule of `choose_routes` (docs/ROUTES.md says which card gets what and why):
  - quantized matmuls, decode and prefill: the int8 dot (dp4a, dp2a, imad) with the highest measured rate, DP4A
    unless another is INT8_MARGIN x faster (on a healthy card DP2A measures ~1/2 and IMAD ~1/8 of DP4A; where DP4A
    is throttled 16x -- CMP 50HX / 90HX / 170HX -- DP2A wins; where both are, IMAD);
  - quantized matmul prefill and attention prefill: `mma` (tensor cores) when the better of the int8 mma.sync and
    f16 HMMA rates is MMA_MARGIN x that int8 dot's (healthy V100 / T4 / A100 / H200 and an unlocked CMP 100-210;
    not a throttled CMP 100-210, whose HMMA runs at 1/16);
  - decode stays on the int8 dot and FP32 attention (bandwidth bound: tensor cores buy nothing there).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping


@dataclass(frozen=True, slots=True)
class Routes:
    matmul_prefill: str = "dp4a"    # quantized GEMM (T > 16): dp4a | dp2a | imad | mma (int8 mma.sync / f16 HMMA)
    matmul_decode: str = "dp4a"     # quantized GEMV (T <= 16): dp4a | dp2a | imad
    attn_prefill: str = "fp32"      # fp32 (FFMA) | mma (f16 mma.sync over f16 caches; others keep fp32)
    attn_decode: str = "fp32"       # fp32


DEFAULT = Routes()

INT8_DOTS = ("dp4a", "dp2a", "imad")
HW_ROUTES = ("auto",) + INT8_DOTS + ("mma",)     # --hw-route values
INT8_MARGIN = 1.25   # another int8 dot replaces DP4A only when this much faster (probe noise is a few %)
MMA_MARGIN = 1.5     # tensor cores take prefill only when this much faster than the best int8 dot: an mma GEMM
                     # reaches less of its peak and converts its operands (unlocked CMP 100-210: 75 TF vs ~40 TOPS)
MIN_CC = {"dp4a": 61, "dp2a": 61, "imad": 0, "mma": 70}   # lowest compute capability (10 * major + minor) per route


class RouteError(ValueError):
    """A route the card (or this build) cannot run; the message names the flag, the value and the card."""


def choose_routes(rates: Mapping[str, float | None], cc: int) -> Routes:
    """rates: ops/s per probe unit (dp4a, dp2a, imad, ffma, hfma2, imma, hmma; None or absent = not measured or
    not on this card); cc: compute capability as 10 * major + minor. -> the Routes of the module doc's rule."""
    def rate(unit: str) -> float:
        return rates.get(unit) or 0.0
    dots = [d for d in INT8_DOTS if cc >= MIN_CC[d] and rate(d) > 0]
    if not dots:
        return replace(DEFAULT, matmul_prefill="imad", matmul_decode="imad")
    best = max(dots, key=rate)
    dot = best if "dp4a" not in dots or rate(best) >= INT8_MARGIN * rate("dp4a") else "dp4a"
    tc = max(rate("imma") if cc >= 75 else 0.0, rate("hmma") if cc >= 70 else 0.0)
    prefill = "mma" if tc >= MMA_MARGIN * rate(dot) else dot
    return Routes(matmul_prefill=prefill, matmul_decode=dot, attn_prefill="mma" if prefill == "mma" else "fp32")


def forced_routes(route: str, cc: int, card: str) -> Routes:
    """--hw-route ROUTE on a card of compute capability cc: dp4a / dp2a / imad take every quantized matmul; mma takes
    only the prefill families (matmul and attention prefill), decode stays on DP4A. RouteError where the card
    cannot run it."""
    if route not in HW_ROUTES or route == "auto":
        raise RouteError(f"--hw-route {route}: not a forced route (one of {', '.join(HW_ROUTES[1:])})")
    need = max(MIN_CC[route], MIN_CC["dp4a"] if route == "mma" else 0)
    if cc < need:
        raise RouteError(f"--hw-route {route}: {card} (compute capability {cc // 10}.{cc % 10}) cannot run it: "
                         f"{_why(route)} needs compute capability {need // 10}.{need % 10} or newer")
    if route == "mma":
        return Routes(matmul_prefill="mma", matmul_decode="dp4a", attn_prefill="mma")
    return Routes(matmul_prefill=route, matmul_decode=route)


def _why(route: str) -> str:
    return {"dp4a": "DP4A (__dp4a)", "dp2a": "DP2A (__dp2a_lo/hi)",
            "mma": "the tensor-core prefill (f16 HMMA on sm_70, int8 mma.sync from sm_75) with DP4A decode"}[route]


MMA_FAMILIES = ("matmul_prefill", "attn_prefill")   # the families a route may put on tensor cores


def without_mma(routes: Routes, families=MMA_FAMILIES) -> Routes:
    """`routes` with those of `families` that chose `mma` moved off tensor cores (a build without their kernels):
    the matmul prefill onto the decode route's int8 dot, attention prefill onto FP32."""
    off = {"matmul_prefill": routes.matmul_decode, "attn_prefill": "fp32"}
    return replace(routes, **{f: off[f] for f in families if getattr(routes, f) == "mma"})
