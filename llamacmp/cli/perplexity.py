"""llamacmp-perplexity: llama.cpp's `llama-perplexity` over a text file (tools/perplexity, the default mode).

The text is cut into chunks of -c tokens; each chunk starts from an empty state and only its second half is
scored, so every scored token sees at least n_ctx/2 tokens of context. After each chunk the running estimate
prints as `[i]ppl,` on stdout; the final `PPL = x +/- y` (standard error of the mean log-prob, propagated) on stderr.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..args import parse_or_exit
from ..engine.sequence import Sequence
from ..params import Params
from .common import CliError, load, run_tool


@dataclass
class NllSums:
    nll: float = 0.0             # sum of -log p(token)
    nll2: float = 0.0            # sum of (log p)^2
    count: int = 0

    def add(self, logits: np.ndarray, targets: np.ndarray) -> None:
        """logits [n, n_vocab] predicting targets [n], in float64 like llama.cpp's accumulation."""
        x = logits.astype(np.float64)
        m = x.max(axis=1, keepdims=True)
        logz = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
        logp = x[np.arange(len(targets)), targets] - logz
        self.nll += float(-logp.sum())
        self.nll2 += float((logp * logp).sum())
        self.count += len(targets)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    def estimate(self) -> tuple[float, float] | None:
        """(ppl, its uncertainty) or None when the variance is not positive."""
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        if var <= 0:
            return None
        return math.exp(mean), math.sqrt(var / (self.count - 1)) * math.exp(mean)


def log(p: Params, text: str) -> None:
    if not p.log_disable:
        sys.stderr.write(text)


def run(p: Params) -> int:
    if p.ppl_stride > 0 or p.ppl_output_type != 0:
        raise CliError("error: --ppl-stride and --ppl-output-type 1 are not supported by llamacmp yet")
    if not p.prompt_file:
        raise CliError("error: llamacmp-perplexity needs the text to score: pass it with -f FILE")
    loaded = load(p)
    n_ctx = p.n_ctx if p.n_ctx > 0 else loaded.lm.cfg.n_ctx_train      # -c 0: the model's own, as llama.cpp
    tok = loaded.lm.tokenizer
    n_ctx = loaded.n_ctx
    t0 = time.perf_counter()
    log(p, "perplexity: tokenizing the input ..\n")
    tokens = np.asarray(tok.encode(p.prompt, parse_special=False, add_special=True), dtype=np.int64)
    log(p, f"perplexity: tokenization took {(time.perf_counter() - t0) * 1e3:g} ms\n")
    if len(tokens) < 2 * n_ctx:
        # llama-perplexity reports this and still exits 0; scripts that check the status see the same
        sys.stderr.write(f"perplexity: you need at least {2 * n_ctx} tokens to evaluate perplexity with a context "
                         f"of {n_ctx}\nperplexity: the data file you provided tokenizes to only {len(tokens)} tokens\n")
        return 0
    n_chunk = len(tokens) // n_ctx if p.n_chunks < 0 else min(p.n_chunks, len(tokens) // n_ctx)
    n_seq = max(1, p.n_batch // n_ctx)
    n_batch = min(p.n_batch, n_ctx * n_seq)
    log(p, f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, "
           f"n_seq={n_seq}\n")
    sums = score_chunks(p, loaded, tokens, n_ctx, n_chunk)
    sys.stdout.write("\n\n")              # the end of the [i] line, then main()'s own blank line
    est = sums.estimate()
    if est is None:
        sys.stderr.write("Unexpected negative standard deviation of log(prob)\n")
        return 1
    log(p, f"Final estimate: PPL = {est[0]:.4f} +/- {est[1]:.5f}\n")
    return 0


def score_chunks(p: Params, loaded, tokens: np.ndarray, n_ctx: int, n_chunk: int) -> NllSums:
    seq = Sequence.from_plan(loaded.lm, loaded.run)
    first = n_ctx // 2
    sums = NllSums()
    for i in range(n_chunk):
        t0 = time.perf_counter()
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
        seq.reset()
        logits = seq.feed(chunk.tolist(), all_logits=True)       # [n_ctx, n_vocab]
        # logits at position j predict token j+1; score positions first .. n_ctx-2
        sums.add(logits[first:n_ctx - 1], chunk[first + 1:])
        if i == 0:
            dt = time.perf_counter() - t0
            # llama.cpp logs the first half on stderr and prints the ETA itself on stdout
            log(p, f"perplexity: {dt:.2f} seconds per pass - ETA ")
            sys.stdout.write(_eta(dt * n_chunk) + "\n")
        sys.stdout.write(f"[{i + 1}]{sums.ppl:.4f},")
        sys.stdout.flush()
    return sums


def _eta(total_seconds: float) -> str:
    s = int(total_seconds)
    hours = f"{s // 3600} hours " if s >= 3600 else ""
    return f"{hours}{(s % 3600 if s >= 3600 else s) / 60.0:.2f} minutes"


def main(argv: list[str] | None = None) -> int:
    p = parse_or_exit("perplexity", argv)
    return run_tool(lambda: run(p))


if __name__ == "__main__":
    sys.exit(main())
