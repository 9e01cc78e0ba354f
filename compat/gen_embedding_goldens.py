"""Generate embedding goldens from llama.cpp b8462's llama-embedding on the tiny fixture (tiny vocabulary, f32).

    python3 compat/gen_embedding_goldens.py [--llama-embedding PATH]

For each pooling (mean, last, cls, none) it runs llama-embedding with llama.cpp's defaults (f16 KV cache) on
PROMPTS (one sequence each) and stores the token ids it used and its vectors in compat/goldens/embeddings.json.
The pooled vectors are normalized as llama-server normalizes them (euclidean, its default); pooling none is
recorded raw (--embd-normalize -1), as llama-server answers it. tests/test_embedding.py writes the same fixture
(same writer, same seed) and checks llamacmp-server's /embedding and /v1/embeddings against these within 1e-3.
llama-embedding is built by compat/build_llamacpp.sh.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from llamacmp.fixtures.qwen_vocab import tiny_vocab
from llamacmp.fixtures.writer import SHAPES, write_model

HERE = Path(__file__).parent
OUT = HERE / "goldens" / "embeddings.json"
CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
DEFAULT_TOOL = CACHE / "llama.cpp-49bfddeca" / "build-cpu" / "bin" / "llama-embedding"
FIXTURE = {"shape": "tiny", "dtype": "f32", "seed": 0}
PROMPTS = ["hello world", "def parse(x): return x.split(',')"]
POOLINGS = {"mean": 2, "last": 2, "cls": 2, "none": -1}       # pooling -> --embd-normalize
TOKEN_LINE = re.compile(r"^\s*(\d+) -> '")


def fixture(folder: Path) -> Path:
    return write_model(folder / "tiny-f32.gguf", SHAPES[FIXTURE["shape"]], FIXTURE["dtype"], tiny_vocab(),
                       seed=FIXTURE["seed"])


def run(tool: Path, model: Path, prompt: str, pooling: str, normalize: int) -> dict:
    out = subprocess.run([str(tool), "-m", str(model), "-p", prompt, "--pooling", pooling, "--embd-normalize",
                          str(normalize), "--embd-output-format", "json", "--verbose-prompt", "-t", "2"],
                         check=True, capture_output=True, text=True).stdout
    tokens = [int(m.group(1)) for line in out.splitlines() if (m := TOKEN_LINE.match(line))]
    body = json.loads(out[out.index("{\n"):out.rindex("}") + 1])
    return {"tokens": tokens, "vectors": [d["embedding"] for d in body["data"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-embedding", type=Path, default=DEFAULT_TOOL)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = fixture(Path(tmp))
        cases = [{"pooling": pooling, "embd_normalize": norm, "prompt": prompt,
                  **run(args.llama_embedding, model, prompt, pooling, norm)}
                 for pooling, norm in POOLINGS.items() for prompt in PROMPTS]
    OUT.write_text(json.dumps({"llama.cpp": "b8462 (49bfddeca) llama-embedding", "fixture": FIXTURE,
                               "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
