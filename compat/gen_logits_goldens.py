"""Generate logits goldens from llama.cpp (b8462, or 0c1e570) on fixture GGUFs written by our own fixture writer.

    python3 compat/gen_logits_goldens.py [--oracle b8462|0c1e570] [--llama-logits PATH] [--only NAME ...]

For each case (shape x weight type, real Qwen3.5 vocabulary) it writes the fixture to a temporary folder, runs
compat/llama_logits (built against the compat llama.cpp tree by compat/build_llamacpp.sh) and stores the top-20
logits of every prompt position and a 64-token greedy continuation in the oracle's logits/<case>.json
(compat/goldens/logits/, or compat/goldens/0c1e570/logits/; the oracle's own llama_logits by default).
tests/test_compat_logits.py regenerates the same fixture (same writer, same seed) and checks the numpy forward.
The quantized cases (q256-*) use the committed files that llama-quantize made (compat/make_quant_fixtures.py, tiny
vocabulary) instead of a regenerated fixture.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import oracles

from llamacmp.fixtures.qwen_vocab import NORMAL, load_qwen35_vocab, tiny_vocab
from llamacmp.fixtures.writer import SHAPES, write_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# F32 files are compared with an f32 KV cache (the 1e-4 check); Q8_0 files with llama.cpp's default f16 cache.
CASES = [
    {"name": "tiny-f32", "shape": "tiny", "dtype": "f32", "kv": "f32", "seed": 11},
    {"name": "small-f32", "shape": "small", "dtype": "f32", "kv": "f32", "seed": 12},
    {"name": "tiny-q8_0", "shape": "tiny", "dtype": "q8_0", "kv": "f16", "seed": 13},
    {"name": "small-q8_0", "shape": "small", "dtype": "q8_0", "kv": "f16", "seed": 14},
]
QUANT_FIXTURES = "compat/fixtures/quant"        # relative to the repository root
# appended, never inserted: a case's prompt seed is its place here
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_S", "Q5_K_S", "Q6_K", "IQ4_NL", "IQ4_XS",
               "Q4_K_M", "Q5_K_M", "UD-Q4_K_XL", "IQ2_XXS", "IQ2_XS", "IQ2_M", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
               "UD-Q2_K_XL")
CASES += [{"name": f"q256-{t}", "file": f"{QUANT_FIXTURES}/q256-{t}.gguf", "dtype": t, "kv": "f16", "seed": 30 + i}
          for i, t in enumerate(QUANT_TYPES)]
N_PROMPT, N_GREEDY, TOP = 40, 64, 20

# F32 weights: everything but summation order is the same function -> 1e-4. Quantized weights (Q8_0 and the other
# block types): both sides quantize the activations to int8 blocks the same way, but an activation sitting on a
# rounding boundary can land one quantum apart after a tiny upstream difference, and random models amplify that
# (measured on Q8_0: ~5e-3).
TOLERANCE = {"f32": 1e-4, "quantized": 2e-2}
# Where llama.cpp's own top two logits are closer than this, either choice is within the noise above.
NEAR_TIE = {"f32": 0.0, "quantized": 0.05}


def tolerance_class(dtype: str) -> str:
    return "f32" if dtype == "f32" else "quantized"


def prompt_ids(seed: int, n_ordinary: int = 248044) -> list[int]:
    """Ordinary (non-special) token ids: special tokens would end a greedy run early."""
    return [int(i) for i in np.random.default_rng(seed).integers(0, n_ordinary - 1, N_PROMPT)]


def case_prompt(case: dict) -> list[int]:
    if "file" not in case:
        return prompt_ids(case["seed"])
    return prompt_ids(case["seed"], sum(t == NORMAL for t in tiny_vocab().token_types))


def fixture_path(case: dict, folder: Path, vocab) -> Path:
    """The committed file of a quantized case; else the writer's fixture (real vocabulary), regenerated in folder."""
    if "file" in case:
        return ROOT / case["file"]
    return write_model(folder / f"{case['name']}.gguf", SHAPES[case["shape"]], case["dtype"], vocab,
                       seed=case["seed"], name=f"compat-{case['name']}")


def run_case(case: dict, tool: Path, vocab, folder: Path, oracle: oracles.Oracle = oracles.B8462) -> dict:
    model = fixture_path(case, folder, vocab)
    ids = case_prompt(case)
    ids_file = folder / "ids.txt"
    ids_file.write_text(" ".join(map(str, ids)))
    prefix = folder / case["name"]
    subprocess.run([str(tool), str(model), str(ids_file), str(prefix), "--kv", case["kv"], "--fa", "off",
                    "--greedy", str(N_GREEDY)], check=True, capture_output=True)
    logits = np.fromfile(f"{prefix}.logits", np.float32).reshape(len(ids), -1)
    top = np.argsort(-logits, axis=1)[:, :TOP]
    greedy = [int(x) for x in Path(f"{prefix}.greedy").read_text().split()]
    return oracle.stamp({**case, "prompt": ids, "top_ids": top.tolist(),
                         "top_logits": np.take_along_axis(logits, top, 1).round(6).tolist(), "greedy": greedy,
                         "source": f"llama.cpp {oracle.short} ({oracle.sdist} sdist), CPU, compat/llama_logits.cpp"})


def main() -> None:
    p = argparse.ArgumentParser()
    oracles.add_argument(p)
    p.add_argument("--llama-logits", type=Path, help="default: the oracle's build (compat/oracles.py)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these cases (default all)")
    args = p.parse_args()
    oracle = oracles.parse(args.oracle)
    tool = args.llama_logits or oracle.tool("llama_logits")
    out = oracle.golden("logits")
    out.mkdir(parents=True, exist_ok=True)
    vocab = load_qwen35_vocab()
    with tempfile.TemporaryDirectory() as d:
        for case in CASES:
            if args.only and case["name"] not in args.only:
                continue
            golden = run_case(case, tool, vocab, Path(d), oracle)
            (out / f"{case['name']}.json").write_text(json.dumps(golden))
            print(f"{case['name']}: greedy {golden['greedy'][:8]}...")


if __name__ == "__main__":
    main()
