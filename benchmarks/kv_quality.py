"""Quality cost of each KV-cache type against f16, on fixture models (numpy reference; issue 7 item 4).

    python3 benchmarks/kv_quality.py [--shape small] [--tokens 256]

Prints, per (K type, V type): bytes per cached token relative to f16, the logits' relative error and the mean
KL(p_f16 || p_type) over all positions of a random prompt. Random-weight models are more sensitive than
trained ones; perplexity and retrieval on the trained model (issue 9) are the real measure.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from llamacmp import kv_quant
from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.fixtures.qwen_vocab import tiny_vocab
from llamacmp.fixtures.writer import SHAPES, write_model
from llamacmp.loader import load_model

PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "tq3"), ("tq3", "tq3")]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="small", choices=sorted(SHAPES))
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        lm = load_model(write_model(Path(d) / "m.gguf", SHAPES[args.shape], "f32", tiny_vocab(), seed=7),
                        NumpyBackend())
    ids = list(np.random.default_rng(0).integers(0, lm.cfg.n_vocab, args.tokens))
    logits = {}
    for kt, vt in PAIRS:
        st = lm.backend.new_state(lm.cfg, args.tokens, kt, vt)
        logits[kt, vt] = lm.model.forward(StepBatch.build([(st, ids)], all_logits=True)).astype(np.float64)
    ref = logits["f16", "f16"]
    p_ref = softmax(ref)
    print(f"| K | V | bytes/token vs f16 | logits rel. error | mean KL (nats) |  ({args.shape}, {args.tokens} tokens)")
    print("|---|---|---|---|---|")
    for kt, vt in PAIRS:
        size = (kv_quant.BYTES_PER_VALUE[kt] + kv_quant.BYTES_PER_VALUE[vt]) / (2 * kv_quant.BYTES_PER_VALUE["f16"])
        rel = np.linalg.norm(logits[kt, vt] - ref) / np.linalg.norm(ref)
        kl = np.mean(np.sum(p_ref * (np.log(p_ref) - np.log(softmax(logits[kt, vt]))), axis=1))
        print(f"| {kt} | {vt} | {size:.3f} | {rel:.2e} | {kl:.2e} |")


if __name__ == "__main__":
    main()
