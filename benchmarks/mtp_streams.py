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
round (a loss at the start or in the tail shows there, not in the steady rate). Last, the plain decode steps of
N rows that ran back to back, per step: the host's parts (between steps, the launch, its work beside the forward)
and the wait for the device (the server's llamacmp:plain_step_seconds_total), so that a steady loss with MTP on is
placed on the host or the device.
With --timeline the servers run with -v (their per-token debug lines cost every setting alike) and, per setting and
round, the start of the measured N streams is printed from the server's log (its 'start timeline' line of each
request at its first token: when the engine got it, when a slot took it, its prompt chunks, the host time of the MTP
head's part of them and of graphs captured at the prompt's end, the first token), in ms after the first of the N
reached the engine.
With --rounds K the settings run K times, every other round in reverse order (off, on, on, off, off, on, ...: ABBA),
so that a drift of the machine (clocks, temperature, a neighbour) lands on every setting alike and a steady drift
cancels over two rounds; with a fixed order "on" always ran after "off", and a machine slowing down over a call
counted against it (back-to-back runs of one setting differed by 3-7% on the H200, 2026-12-05). The table gives each
setting's median and the range of its rounds, on / off per round, and their geometric mean over the rounds.
    python3 benchmarks/mtp_streams.py --model M.gguf --spec-synth-len 1,2.5 [--streams 1,4] [-n 128] [--rounds K]
        [--timeline] [--out F.md]
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import server_vs_llamacpp as sv  # noqa: E402
from side_by_side import draft_mean_len, single_stream_tps, spec_settings  # noqa: E402
from llamacmp.engine.perf import STEP_PARTS  # noqa: E402  (the server's part labels; sv put the tree on the path)


def labelled(url: str, name: str) -> list[tuple[dict, float]]:
    """The server's /metrics samples of one labelled llamacmp-only metric -> [({label: value}, sample)]."""
    import httpx
    head = name + "{"
    out = []
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(head):
            labels, value = line[len(head):].rsplit("} ", 1)
            out.append(({k: v.strip('"') for k, v in (part.split("=", 1) for part in labels.split(","))},
                        float(value)))
    return out


def spec_rounds(url: str) -> dict[tuple[int, str], int]:
    """The server's llamacmp:spec_rounds_total counters -> {(S, kind): rounds} ({} with MTP off)."""
    return {(int(kv["seqs"]), kv["kind"]): int(v) for kv, v in labelled(url, "llamacmp:spec_rounds_total")}


def rounds_text(before: dict, after: dict) -> str:
    """What ran between two spec_rounds() readings, per number of sequences: 'S=4: plain 120, probes 2, ...'."""
    diff = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    return "; ".join(f"S={S}: " + ", ".join(f"{kind} {n}" for (s, kind), n in sorted(diff.items()) if s == S)
                     for S in sorted({S for S, _ in diff})) or "-"


def plain_steps(url: str) -> dict[int, dict[str, float]]:
    """The server's llamacmp:plain_step_seconds_total / plain_steps_total lines (engine/perf.py StepClock) ->
    {S: {"steps": n, part: seconds}}."""
    out: dict[int, dict[str, float]] = {}
    for kv, v in labelled(url, "llamacmp:plain_step_seconds_total"):
        out.setdefault(int(kv["seqs"]), {})[kv["part"]] = v
    for kv, v in labelled(url, "llamacmp:plain_steps_total"):
        out.setdefault(int(kv["seqs"]), {})["steps"] = v
    return out


def step_parts(before: dict, after: dict, S: int) -> dict[str, float]:
    """The plain steps of S rows between two plain_steps() readings -> {"steps": n, part: ms per step} ({} when
    none ran)."""
    a, b = after.get(S, {}), before.get(S, {})
    n = a.get("steps", 0) - b.get("steps", 0)
    if n <= 0:
        return {}
    return {"steps": n, **{part: 1e3 * (a[part] - b.get(part, 0.0)) / n for part in STEP_PARTS}}


PARTS = ("start", "steady", "tail")


def round_order(settings: list, k: int) -> list:
    """The settings of round k (0-based): as given in even rounds, reversed in odd ones (ABBA)."""
    return list(settings) if k % 2 == 0 else list(reversed(settings))


def measure_streams(url: str, texts, n: int, args) -> tuple[float, float, str, dict, dict]:
    """t/s of n streams (1: the decode rate), their steady t/s (1 stream: the decode rate again), the policy's
    rounds during that measurement, where the wall time went ({part: (seconds, tokens)}; {} for 1 stream) and the
    plain steps of n rows meanwhile (step_parts)."""
    before, steps = spec_rounds(url), plain_steps(url)
    split = {}
    if n == 1:
        tps = steady = single_stream_tps(url, texts[0], args.n, args.r, None)
    else:
        got = sv.measure(url, texts[:n], args.n)
        tps, steady = got["wall_tps"], got["steady_tps"]
        split = {part: (got[f"{part}_s"], got[f"{part}_n"]) for part in PARTS}
    return tps, steady, rounds_text(before, spec_rounds(url)), split, step_parts(steps, plain_steps(url), n)


def split_text(split: dict) -> str:
    """'start 41 ms (4 tok), steady 5120 ms (2030 tok), tail 12 ms (6 tok)'."""
    return ", ".join(f"{part} {1e3 * split[part][0]:.0f} ms ({split[part][1]} tok)" for part in PARTS)


TIMELINE = re.compile(r"id +(\d+) \| task (\d+) \| start timeline: queued at ([\d.]+) ms, assigned \+([\d.]+), "
                      r"(?:prompt \+([\d.]+) \.\. \+([\d.]+) \((\d+) chunks\)|prompt cached), "
                      r"mtp head ([\d.]+) ms, mtp graphs ([\d.]+) ms, first token \+([\d.]+)")


def start_timelines(log_text: str, n: int) -> list[dict]:
    """The server log's last n 'start timeline' lines (slot_log.start_timeline, at -v) -> per request: slot, task,
    and in ms after the first of them reached the engine: queued, assigned, prompt0 / prompt1 (its chunks' first
    launch and last; None: all cached), first; and chunks, head and graphs (ms of host time)."""
    rows = []
    for m in TIMELINE.finditer(log_text):
        slot, task, queued, assigned, p0, p1, chunks, head, graphs, first = m.groups()
        q = float(queued)
        rows.append({"slot": int(slot), "task": int(task), "queued": q, "assigned": q + float(assigned),
                     "prompt0": q + float(p0) if p0 else None, "prompt1": q + float(p1) if p1 else None,
                     "chunks": int(chunks or 0), "head": float(head), "graphs": float(graphs),
                     "first": q + float(first)})
    rows = sorted(rows[-n:], key=lambda r: r["queued"]) if n > 0 else []
    t0 = rows[0]["queued"] if rows else 0.0
    for r in rows:
        for key in ("queued", "assigned", "prompt0", "prompt1", "first"):
            r[key] = None if r[key] is None else r[key] - t0
    return rows


def timeline_table(timelines: dict) -> list[str]:
    """{(setting, round): start_timelines()} -> a table, one row per request."""
    if not timelines:
        return []

    def ms(x):
        return "-" if x is None else f"{x:.1f}"
    lines = ["", "Start of the measured streams per request (--timeline; the server's 'start timeline' lines), ms "
             "after the first request reached the engine; head and graphs: host ms of the MTP head's prompt work "
             "and of graphs captured at the prompt's end:", "",
             "| setting | round | slot | task | queued | assigned | prompt launched | chunks | head ms | graphs ms "
             "| first token |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (label, k), rows in timelines.items():
        for r in rows:
            lines.append(f"| {label} | {k} | {r['slot']} | {r['task']} | {ms(r['queued'])} | {ms(r['assigned'])} | "
                         f"{ms(r['prompt0'])} .. {ms(r['prompt1'])} | {r['chunks']} | {r['head']:.1f} | "
                         f"{r['graphs']:.1f} | {ms(r['first'])} |")
    return lines


def run_setting(args, label: str, flags: list[str], streams: list[int], texts, env) -> tuple:
    """One fresh server of the setting -> ({streams: t/s}, mean accepted length, {streams: policy rounds text},
    {streams: steady t/s}, {streams: where the wall time went}, the measured N streams' start_timelines()
    (--timeline; [] without), {streams: its plain steps' parts (step_parts)})."""
    port = sv.free_port()
    log = Path(f"/tmp/mtp-streams-{label.replace(' ', '_')}.log")
    np_ = max(streams)
    flags = flags + ["--metrics"] + (["-v"] if args.timeline else [])
    with sv.Server(sv.llamacmp_argv(args.model, port, np_, np_ * args.ctx_slot, flags), port, log, env) as srv:
        srv.wait_ready(args.load_timeout)
        got = {n: measure_streams(srv.url, texts, n, args) for n in streams}
        out = ({n: g[0] for n, g in got.items()}, draft_mean_len(srv.url), {n: g[2] for n, g in got.items()},
               {n: g[1] for n, g in got.items()}, {n: g[3] for n, g in got.items()})
    # (the last N requests are the measured N streams: the warm-up's and the single stream's came before)
    timeline = start_timelines(log.read_text(errors="replace"), np_ if np_ > 1 else 0) if args.timeline else []
    return out + (timeline, {n: g[4] for n, g in got.items()})


# Student's t, two-sided 95%, for 1..9 degrees of freedom; past them the Cornish-Fisher expansion below (within
# 0.2% of the table's value at 10)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)


def t975(df: int) -> float:
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df * df)


def ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    """The geometric mean of on / off over the rounds and its 95% confidence interval (Student's t on the logs: a
    round's ratio is the same machine's two runs, so the rounds are the samples) -> (low, mean, high); one round:
    (mean, mean, mean). "Never slower" reads from the interval: a mean under 1.0 whose interval holds 1.0 is not a
    measured loss, and the low end bounds the loss the rounds allow."""
    logs = [math.log(x) for x in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return (math.exp(mean),) * 3
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean), math.exp(mean + half)


def ratio_cells(ratios: list[float]) -> str:
    """Two table cells: the on / off ratios per round, and their geometric mean (a ratio and its inverse weigh
    alike) with its 95% interval over the rounds (ratio_interval)."""
    low, mean, high = ratio_interval(ratios)
    spread = f" [{low:.3f}, {high:.3f}]" if len(ratios) > 1 else ""
    return " / ".join(f"{x:.3f}" for x in ratios) + f" | {mean:.3f}{spread}"


def rate_table(runs: dict, streams: list[int]) -> list[str]:
    """Per setting and stream count: t/s (median, range), on / off per round and their geometric mean, the same for
    the steady rate (N > 1), the mean accepted length. Round k of a setting pairs with round k of "off" (the same
    round of the ABBA order)."""
    lines = ["| setting | streams | t/s (median, range of rounds) | on / off per round | on / off (geomean [95%]) | "
             "steady t/s (median) | steady on / off per round | steady (geomean [95%]) | mean len |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, rounds in runs.items():
        for n in streams:
            tps, steady = [r[0][n] for r in rounds], [r[3][n] for r in rounds]
            spread = f" ({min(tps):.1f}-{max(tps):.1f})" if len(tps) > 1 else ""
            cells = [ratio_cells([r[0][n] / off[0][n] for r, off in zip(rounds, runs["off"])]),
                     ratio_cells([r[3][n] / off[3][n] for r, off in zip(rounds, runs["off"])]) if n > 1 else "- | -"]
            lines.append(f"| {label} | {n} | {statistics.median(tps):.1f}{spread} | {cells[0]} | "
                         f"{statistics.median(steady):.1f} | {cells[1]} | "
                         f"{statistics.median(r[1] for r in rounds):.2f} |")
    return lines


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


def step_table(runs: dict, streams: list[int]) -> list[str]:
    """Where the plain steps of N rows spent their time, per setting: each part's ms per step (median over the
    rounds) and its on - off per round; a part that grows with MTP on is the host's work where it is not 'wait'."""
    lines = ["", "Plain decode steps of N rows run back to back (the server's llamacmp:plain_step_seconds_total): ms "
             "per step from the previous step's tokens drawn: between (-> the step's start), launch (-> the forward "
             "launched), overlap (-> the host's work beside it done), wait (-> its tokens drawn); medians over the "
             "rounds, then on - off per round:", "",
             "| setting | streams | steps | " + " | ".join(STEP_PARTS) + " | total | "
             + " | ".join(f"{part} on - off" for part in STEP_PARTS) + " |",
             "|---|---:|---:|" + "---:|" * (2 * len(STEP_PARTS) + 1)]
    for label, rounds in runs.items():
        for n in streams:
            got = [r[6][n] for r in rounds]
            if not all(got):
                continue
            med = {part: statistics.median(g[part] for g in got) for part in ("steps",) + STEP_PARTS}
            diffs = [" / ".join(f"{r[6][n][part] - off[6][n][part]:+.3f}" for r, off in zip(rounds, runs["off"])
                                if r[6][n] and off[6][n]) if label != "off" else "-" for part in STEP_PARTS]
            lines.append(f"| {label} | {n} | {med['steps']:.0f} | "
                         + " | ".join(f"{med[part]:.3f}" for part in STEP_PARTS)
                         + f" | {sum(med[part] for part in STEP_PARTS):.3f} | " + " | ".join(diffs) + " |")
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
    p.add_argument("--timeline", action="store_true",
                   help="servers at -v; print the start of the measured N streams per request from their logs")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    texts = sv.prompts(max(streams), sv.vocab_size(args.model))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(sv.ROOT), os.environ.get("PYTHONPATH")])))
    settings = spec_settings(args)
    runs: dict[str, list] = {label: [] for label, _ in settings}   # label -> per round (run_setting's tuple)
    for k in range(args.rounds):
        for label, flags in round_order(settings, k):
            runs[label].append(run_setting(args, label, flags, streams, texts, env))
            tps = runs[label][-1][0]
            steady = runs[label][-1][3]
            split = runs[label][-1][4]
            print(f"round {k + 1} {label}: " + ", ".join(f"{n} stream(s) {t:.1f} t/s" + (
                f" (steady {steady[n]:.1f}; {split_text(split[n])})" if n > 1 else "") for n, t in tps.items()),
                flush=True)
    lines = rate_table(runs, streams)
    lines += split_table(runs, [n for n in streams if n > 1])
    lines += step_table(runs, streams)
    lines += timeline_table({(label, k + 1): r[5] for label, rounds in runs.items()
                             for k, r in enumerate(rounds) if r[5]})
    lines += ["", "Draft policy rounds per number of sequences in a round (llamacmp:spec_rounds_total):"]
    lines += [f"- {label}, {n} stream(s), round {k + 1}: {r[2][n]}" for label, rounds in runs.items()
              if label != "off" for k, r in enumerate(rounds) for n in streams]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
