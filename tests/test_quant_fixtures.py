"""The quantized fixtures that llama.cpp's llama-quantize made (compat/make_quant_fixtures.py): what they hold, the
CLI's greedy text on them against llama-completion's (compat/goldens/cli_quant.jsonl), and the clear refusal of a
type llamacmp does not load (TQ1_0). The logits goldens of the same files are checked in test_compat_logits.py."""
from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from llamacmp.gguf_file import TYPE_NAMES, GGUFFile

from test_cli import run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "compat"))
from make_quant_fixtures import DEMO_OUT, FIXTURES, PRESETS, fixture_name  # noqa: E402

MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
CLI_GOLDENS = [json.loads(line) for line in (ROOT / "compat" / "goldens" / "cli_quant.jsonl").read_text().splitlines()]
LOADED = [p for p in PRESETS if p.loads]


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_fixture_is_the_recorded_file(preset):
    path = FIXTURES / fixture_name(preset)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == MANIFEST[path.name]["sha256"], \
        f"{path.name} is not the file make_quant_fixtures.py recorded"


@pytest.mark.parametrize("preset", LOADED, ids=[p.name for p in LOADED])
def test_fixture_holds_its_type(preset):
    """Our reader sees the recorded type mix, and the preset's own type really appears (the q256 shape exists so
    that llama-quantize does not fall back to another type for every matrix)."""
    f = GGUFFile(FIXTURES / fixture_name(preset))
    counts: dict[str, int] = {}
    for name in f.names():
        t = f.info(name).type_name
        counts[t] = counts.get(t, 0) + 1
    assert counts == MANIFEST[fixture_name(preset)]["types"]
    assert counts.get(preset.main, 0) >= 5, f"only {counts.get(preset.main, 0)} {preset.main} tensors: {counts}"


def test_ud_mix_has_every_override_type():
    types = MANIFEST[fixture_name(next(p for p in PRESETS if p.name == "UD-Q4_K_XL"))]["types"]
    assert {"F16", "BF16", "Q8_0", "Q5_K", "Q4_K", "Q6_K"} <= set(types), types


def test_ud_q2_mix_has_the_grid_types_among_k_quants_and_q8_0():
    """The UD-Q2_K_XL-style file: IQ3_XXS / IQ2_S / IQ1_S / IQ2_XXS / IQ3_S bodies among Q4_K and Q8_0 tensors, as
    unsloth's Qwen3.5/3.6-27B UD-Q2_K_XL files mix them."""
    types = MANIFEST[fixture_name(next(p for p in PRESETS if p.name == "UD-Q2_K_XL"))]["types"]
    assert {"IQ3_XXS", "IQ2_S", "IQ1_S", "IQ2_XXS", "IQ3_S", "Q4_K", "Q8_0"} <= set(types), types


def test_every_grid_type_has_a_fixture_where_it_is_the_main_type():
    from llamacmp.gguf_file import GRID_TYPES
    assert set(GRID_TYPES) <= {p.main for p in LOADED}


@pytest.mark.compat
@pytest.mark.parametrize("row", CLI_GOLDENS, ids=[Path(r["model"]).stem for r in CLI_GOLDENS])
def test_completion_text_matches_llamacpp(row):
    r = run("completion", "-m", str(ROOT / row["model"]), *shlex.split(row["args"]))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == base64.b64decode(row["stdout_b64"])


def test_cli_goldens_cover_every_loaded_fixture():
    assert {Path(r["model"]).name for r in CLI_GOLDENS} == {fixture_name(p) for p in LOADED}


def test_unsupported_type_is_refused_clearly():
    """TQ1_0 (ternary, made by llama-quantize): one error line naming the file, a tensor, its type and the supported
    list; a non-zero exit and no traceback."""
    [refused] = [p for p in PRESETS if not p.loads]
    path = FIXTURES / fixture_name(refused)
    r = run("completion", "-m", str(path), "-p", "Hello", "-n", "4", "-no-cnv")
    err = r.stderr.decode()
    assert r.returncode != 0
    assert "Traceback" not in err
    line = next(x for x in err.splitlines() if "TQ1_0" in x)
    assert path.name in line and re.search(r"tensor '[\w.]+'", line) and "supported:" in line
    assert all(t in line for t in TYPE_NAMES.values()), line


@pytest.mark.compat
def test_demo_model_in_q4_k_m_writes_llamacpps_text():
    """The bundled demo model requantized to Q4_K_M by llama-quantize (16.6 MB, not committed: made by
    `compat/make_quant_fixtures.py --demo` into $LLAMACMP_CACHE): llamacmp-completion's text equals the one
    llama-completion wrote (recorded in compat/goldens/perplexity_quant.json)."""
    want = json.loads((ROOT / "compat" / "goldens" / "perplexity_quant.json").read_text())["completion"]
    path = DEMO_OUT / want["file"]
    if not path.exists():
        pytest.skip(f"{path} is missing: run compat/make_quant_fixtures.py --demo (needs compat/build_llamacpp.sh)")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == want["file_sha256"], f"{path} is not the recorded file"
    r = run("completion", "-m", str(path), *shlex.split(want["args"]))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode("utf-8", "replace") == want["llama.cpp"]
