"""MTP draft acceptance per --spec-draft-vocab N, greedy, on compat/mtp_acceptance.py's held-out prompts.

    python3 benchmarks/draft_vocab_acceptance.py                          # the demo model (+ its MTP head), numpy
    python3 benchmarks/draft_vocab_acceptance.py -m M.gguf --cuda --vocab 0,65536,32768,16384

In-process (no server): one slot, n_max drafts every round (the adaptive policy off, as llama.cpp drafts), so the
figures do not depend on measured timings. Every N's output is checked token for token against N = 0 (the whole
vocabulary): the draft vocabulary may change acceptance only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "compat")]

from llamacmp.engine.client import SlotClient  # noqa: E402
from llamacmp.engine.tasks import GenParams  # noqa: E402
from llamacmp.loader import load_model  # noqa: E402
from llamacmp.sampling import SamplingParams  # noqa: E402
from llamacmp.spec import SpecConfig  # noqa: E402


def run(lm, prompts: list[str], n_predict: int, n_max: int, vocab: int, ctx: int):
    """-> (drafted, accepted, the generated tokens per prompt)."""
    spec = SpecConfig("draft-mtp", n_max, draft_vocab=vocab)
    drafted = accepted = 0
    outs = []
    for prompt in prompts:
        c = SlotClient(lm, SimpleNamespace(n_ctx=ctx, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                           spec=spec))
        c.engine.spec.policy = None
        c.history = list(lm.tokenizer.encode(prompt))
        outs.append(c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=n_predict)).tokens)
        drafted += c.engine.spec.n_drafted
        accepted += c.engine.spec.n_accepted
    return drafted, accepted, outs


def main() -> None:
    from mtp_acceptance import heldout_prompts
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, help="a GGUF with an MTP head (default: the demo model's join)")
    ap.add_argument("--cuda", action="store_true", help="the CUDA backend (default: the numpy reference)")
    ap.add_argument("--vocab", default="0,4096,2048,1024,512", help="comma list of N (0: the whole vocabulary)")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-chars", type=int, default=1200)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=3)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    args = ap.parse_args()
    if args.model is None:
        from llamacmp.demo_model import with_mtp_head
        args.model = with_mtp_head()
    if args.cuda:
        from llamacmp.backends.cuda import CudaBackend
        be = CudaBackend()
    else:
        from llamacmp.backends.numpy_ref import NumpyBackend
        be = NumpyBackend()
    lm = load_model(args.model, be)
    prompts = heldout_prompts(args.prompts, args.prompt_chars)
    n_vocab = lm.model.mtp.head.shape[0]
    print(f"{args.model}: n_vocab {n_vocab}, {len(prompts)} prompts, n_predict {args.n_predict}, "
          f"n_max {args.draft_max}, greedy")
    print("| draft vocab | drafted | accepted | acceptance | output = full |\n|---|---|---|---|---|")
    ref = None
    for v in (int(x) for x in args.vocab.split(",")):
        d, a, outs = run(lm, prompts, args.n_predict, args.draft_max, v, args.ctx)
        ref = outs if ref is None else ref
        print(f"| {v or f'full ({n_vocab})'} | {d} | {a} | {a / max(1, d):.3f} | {outs == ref} |", flush=True)


if __name__ == "__main__":
    main()
