"""Plot retrieval accuracy against context length from one or more benchmarks/retrieval.py JSON files.

    python3 benchmarks/plot_retrieval.py retrieval-f16.json [retrieval-q8_0.json ...] -o retrieval.png

One line per file (labelled with its KV types unless --label is given, once per file): exact-answer accuracy with
its 95% Wilson interval as error bars, and dashed the fraction of answer tokens right; context length on a log2
axis.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--label", action="append", help="legend text per file, in order (default: the KV types)")
    ap.add_argument("--title", default="Retrieval accuracy against context length (llamacmp)")
    args = ap.parse_args(argv)
    if args.label and len(args.label) != len(args.json):
        ap.error(f"{len(args.label)} --label for {len(args.json)} files")
    import matplotlib
    matplotlib.use("Agg")                       # no display on the GPU machine or in CI
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for i, path in enumerate(args.json):
        data = json.loads(path.read_text())
        meta, rows = data["meta"], data["lengths"]
        x = [r["n_ctx"] for r in rows]
        y = [r["accuracy"] for r in rows]
        # clamped at 0: at 0/n the Wilson bound comes out as ~1e-17 rather than 0, a negative lower error bar
        # that matplotlib refuses
        err = [[max(0.0, r["accuracy"] - r["accuracy_95ci"][0]) for r in rows],
               [max(0.0, r["accuracy_95ci"][1] - r["accuracy"]) for r in rows]]
        docs = sorted({r["docs"] for r in rows})
        label = args.label[i] if args.label else f"KV {meta['cache_type_k']}/{meta['cache_type_v']}"
        label += f" ({'/'.join(map(str, docs))} docs per length, {meta['backend']})"
        line = ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)[0]
        ax.plot(x, [r["token_accuracy"] for r in rows], ls="--", lw=1, alpha=0.6, color=line.get_color(),
                label="  answer tokens right (teacher-forced)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{n // 1024}K" if n >= 1024 else str(n) for n in x])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("context length (tokens; the facts lie anywhere in it)")
    ax.set_ylabel("exact answer accuracy (greedy)")
    ax.set_title(args.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
