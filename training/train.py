"""Train the small qwen35 model: tokenizer, then AdamW with a cosine schedule on the CPython stdlib sources mixed
with the synthetic retrieval task; save the HF checkpoint and (with --export) the F32 / Q8_0 GGUFs.

    python -m training.train --preset smoke            # <= 5 min on a 2-core CPU: proves the pipeline
    python -m training.train --preset full --export    # the GPU recipe (one H200, < 20 min; fla: training/README.md)

The log goes to training/logs/<run>.log (kept in the repository); checkpoints and GGUFs to out/<run>/ (ignored).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import corpus
from .model import GDN_KERNELS, SIZES, build_model, gdn_kernel, n_params, resolve_gdn_kernel

HERE = Path(__file__).parent
REPO = HERE.parent


@dataclass(frozen=True)
class Preset:
    size: str
    vocab: int
    corpus_chars: int | None     # None: the whole train split (~29 MB of Python 3.11's Lib/)
    seq_len: int
    batch: int
    steps: int
    lr: float
    warmup: int
    # Share of the steps on retrieval documents instead of code: grows linearly from the first value to the second
    # by SHARE_RAMP_END of the run (the model first learns tokens and syntax, then the lookup).
    retrieval_share: tuple[float, float]
    # Document lengths in filler words; with the 8K vocabulary a word is ~1.18 tokens (measured: 65536 words ->
    # 77.5K tokens), so (3400, 54000) words is ~4K-64K tokens. Curriculum: a step's length is drawn log-uniformly
    # between retrieval_words[0] and an upper bound that grows geometrically from retrieval_start_words to
    # retrieval_words[1] by CURRICULUM_END of the run.
    retrieval_words: tuple[int, int]
    retrieval_start_words: int
    eval_every: int
    eval_retrieval_words: tuple[int, ...]
    max_minutes: float           # training-loop budget: stops there, and the cosine schedule ends by then
    seed: int = 0
    retrieval_pairs: int = 4     # facts per retrieval document
    retrieval_questions: int = 1  # questions at its end (each answered; the last one is the one evaluated)


PRESETS = {
    "smoke": Preset(size="smoke", vocab=2048, corpus_chars=2_000_000, seq_len=256, batch=8, steps=250, lr=3e-3,
                    warmup=15, retrieval_share=(0.2, 0.4), retrieval_words=(64, 512), retrieval_start_words=128,
                    eval_every=50, eval_retrieval_words=(128, 512), max_minutes=3.5),
    # ~80 M tokens (~10 passes over the ~8 M-token stdlib); the time guard bends the schedule if the GPU is slower.
    # Retrieval: 8 facts, all 8 asked; lengths from ~250 tokens, the upper bound growing from ~1.2K to ~64K tokens;
    # short documents are packed ~100 to a step, so the early steps carry hundreds of recall targets each
    # (training/README.md, "Next run", says why).
    "full": Preset(size="full", vocab=8192, corpus_chars=None, seq_len=2048, batch=16, steps=2500, lr=2e-3,
                   warmup=150, retrieval_share=(0.2, 0.5), retrieval_words=(200, 54000), retrieval_start_words=1000,
                   eval_every=250, eval_retrieval_words=(800, 3400, 13500, 54000), max_minutes=16.0,
                   retrieval_pairs=8, retrieval_questions=8),
}


class Log:
    """Appends to training/logs/<run>.log and echoes to stdout (the file is the record kept in git)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("w")
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


WARMUP_TIME_SHARE = 0.05       # warmup also ends after this share of the time budget (slow steps: see full.log)
SHARE_RAMP_END = 0.5           # the retrieval share reaches its final value half-way through the run
CURRICULUM_END = 0.6           # retrieval documents reach full length at 60% of the run (40% left to train on them)


def progress(step: int, p: Preset, elapsed_s: float) -> float:
    """How far along the run is, 0..1: by steps or by the time budget, whichever is further."""
    return min(1.0, max(step / p.steps, elapsed_s / (p.max_minutes * 60)))


def retrieval_share(p: Preset, frac: float) -> float:
    first, last = p.retrieval_share
    return first + (last - first) * min(1.0, frac / SHARE_RAMP_END)


def retrieval_max_words(p: Preset, frac: float) -> int:
    """The curriculum's upper document length (words) at progress `frac`: geometric growth, so each doubling of
    the length gets the same share of the ramp."""
    start, end = p.retrieval_start_words, p.retrieval_words[1]
    return int(round(start * (end / start) ** min(1.0, frac / CURRICULUM_END)))


def lr_at(step: int, p: Preset, elapsed_s: float = 0.0) -> float:
    """Linear warmup, then cosine down to 10%. Progress is by steps or by the time budget, whichever is further
    along, so a run that hits --max-minutes still ends its schedule instead of stopping at a high rate. The warmup
    ends by steps or by WARMUP_TIME_SHARE of the budget, whichever comes first: the first full run (183 steps in
    6 min) spent 150 steps warming up and then dropped from 1.9e-3 to 3.2e-4 in one step."""
    budget = p.max_minutes * 60
    warm = max((step + 1) / p.warmup, elapsed_s / (WARMUP_TIME_SHARE * budget))
    if warm < 1:
        return p.lr * warm
    frac = max((step - p.warmup) / max(1, p.steps - p.warmup), elapsed_s / budget)
    return p.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def token_stream(tok, texts, eot_id: int) -> np.ndarray:
    """All documents as one id array, each followed by <|endoftext|> (the document separator)."""
    parts = []
    for enc in tok.encode_batch(list(texts)):
        parts.append(np.asarray(enc.ids, np.int32))
        parts.append(np.asarray([eot_id], np.int32))
    return np.concatenate(parts)


def code_batch(stream: np.ndarray, p: Preset, rng: np.random.Generator):
    """(ids, labels) [batch, seq_len]: random windows of the token stream, every token a target."""
    import torch
    starts = rng.integers(0, len(stream) - p.seq_len - 1, p.batch)
    ids = torch.from_numpy(np.stack([stream[s:s + p.seq_len] for s in starts]).astype(np.int64))
    return ids, ids


IGNORE = -100                  # the label transformers' loss skips


def retrieval_batch(tok, p: Preset, rng: random.Random, frac: float, pad_id: int):
    """(ids, labels) [docs, longest] and the word count: documents of one drawn length, as many as fill the step's
    batch * seq_len tokens (at least one), right-padded (causal: padding after a document cannot change it).

    The labels are the question-and-answer tail only: the filler is random words from a 40-word list and the
    values random digits, so their loss is irreducible noise that would swamp the ~1% of tokens that are recall
    targets; the code steps keep the language modelling."""
    import torch
    lo, hi = p.retrieval_words[0], max(p.retrieval_words[0], retrieval_max_words(p, frac))
    words = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))

    def doc() -> str:
        return corpus.retrieval_doc(rng, words, p.retrieval_pairs, p.retrieval_questions).text

    texts = [doc()]
    first = tok.encode(texts[0])
    texts += [doc() for _ in range(p.batch * p.seq_len // len(first.ids) - 1)]
    rows = []
    for text, enc in zip(texts, [first] + tok.encode_batch(texts[1:])):
        tail_chars = text.index("\nQuestion:")
        rows.append((enc.ids, next(i for i, (_, end) in enumerate(enc.offsets) if end > tail_chars)))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.int64)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.int64)
    for r, (row, tail) in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row)
        labels[r, tail:len(row)] = ids[r, tail:len(row)]
    return ids, labels, words


@contextlib.contextmanager
def triangular_solve_fix(device: str):
    """Run transformers' reference Gated DeltaNet triangular solve in a wider dtype.

    CPU: MKL's batched float32 solve of the 64x64 chunk systems is ~40x slower than float64 (it dominated the
    step time). CUDA: under bf16 autocast the chunk matrices arrive as bf16, which the CUDA solver does not
    take; float32 also keeps the UT transform accurate."""
    import torch
    wide = {"cpu": {torch.float32: torch.float64}}.get(device, {torch.bfloat16: torch.float32,
                                                                 torch.float16: torch.float32})
    original = torch.linalg.solve_triangular

    def solve(a, b, **kw):
        dtype = wide.get(a.dtype) or wide.get(b.dtype)
        if dtype is None:
            return original(a, b, **kw)
        return original(a.to(dtype), b.to(dtype), **kw).to(b.dtype)

    torch.linalg.solve_triangular = solve
    try:
        yield
    finally:
        torch.linalg.solve_triangular = original


@dataclass
class Trainer:
    model: object
    opt: object
    device: str
    log: Log

    def loss(self, ids, labels=None):
        import torch
        ids = ids.to(self.device)
        labels = ids if labels is None else labels.to(self.device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device == "cuda"):
            return self.model(input_ids=ids, labels=labels, use_cache=False).loss

    def step(self, ids, labels, lr: float) -> float:
        """One optimizer step on one batch (mean loss over its labelled tokens)."""
        import torch
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss.item()


def eval_heldout(trainer: Trainer, stream: np.ndarray, p: Preset, n_chunks: int = 16) -> float:
    import torch
    trainer.model.eval()
    starts = np.linspace(0, len(stream) - p.seq_len - 1, n_chunks).astype(int)
    with torch.no_grad():
        losses = [trainer.loss(torch.from_numpy(stream[s:s + p.seq_len][None].astype(np.int64))).item()
                  for s in starts]
    trainer.model.train()
    return float(np.mean(losses))


def eval_retrieval(trainer: Trainer, tok, p: Preset, words: int, n_docs: int = 8) -> float:
    """Fraction of documents whose answer tokens are all the argmax (teacher-forced greedy recall)."""
    import torch
    rng = random.Random(10_000 + words)       # fixed evaluation documents, distinct from training draws
    trainer.model.eval()
    hits = 0
    with torch.no_grad():
        for _ in range(n_docs):
            doc = corpus.retrieval_doc(rng, words, p.retrieval_pairs, p.retrieval_questions)
            prompt, full = tok.encode(doc.prompt).ids, tok.encode(doc.text).ids
            ids = torch.tensor([full], device=trainer.device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=trainer.device == "cuda"):
                pred = trainer.model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1:-1].argmax(-1).cpu()
            hits += bool((pred == torch.tensor(full[len(prompt):])).all())
    trainer.model.train()
    return hits / n_docs


def evaluate(trainer: Trainer, tok, heldout: np.ndarray, p: Preset, step: int) -> None:
    msg = f"eval step {step}: heldout loss {eval_heldout(trainer, heldout, p):.4f}"
    for w in p.eval_retrieval_words:
        msg += f" | retrieval@{w}w {eval_retrieval(trainer, tok, p, w):.2f}"
    trainer.log(msg)


def prepare_data(p: Preset, out: Path, log: Log):
    from .tokenizer import PAD_TOKEN, train_tokenizer
    texts = list(corpus.corpus_texts("train", p.corpus_chars))
    retr = [d.text for d in corpus.retrieval_docs(p.seed, (64, 256), 200)]   # the task's words get merges too
    tok = train_tokenizer(texts + retr, p.vocab)
    tok.save(str(out / "tokenizer.json"))
    eot = tok.token_to_id(PAD_TOKEN)
    train = token_stream(tok, texts, eot)
    held_texts = list(corpus.corpus_texts("heldout"))
    (out / "heldout.txt").write_text("\n".join(held_texts))    # for llama-perplexity / llamacmp-perplexity
    heldout = token_stream(tok, held_texts, eot)
    log(f"data: {sum(map(len, texts)) / 1e6:.1f} M chars -> {len(train) / 1e6:.2f} M train tokens, "
        f"{len(heldout) / 1e6:.3f} M held-out tokens; vocab {tok.get_vocab_size()} "
        f"({len(train) and sum(map(len, texts)) / len(train):.2f} chars/token)")
    return tok, train, heldout


def train(p: Preset, run: str, out: Path, device: str, export: bool, gdn: str = "auto") -> Path:
    import torch
    import transformers
    out.mkdir(parents=True, exist_ok=True)
    log = Log(HERE / "logs" / f"{run}.log")
    log(f"run {run}: {p}")
    gpu = f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""
    log(f"device {device}{gpu}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"threads {torch.get_num_threads()}")
    gdn = resolve_gdn_kernel(gdn, device)
    if gdn == "fla":
        import fla
        log(f"gated delta rule: fla {fla.__version__} chunk_gated_delta_rule (Triton)")
    else:
        log("gated delta rule: transformers' reference torch_chunk_gated_delta_rule (PyTorch chunk loop)")
    with gdn_kernel(gdn):
        return _train(p, run, out, device, export, log)


def _train(p: Preset, run: str, out: Path, device: str, export: bool, log: Log) -> Path:
    import torch
    tok, train_ids, heldout = prepare_data(p, out, log)
    from .tokenizer import EOS_TOKEN, PAD_TOKEN
    model = build_model(SIZES[p.size], tok.get_vocab_size(), tok.token_to_id(EOS_TOKEN),
                        tok.token_to_id(PAD_TOKEN), p.seed).to(device).train()
    log(f"model {p.size}: {n_params(model) / 1e6:.2f} M parameters, {SIZES[p.size]}")
    opt = torch.optim.AdamW(model.parameters(), lr=p.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device == "cuda")
    trainer = Trainer(model, opt, device, log)
    np_rng, rng = np.random.default_rng(p.seed), random.Random(p.seed)
    pad_id = tok.token_to_id(PAD_TOKEN)
    # `elapsed` (the schedule's clock and the --max-minutes guard) is training time only: evaluations and step 0
    # (which carries the kernels' compile and autotuning, tens of seconds with fla) are left out, so neither eats
    # the warmup; the wall time is this plus those (logged).
    t0, elapsed, tokens, credit, counts = time.time(), 0.0, 0, 0.0, [0, 0]
    for step in range(p.steps):
        if step % p.eval_every == 0:
            evaluate(trainer, tok, heldout, p, step)
        t_step = time.time()
        frac = progress(step, p, elapsed)
        credit += retrieval_share(p, frac)          # deterministic interleave: exactly the share, no clumps
        is_retr = credit >= 1.0
        if is_retr:
            credit -= 1.0
            ids, labels, words = retrieval_batch(tok, p, rng, frac, pad_id)
            kind = f"retr {ids.shape[0]}x{ids.shape[1]} ({words}w, Q/A loss)"
        else:
            ids, labels = code_batch(train_ids, p, np_rng)
            kind = "code"
        lr = lr_at(step, p, elapsed)
        loss = trainer.step(ids, labels, lr)
        if step == 0:
            log(f"step 0 took {time.time() - t_step:.1f} s (first-call set-up; with fla: Triton compile, autotuning)")
        else:
            elapsed += time.time() - t_step
            tokens += int((ids != pad_id).sum()) if is_retr else ids.numel()
        counts[is_retr] += 1
        if counts[is_retr] % 10 == 1 or step == p.steps - 1:    # every 10th step of each kind
            log(f"step {step}/{p.steps} {kind} loss {loss:.4f} lr {lr:.2e} {tokens / max(elapsed, 1e-9):.0f} tok/s")
        if elapsed > p.max_minutes * 60:
            log(f"time budget of {p.max_minutes} min reached at step {step}: stopping early")
            break
    evaluate(trainer, tok, heldout, p, step + 1)
    log(f"trained {tokens / 1e6:.2f} M tokens in {elapsed / 60:.1f} min of training steps "
        f"({(time.time() - t0) / 60:.1f} min with evaluations and step 0)")
    model.to("cpu").float().save_pretrained(str(out))
    if export:
        export_ggufs(out, run, log, SIZES[p.size].max_positions)
    return out


def export_ggufs(out: Path, run: str, log: Log, n_ctx_train: int) -> None:
    from .export import load_checkpoint, write_gguf
    model, vocab = load_checkpoint(out)
    for dtype in ("f32", "q8_0"):
        path = write_gguf(out / f"{run}-{dtype}.gguf", model, vocab, dtype, f"llamacmp-qwen35-{run}",
                          n_ctx_train=n_ctx_train)
        log(f"exported {path} ({path.stat().st_size / 1e6:.1f} MB)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--run", help="run name (log file and out/ folder); default: the preset name")
    ap.add_argument("--out", help="checkpoint folder; default out/<run>")
    ap.add_argument("--steps", type=int, help="override the preset's step count")
    ap.add_argument("--max-minutes", type=float, help="override the preset's time guard")
    ap.add_argument("--eval-every", type=int, help="override the preset's evaluation interval (steps)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--gdn-kernel", choices=GDN_KERNELS, default="auto",
                    help="Gated DeltaNet chunk kernel: fla (flash-linear-attention's Triton kernel), torch "
                         "(transformers' reference), auto = fla on CUDA when importable (the log says which ran)")
    ap.add_argument("--export", action="store_true", help="also write <run>-f32.gguf and <run>-q8_0.gguf")
    args = ap.parse_args(argv)
    import torch
    p = PRESETS[args.preset]
    if args.steps:
        p = replace(p, steps=args.steps)
    if args.max_minutes:
        p = replace(p, max_minutes=args.max_minutes)
    if args.eval_every:
        p = replace(p, eval_every=args.eval_every)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    run = args.run or args.preset
    with triangular_solve_fix(device):
        train(p, run, Path(args.out) if args.out else REPO / "out" / run, device, args.export, args.gdn_kernel)


if __name__ == "__main__":
    main()
