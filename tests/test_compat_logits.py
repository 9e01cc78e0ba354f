"""The numpy forward against llama.cpp's logits and greedy continuations (goldens in compat/goldens/logits)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.loader import load_model

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = sorted((ROOT / "compat" / "goldens" / "logits").glob("*.json"))
sys.path.insert(0, str(ROOT / "compat"))

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def real_vocab():
    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
    return load_qwen35_vocab()


def test_goldens_are_present():
    from gen_logits_goldens import CASES
    missing = {c["name"] for c in CASES} - {p.stem for p in GOLDENS}
    assert not missing, f"no golden for {sorted(missing)}: run compat/gen_logits_goldens.py --only ..."


@pytest.mark.parametrize("golden_path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_logits_and_greedy_match_llama_cpp(golden_path, real_vocab, tmp_path):
    from gen_logits_goldens import NEAR_TIE, TOLERANCE, fixture_path, tolerance_class
    golden = json.loads(golden_path.read_text())
    tol, near_tie = TOLERANCE[tolerance_class(golden["dtype"])], NEAR_TIE[tolerance_class(golden["dtype"])]
    lm = load_model(fixture_path(golden, tmp_path, real_vocab), NumpyBackend())
    state = lm.backend.new_state(lm.cfg, len(golden["prompt"]) + len(golden["greedy"]) + 1, golden["kv"])
    logits = lm.model.forward(StepBatch.build([(state, golden["prompt"])], all_logits=True))
    top_ids, top_vals = np.array(golden["top_ids"]), np.array(golden["top_logits"])
    ours = np.take_along_axis(logits, top_ids, 1)
    rel = np.linalg.norm(ours - top_vals) / np.linalg.norm(top_vals)
    assert rel < tol, f"top-20 logits differ from llama.cpp by {rel:.2e} relative"
    decided = top_vals[:, 0] - top_vals[:, 1] > near_tie
    assert np.array_equal(logits.argmax(1)[decided], top_ids[decided, 0])
    # Greedy, teacher-forced on llama.cpp's tokens so that one near tie cannot derail the rest: at every step
    # our argmax must be llama.cpp's token unless our own margin between the two is a near tie.
    step_logits = logits[-1]
    for i, want in enumerate(golden["greedy"]):
        margin = step_logits.max() - step_logits[want]
        assert margin <= near_tie, f"greedy step {i}: we prefer {int(step_logits.argmax())}, " \
                                                   f"llama.cpp chose {want} (margin {margin:.3g})"
        step_logits = lm.model.forward(StepBatch.build([(state, [want])]))[0]
