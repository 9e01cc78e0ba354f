"""Generate vision goldens from llama.cpp's mtmd (≈ b8462) on mmproj + text fixtures written by our own writers.

    python3 compat/gen_vision_goldens.py [--tool PATH]

For each case (mmproj F32 / F16 x images of different sizes and aspect ratios) it writes the fixtures to a
temporary folder, runs compat/llama_mtmd (compat/build_oracle_tools.sh builds it) and stores in
compat/goldens/vision/: <case>.json (the chunks mtmd made of the prompt, n_past after it, the top-20 logits after
the prompt, 32 greedy tokens) and <case>.embd.npy (the image embeddings, float32 [n_tokens, n_embd]).
The images are drawn here (deterministic) and kept beside the goldens as PNG. The encoder runs with flash
attention off (exact f32 attention); the text model with an f32 KV cache and flash attention off.
tests/test_compat_vision.py regenerates the same fixtures (same writers, same seeds) and checks our numpy path.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
OUT = HERE / "goldens" / "vision"
CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
DEFAULT_TOOL = CACHE / "llama.cpp-49bfddeca" / "build-cpu" / "bin" / "llama_mtmd"

PROMPT = "<|im_start|>user\n<__media__>What is in this picture?<|im_end|>\n<|im_start|>assistant\n"
IMAGES = {            # name: (width, height); smart resize takes them to multiples of 32 within 8..4096 tokens
    "wide": (100, 60),
    "tall": (72, 230),
    "square": (320, 240),
}
CASES = [
    {"name": "f32-wide", "dtype": "f32", "image": "wide", "seed": 21},
    {"name": "f32-tall", "dtype": "f32", "image": "tall", "seed": 21},
    {"name": "f32-square", "dtype": "f32", "image": "square", "seed": 21},
    {"name": "f16-wide", "dtype": "f16", "image": "wide", "seed": 22},
    {"name": "f16-square", "dtype": "f16", "image": "square", "seed": 22},
]
N_GREEDY, TOP = 32, 20


def draw_image(name: str) -> np.ndarray:
    """A deterministic picture (gradients, a disc, a little noise): compresses well and is not flat."""
    w, h = IMAGES[name]
    rng = np.random.default_rng(len(name) * 1000 + w)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    b = np.where((x - w / 3) ** 2 + (y - h / 2) ** 2 < (min(w, h) / 3) ** 2, 230.0, 40.0)
    img = np.stack([r, g, b], -1) + rng.normal(0, 12, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def image_path(name: str) -> Path:
    return OUT / f"{name}.png"


def fixtures(case: dict, folder: Path) -> tuple[Path, Path]:
    from llamacmp.fixtures.mmproj_writer import VISION_SHAPES, write_mmproj, write_text_model
    mm = write_mmproj(folder / f"mmproj-{case['dtype']}-{case['seed']}.gguf", VISION_SHAPES["tiny"], case["dtype"],
                      case["seed"])
    text = write_text_model(folder / f"text-{case['seed']}.gguf", "tiny", "f32", case["seed"])
    return text, mm


def run_case(case: dict, tool: Path, folder: Path) -> dict:
    text, mm = fixtures(case, folder)
    prompt_file = folder / "prompt.txt"
    prompt_file.write_text(PROMPT)
    prefix = folder / case["name"]
    subprocess.run([str(tool), str(text), str(mm), str(image_path(case["image"])), str(prompt_file), str(prefix),
                    "--greedy", str(N_GREEDY), "--clip-fa", "off", "--kv", "f32"], check=True, capture_output=True)
    chunks, n_past = [], None
    for line in Path(f"{prefix}.chunks").read_text().splitlines():
        kind, *vals = line.split()
        if kind == "text":
            chunks.append({"text": [int(v) for v in vals]})
        elif kind == "image":
            nx, ny, n_tokens, n_pos = map(int, vals)
            chunks.append({"image": {"nx": nx, "ny": ny, "n_tokens": n_tokens, "n_pos": n_pos}})
        else:
            n_past = int(vals[0])
    n_tokens = next(c["image"]["n_tokens"] for c in chunks if "image" in c)
    embd = np.fromfile(f"{prefix}.embd", np.float32).reshape(n_tokens, -1)
    np.save(OUT / f"{case['name']}.embd.npy", embd)
    logits = np.fromfile(f"{prefix}.logits", np.float32)
    top = np.argsort(-logits)[:TOP]
    greedy = [int(t) for t in Path(f"{prefix}.greedy").read_text().split()]
    return {**case, "prompt": PROMPT, "chunks": chunks, "n_past": n_past, "top_ids": top.tolist(),
            "top_logits": [float(logits[i]) for i in top], "greedy": greedy}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tool", type=Path, default=DEFAULT_TOOL)
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    from PIL import Image
    for name in IMAGES:
        Image.fromarray(draw_image(name)).save(image_path(name), optimize=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            golden = run_case(case, args.tool, Path(tmp))
            (OUT / f"{case['name']}.json").write_text(json.dumps(golden, indent=1) + "\n")
            print(f"{case['name']}: {golden['chunks'][1]['image']} greedy {golden['greedy'][:8]}...")


if __name__ == "__main__":
    main()
