"""Generate logits goldens from llama.cpp (≈ b8462) on fixture GGUFs written by our own fixture writer.

    python3 compat/gen_logits_goldens.py [--llama-logits PATH]

For each case (shape x weight type, real Qwen3.5 vocabulary) it writes the fixture to a temporary folder, runs
compat/llama_logits (built against the compat llama.cpp tree by compat/build_llamacpp.sh) and stores the top-20
logits of every prompt position and a 64-token greedy continuation in compat/goldens/logits/<case>.json.
tests/test_compat_logits.py regenerates the same fixture (same writer, same seed) and checks the numpy forward.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
from llamacmp.fixtures.writer import SHAPES, write_model

HERE = Path(__file__).parent
OUT = HERE / "goldens" / "logits"
CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
DEFAULT_TOOL = CACHE / "llama.cpp-49bfddeca" / "build-cpu" / "bin" / "llama_logits"

# F32 files are compared with an f32 KV cache (the 1e-4 check); Q8_0 files with llama.cpp's default f16 cache.
CASES = [
    {"name": "tiny-f32", "shape": "tiny", "dtype": "f32", "kv": "f32", "seed": 11},
    {"name": "small-f32", "shape": "small", "dtype": "f32", "kv": "f32", "seed": 12},
    {"name": "tiny-q8_0", "shape": "tiny", "dtype": "q8_0", "kv": "f16", "seed": 13},
    {"name": "small-q8_0", "shape": "small", "dtype": "q8_0", "kv": "f16", "seed": 14},
]
N_PROMPT, N_GREEDY, TOP = 40, 64, 20


def prompt_ids(seed: int, n_vocab_real: int = 248044) -> list[int]:
    """Ordinary (non-special) token ids: special tokens would end a greedy run early."""
    return [int(i) for i in np.random.default_rng(seed).integers(0, n_vocab_real - 1, N_PROMPT)]


def fixture_path(case: dict, folder: Path, vocab) -> Path:
    return write_model(folder / f"{case['name']}.gguf", SHAPES[case["shape"]], case["dtype"], vocab,
                       seed=case["seed"], name=f"compat-{case['name']}")


def run_case(case: dict, tool: Path, vocab, folder: Path) -> dict:
    model = fixture_path(case, folder, vocab)
    ids = prompt_ids(case["seed"])
    ids_file = folder / "ids.txt"
    ids_file.write_text(" ".join(map(str, ids)))
    prefix = folder / case["name"]
    subprocess.run([str(tool), str(model), str(ids_file), str(prefix), "--kv", case["kv"], "--fa", "off",
                    "--greedy", str(N_GREEDY)], check=True, capture_output=True)
    logits = np.fromfile(f"{prefix}.logits", np.float32).reshape(len(ids), -1)
    top = np.argsort(-logits, axis=1)[:, :TOP]
    greedy = [int(x) for x in Path(f"{prefix}.greedy").read_text().split()]
    return {**case, "prompt": ids, "top_ids": top.tolist(),
            "top_logits": np.take_along_axis(logits, top, 1).round(6).tolist(), "greedy": greedy,
            "source": "llama.cpp 49bfddeca (llama-cpp-python 0.3.17 sdist), CPU, compat/llama_logits.cpp"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--llama-logits", type=Path, default=DEFAULT_TOOL)
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    vocab = load_qwen35_vocab()
    with tempfile.TemporaryDirectory() as d:
        for case in CASES:
            golden = run_case(case, args.llama_logits, vocab, Path(d))
            (OUT / f"{case['name']}.json").write_text(json.dumps(golden))
            print(f"{case['name']}: greedy {golden['greedy'][:8]}...")


if __name__ == "__main__":
    main()
