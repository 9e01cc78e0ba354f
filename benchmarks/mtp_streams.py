"""llamacmp-server alone, MTP off against on, at 1 and N concurrent streams (issue 19: with 4 streams MTP on must
never be slower than off; the scheduler's draft policy steps plainly where batching wins). Per setting a fresh
server (-np = the most streams), as benchmarks/side_by_side.py's spec mode measures llamacmp (same helpers):
1 stream: the server's decode rate; N: all tokens of N concurrent greedy streams over the wall time, and beside it
the steady rate (server_vs_llamacpp.measure: the tokens between every stream's first token and the first stream's
last over that span, which leaves out the start: prompts, first tokens, a graph capture at a request's start, so
that a gap in the wall rate but not in the steady one lies at the start, not in the plain steps). Under the
table, per setting and stream count, the draft policy's rounds by number of sequences in a round (the server's
llamacmp:spec_rounds_total counters over that measurement, warm-ups included): drafted / plain / probes /
explored / skipped / short / prompt, and the drafting rounds' graph captures and eager rounds. Then, for N streams,
where the wall time goes: the start (from the requests to every stream's first token), the steady part and the
tail (after the first stream's last token), in ms with the tokens delivered in each, and each part's on - off per
round (a loss at the start or in the tail shows there, not in the steady rate).
With --rounds K the settings run K times in turn (off, on, ..., off, on, ...), so that a drift of the machine lands on
every setting alike; the table gives each setting's median and the range of its rounds, and on / off per round.
    python3 benchmarks/mtp_streams.py --model M.gguf --spec-synth-len 1,2.5 [--streams 1,4] [-n 128] [--rounds K]
        [--out F.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import server_vs_llamacpp as sv  # noqa: E402
from side_by_side import draft_mean_len, single_stream_tps, spec_settings  # noqa: E402


def spec_rounds(url: str) -> dict[tuple[int, str], int]:
    """The server's llamacmp:spec_rounds_total counters -> {(S, kind): rounds} ({} with MTP off)."""
    import httpx
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("llamacmp:spec_rounds_total{"):
            labels, value = line[len("llamacmp:spec_rounds_total{"):].rsplit("} ", 1)
            kv = dict(part.split("=", 1) for part in labels.split(","))
            out[(int(kv["seqs"].strip('"')), kv["kind"].strip('"'))] = int(float(value))
    return out


def rounds_text(before: dict, after: dict) -> str:
    """What ran between two spec_rounds() readings, per number of sequences: 'S=4: plain 120, probes 2, ...'."""
    diff = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    return "; ".join(f"S={S}: " + ", ".join(f"{kind} {n}" for (s, kind), n in sorted(diff.items()) if s == S)
                     for S in sorted({S for S, _ in diff})) or "-"


PARTS = ("start", "steady", "tail")


def measure_streams(url: str, texts, n: int, args) -> tuple[float, float, str, dict]:
    """t/s of n streams (1: the decode rate), their steady t/s (1 stream: the decode rate again), the policy's
    rounds during that measurement and where the wall time went ({part: (seconds, tokens)}; {} for 1 stream)."""
    before = spec_rounds(url)
    split = {}
    if n == 1:
        tps = steady = single_stream_tps(url, texts[0], args.n, args.r, None)
    else:
        got = sv.measure(url, texts[:n], args.n)
        tps, steady = got["wall_tps"], got["steady_tps"]
        split = {part: (got[f"{part}_s"], got[f"{part}_n"]) for part in PARTS}
    return tps, steady, rounds_text(before, spec_rounds(url)), split


def split_text(split: dict) -> str:
    """'start 41 ms (4 tok), steady 5120 ms (2030 tok), tail 12 ms (6 tok)'."""
    return ", ".join(f"{part} {1e3 * split[part][0]:.0f} ms ({split[part][1]} tok)" for part in PARTS)


def run_setting(args, label: str, flags: list[str], streams: list[int], texts, env) -> tuple:
    """One fresh server of the setting -> ({streams: t/s}, mean accepted length, {streams: policy rounds text},
    {streams: steady t/s}, {streams: where the wall time went})."""
    port = sv.free_port()
    log = Path(f"/tmp/mtp-streams-{label.replace(' ', '_')}.log")
    np_ = max(streams)
    with sv.Server(sv.llamacmp_argv(args.model, port, np_, np_ * args.ctx_slot, flags + ["--metrics"]), port,
                   log, env) as srv:
        srv.wait_ready(args.load_timeout)
        got = {n: measure_streams(srv.url, texts, n, args) for n in streams}
        return ({n: g[0] for n, g in got.items()}, draft_mean_len(srv.url), {n: g[2] for n, g in got.items()},
                {n: g[1] for n, g in got.items()}, {n: g[3] for n, g in got.items()})


def split_table(runs: dict, streams: list[int]) -> list[str]:
    """Where the wall time of N streams went, per setting: each part's median ms (and tokens) over the rounds, and
    its on - off in ms per round."""
    if not streams:
        return []
    head = " | ".join(f"{part} ms (tok)" for part in PARTS)
    lines = ["", "Where the wall time of N streams goes: the start (to every stream's first token), the steady part, "
             "the tail (after the first stream's last token); medians over the rounds, and on - off per round:", "",
             f"| setting | streams | {head} | " + " | ".join(f"{part} on - off ms" for part in PARTS) + " |",
             "|---|---:|" + "---:|" * (2 * len(PARTS))]
    for label, rounds in runs.items():
        for n in streams:
            cells = [f"{1e3 * statistics.median(r[4][n][part][0] for r in rounds):.1f} "
                     f"({statistics.median(r[4][n][part][1] for r in rounds):.0f})" for part in PARTS]
            diffs = [" / ".join(f"{1e3 * (r[4][n][part][0] - off[4][n][part][0]):+.1f}"
                                for r, off in zip(rounds, runs["off"])) if label != "off" else "-" for part in PARTS]
            lines.append(f"| {label} | {n} | " + " | ".join(cells + diffs) + " |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--spec-type", default="draft-mtp", choices=["draft-mtp"])
    p.add_argument("--spec-draft-n-max", type=int, default=3)
    p.add_argument("--spec-synth-len", default="", help="comma-separated synthetic acceptance lengths")
    p.add_argument("--streams", default="1,4")
    p.add_argument("--ctx-slot", type=int, default=1024)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("-r", type=int, default=2, help="single-stream repetitions (median)")
    p.add_argument("--load-timeout", type=float, default=900)
    p.add_argument("--rounds", type=int, default=1, help="times to run every setting, in turn (default 1)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    texts = sv.prompts(max(streams), sv.vocab_size(args.model))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(sv.ROOT), os.environ.get("PYTHONPATH")])))
    runs: dict[str, list] = {}    # label -> per round ({streams: t/s}, mean len, {streams: rounds text})
    for k in range(args.rounds):
        for label, flags in spec_settings(args):
            runs.setdefault(label, []).append(run_setting(args, label, flags, streams, texts, env))
            tps = runs[label][-1][0]
            steady = runs[label][-1][3]
            split = runs[label][-1][4]
            print(f"round {k + 1} {label}: " + ", ".join(f"{n} stream(s) {t:.1f} t/s" + (
                f" (steady {steady[n]:.1f}; {split_text(split[n])})" if n > 1 else "") for n, t in tps.items()),
                flush=True)
    lines = ["| setting | streams | t/s (median, range of rounds) | on / off per round | steady t/s (median) | "
             "steady on / off per round | mean len |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label, rounds in runs.items():
        for n in streams:
            tps, steady = [r[0][n] for r in rounds], [r[3][n] for r in rounds]
            ratios = " / ".join(f"{r[0][n] / off[0][n]:.3f}" for r, off in zip(rounds, runs["off"]))
            s_ratios = " / ".join(f"{r[3][n] / off[3][n]:.3f}" for r, off in zip(rounds, runs["off"])) \
                if n > 1 else "-"
            spread = f" ({min(tps):.1f}-{max(tps):.1f})" if len(tps) > 1 else ""
            lines.append(f"| {label} | {n} | {statistics.median(tps):.1f}{spread} | {ratios} | "
                         f"{statistics.median(steady):.1f} | {s_ratios} | "
                         f"{statistics.median(r[1] for r in rounds):.2f} |")
    lines += split_table(runs, [n for n in streams if n > 1])
    lines += ["", "Draft policy rounds per number of sequences in a round (llamacmp:spec_rounds_total):"]
    lines += [f"- {label}, {n} stream(s), round {k + 1}: {r[2][n]}" for label, rounds in runs.items()
              if label != "off" for k, r in enumerate(rounds) for n in streams]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
