"""Train an MTP head (training/mtp.py) for an existing `qwen35` GGUF with its trunk frozen, and export the GGUF
with the head added (the trunk's tensors byte-identical).

    python -m training.train_mtp --preset test --gguf llamacmp/data/default.gguf     # CPU, ~1 min: proves it
    python -m training.train_mtp --preset full --max-minutes 2.5                     # the GPU run (README)
    python -m training.train_mtp --export-from out/mtp/mtp_head.pt --gguf SRC.gguf --out out/mtp   # GGUF only

The trunk's hidden states are computed once over the train split (the trunk is frozen), kept on the device, and
the head trains on them for as many passes as the time budget allows: each step costs one decoder block and the
LM head, not the 8-layer trunk. Log: training/logs/<run>.log; head and GGUF: out/<run>/ (ignored).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import corpus
from .train import HERE, REPO, Log, lr_at, token_stream

DEFAULT_GGUF = REPO / "llamacmp" / "data" / "default.gguf"


@dataclass(frozen=True)
class MTPPreset:
    corpus_chars: int | None     # None: the whole train split
    seq_len: int
    batch: int
    steps: int
    lr: float
    warmup: int
    eval_every: int
    max_minutes: float           # training steps only (lr_at's clock); the cosine ends by then
    heldout_tokens: int          # held-out tokens evaluated (whole windows)
    seed: int = 0
    # > 0: also train the second draft step as llama.cpp chains it (the head's own output as h; mtp.py
    # chained_logits), weighted so; 0: the next-next-token loss alone (the run in training/README.md)
    chain_weight: float = 0.0


PRESETS = {
    "test": MTPPreset(corpus_chars=16_000, seq_len=64, batch=4, steps=20, lr=2e-3, warmup=5, eval_every=10,
                      max_minutes=2.0, heldout_tokens=512),
    "full": MTPPreset(corpus_chars=None, seq_len=2048, batch=16, steps=20_000, lr=1e-3, warmup=50, eval_every=250,
                      max_minutes=2.5, heldout_tokens=65536),
}


def windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """[n, seq_len] non-overlapping windows of the token stream (the tail shorter than a window is dropped)."""
    n = len(stream) // seq_len
    if n == 0:
        raise ValueError(f"{len(stream)} tokens do not fill one window of {seq_len}")
    return stream[:n * seq_len].reshape(n, seq_len).astype(np.int64)


def trunk_states(model, ids: np.ndarray, batch: int, device: str, dtype):
    """ids [n, T] -> (ids, h) on the device: the frozen trunk's output-normed hidden states [n, T, D] in `dtype`,
    computed once (float32 forward: close to what llama.cpp computes from the same weights)."""
    import torch
    ids_t = torch.from_numpy(ids).to(device)
    h = torch.empty((*ids.shape, model.trunk.config.hidden_size), dtype=dtype, device=device)
    for i in range(0, len(ids), batch):
        h[i:i + batch] = model.hidden(ids_t[i:i + batch]).to(dtype)
    return ids_t, h


def evaluate(model, ids, h, batch: int, device: str) -> dict[str, float]:
    import torch
    model.head.eval()
    parts = []
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        for i in range(0, len(ids), batch):
            parts.append((len(ids[i:i + batch]), model.metrics(h[i:i + batch], ids[i:i + batch])))
    model.head.train()
    n = sum(k for k, _ in parts)
    return {key: sum(k * m[key] for k, m in parts) / n for key in parts[0][1]}


def fmt(m: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in m.items())


class Best:
    """The head with the lowest held-out loss so far (float32 on the CPU): many passes over a 3 M-token corpus
    can overfit a 2 M-parameter head, and the cosine schedule ends by time, not by held-out loss."""

    def __init__(self):
        self.step, self.metrics, self.state = -1, {"loss": float("inf")}, None

    def update(self, step: int, metrics: dict[str, float], head, log) -> None:
        log(f"eval step {step}: {fmt(metrics)}")
        if metrics["loss"] < self.metrics["loss"]:
            self.step, self.metrics = step, metrics
            self.state = {k: v.detach().float().cpu().clone() for k, v in head.state_dict().items()}


RESERVE_S = 20.0                 # --wall-minutes: kept for the final evaluation and saving after the last step


def train(p: MTPPreset, gguf_path: Path, run: str, out: Path, device: str, export: bool,
          log_dir: Path = HERE / "logs", wall_minutes: float | None = None) -> Path:
    """wall_minutes: the whole run (data, trunk states, steps, evaluations, save) ends by then: the steps get
    what is left, at most p.max_minutes (a lent GPU's time is fixed, the data and set-up time is not)."""
    t_start = time.time()
    import torch
    import transformers
    from . import from_gguf, tokenizer
    from .mtp import MTPModel
    out.mkdir(parents=True, exist_ok=True)
    log = Log(log_dir / f"{run}.log")
    log(f"run {run}: {p}, trunk {gguf_path}")
    log(f"device {device}{f' ({torch.cuda.get_device_name()})' if device == 'cuda' else ''}, torch "
        f"{torch.__version__}, transformers {transformers.__version__}")
    torch.manual_seed(p.seed)
    g = from_gguf.read(gguf_path)
    trunk, vocab = from_gguf.load_trunk(g)
    model = MTPModel(trunk)
    model.head.init_from_trunk(trunk)
    model.to(device)
    n_head = sum(x.numel() for x in model.head.parameters())
    log(f"trunk {sum(x.numel() for x in trunk.parameters()) / 1e6:.2f} M parameters (frozen), "
        f"MTP head {n_head / 1e6:.2f} M")
    tok = tokenizer.from_vocab(vocab)
    eot = tok.token_to_id(tokenizer.PAD_TOKEN)
    train_ids = windows(token_stream(tok, list(corpus.corpus_texts("train", p.corpus_chars)), eot), p.seq_len)
    held = token_stream(tok, list(corpus.corpus_texts("heldout")), eot)[:p.heldout_tokens]
    held_ids = windows(held, min(p.seq_len, len(held)))
    t0 = time.time()
    state_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.autocast("cuda", enabled=False):
        ids, h = trunk_states(model, train_ids, p.batch, device, state_dtype)
        hids, hh = trunk_states(model, held_ids, p.batch, device, state_dtype)
    log(f"trunk states: {ids.numel() / 1e6:.2f} M train tokens ({len(ids)} x {p.seq_len}), "
        f"{hids.numel()} held-out tokens, in {time.time() - t0:.1f} s")
    if wall_minutes is not None:
        left = wall_minutes * 60 - (time.time() - t_start) - RESERVE_S
        if left < 30:
            raise RuntimeError(f"--wall-minutes {wall_minutes}: only {left:.0f} s left for training steps")
        p = replace(p, max_minutes=min(p.max_minutes, left / 60))
        log(f"--wall-minutes {wall_minutes}: {p.max_minutes:.2f} min of training steps")
    opt = torch.optim.AdamW(model.head.parameters(), lr=p.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device == "cuda")
    gen = torch.Generator(device="cpu").manual_seed(p.seed)
    best = Best()
    best.update(0, evaluate(model, hids, hh, p.batch, device), model.head, log)
    elapsed, step = 0.0, 0
    for step in range(1, p.steps + 1):
        t_step = time.time()
        lr = lr_at(step - 1, p, elapsed)
        for group in opt.param_groups:
            group["lr"] = lr
        pick = torch.randint(0, len(ids), (p.batch,), generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model.loss(h[pick], ids[pick], p.chain_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.head.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == 1:
            # .item() syncs; only on logged steps, so the timing below counts the GPU's work
            log(f"step {step} loss {loss.item():.4f} lr {lr:.2e} "
                f"{step * p.batch * p.seq_len / max(elapsed, 1e-9):.0f} tok/s")
        elapsed += time.time() - t_step
        if step % p.eval_every == 0:
            best.update(step, evaluate(model, hids, hh, p.batch, device), model.head, log)
        if elapsed > p.max_minutes * 60:
            log(f"time budget of {p.max_minutes} min reached at step {step}")
            break
    if step % p.eval_every:
        best.update(step, evaluate(model, hids, hh, p.batch, device), model.head, log)
    log(f"kept the head of step {best.step} (lowest held-out loss): {fmt(best.metrics)}")
    log(f"trained {step} steps, {step * p.batch * p.seq_len / 1e6:.1f} M tokens "
        f"({step * p.batch / len(ids):.1f} passes) in {elapsed / 60:.2f} min of steps")
    head_path = out / "mtp_head.pt"
    torch.save(best.state, head_path)
    log(f"saved {head_path}")
    if export:
        export_gguf(head_path, gguf_path, out, log)
    return head_path


def export_gguf(head_path: Path, gguf_path: Path, out: Path, log=print) -> Path:
    import torch
    from . import from_gguf
    from .export import write_with_mtp
    head_sd = {k: v.numpy() for k, v in torch.load(head_path).items()}
    src = from_gguf.read(gguf_path)
    dst = write_with_mtp(src, head_sd, out / f"{gguf_path.stem}-mtp.gguf")
    log(f"exported {dst} ({dst.stat().st_size / 1e6:.1f} MB)")
    return dst


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="test")
    ap.add_argument("--gguf", default=str(DEFAULT_GGUF), help="the trunk: a qwen35 GGUF without an MTP block")
    ap.add_argument("--run", help="run name (log file and out/ folder); default mtp-<preset>")
    ap.add_argument("--out", help="output folder; default out/<run>")
    ap.add_argument("--steps", type=int, help="override the preset's step count")
    ap.add_argument("--max-minutes", type=float, help="override the preset's time budget (training steps)")
    ap.add_argument("--chain-weight", type=float, help="weight of the second draft step's loss (default 0: off)")
    ap.add_argument("--wall-minutes", type=float, help="end the whole run by then (the steps get what is left)")
    ap.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--export", action="store_true", help="also write <out>/<gguf stem>-mtp.gguf")
    ap.add_argument("--export-from", metavar="HEAD.pt", help="no training: export this saved head with --gguf")
    args = ap.parse_args(argv)
    import torch
    run = args.run or f"mtp-{args.preset}"
    out = Path(args.out) if args.out else REPO / "out" / run
    if args.export_from:
        clash = [f for f, v in (("--steps", args.steps), ("--max-minutes", args.max_minutes),
                                ("--chain-weight", args.chain_weight is not None),
                                ("--wall-minutes", args.wall_minutes), ("--device", args.device),
                                ("--export", args.export)) if v]
        if clash:
            ap.error(f"--export-from trains nothing: {', '.join(clash)} would have no effect")
        out.mkdir(parents=True, exist_ok=True)
        export_gguf(Path(args.export_from), Path(args.gguf), out)
        return
    p = PRESETS[args.preset]
    if args.steps:
        p = replace(p, steps=args.steps)
    if args.max_minutes:
        p = replace(p, max_minutes=args.max_minutes)
    if args.chain_weight is not None:
        p = replace(p, chain_weight=args.chain_weight)
    from .train import triangular_solve_fix
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with triangular_solve_fix(device):
        train(p, Path(args.gguf), run, out, device, args.export, wall_minutes=args.wall_minutes)


if __name__ == "__main__":
    main()
