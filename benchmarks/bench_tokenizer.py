#!/usr/bin/env python3
"""Tokenizer throughput on the real Qwen3.5 vocabulary: 1 MB of mixed text, encode and decode.

    python benchmarks/bench_tokenizer.py [--mb 1.0] [--repeat 3]

Two inputs: "prose" (natural mixed-script text and code, whose words repeat as in real prompts) and
"high-entropy" (random syllables in many scripts, so nearly every word is new and the BPE cache rarely helps).
Each is timed on a freshly built tokenizer (cold word cache) and again (warm).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab  # noqa: E402
from llamacmp.tokenizer import Tokenizer  # noqa: E402

PROSE = (
    "The quick brown fox jumps over the lazy dog, and the server streams every answer back to the user. "
    "我想在apple工作1314151天，今天天气很好。 日本語のテキストも混ぜる。 안녕하세요, 세계! "
    "нещо на Български и Русский текст. مرحبا بالعالم، كيف حالك؟ Ελληνικά κείμενα. हिन्दी वाक्य। "
    "def f(x):\n\tif x:\r\n\t\treturn {'a': [1, 2, 3]}\n    return None\n"
    "Numbers 3 33 333 3333 3.14159 and emoji 👨\u200d👩\u200d👧 🦙🦙 ✅ <|im_start|>user\n<think>hi</think><|im_end|>\n"
)
SCRIPTS = [(0x61, 0x7A), (0x430, 0x44F), (0x3B1, 0x3C9), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x627, 0x64A),
           (0x905, 0x939), (0x30A1, 0x30F6)]


def prose_text(n_bytes: int) -> str:
    reps = n_bytes // len(PROSE.encode()) + 1
    return (PROSE * reps).encode()[:n_bytes].decode(errors="ignore")


def entropy_text(n_bytes: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words, size = [], 0
    while size < n_bytes:
        lo, hi = rng.choice(SCRIPTS)
        w = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(2, 8)))
        w += rng.choice([" ", " ", " ", ", ", ".\n", " 42 "])
        words.append(w)
        size += len(w.encode())
    return "".join(words).encode()[:n_bytes].decode(errors="ignore")


def build() -> Tokenizer:
    v = load_qwen35_vocab()
    return Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, v.pre, v.eos_id, v.bos_id, v.add_bos)


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n_bytes = int(args.mb * 1e6)
    _, t_build = timed(build)
    print(f"tokenizer build (vocab cached): {t_build:.2f} s")
    print(f"{'input':<14}{'MB':>6}{'tokens':>9}{'cold s':>9}{'cold MB/s':>11}{'warm s':>9}{'warm MB/s':>11}"
          f"{'decode MB/s':>13}")
    for name, text in (("prose", prose_text(n_bytes)), ("high-entropy", entropy_text(n_bytes))):
        mb = len(text.encode()) / 1e6
        best_cold = best_warm = best_dec = float("inf")
        for _ in range(args.repeat):
            tok = build()
            ids, cold = timed(tok.encode, text, True)
            _, warm = timed(tok.encode, text, True)
            _, dec = timed(tok.decode, ids)
            best_cold, best_warm, best_dec = min(best_cold, cold), min(best_warm, warm), min(best_dec, dec)
        print(f"{name:<14}{mb:>6.2f}{len(ids):>9}{best_cold:>9.3f}{mb / best_cold:>11.2f}{best_warm:>9.3f}"
              f"{mb / best_warm:>11.2f}{mb / best_dec:>13.1f}")


if __name__ == "__main__":
    main()
