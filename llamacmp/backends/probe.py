"""The probe (issue 20): time each unit a route could use on this device (cuda_src/probe.cu), once per device,
driver, library build and boot, and keep the rates in the user cache (a volatile unlock -- CMP 100-210's -- is
lost at reboot, so a boot makes a new measurement). routes.choose_routes turns the rates into Routes.

One unit's measurement: an untimed one-step run (the module load), then its kernel at growing step counts until a
run takes TARGET_MS; rate = operations / time. All seven units take well under a second (estimate: ~10 ms each on
an H200; not yet measured).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..lib._native import CMP_ERR_UNSUPPORTED, CMP_PROBE_UNITS, Native, NativeError, library_path
from ..user_cache import cache_dir
from .routes import Routes

UNITS = tuple(CMP_PROBE_UNITS)   # dp4a, dp2a, imad, ffma, hfma2, imma, hmma
LABELS = {"dp4a": "DP4A int8 dot", "dp2a": "DP2A int8 dot", "imad": "IMAD int8 dot", "ffma": "FP32 FMA",
          "hfma2": "HFMA2 (f16x2)", "imma": "int8 mma.sync", "hmma": "f16 HMMA"}
TARGET_MS = 3.0
MAX_ITERS = 1 << 22
CACHE_VERSION = 1


@dataclass(frozen=True)
class ProbeResult:
    card: str                      # device name
    cc: int                        # compute capability, 10 * major + minor
    rates: dict[str, float | None]  # ops/s per unit (2 per multiply-add); None: not on this card / build
    seconds: float                 # what the measurement took (0 when read from the cache)
    cached: Path | None = None     # the cache file it was read from, or None when measured now


def measure_unit(native: Native, unit: str) -> float | None:
    """ops/s of one unit, or None where the library's code on this device lacks it. A first run of one step is
    not timed: it pays the kernel's module load (lazy loading) and would pass for a slow unit."""
    try:
        native.probe(unit, 1)
    except NativeError as e:
        if e.code == CMP_ERR_UNSUPPORTED:
            return None
        raise
    iters = 16
    while True:
        ms, ops = native.probe(unit, iters)
        if ms >= TARGET_MS or iters >= MAX_ITERS:
            return ops / (ms * 1e-3) if ms > 0 else None
        # aim straight at the target from this run (at most 64x per step: the first run includes warm-up)
        iters = min(MAX_ITERS, iters * max(2, min(64, int(TARGET_MS / max(ms, 1e-3)) + 1)))


def measure(native: Native) -> tuple[dict[str, float | None], float]:
    """-> (rates of every unit, seconds taken)."""
    t0 = time.perf_counter()
    rates = {u: measure_unit(native, u) for u in UNITS}
    return rates, time.perf_counter() - t0


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _driver_text() -> str:
    try:   # the kernel module's full version (cudaDriverGetVersion says only which CUDA it speaks)
        return Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return ""


def library_build_id(path: Path | None = None) -> str:
    """sha256 of libcmpkern.so's bytes (first 16 hex digits): a rebuild is a new build."""
    h = hashlib.sha256()
    with open(path or library_path(), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def cache_key(card: str, driver: str, build: str, boot: str) -> str:
    return hashlib.sha256(json.dumps([CACHE_VERSION, card, driver, build, boot]).encode()).hexdigest()[:24]


def probe_device(native: Native, folder: Path | None = None, fresh: bool = False) -> ProbeResult:
    """The rates of the current device: from the cache when this device, driver, library build and boot were
    measured before (unless `fresh`), else measured now and stored."""
    card = native.device_name()
    cc, _sms, driver = native.device_info()
    key = cache_key(card, f"{driver} {_driver_text()}", library_build_id(), _boot_id())
    path = (folder or cache_dir() / "probe") / f"{key}.json"
    try:
        if not fresh:
            data = json.loads(path.read_text())
            return ProbeResult(data["card"], data["cc"], {u: data["rates"].get(u) for u in UNITS}, 0.0, path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    rates, seconds = measure(native)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")   # two processes probing at once never share a file
        tmp.write_text(json.dumps({"card": card, "cc": cc, "driver": driver, "rates": rates}, indent=1))
        tmp.replace(path)
    except OSError:
        pass   # an unwritable cache only costs the next start another measurement
    return ProbeResult(card, cc, rates, seconds)


def table_lines(result: ProbeResult, routes: Routes, how: str) -> list[str]:
    """The probe table and the choice, as the load log and llamacmp-bench print them. how: why these routes
    ("probe", "--hw-route dp2a", ...)."""
    src = f"cached in {result.cached}" if result.cached else f"measured in {result.seconds * 1e3:.0f} ms"
    lines = [f"probe: {result.card} (compute capability {result.cc // 10}.{result.cc % 10}), {src}"]
    for u in UNITS:
        r = result.rates.get(u)
        lines.append(f"probe:   {LABELS[u]:<16} " + (f"{r / 1e12:9.2f} Tops/s" if r else "        - (not on this card)"))
    lines.append(f"probe: routes ({how}): matmul prefill {routes.matmul_prefill}, matmul decode "
                 f"{routes.matmul_decode}, attention prefill {routes.attn_prefill}, attention decode "
                 f"{routes.attn_decode}")
    return lines


def as_json(result: ProbeResult, routes: Routes, how: str) -> dict:
    """The same for llamacmp-bench's JSON output."""
    return {"card": result.card, "compute_capability": result.cc, "cached": bool(result.cached),
            "rates_ops_per_s": dict(result.rates), "route_source": how,
            "routes": {"matmul_prefill": routes.matmul_prefill, "matmul_decode": routes.matmul_decode,
                       "attn_prefill": routes.attn_prefill, "attn_decode": routes.attn_decode}}


def main(argv: list[str] | None = None) -> None:
    """python3 -m llamacmp.backends.probe [--device N] [--fresh]: the table and the routes the probe picks."""
    import argparse
    from .routes import choose_routes
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--fresh", action="store_true", help="measure now, ignoring (and replacing) the cached result")
    args = ap.parse_args(argv)
    native = Native()
    native.cmp_init(args.device)
    result = probe_device(native, fresh=args.fresh)
    routes = choose_routes(result.rates, result.cc)
    print("\n".join(table_lines(result, routes, "probe")))
    print(json.dumps(as_json(result, routes, "probe")))


if __name__ == "__main__":
    main()
