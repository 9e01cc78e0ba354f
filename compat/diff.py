"""Diff llamacmp against both llama.cpp oracles (b8462 and current 0c1e570, compat/oracles.py): the committed
goldens (no llama.cpp needed), or live.

    python3 compat/diff.py [--live] [--skip-logits]

Prints a table (area; per oracle: cases, identical, within tolerance, different) and the cases where the two
oracles answer differently with the one llamacmp matches, and writes compat/REPORT.md. With --live the b8462 golden
generators are re-run first against the llama.cpp build (compat/build_llamacpp.sh and compat/build_oracle_tools.sh),
so the comparison is with llama.cpp itself; `git diff compat/goldens` then shows whether llama.cpp's answers changed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import oracles

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))    # this checkout's llamacmp, not an installed copy elsewhere


@dataclass
class Area:
    name: str
    cases: int = 0
    identical: int = 0
    within: int = 0
    allowed: int = 0          # differences named with their reason in an allow-list: reported, not a failure
    examples: list[str] = field(default_factory=list)
    matched: dict[str, bool] = field(default_factory=dict)   # case id -> identical or within tolerance
    missing: str = ""         # why this oracle has no golden for the area

    @property
    def different(self) -> int:
        return self.cases - self.identical - self.within

    def add(self, ok: bool, close: bool = False, example: str = "", case: str = "") -> None:
        self.matched[case or str(self.cases)] = ok or close
        self.cases += 1
        if ok:
            self.identical += 1
        elif close:
            self.within += 1
        elif len(self.examples) < 5:
            self.examples.append(example)


def _jsonl(name: str, oracle: oracles.Oracle = oracles.B8462) -> list[dict]:
    return [json.loads(line) for line in oracle.golden(name).read_text(encoding="utf-8").split("\n") if line.strip()]


def per_oracle(name: str, golden: str, judge) -> dict[str, Area]:
    """judge(area, records) for each oracle's golden file; an oracle without it gets an empty area saying why."""
    out = {}
    for o, path, why in oracles.recorded(golden):
        out[o.label] = area = Area(name, missing=why)
        if path is not None:
            judge(area, _jsonl(golden, o), o)
    return out


def _follows_other(golden: str, case_id: str, oracle: oracles.Oracle) -> bool:
    """llamacmp follows the other oracle in this case (compat/oracles.py DIVERGENCES): a difference with a reason."""
    return oracles.followed(golden, case_id, oracle)[0] is not oracle


def b8462_only(area: Area, golden: str) -> dict[str, Area]:
    """An area whose goldens only b8462 has (oracles.NOT_RECORDED says why 0c1e570 has none)."""
    return {oracles.B8462.label: area,
            oracles.CURRENT.label: Area(area.name, missing=oracles.NOT_RECORDED[oracles.CURRENT.label][golden])}


def tokenization() -> dict[str, Area]:
    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
    from llamacmp.tokenizer import Tokenizer
    v = load_qwen35_vocab()
    toks = {pre: Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, pre, v.eos_id, v.bos_id, v.add_bos)
            for pre in ("qwen35", "qwen2")}
    ours: dict[tuple, list[int]] = {}     # both oracles tokenize the same strings: encode each once

    def judge(area: Area, goldens: list[dict], _oracle) -> None:
        for g in goldens:
            key = (g["text"], g["parse_special"], g.get("pre", "qwen35"))
            if key not in ours:
                ours[key] = toks[key[2]].encode(g["text"], g["parse_special"])
            area.add(ours[key] == g["ids"], example=repr(g["text"][:60]), case=repr(key))
    return per_oracle("tokenization", "tokenize.jsonl", judge)


def templates() -> dict[str, Area]:
    from llamacmp.chat import ChatTemplate
    tmpl = ChatTemplate((HERE.parent / "llamacmp" / "fixtures" / "qwen35_chat_template.jinja").read_text())

    def judge(area: Area, goldens: list[dict], oracle) -> None:
        for g in goldens:
            c = g["case"]
            ours = tmpl.render(c["messages"], c["add_generation_prompt"], c.get("tools"), c["enable_thinking"])
            area.add(ours == g["llama.cpp"]["prompt"], example=c["id"], case=c["id"])
            area.allowed += ours != g["llama.cpp"]["prompt"] and _follows_other("chat_render.jsonl", c["id"], oracle)
    return per_oracle("template renders", "chat_render.jsonl", judge)


def parsing(partial: bool) -> dict[str, Area]:
    """Final outputs must be identical. Partial (streaming) ones differ by design where llama.cpp returns a tool
    call whose arguments are still being written: we return a call once it is closed (compat/DIFFERENCES.md)."""
    from llamacmp.chat import parse_output

    def judge(area: Area, goldens: list[dict], oracle) -> None:
        for g in goldens:
            c = g["case"]
            other = _follows_other("chat_parse.jsonl", c["id"], oracle)
            for i, (out, want) in enumerate(zip(c["outputs"], g["llama.cpp"]["parsed"])):
                if out["is_partial"] != partial:
                    continue
                p = parse_output(out["text"], "auto", c["enable_thinking"], c.get("tools"), partial=partial)
                calls = [(t["function"]["name"], t["function"]["arguments"]) for t in want.get("tool_calls", [])]
                text_same = p.content == want["content"] and p.reasoning_content == want.get("reasoning_content", "")
                ours = [(t.name, t.arguments) for t in p.tool_calls]
                area.add(text_same and ours == calls, example=c["id"], case=f"{c['id']}#{i}")
                # The one open call llama.cpp already shows (arguments still being written) is the designed
                # difference.
                designed = partial and text_same and ours == calls[:len(ours)] and len(calls) == len(ours) + 1
                area.allowed += not (text_same and ours == calls) and (designed or other)
    name = "parsed messages (streaming, partial)" if partial else "parsed messages (final)"
    return per_oracle(name, "chat_parse.jsonl", judge)


def logits() -> tuple[dict[str, Area], dict[str, Area]]:
    """Top-20 logits and teacher-forced greedy steps against each oracle's logits goldens; our forward runs once
    per case and input (the oracles' prompts are the same; their greedy tokens usually are)."""
    from gen_logits_goldens import NEAR_TIE, TOLERANCE, fixture_path, tolerance_class
    from llamacmp.backends.base import StepBatch
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
    from llamacmp.loader import load_model
    vocab, done = load_qwen35_vocab(), {}
    lg = {o.label: Area("logits (top-20, per case)") for o in oracles.ORACLES.values()}
    gr = {o.label: Area("greedy steps (teacher-forced)") for o in oracles.ORACLES.values()}
    recorded = oracles.recorded("logits")
    for o, folder, why in recorded:
        lg[o.label].missing = gr[o.label].missing = why
    names = sorted({p.stem for _, folder, _ in recorded if folder for p in folder.glob("*.json")})
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            for o, folder, _ in recorded:
                if folder is None or not (folder / f"{name}.json").exists():
                    continue
                g = json.loads((folder / f"{name}.json").read_text())
                key = (name, tuple(g["prompt"]), tuple(g["greedy"]), g["kv"])
                if key not in done:
                    done.clear()            # one case at a time: a forward's logits are [prompt, vocab]
                    lm = load_model(fixture_path(g, Path(d), vocab), NumpyBackend())
                    state = lm.backend.new_state(lm.cfg, len(g["prompt"]) + len(g["greedy"]) + 1, g["kv"])
                    out = lm.model.forward(StepBatch.build([(state, g["prompt"])], all_logits=True))
                    step, steps = out[-1], []
                    for tok in g["greedy"]:
                        steps.append((int(step.argmax()), float(step.max() - step[tok])))
                        step = lm.model.forward(StepBatch.build([(state, [tok])]))[0]
                    done[key] = out, steps
                out, steps = done[key]
                want = np.array(g["top_logits"])
                rel = np.linalg.norm(np.take_along_axis(out, np.array(g["top_ids"]), 1) - want) / np.linalg.norm(want)
                tol, tie = TOLERANCE[tolerance_class(g["dtype"])], NEAR_TIE[tolerance_class(g["dtype"])]
                lg[o.label].add(rel < 1e-6, rel < tol, f"{name}: rel {rel:.2e}", case=name)
                for i, (tok, (best, margin)) in enumerate(zip(g["greedy"], steps)):
                    gr[o.label].add(best == tok, margin <= tie, f"{name}: margin {margin:.3g}", case=f"{name}#{i}")
    return lg, gr


def quant_cli() -> Area:
    """llamacmp-completion (numpy backend) on each quantized fixture against llama-completion's recorded stdout
    (compat/gen_quant_file_goldens.py; the checks of tests/test_quant_fixtures.py)."""
    import base64
    import shlex
    area = Area("CLI text on quantized files")
    for g in _jsonl("cli_quant.jsonl"):
        r = subprocess.run([sys.executable, "-m", "llamacmp.cli.completion", "-m", str(HERE.parent / g["model"]),
                            *shlex.split(g["args"])], capture_output=True, stdin=subprocess.DEVNULL)
        area.add(r.returncode == 0 and r.stdout == base64.b64decode(g["stdout_b64"]), example=Path(g["model"]).stem)
    return area


def quant_perplexity() -> Area:
    """The demo model per type: llama-perplexity and llamacmp-perplexity as gen_quant_file_goldens.py recorded them
    (the requantized files are not committed); within = 0.1% of llama.cpp's default (flash attention on). Beyond
    that but within 0.1% of its `-fa off` figure is reported as allowed: llama.cpp's two attention paths differ by
    up to 0.1% themselves on these files."""
    g = json.loads((GOLDENS / "perplexity_quant.json").read_text())
    area = Area("demo perplexity per type (recorded)")
    for row in g["rows"]:
        off = abs(row["llamacmp"] - row["llama.cpp -fa off"]) / row["llama.cpp -fa off"]
        area.add(row["rel"] == 0.0, row["rel"] <= 1e-3,
                 f"{row['type']}: {row['llamacmp']} / {row['llama.cpp']} ({row['rel']:.3%}; -fa off "
                 f"{row['llama.cpp -fa off']}, {off:.3%})")
        area.allowed += row["rel"] > 1e-3 and off <= 1e-3
    c = g["completion"]
    area.add(c["llama.cpp"] == c["llamacmp"], example=f"{c['file']} completion text")
    return area


def server_responses() -> dict[str, Area]:
    """llamacmp-server (numpy backend, in this process) against llama-server's recorded answers; see
    tests/test_compat_server.py, whose allow-list names the reason of every deliberate difference and known bug,
    per oracle. The requests are sent once; each oracle's golden judges the same answers."""
    import httpx
    sys.path.insert(0, str(HERE.parent / "tests"))
    from server_cases import API_KEY, CASES, FIXTURE_NAME, FIXTURE_SEED, SERVER_FLAGS, compare, send
    from server_harness import LiveServer
    from test_compat_server import ALLOWED, unexcused

    from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
    from llamacmp.fixtures.writer import SHAPES, write_model
    answers = {}
    with tempfile.TemporaryDirectory() as d:
        model = write_model(Path(d) / FIXTURE_NAME, SHAPES["tiny"], "f32", load_qwen35_vocab(), seed=FIXTURE_SEED,
                            name="compat-server")
        with LiveServer(model, *SERVER_FLAGS) as main, \
                LiveServer(model, *SERVER_FLAGS, "--api-key", API_KEY) as auth:
            urls = {"main": main.url, "auth": auth.url}
            for case in CASES:        # in the goldens' order, as llama.cpp's runs (tests check that order)
                with httpx.Client(timeout=60) as client:
                    answers[case.id] = send(client, urls[case.server], case)

    def judge(area: Area, goldens: list[dict], oracle) -> None:
        allowed = ALLOWED[oracle.label]
        for want in goldens:
            verdict, problems = compare(want, answers[want["id"]])
            left = unexcused(allowed, want["id"], problems)
            area.allowed += bool(problems) and not left
            why = next((allowed[k][0] for k in (want["id"], "*") if k in allowed), "not allowed")
            area.add(verdict == "identical", verdict == "within",
                     f"{want['id']} ({(left or problems)[0][:60] if problems else ''}; {why[:50]})", case=want["id"])
    return per_oracle("server responses", "server.jsonl", judge)


def vision() -> tuple[Area, Area]:
    """Image embeddings and the 32 greedy tokens after an image, against llama.cpp's mtmd goldens
    (compat/gen_vision_goldens.py); the checks of tests/test_compat_vision.py, counted."""
    from gen_vision_goldens import fixtures
    from llamacmp.backends.base import StepBatch
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.loader import load_model
    from llamacmp.vision.config import load_mmproj
    from llamacmp.vision.encoder import VisionEncoder
    from llamacmp.vision.preprocess import decode_image, prepare
    from llamacmp.vision.prompt import eval_chunks, split_prompt
    emb_area, greedy = Area("image embeddings (1e-3 of max)"), Area("greedy tokens after an image")
    folder = GOLDENS / "vision"
    with tempfile.TemporaryDirectory() as d:
        for path in sorted(folder.glob("*.json")):
            g = json.loads(path.read_text())
            text, mm = fixtures(g, Path(d))
            be = NumpyBackend()
            lm = load_model(text, be)
            cfg, w = load_mmproj(mm, lm.cfg.n_embd)
            emb = VisionEncoder(cfg, w, be).encode(prepare(decode_image((folder / f"{g['image']}.png").read_bytes()),
                                                           cfg))
            ref = np.load(folder / f"{path.stem}.embd.npy")
            rel = float(np.abs(emb.embeddings - ref).max() / np.abs(ref).max()) if emb.embeddings.shape == ref.shape \
                else float("inf")
            emb_area.add(rel == 0.0, rel <= 1e-3, f"{path.stem}: {rel:.2e}")
            chunks = split_prompt(g["prompt"], [emb], lambda s: lm.tokenizer.encode(s, parse_special=True))
            state = be.new_state(lm.cfg, 512, "f32")
            tok, got = int(np.argmax(be.to_host(eval_chunks(lm.model, state, chunks))[-1])), []
            for _ in g["greedy"]:
                got.append(tok)
                tok = int(np.argmax(be.to_host(lm.model.forward(StepBatch.build([(state, [tok])])))[-1]))
            greedy.add(got == g["greedy"], False, f"{path.stem}: first difference at step "
                       f"{next((i for i, (a, b) in enumerate(zip(got, g['greedy'])) if a != b), -1)}")
    return emb_area, greedy


def report(areas: list[dict[str, Area]]) -> str:
    labels = list(oracles.ORACLES)
    head = "| area | " + " | ".join(f"{lb}: cases | identical | within tolerance | different" for lb in labels) + " |"
    lines = [head, "|---|" + "---|---|---|---|" * len(labels)]
    for pair in areas:
        cells = [f"— | — | — | — ({pair[lb].missing[:40]}…)" if pair[lb].missing and not pair[lb].cases else
                 f"{pair[lb].cases} | {pair[lb].identical} | {pair[lb].within} | {pair[lb].different}" for lb in labels]
        lines.append(f"| {pair[labels[0]].name} | " + " | ".join(cells) + " |")
    lines += ["", "Where llamacmp matches one oracle and not the other (same case, both recorded; why: compat/oracles.py "
              "DIVERGENCES, the per-oracle ALLOWED of tests/test_compat_server.py, and the section on the two oracles "
              "below):", "", "| area | " + " | ".join(f"matches {lb} only" for lb in labels) + " |",
              "|---|" + "---|" * len(labels)]
    for pair in areas:
        a, b = (pair[lb].matched for lb in labels)
        both = a.keys() & b.keys()
        if both:
            lines.append(f"| {pair[labels[0]].name} | {sum(a[k] and not b[k] for k in both)} | "
                         f"{sum(b[k] and not a[k] for k in both)} |")
    for pair in areas:
        for lb in labels:
            x = pair[lb]
            if x.examples:
                lines.append(f"\nDifferent from {lb} in {x.name}" + (f" ({x.allowed} with a reason, see below)"
                                                                     if x.allowed else "") + ": " + "; ".join(x.examples))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--live", action="store_true", help="re-run the b8462 golden generators against llama.cpp first")
    p.add_argument("--skip-logits", action="store_true", help="skip the (slow) logits area")
    args = p.parse_args()
    if args.live:
        for gen in ("gen_tokenize_goldens.py", "gen_chat_goldens.py", "gen_logits_goldens.py",
                    "gen_server_goldens.py", "gen_vision_goldens.py", "make_quant_fixtures.py --check",
                    "make_quant_fixtures.py --demo", "gen_quant_file_goldens.py"):
            subprocess.run([sys.executable, str(HERE / gen.split()[0]), *gen.split()[1:]], check=True)
    with ThreadPoolExecutor(1) as pool:
        # quant_cli's llamacmp-completion runs are child processes: they take a second core while this one works
        cli = pool.submit(quant_cli)
        areas = [tokenization(), templates(), parsing(partial=False), parsing(partial=True), server_responses()]
        if not args.skip_logits:
            areas += list(logits())
        areas += [b8462_only(cli.result(), "cli_quant.jsonl"),
                  b8462_only(quant_perplexity(), "perplexity_quant.json")]
    areas += [b8462_only(a, "vision") for a in vision()]
    table = report(areas)
    print(table)
    differences = (HERE / "DIFFERENCES.md").read_text() if (HERE / "DIFFERENCES.md").exists() else ""
    (HERE / "REPORT.md").write_text(
        f"# llamacmp vs llama.cpp ≈ b8462 ({oracles.B8462.short}) and current llama.cpp ({oracles.CURRENT.label})\n\n"
        "Written by `python3 compat/diff.py` from the committed goldens (b8462's in compat/goldens/, 0c1e570's in "
        "compat/goldens/0c1e570/; tolerances: logits 1e-4 relative for F32 weights, 2e-2 for quantized ones: Q8_0 "
        "and the llama-quantize fixtures q256-*; greedy steps within tolerance are near ties of < 0.05 in logit; "
        "perplexity within 0.1%). Tokenizer, chat, server, CLI and logits goldens exist for both oracles (the CLI "
        "ones are checked in tests/test_cli.py); the rest for b8462 only (compat/oracles.py NOT_RECORDED says why).\n\n"
        + table + "\n\n" + differences)
    sys.exit(1 if any(a.different - a.allowed for pair in areas for a in pair.values()) else 0)


if __name__ == "__main__":
    main()
