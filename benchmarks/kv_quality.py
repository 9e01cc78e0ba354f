"""Quality cost of each KV-cache format against f16, numpy reference (issue 7 item 4).

    python3 benchmarks/kv_quality.py [--shape small] [--tokens 256] [--pairs all]
    python3 benchmarks/kv_quality.py --model /tmp/trained-q8_0.gguf --text /tmp/trained-heldout.txt --tokens 512

Prints, per (K format, V format): bytes per cached token relative to f16; the attention-output error (every
attention layer's own inputs from the f16 run, attended again with K and V read back in that format: the op's
error alone, relative Frobenius norm, mean over layers); and over the whole forward the logits' relative error,
the mean KL(p_f16 || p_format) and the share of positions whose argmax is unchanged. Without --model: a
random-weight fixture (F32 weights, tiny vocabulary, random token ids), more sensitive than a trained model; with
--model and --text: the first --tokens tokens of the text.
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
from llamacmp.sparse_attn import Chunk, attend_chunk

PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("tq3", "tq3"), ("q8_0", "tq3"), ("f16", "tq3"),
         ("q8_0", "q4_0")]
GRID = ("f16", "q8_0", "q4_0", "tq3")


class RecordingBackend(NumpyBackend):
    """The numpy reference that also keeps each attention layer's inputs (q after RoPE, k, v) of its last call."""

    def __init__(self):
        self.seen: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def attention(self, q, k, v, batch, layer, cfg):
        self.seen[layer] = (q.copy(), k.copy(), v.reshape(len(v), cfg.n_head_kv, cfg.head_dim).copy())
        return super().attention(q, k, v, batch, layer, cfg)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def attention_error(seen: dict, k_type: str, v_type: str) -> float:
    """Mean over attention layers of |attn(q, K', V') - attn(q, K16, V16)| / |attn(q, K16, V16)|, whole prompt."""
    errs = []
    for q, k, v in seen.values():
        T = len(q)
        full = np.broadcast_to(Chunk(0, T, 64).causal(), (k.shape[1], Chunk(0, T, 64).nqb, Chunk(0, T, 64).nkb))
        ref = attend_chunk(q, kv_quant.roundtrip(k, "f16"), kv_quant.roundtrip(v, "f16"), 0, full, q.shape[2] ** -0.5,
                           64)
        got = attend_chunk(q, kv_quant.roundtrip(k, k_type), kv_quant.roundtrip(v, v_type), 0, full,
                           q.shape[2] ** -0.5, 64)
        errs.append(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    return float(np.mean(errs))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="small", choices=sorted(SHAPES))
    p.add_argument("--model", help="a GGUF to measure instead of the random fixture")
    p.add_argument("--text", help="with --model: the text whose first --tokens tokens are the prompt")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--pairs", default="list", choices=["list", "all"],
                   help="list: the issue's pairs; all: every K x V of f16, q8_0, q4_0, tq3")
    args = p.parse_args()
    be = RecordingBackend()
    if args.model:
        lm = load_model(args.model, be)
        ids = lm.tokenizer.encode(Path(args.text).read_text(), parse_special=False, add_special=True)[:args.tokens]
        what = f"{Path(args.model).name}, first {len(ids)} tokens of {Path(args.text).name}"
    else:
        with tempfile.TemporaryDirectory() as d:
            lm = load_model(write_model(Path(d) / "m.gguf", SHAPES[args.shape], "f32", tiny_vocab(), seed=7), be)
        ids = list(np.random.default_rng(0).integers(0, lm.cfg.n_vocab, args.tokens))
        what = f"random-weight {args.shape} fixture, {args.tokens} random tokens"
    pairs = [(k, v) for k in GRID for v in GRID] if args.pairs == "all" else PAIRS
    logits, seen = {}, None
    for kt, vt in [("f16", "f16")] + [pr for pr in pairs if pr != ("f16", "f16")]:
        st = lm.backend.new_state(lm.cfg, len(ids), kt, vt)
        logits[kt, vt] = lm.model.forward(StepBatch.build([(st, ids)], all_logits=True)).astype(np.float64)
        if seen is None:
            seen = dict(be.seen)            # the f16 run's attention inputs
    ref = logits["f16", "f16"]
    p_ref = softmax(ref)
    top_ref = ref.argmax(1)
    print(f"({what})")
    print("| K | V | bytes/token vs f16 | attention-output rel. error | logits rel. error | mean KL (nats) "
          "| argmax unchanged |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kt, vt in pairs:
        size = (kv_quant.BYTES_PER_VALUE[kt] + kv_quant.BYTES_PER_VALUE[vt]) / (2 * kv_quant.BYTES_PER_VALUE["f16"])
        rel = np.linalg.norm(logits[kt, vt] - ref) / np.linalg.norm(ref)
        kl = np.mean(np.sum(p_ref * (np.log(p_ref) - np.log(softmax(logits[kt, vt]))), axis=1))
        same = np.mean(logits[kt, vt].argmax(1) == top_ref)
        print(f"| {kt} | {vt} | {size:.3f} | {attention_error(seen, kt, vt):.2e} | {rel:.2e} | {kl:.2e} "
              f"| {100 * same:.1f}% |")


if __name__ == "__main__":
    main()
