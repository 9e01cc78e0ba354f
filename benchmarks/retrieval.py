"""Long-context retrieval accuracy through llamacmp's own engine, per context length (issue 9; reused by issue 7).

    python3 benchmarks/retrieval.py -m trained-q8_0.gguf --lengths 4096,8192,16384,32768,65536 --docs 30 \
        -ctk f16 -ctv f16 --json retrieval-f16.json

Each document is the training task of training/corpus.py: filler text of about the target length in tokens with
`The code for <key> is <4 digits>.` facts at random places, ending with questions about them, each answered;
the last question is scored. The document is fed through `engine.sequence.Sequence` (the forward path llamacmp-cli and the
server use: the selected backend, the KV cache type given by -ctk/-ctv, -ub tokens per forward), then the answer
tokens are fed one by one (teacher forcing) and compared with the argmax before each:
  exact    the whole answer is the argmax at every step (= greedy decoding reproduces it),
  token    the fraction of answer tokens that are the argmax,
  nll      the mean negative log-probability of the answer tokens (a continuous measure of damage).
Documents depend only on (--seed, length, index), so runs with different KV types score the same documents.
Lengths run round-robin (document i of every length before document i+1) until --docs each or --max-seconds,
so a time cap leaves every length with about the same count. Prints a markdown table; --json writes everything.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))     # training/ lives at the repository root

from llamacmp.backends.select import select_backend  # noqa: E402
from llamacmp.engine.sequence import Sequence  # noqa: E402
from llamacmp.loader import load_model  # noqa: E402
from training import corpus  # noqa: E402

TOKENS_PER_WORD = 1.2        # first guess for the filler (measured ~1.18 with the trained 8K vocabulary); adapted


@dataclass
class LengthResult:
    n_ctx: int
    docs: int = 0
    exact: int = 0
    token_hits: int = 0
    answer_tokens: int = 0
    nll_sum: float = 0.0
    prompt_tokens: list[int] = field(default_factory=list)
    prefill_s: float = 0.0

    @property
    def accuracy(self) -> float:
        return self.exact / self.docs if self.docs else float("nan")

    def row(self) -> dict:
        lo, hi = wilson(self.exact, self.docs)
        return {"n_ctx": self.n_ctx, "docs": self.docs, "exact": self.exact, "accuracy": self.accuracy,
                "accuracy_95ci": [lo, hi],
                "token_accuracy": self.token_hits / self.answer_tokens if self.answer_tokens else float("nan"),
                "answer_nll": self.nll_sum / self.answer_tokens if self.answer_tokens else float("nan"),
                "mean_prompt_tokens": float(np.mean(self.prompt_tokens)) if self.prompt_tokens else float("nan"),
                "prefill_tok_per_s": sum(self.prompt_tokens) / self.prefill_s if self.prefill_s else float("nan")}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (stays inside [0, 1] at 0/n and n/n)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))


def make_doc(tok, n_ctx: int, index: int, seed: int, pairs: int, questions: int, ratio: list[float]):
    """(prompt ids, answer ids) of document `index` at this length: as long as fits n_ctx with ~3% to spare.
    `ratio` (tokens per filler word, a one-element list) is refined from each document made."""
    overhead = 20 * questions + 12 * pairs              # questions, answers and facts, in tokens (about)
    words = max(1, int(0.97 * (n_ctx - overhead) / ratio[0]))
    for attempt in range(8):
        rng = random.Random(f"retrieval-{seed}-{n_ctx}-{index}-{attempt}")
        doc = corpus.retrieval_doc(rng, words, pairs, questions)
        prompt, full = tok.encode(doc.prompt), tok.encode(doc.text)
        if full[:len(prompt)] != prompt:
            raise RuntimeError(f"the answer {doc.answer!r} does not tokenize as a continuation of the prompt")
        ratio[0] = max(0.5, (len(full) - overhead) / words)
        if len(full) <= n_ctx:
            return prompt, full[len(prompt):]
        words = max(1, int(words * 0.97 * n_ctx / len(full)))
    raise RuntimeError(f"could not make a document that fits n_ctx={n_ctx} with {pairs} facts and {questions} "
                       "questions: use a longer length or fewer --pairs / --questions")


def score_doc(lm, session: Sequence, prompt: list[int], answer: list[int]) -> tuple[int, int, float, float]:
    """(all right, tokens right, summed answer NLL, prefill seconds) with teacher-forced answer tokens."""
    session.reset()
    t0 = time.perf_counter()
    logits = session.feed(prompt)
    prefill = time.perf_counter() - t0
    hits, nll = 0, 0.0
    for i, tok in enumerate(answer):
        x = np.asarray(logits, np.float64)
        m = x.max()
        nll += float(m + math.log(np.exp(x - m).sum()) - x[tok])
        hits += int(np.argmax(x)) == tok
        if i + 1 < len(answer):
            logits = session.feed([tok])
    return int(hits == len(answer)), hits, nll, prefill


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--lengths", default="4096,8192,16384,32768,65536",
                    help="context lengths in tokens, comma-separated (each document fills ~97%% of one)")
    ap.add_argument("--docs", type=int, default=30, help="documents per length")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop starting new rounds after this (0: no cap)")
    ap.add_argument("-ctk", "--cache-type-k", default="f16")
    ap.add_argument("-ctv", "--cache-type-v", default="f16")
    ap.add_argument("-ub", "--ubatch-size", type=int, default=512, help="tokens per forward during the prefill")
    ap.add_argument("-ngl", "--n-gpu-layers", default="all", help="0: the numpy reference backend (slow)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pairs", type=int, default=8, help="facts per document (the trained model's task: 8)")
    ap.add_argument("--questions", type=int, default=8, help="questions at the end, the last one scored (8)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    backend = select_backend(cpu_only=args.n_gpu_layers == "0")
    lm = load_model(args.model, backend)
    print(f"model {args.model} ({lm.cfg.n_ctx_train} training context), backend {backend.name}, "
          f"KV {args.cache_type_k}/{args.cache_type_v}, ubatch {args.ubatch_size}", flush=True)
    results = {n: LengthResult(n) for n in lengths}
    sessions = {n: Sequence(lm, n, args.ubatch_size, args.ubatch_size, args.cache_type_k, args.cache_type_v)
                for n in lengths}
    ratio, t_start, stopped = [TOKENS_PER_WORD], time.perf_counter(), ""
    for i in range(args.docs):
        if args.max_seconds and time.perf_counter() - t_start > args.max_seconds:
            stopped = f"time cap of {args.max_seconds:g} s reached after {i} documents per length"
            break
        for n in lengths:
            prompt, answer = make_doc(lm.tokenizer, n, i, args.seed, args.pairs, args.questions, ratio)
            exact, hits, nll, prefill = score_doc(lm, sessions[n], prompt, answer)
            r = results[n]
            r.docs, r.exact, r.token_hits, r.nll_sum = r.docs + 1, r.exact + exact, r.token_hits + hits, r.nll_sum + nll
            r.answer_tokens += len(answer)
            r.prompt_tokens.append(len(prompt))
            r.prefill_s += prefill
        print(f"  round {i + 1}: " + " ".join(f"{n}:{results[n].exact}/{results[n].docs}" for n in lengths)
              + f" ({time.perf_counter() - t_start:.0f} s)", flush=True)
        write_json(args, backend, lm, results, lengths, stopped, t_start)    # after every round: a kill keeps it
    if stopped:
        print(stopped)
    rows = write_json(args, backend, lm, results, lengths, stopped, t_start)
    print(f"\n| n_ctx | mean prompt tokens | docs | exact accuracy (95% CI) | answer-token accuracy | answer NLL "
          f"| prefill tok/s |  KV {args.cache_type_k}/{args.cache_type_v}")
    print("|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n_ctx']} | {r['mean_prompt_tokens']:.0f} | {r['docs']} | {r['accuracy']:.3f} "
              f"({r['accuracy_95ci'][0]:.2f}-{r['accuracy_95ci'][1]:.2f}) | {r['token_accuracy']:.3f} "
              f"| {r['answer_nll']:.3f} | {r['prefill_tok_per_s']:.0f} |")
    if args.json:
        print(f"wrote {args.json}")
    return 0


def write_json(args, backend, lm, results: dict, lengths: list[int], stopped: str, t_start: float) -> list[dict]:
    rows = [results[n].row() for n in lengths]
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "json"}
        meta.update(backend=backend.name, n_ctx_train=lm.cfg.n_ctx_train, stopped=stopped,
                    seconds=time.perf_counter() - t_start, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        Path(args.json).write_text(json.dumps({"meta": meta, "lengths": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(main())
