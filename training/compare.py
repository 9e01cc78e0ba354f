"""Check an exported model against llama.cpp: greedy continuation token ids and held-out perplexity.

    python -m training.compare out/smoke/smoke-q8_0.gguf --heldout out/smoke/heldout.txt [--prompt "def "]

Greedy: our numpy forward vs compat/llama_logits (llama.cpp's own decode loop), both on the same prompt ids and
with the same KV type. Perplexity: llamacmp-perplexity vs llama-perplexity on the first --chars of the held-out
text with the same -c and --chunks. Prints a markdown summary for training/README.md.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.loader import load_model

CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
LLAMA_BIN = CACHE / "llama.cpp-49bfddeca" / "build-cpu" / "bin"


def our_greedy(lm, prompt: list[int], n: int, kv: str) -> list[int]:
    state = lm.backend.new_state(lm.cfg, len(prompt) + n + 1, kv)
    logits = lm.model.forward(StepBatch.build([(state, prompt)]))[0]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = lm.model.forward(StepBatch.build([(state, [out[-1]])]))[0]
    return out


def llama_greedy(model: Path, prompt: list[int], n: int, kv: str, folder: Path) -> list[int]:
    ids = folder / "ids.txt"
    ids.write_text(" ".join(map(str, prompt)))
    subprocess.run([str(LLAMA_BIN / "llama_logits"), str(model), str(ids), str(folder / "g"), "--kv", kv,
                    "--fa", "off", "--greedy", str(n)], check=True, capture_output=True)
    return [int(x) for x in (folder / "g.greedy").read_text().split()]


def llama_tokenize(model: Path, text_file: Path) -> list[int]:
    r = subprocess.run([str(LLAMA_BIN / "llama-tokenize"), "-m", str(model), "-f", str(text_file), "--ids",
                        "--no-bos", "--log-disable"], capture_output=True, text=True, check=True)
    return [int(x) for x in re.findall(r"-?\d+", r.stdout.strip().splitlines()[-1])]


def tokenizer_agreement(lm, model: Path, heldout: Path, n_chars: int, folder: Path) -> tuple[bool, int]:
    """Our encode (parse_special like llama-tokenize's default) vs llama-tokenize on a held-out slice."""
    text = heldout.read_text()[:n_chars] + "\n<think>x</think> <|im_end|> héllo ✓ 12345\n"
    path = folder / "tok.txt"
    path.write_text(text)
    ours = lm.tokenizer.encode(text, parse_special=True)
    return ours == llama_tokenize(model, path), len(ours)


def final_ppl(cmd: list[str]) -> float:
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"PPL = ([0-9.]+)", r.stdout + r.stderr)
    if not m:
        raise RuntimeError(f"no PPL in the output of {cmd[0]}:\n{r.stderr[-2000:]}")
    return float(m.group(1))


def perplexities(model: Path, text_file: Path, ctx: int, chunks: int) -> tuple[float, float]:
    common = ["-m", str(model), "-f", str(text_file), "-c", str(ctx), "--chunks", str(chunks), "-t", "2"]
    ours = final_ppl(["llamacmp-perplexity", *common])
    theirs = final_ppl([str(LLAMA_BIN / "llama-perplexity"), *common])
    return ours, theirs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--prompt", action="append", help="greedy prompts (repeatable); default a few code openings")
    ap.add_argument("-n", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--kv", default="f16", help="KV cache type on both sides (llama.cpp's default is f16)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    args = ap.parse_args(argv)
    prompts = args.prompt or ["def ", "import os\n", "class Parser:\n    def __init__(self", "    return "]
    lm = load_model(args.model, NumpyBackend())
    same = total = 0
    with tempfile.TemporaryDirectory() as d:
        agree, n_tok = tokenizer_agreement(lm, args.model, args.heldout, 20000, Path(d))
        print(f"tokenizer vs llama-tokenize on {n_tok} held-out tokens: {'identical' if agree else 'DIFFERENT'}")
        for p in prompts:
            ids = lm.tokenizer.encode(p)
            ours, theirs = our_greedy(lm, ids, args.n, args.kv), llama_greedy(args.model, ids, args.n, args.kv, Path(d))
            first_diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
            same += sum(a == b for a, b in zip(ours, theirs))
            total += len(theirs)
            print(f"prompt {p!r}: {'identical' if first_diff is None else f'first difference at token {first_diff}'}"
                  f" -> {lm.tokenizer.decode(ours)!r}")
    print(f"greedy agreement: {same}/{total} tokens identical over {len(prompts)} prompts")
    ours_ppl, theirs_ppl = perplexities(args.model, args.heldout, args.ctx, args.chunks)
    print(f"perplexity (-c {args.ctx}, {args.chunks} chunks): llamacmp {ours_ppl:.4f}, llama.cpp {theirs_ppl:.4f}, "
          f"difference {100 * abs(ours_ppl - theirs_ppl) / theirs_ppl:.3f}%")


if __name__ == "__main__":
    main()
