"""Routes (issue 20): the chooser on the cards' published facts, --hw-route forcing and refusing, the probe's cache
and table, and that a forced route reaches the CUDA backend's kernel bits -- without a GPU (a fake library)."""
from __future__ import annotations

import json

import pytest

from llamacmp.arg_values import ArgError
from llamacmp.args import parse_args
from llamacmp.backends import probe
from llamacmp.backends.routes import RouteError, Routes, choose_routes, forced_routes, without_mma

T = 1e12
# ops/s per unit (2 per multiply-add) from docs/ROUTES.md's facts; the int8 dots are the route primitives' rates
# (DP2A ~1/2, IMAD ~1/8 of DP4A on a healthy card), mma figures as mma.sync reaches them.
CARDS = {
    # GV100, tensor cores held at 1/16 (~6 TF HMMA) while DP4A, FP32, HFMA2 run at full speed
    "CMP 100-210": (70, dict(dp4a=40 * T, dp2a=20 * T, imad=5 * T, ffma=9.9 * T, hfma2=22 * T, imma=None,
                             hmma=6 * T)),
    # the same card after the Sep 2026 volatile unlock: 74-75 TFLOPS f16 on tensor cores
    "CMP 100-210 unlocked": (70, dict(dp4a=40 * T, dp2a=20 * T, imad=5 * T, ffma=9.9 * T, hfma2=22 * T, imma=None,
                                      hmma=75 * T)),
    # TU102 with DP4A throttled 16x (DP2A untouched); its tensor cores throttled too
    "CMP 50HX": (75, dict(dp4a=3.3 * T, dp2a=26 * T, imad=6 * T, ffma=13 * T, hfma2=26 * T, imma=4 * T,
                          hmma=4 * T)),
    # GA102: DP4A 16x and FP32 8x cut; DP2A reported throttled too here (the "both" case): IMAD
    "DP4A and DP2A throttled": (86, dict(dp4a=2 * T, dp2a=1 * T, imad=5 * T, ffma=2 * T, hfma2=4 * T, imma=3 * T,
                                         hmma=3 * T)),
    "H200": (90, dict(dp4a=134 * T, dp2a=67 * T, imad=17 * T, ffma=67 * T, hfma2=134 * T, imma=990 * T,
                      hmma=495 * T)),
    "Tesla P40": (61, dict(dp4a=47 * T, dp2a=23 * T, imad=6 * T, ffma=11.8 * T, hfma2=0.18 * T, imma=None,
                           hmma=None)),
}


@pytest.mark.parametrize("card,want", [
    ("CMP 100-210", Routes("dp4a", "dp4a", "fp32")),
    ("CMP 100-210 unlocked", Routes("mma", "dp4a", "mma")),
    ("CMP 50HX", Routes("dp2a", "dp2a", "fp32")),
    ("DP4A and DP2A throttled", Routes("imad", "imad", "fp32")),
    ("H200", Routes("mma", "dp4a", "mma")),
    ("Tesla P40", Routes("dp4a", "dp4a", "fp32")),
])
def test_chooser_on_the_cards(card, want):
    cc, rates = CARDS[card]
    assert choose_routes(rates, cc) == want


def test_chooser_margins_and_gaps():
    # DP2A a little faster than DP4A (noise) does not move the route; 25% faster does
    assert choose_routes(dict(dp4a=10 * T, dp2a=11 * T), 75).matmul_decode == "dp4a"
    assert choose_routes(dict(dp4a=10 * T, dp2a=12.5 * T), 75).matmul_decode == "dp2a"
    # tensor cores below the margin stay off; the int8 mma rate counts only from sm_75 (sm_70 has none)
    assert choose_routes(dict(dp4a=10 * T, hmma=14 * T), 70).matmul_prefill == "dp4a"
    assert choose_routes(dict(dp4a=10 * T, imma=100 * T), 70).matmul_prefill == "dp4a"
    assert choose_routes(dict(dp4a=10 * T, imma=100 * T), 75).matmul_prefill == "mma"
    # nothing measured (a build without DP4A code): the emulation everyone can run
    assert choose_routes({}, 60) == Routes("imad", "imad", "fp32")


def test_forced_routes_and_refusals():
    assert forced_routes("dp2a", 75, "CMP 50HX") == Routes("dp2a", "dp2a", "fp32")
    assert forced_routes("imad", 60, "Tesla P100") == Routes("imad", "imad", "fp32")
    assert forced_routes("mma", 70, "CMP 100-210") == Routes("mma", "dp4a", "mma")   # decode stays DP4A
    with pytest.raises(RouteError, match=r"--hw-route mma: Tesla P40 \(compute capability 6.1\)"):
        forced_routes("mma", 61, "Tesla P40")
    with pytest.raises(RouteError, match=r"--hw-route dp4a: Tesla P100 \(compute capability 6.0\)"):
        forced_routes("dp4a", 60, "Tesla P100")
    assert without_mma(Routes("mma", "dp2a", "mma")) == Routes("dp2a", "dp2a", "fp32")
    assert without_mma(Routes("mma", "dp4a", "mma"), ["attn_prefill"]) == Routes("mma", "dp4a", "fp32")


def test_hw_route_flag_parses_and_refuses_bad_values():
    def parsed(tool, *argv):
        return parse_args(tool, ["-m", "x.gguf", *argv], {}).params.hw_route
    assert parsed("completion") == "auto"
    assert parsed("completion", "--hw-route", "dp2a") == "dp2a"
    assert parsed("server", "--hw-route", "mma") == "mma"
    assert parsed("perplexity", "--hw-route", "imad") == "imad"
    with pytest.raises(ArgError, match="--hw-route"):
        parsed("completion", "--hw-route", "tensor")


def test_numpy_backend_refuses_a_forced_route():
    """The flag is not ignored where there is nothing to route: the numpy reference refuses all but auto."""
    from llamacmp.backends.numpy_ref import NumpyBackend
    assert NumpyBackend().pick_routes("auto") == []
    with pytest.raises(RouteError, match="--hw-route dp4a: the numpy backend has no hardware routes"):
        NumpyBackend().pick_routes("dp4a")


class FakeNative:
    """What probe.py and CudaBackend.pick_routes ask of libcmpkern.so, for a card with given rates."""

    def __init__(self, card: str, mma: bool = False):
        self.card, (self.cc, self.rates) = card, CARDS[card]
        self.runs, self.loaded = 0, set()
        self.mma = mma          # whether "the library" has the mma GEMM for this device (cmp_mma_available)

    def mma_available(self):
        return self.mma

    def attn_mma_available(self):
        return False            # (the attention kernels' f16 mma: not in these tests' "library")

    def device_name(self):
        return self.card

    def device_info(self):
        return self.cc, 68, 12080

    def cmp_set_device(self, device):
        self.current = device

    def cmp_get_device(self, out):
        out._obj.value = getattr(self, "current", 0)

    def probe(self, unit, iters):
        from llamacmp.lib._native import CMP_ERR_UNSUPPORTED, NativeError
        self.runs += 1
        if self.rates.get(unit) is None:
            raise NativeError("cmp_probe", CMP_ERR_UNSUPPORTED, "not in this code")
        ops = iters * 1e9
        # the first run of a unit pays a 50 ms module load (lazy loading): the probe must not time it
        load_ms = 50.0 if unit not in self.loaded else 0.0
        self.loaded.add(unit)
        return ops / self.rates[unit] * 1e3 + load_ms, ops


def test_probe_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "library_build_id", lambda path=None: "build-a")
    nat = FakeNative("H200")
    first = probe.probe_device(nat, tmp_path)
    assert first.cached is None and nat.runs > 0
    for unit, want in CARDS["H200"][1].items():
        assert first.rates[unit] == pytest.approx(want, rel=1e-6), unit
    runs = nat.runs
    again = probe.probe_device(nat, tmp_path)
    assert nat.runs == runs and again.cached is not None and again.rates == first.rates
    # a new library build is measured again
    monkeypatch.setattr(probe, "library_build_id", lambda path=None: "build-b")
    assert probe.probe_device(nat, tmp_path).cached is None and nat.runs > runs
    assert len(list(tmp_path.glob("*.json"))) == 2
    lines = probe.table_lines(first, choose_routes(first.rates, 90), "probe")
    assert lines[0].startswith("probe: H200 (compute capability 9.0), measured in")
    assert any("DP4A int8 dot" in ln and "134.00 Tops/s" in ln for ln in lines)
    assert lines[-1] == ("probe: routes (probe): matmul prefill mma, matmul decode dp4a, attention prefill mma, "
                         "attention decode fp32")
    j = probe.as_json(first, Routes(), "probe")
    assert json.loads(json.dumps(j))["rates_ops_per_s"]["dp4a"] == pytest.approx(134 * T)


def test_probe_marks_units_the_card_lacks(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "library_build_id", lambda path=None: "b")
    r = probe.probe_device(FakeNative("Tesla P40"), tmp_path)
    assert r.rates["hmma"] is None and r.rates["imma"] is None and r.rates["dp4a"] == pytest.approx(47 * T)
    assert any("f16 HMMA" in ln and "not on this card" in ln for ln in probe.table_lines(r, Routes(), "probe"))


def _fake_cuda_backend(card: str):
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.backends.routes import DEFAULT
    be = object.__new__(CudaBackend)      # no GPU here: only what pick_routes and _dot_bits touch
    be.native, be.device, be.routes = FakeNative(card), 0, DEFAULT
    return be


@pytest.mark.parametrize("flag,decode,prefill", [("dp4a", 0, 0), ("dp2a", 1, 1), ("imad", 2, 2)])
def test_forced_route_sets_the_kernel_bits(tmp_path, monkeypatch, flag, decode, prefill):
    """--hw-route reaches cmp_matmul_*'s dot fields (api.h CmpMatmulDotField): what the kernels dispatch on."""
    pytest.importorskip("llamacmp.backends.cuda")
    monkeypatch.setattr(probe, "library_build_id", lambda path=None: "b")
    monkeypatch.setenv("LLAMACMP_CACHE", str(tmp_path))
    be = _fake_cuda_backend("H200")
    lines = be.pick_routes(flag)
    assert be.routes == Routes(flag, flag, "fp32")
    assert be._dot_bits() == decode << 8 | prefill << 10
    assert lines[-1].startswith(f"probe: routes (--hw-route {flag}): matmul prefill {flag}")


def test_auto_route_without_tensor_core_kernels_says_so(tmp_path, monkeypatch):
    """The probe picks mma on an H200, but a build without the tensor-core GEMM (a compute_61 PTX JIT-compiled
    there): DP4A, and the log says why; forcing mma is refused naming the flag."""
    pytest.importorskip("llamacmp.backends.cuda")
    monkeypatch.setattr(probe, "library_build_id", lambda path=None: "b")
    monkeypatch.setenv("LLAMACMP_CACHE", str(tmp_path))
    be = _fake_cuda_backend("H200")
    lines = be.pick_routes("auto")
    assert be.routes == Routes("dp4a", "dp4a", "fp32")
    assert "no tensor-core kernels" in lines[-1]
    with pytest.raises(RouteError, match="--hw-route mma: this build of libcmpkern.so has no tensor-core kernels"):
        be.pick_routes("mma")
    # a build with the tensor-core GEMM but no tensor-core attention: mma for the matmul prefill only
    be = _fake_cuda_backend("H200")
    be.native.mma = True
    lines = be.pick_routes("mma")
    assert be.routes == Routes("mma", "dp4a", "fp32") and "no tensor-core kernels for attn_prefill" in lines[-1]
    be = _fake_cuda_backend("CMP 50HX")
    be.pick_routes("auto")
    assert be.routes == Routes("dp2a", "dp2a", "fp32") and be._dot_bits() == 1 << 8 | 1 << 10


def test_volta_picks_its_hmma_gemm(tmp_path, monkeypatch):
    """An unlocked CMP 100-210 (or a V100) with a build holding Volta's f16 HMMA GEMM (cmp_mma_available is true
    for its compute_70 code): the probe's HMMA rate puts the matmul prefill on mma, the attention prefill (no sm_70
    kernel) stays FP32 and the log says why; --hw-route mma is accepted the same way. The throttled card keeps DP4A
    (its HMMA measures ~1/7 of DP4A)."""
    pytest.importorskip("llamacmp.backends.cuda")
    from llamacmp.lib._native import CMP_MM_MMA, CMP_MM_MMA_F16
    monkeypatch.setattr(probe, "library_build_id", lambda path=None: "b")
    monkeypatch.setenv("LLAMACMP_CACHE", str(tmp_path))
    for flag in ("auto", "mma"):
        be = _fake_cuda_backend("CMP 100-210 unlocked")
        be.native.mma = True
        lines = be.pick_routes(flag)
        assert be.routes == Routes("mma", "dp4a", "fp32")
        assert "no tensor-core kernels for attn_prefill" in lines[-1] and "matmul prefill mma" in lines[-1]
        be._mma_gemm = "auto"     # (object.__new__ skipped __init__) the device's own GEMM: no forcing bit
        assert be._route_bits() & (CMP_MM_MMA | CMP_MM_MMA_F16) == CMP_MM_MMA
    be = _fake_cuda_backend("CMP 100-210")
    be.native.mma = True
    be.pick_routes("auto")
    assert be.routes == Routes("dp4a", "dp4a", "fp32")
