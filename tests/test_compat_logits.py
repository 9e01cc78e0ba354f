"""The numpy forward against llama.cpp's logits and greedy continuations, for both oracles (b8462 in
compat/goldens/logits, 0c1e570 in compat/goldens/0c1e570/logits: compat/oracles.py), within the same tolerances.
Our forward runs once per case and is judged against each oracle's golden (they usually share the prompt and the
greedy tokens)."""
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
sys.path.insert(0, str(ROOT / "compat"))
import oracles  # noqa: E402

pytestmark = pytest.mark.compat


def _params() -> list:
    """(oracle, golden path) ordered by case, so that one case's oracles run one after the other (see _ours)."""
    by_case, skipped = {}, []
    for o, folder, why in oracles.recorded("logits"):
        if folder is None:
            skipped.append(pytest.param(o, None, id=o.label, marks=pytest.mark.skip(reason=f"no {o.label} logits: "
                                                                                          f"{why}")))
            continue
        for p in sorted(folder.glob("*.json")):
            by_case.setdefault(p.stem, []).append(pytest.param(o, p, id=f"{o.label}-{p.stem}"))
        for case in _excused(o, folder):          # cases compat/oracles.py says this oracle has not recorded yet
            why = oracles.missing_case(o.label, "logits", case)
            skipped.append(pytest.param(o, None, id=f"{o.label}-{case}",
                                        marks=pytest.mark.skip(reason=f"no {o.label} {case} logits: {why}")))
    return [p for case in sorted(by_case) for p in by_case[case]] + skipped


def _excused(oracle, folder: Path) -> list[str]:
    from gen_logits_goldens import CASES
    have = {p.stem for p in folder.glob("*.json")}
    return [c["name"] for c in CASES if c["name"] not in have and oracles.missing_case(oracle.label, "logits",
                                                                                        c["name"])]


@pytest.fixture(scope="module")
def real_vocab():
    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
    return load_qwen35_vocab()


@pytest.mark.parametrize("oracle", oracles.ORACLES.values(), ids=oracles.ORACLES)
def test_goldens_are_present(oracle):
    from gen_logits_goldens import CASES
    [(_, folder, why)] = [r for r in oracles.recorded("logits") if r[0] is oracle]
    if folder is None:
        pytest.skip(f"no {oracle.label} logits: {why}")
    missing = {c["name"] for c in CASES} - {p.stem for p in folder.glob("*.json")} - set(_excused(oracle, folder))
    assert not missing, f"no golden for {sorted(missing)}: run compat/gen_logits_goldens.py --oracle " \
                        f"{oracle.label} --only ..."


_case: dict = {}      # the last case's model and forward: see _ours


@pytest.fixture(scope="module", autouse=True)
def _forget_the_last_case():
    yield
    _case.clear()


def _ours(golden: dict, vocab, tmp_path: Path):
    """Our prompt logits and, teacher-forced on llama.cpp's greedy tokens (so that one near tie cannot derail the
    rest), per greedy step (max logit, logit of llama.cpp's token, our argmax). The forward of a case is shared by
    its goldens: the oracles' greedy tokens can part (0c1e570 and b8462 on small-q8_0, after 44 of 64), and then
    the decode goes on from the checkpoint (StateOps.snapshot / restore) taken where they part."""
    from gen_logits_goldens import fixture_path
    prompt, greedy = golden["prompt"], golden["greedy"]
    key = (*(golden.get(f) for f in ("name", "file", "shape", "dtype", "seed", "kv")), tuple(prompt), len(greedy))
    if _case.get("key") != key:
        _case.clear()
        lm = load_model(fixture_path(golden, tmp_path, vocab), NumpyBackend())
        state = lm.backend.new_state(lm.cfg, len(prompt) + len(greedy) + 1, golden["kv"])
        logits = lm.model.forward(StepBatch.build([(state, prompt)], all_logits=True))  # [n_prompt, vocab]
        ops = lm.backend.state_ops()
        # fed: the greedy tokens decoded so far; rows[i], ckpts[i]: the logits and the state after fed[:i]
        _case.update(key=key, lm=lm, state=state, ops=ops, logits=logits, fed=[], rows=[logits[-1]],
                     ckpts=[ops.snapshot(state, None)])
    c = _case
    want = greedy[:-1]                 # the last step's logits come from the tokens before it
    k = next((i for i, (a, b) in enumerate(zip(c["fed"], want)) if a != b), min(len(c["fed"]), len(want)))
    if k < len(c["fed"]):
        c["ops"].restore(c["state"], c["ckpts"][k])
        del c["fed"][k:], c["rows"][k + 1:], c["ckpts"][k + 1:]
    for tok in want[k:]:
        c["rows"].append(c["lm"].model.forward(StepBatch.build([(c["state"], [tok])]))[0])
        c["fed"].append(tok)
        c["ckpts"].append(c["ops"].snapshot(c["state"], None))
    steps = [(float(row.max()), float(row[tok]), int(row.argmax())) for row, tok in zip(c["rows"], greedy)]
    return c["logits"], steps


@pytest.mark.parametrize("oracle,golden_path", _params())
def test_logits_and_greedy_match_llama_cpp(oracle, golden_path, real_vocab, tmp_path):
    from gen_logits_goldens import NEAR_TIE, TOLERANCE, tolerance_class
    golden = json.loads(golden_path.read_text())
    tol, near_tie = TOLERANCE[tolerance_class(golden["dtype"])], NEAR_TIE[tolerance_class(golden["dtype"])]
    logits, steps = _ours(golden, real_vocab, tmp_path)
    top_ids, top_vals = np.array(golden["top_ids"]), np.array(golden["top_logits"])
    ours = np.take_along_axis(logits, top_ids, 1)
    rel = np.linalg.norm(ours - top_vals) / np.linalg.norm(top_vals)
    assert rel < tol, f"top-20 logits differ from llama.cpp {oracle.label} by {rel:.2e} relative"
    decided = top_vals[:, 0] - top_vals[:, 1] > near_tie
    assert np.array_equal(logits.argmax(1)[decided], top_ids[decided, 0])
    # at every greedy step our argmax must be llama.cpp's token unless our own margin between the two is a near tie
    for i, (want, (best, got, ours_id)) in enumerate(zip(golden["greedy"], steps)):
        margin = best - got
        assert margin <= near_tie, f"greedy step {i}: we prefer {ours_id}, llama.cpp {oracle.label} chose {want} " \
                                   f"(margin {margin:.3g})"
