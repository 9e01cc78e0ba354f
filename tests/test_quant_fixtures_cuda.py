"""The whole forward of every quantized fixture llama-quantize made (compat/make_quant_fixtures.py: one file per type
mix, the IQ1-3 grid types and unsloth-style mixes among them) on the CUDA backend against the numpy reference, on
each prefill route: a prefill long enough for the GEMM and one decode step on top of it (the GEMV)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.loader import load_model

from test_model_cuda import logits, rel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "compat"))
from make_quant_fixtures import FIXTURES, PRESETS, fixture_name  # noqa: E402

pytestmark = pytest.mark.cuda

LOADED = [p for p in PRESETS if p.loads]
# Both backends quantize the activations per block (Q8_1 per 32 on the device, the CPU vec_dot type in the
# reference), so the logits agree to the rounding of those blocks, not to fp32: the K-quant and IQ4 fixtures, whose
# kernels the model tests already hold to the reference, are the control for this tolerance.
TOL = 3e-2
PROMPT = 40        # tokens: the prefill projections run on the GEMM (more rows than the GEMV takes)


@pytest.fixture(scope="module")
def pair(cuda_backend):
    made = {}

    def get(preset):
        if preset.name not in made:
            path = FIXTURES / fixture_name(preset)
            made[preset.name] = (load_model(path, NumpyBackend()), load_model(path, cuda_backend))
        return made[preset.name]
    return get


@pytest.mark.parametrize("preset", LOADED, ids=[p.name for p in LOADED])
def test_fixture_logits_match_numpy(pair, gemm_backend, preset):
    ref, dev = pair(preset)
    assert dev.backend is gemm_backend
    ids = [int(i) for i in np.random.default_rng(7).integers(0, ref.cfg.n_vocab, PROMPT)]
    s_r, s_d = ref.backend.new_state(ref.cfg, 64, "f16"), dev.backend.new_state(dev.cfg, 64, "f16")
    lr = logits(ref, StepBatch.build([(s_r, ids)], all_logits=True))
    ld = logits(dev, StepBatch.build([(s_d, ids)], all_logits=True))
    e_prefill = rel(ld, lr)
    lr = logits(ref, StepBatch.build([(s_r, [5])]))
    ld = logits(dev, StepBatch.build([(s_d, [5])]))
    e_decode = rel(ld, lr)
    assert e_prefill < TOL and e_decode < TOL, f"{preset.name}: prefill {e_prefill:.2e}, decode {e_decode:.2e}"
