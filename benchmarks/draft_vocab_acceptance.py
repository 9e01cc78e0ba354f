"""MTP draft acceptance per --spec-draft-vocab (auto or N) and --spec-draft-coarse K, greedy, on held-out code,
English and Chinese prompts.

    python3 benchmarks/draft_vocab_acceptance.py                          # the demo model (+ its MTP head), numpy
    python3 benchmarks/draft_vocab_acceptance.py --spec-draft-vocab 0,1024,auto --auto-prefix 1024
    python3 benchmarks/draft_vocab_acceptance.py -m M.gguf --cuda --spec-draft-vocab 0,32768,auto
    python3 benchmarks/draft_vocab_acceptance.py --spec-draft-vocab 0 --spec-draft-coarse 0,1,4,16

In-process (no server): one slot, n_max drafts every round (the adaptive policy off, as llama.cpp drafts), so the
figures do not depend on measured timings. Every setting's output is checked token for token against the first
one's (list 0 first: the whole vocabulary): the draft vocabulary may change acceptance only.

Prompt sets (--sets): `code`, compat/mtp_acceptance.py's held-out standard-library files; `english` and `chinese`,
the short texts below. auto uses engine/draft_vocab.py's constants; --auto-prefix P scales its prefix for a small
vocabulary (the demo model has 8192 ids, under auto's 4 x 32768, so plain auto drafts from all of them there;
P = 1024 is about the share of the vocabulary that 32768 is of Qwen3.5's 248320). Each row also gives the share of
the generated tokens at or above the prefix, and with --qwen-vocab the share of Qwen3.5's own token ids >= 32768
in the same text (prompt and output decoded, encoded again with the real vocabulary).
--spec-draft-coarse K (a comma list, default 0: the exact head): the draft's argmax through a CQ2 copy of the head,
its K best rescored by the exact head, for every head of the run whatever its size (the demo model's 8192 rows are
under spec.COARSE_MIN_ROWS): the acceptance it costs on a trained head.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "compat")]

from llamacmp.engine.client import SlotClient  # noqa: E402
from llamacmp.engine.draft_vocab import AutoVocab  # noqa: E402
from llamacmp.engine.speculative import Speculator  # noqa: E402
from llamacmp.engine.tasks import GenParams  # noqa: E402
from llamacmp.loader import load_model  # noqa: E402
from llamacmp.sampling import SamplingParams  # noqa: E402
from llamacmp.spec import AUTO, CoarseHead, SpecConfig, parse_draft_coarse, parse_draft_vocab  # noqa: E402

ENGLISH = (
    "The library opened at nine every morning, and by ten the reading room was usually full. Most of the people "
    "who came were students preparing for their examinations, but there were also retired teachers, a few "
    "writers, and one old man who read the newspapers from front to back every single day.\n",
    "To install the package, first make sure that a recent version of the interpreter is available on your "
    "system. Then create a virtual environment, activate it, and run the installer. If the installation fails, "
    "read the error message carefully: it usually names the missing dependency.\n",
    "When the storm reached the coast, the fishing boats had already returned to the harbour. The wind broke "
    "several windows in the town, and the electricity failed for most of the night, but nobody was hurt.\n",
)
CHINESE = (
    "图书馆每天早上九点开门，到了十点，阅览室里通常已经坐满了人。来这里的大多数是准备考试的学生，也有退休的老师和"
    "几位作家，还有一位老人每天都会把报纸从头到尾读一遍。\n",
    "安装这个软件包之前，请先确认系统中已经有较新版本的解释器。然后创建一个虚拟环境，激活它，再运行安装程序。如果"
    "安装失败，请仔细阅读错误信息：它通常会指出缺少的依赖。\n",
)


def prompt_sets(names: list[str], count: int, chars: int) -> list[tuple[str, str]]:
    """-> (set name, prompt) for the sets asked for."""
    out = []
    for name in names:
        if name == "code":
            from mtp_acceptance import heldout_prompts
            out += [("code", p) for p in heldout_prompts(count, chars)]
        elif name in ("english", "chinese"):
            out += [(name, p) for p in (ENGLISH if name == "english" else CHINESE)[:count]]
        else:
            raise SystemExit(f"--sets: unknown set '{name}' (code, english, chinese)")
    return out


def run(lm, prompt: str, n_predict: int, n_max: int, vocab, ctx: int, auto: AutoVocab, coarse: int = 0):
    """-> (drafted, accepted, the generated tokens, auto's switches)."""
    spec = SpecConfig("draft-mtp", n_max, draft_vocab=vocab)
    c = SlotClient(lm, SimpleNamespace(n_ctx=ctx, n_batch=2048, micro_batch=512, k_type="f16", v_type="f16",
                                       spec=spec))
    if vocab == AUTO:                     # auto with these constants (the client built it with the defaults)
        c.engine.spec = Speculator(lm.model, n_max, adaptive=False, auto=auto,
                                   graphs=c.engine.spec.graphs is not None)
    sp = c.engine.spec
    sp.policy = None
    sp.set_coarse(CoarseHead(coarse, lm.model.mtp.head.shape[0], 1) if coarse else None)
    c.history = list(lm.tokenizer.encode(prompt))
    toks = c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), n_predict=n_predict)).tokens
    return sp.n_drafted, sp.n_accepted, toks, sp.vocab.n_switches if sp.vocab is not None else 0


def qwen_share(texts: list[str]) -> float:
    """The share of Qwen3.5's own token ids >= 32768 in these texts (its real 248320-id vocabulary)."""
    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab_anywhere
    from llamacmp.tokenizer import Tokenizer
    v = load_qwen35_vocab_anywhere()
    tok = Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, v.pre, v.eos_id, v.bos_id, False)
    ids = [t for text in texts for t in tok.encode(text)]
    return sum(t >= 32768 for t in ids) / max(1, len(ids))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, help="a GGUF with an MTP head (default: the demo model's join)")
    ap.add_argument("--cuda", action="store_true", help="the CUDA backend (default: the numpy reference)")
    ap.add_argument("--spec-draft-vocab", "--vocab", dest="vocab", default="0,4096,2048,1024,512,auto",
                    help="comma list of auto or N (0: the whole vocabulary); the first is the reference output")
    ap.add_argument("--spec-draft-coarse", "--coarse", dest="coarse", default="0",
                    help="comma list of K (0: the exact head): the draft's argmax through the CQ2 copy's K best")
    ap.add_argument("--auto-prefix", type=int, default=AutoVocab().prefix,
                    help="auto's prefix (default: engine/draft_vocab.py's); the other constants stay")
    ap.add_argument("--sets", default="code,english,chinese", help="comma list of prompt sets")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per set (at most)")
    ap.add_argument("--prompt-chars", type=int, default=1200)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=3)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--qwen-vocab", action="store_true", help="also the share of Qwen3.5 ids >= 32768 per set")
    args = ap.parse_args()
    vocabs = [(parse_draft_vocab(x), parse_draft_coarse(k)) for x in args.vocab.split(",")
              for k in args.coarse.split(",")]
    auto = AutoVocab(prefix=args.auto_prefix)
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
    prompts = prompt_sets(args.sets.split(","), args.prompts, args.prompt_chars)
    n_vocab = lm.model.mtp.head.shape[0]
    print(f"{args.model}: n_vocab {n_vocab}, prompts {len(prompts)} ({args.sets}), n_predict {args.n_predict}, "
          f"n_max {args.draft_max}, greedy; auto: {auto}{'' if auto.applies(n_vocab) else ' (whole vocabulary)'}")
    print("| set | draft vocab | drafted | accepted | acceptance | tokens >= prefix | auto switches | "
          "output = first |\n|---|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(n for n, _ in prompts):
        ref, texts = None, [p for n, p in prompts if n == name]
        for v, k in vocabs:
            d = a = sw = 0
            outs = []
            for _, p in ((n, p) for n, p in prompts if n == name):
                dv, av, toks, s = run(lm, p, args.n_predict, args.draft_max, v, args.ctx, auto, k)
                d, a, sw = d + dv, a + av, sw + s
                outs.append(toks)
            ref = outs if ref is None else ref
            cut = auto.prefix if v == AUTO else v
            gen = [t for o in outs for t in o]
            share = f"{sum(t >= cut for t in gen) / max(1, len(gen)):.1%}" if cut else "-"
            label = (f"auto (prefix {auto.prefix})" if v == AUTO else v or f"full ({n_vocab})") + \
                (f", coarse k {k}" if k else "")
            print(f"| {name} | {label} | {d} | {a} | {a / max(1, d):.3f} | {share} | "
                  f"{sw if v == AUTO else '-'} | {outs == ref} |", flush=True)
        if args.qwen_vocab:
            texts += [lm.tokenizer.decode(o) for o in ref]
            print(f"| {name} | Qwen3.5 ids >= 32768 in prompts + outputs | | | | {qwen_share(texts):.1%} | | |",
                  flush=True)


if __name__ == "__main__":
    main()
