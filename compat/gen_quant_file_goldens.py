"""Goldens from llama.cpp (≈ b8462) on the quantized files: CLI greedy text and the demo model's perplexity per type.

    python3 compat/gen_quant_file_goldens.py [--bin DIR] [--skip-cli] [--skip-ppl] [--types T ...]

cli: `llama-completion -m FILE -p PROMPT -n N -no-cnv --temp 0 -c 512` on every committed fixture that llamacmp
loads (compat/fixtures/quant, made by compat/make_quant_fixtures.py); its stdout goes to
compat/goldens/cli_quant.jsonl, which tests/test_quant_fixtures.py replays through llamacmp-completion. The random
tiny-vocabulary models have flat logits (a top-two gap under 0.1 within a few steps is the rule), and at such a near
tie llama.cpp's own paths disagree (flash attention on or off picks different tokens in 4 of 7 files tried), so
exact text is only meaningful while greedy is decided: per file, PROMPT is the candidate with the longest run of
steps whose top-two gap in the numpy reference is at least CLI_MARGIN (10x the logits' measured difference), and N
that run's length (at most 16). The logits goldens check the numerics at every step, near ties included.

perplexity: the bundled demo model requantized per type (make_quant_fixtures.py --demo, in $LLAMACMP_CACHE), on the
first PPL_CHARS characters of the training corpus' held-out split (CPython standard library sources; the text's
sha256 is recorded), `-c 512 --chunks 8`, llama-perplexity against llamacmp-perplexity (numpy backend); both figures
go to compat/goldens/perplexity_quant.json (target: within 0.1%). The files are not committed, so the comparison is
recorded here and reported by compat/diff.py, not re-run by the tests.

The logits and teacher-forced greedy goldens of the same fixtures come from compat/gen_logits_goldens.py.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))

from make_quant_fixtures import DEFAULT_BIN, DEMO, DEMO_OUT, DEMO_TYPES, FIXTURES, PRESETS, fixture_name, sha256  # noqa: E402

GOLDENS = HERE / "goldens"
CLI_ARGS = "-no-cnv --temp 0 -c 512"
CLI_PROMPTS = ("Hello world", "A block of", "Two numbers", "Layers of memory", "state", "hi", "One", "Sequence",
               "Write", "Class", "The")
CLI_MARGIN, CLI_MAX_TOKENS = 0.1, 16
PPL_ARGS = ["-c", "512", "--chunks", "8", "-t", "2"]
PPL_CHARS = 60000
SOURCE = "llama.cpp 49bfddeca (llama-cpp-python 0.3.17 sdist), CPU build"


def decided_steps(lm, prompt: str) -> int:
    """Greedy steps from `prompt` before the first whose top-two logit gap is under CLI_MARGIN (an end-of-generation
    token ends the run: all later steps count as decided)."""
    import numpy as np
    from llamacmp.backends.base import StepBatch
    state = lm.backend.new_state(lm.cfg, 64, "f16")
    logits = lm.model.forward(StepBatch.build([(state, lm.tokenizer.encode(prompt, parse_special=True))]))[-1]
    for i in range(CLI_MAX_TOKENS):
        top2 = np.sort(logits)[-2:]
        if top2[1] - top2[0] < CLI_MARGIN:
            return i
        tok = int(logits.argmax())
        if tok in lm.tokenizer.eog_ids:
            return CLI_MAX_TOKENS
        logits = lm.model.forward(StepBatch.build([(state, [tok])]))[0]
    return CLI_MAX_TOKENS


def cli_case(model: Path) -> tuple[str, int]:
    from llamacmp.backends.numpy_ref import NumpyBackend
    from llamacmp.loader import load_model
    lm = load_model(model, NumpyBackend())
    runs = [(decided_steps(lm, p), -i, p) for i, p in enumerate(CLI_PROMPTS)]
    n, _, prompt = max(runs)
    return prompt, n


def cli_goldens(bin_dir: Path) -> list[dict]:
    rows = []
    for p in PRESETS:
        if not p.loads:
            continue
        model = FIXTURES / fixture_name(p)
        prompt, n = cli_case(model)
        args = f"-p {shlex.quote(prompt)} -n {n} {CLI_ARGS}"
        r = subprocess.run([str(bin_dir / "llama-completion"), "-m", str(model), *shlex.split(args)],
                           capture_output=True, stdin=subprocess.DEVNULL, check=True)
        rows.append({"tool": "llama-completion", "model": model.relative_to(ROOT).as_posix(), "args": args,
                     "stdout_b64": base64.b64encode(r.stdout).decode()})
        print(f"{model.name}: {args}: {r.stdout!r}", flush=True)
    return rows


def heldout_text() -> str:
    from training.corpus import corpus_texts
    return "".join(corpus_texts("heldout", PPL_CHARS))[:PPL_CHARS]


def final_ppl(cmd: list[str]) -> float:
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
    if r.returncode or not m:
        sys.exit(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return float(m.group(1))


def ppl_goldens(bin_dir: Path, types: list[str]) -> dict:
    text = heldout_text()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        text_file = Path(d) / "heldout.txt"
        text_file.write_text(text)
        for t in types:
            model = DEMO if t == "Q8_0" else DEMO_OUT / f"default-{t}.gguf"
            if not model.exists():
                sys.exit(f"{model} is missing: run compat/make_quant_fixtures.py --demo first")
            common = ["-m", str(model), "-f", str(text_file), *PPL_ARGS]
            theirs = final_ppl([str(bin_dir / "llama-perplexity"), *common])
            # llama.cpp's own spread: its two attention paths (flash attention is on by default on the CPU)
            theirs_fa_off = final_ppl([str(bin_dir / "llama-perplexity"), *common, "-fa", "off"])
            ours = final_ppl([sys.executable, "-m", "llamacmp.cli.perplexity", *common])
            rows.append({"type": t, "file_sha256": sha256(model), "bytes": model.stat().st_size,
                         "llama.cpp": theirs, "llamacmp": ours, "rel": abs(ours - theirs) / theirs,
                         "llama.cpp -fa off": theirs_fa_off, "rel fa on/off": abs(theirs_fa_off - theirs) / theirs})
            print(f"{t}: llama.cpp {theirs:.4f} (-fa off {theirs_fa_off:.4f})  llamacmp {ours:.4f}  "
                  f"({rows[-1]['rel']:.4%}; llama.cpp's own fa on/off {rows[-1]['rel fa on/off']:.4%})", flush=True)
    return {"source": SOURCE, "args": " ".join(PPL_ARGS),
            "text": f"first {PPL_CHARS} characters of training.corpus' held-out split (Python "
                    f"{sysconfig.get_python_version()} standard library)",
            "text_sha256": hashlib.sha256(text.encode()).hexdigest(), "rows": rows}


DEMO_CLI_ARGS = '-p "class Parser:" -n 32 --temp 0 -no-cnv'


def demo_completion(bin_dir: Path) -> dict:
    """llama-completion and llamacmp-completion (numpy backend) on the demo model in Q4_K_M: the text, both ways."""
    model = DEMO_OUT / "default-Q4_K_M.gguf"
    out = {}
    for who, cmd in (("llama.cpp", [str(bin_dir / "llama-completion")]),
                     ("llamacmp", [sys.executable, "-m", "llamacmp.cli.completion"])):
        r = subprocess.run([*cmd, "-m", str(model), *shlex.split(DEMO_CLI_ARGS)], capture_output=True,
                           stdin=subprocess.DEVNULL, check=True)
        out[who] = r.stdout.decode("utf-8", "replace")
    print(f"demo Q4_K_M text identical: {out['llama.cpp'] == out['llamacmp']}", flush=True)
    return {"file": model.name, "file_sha256": sha256(model), "args": DEMO_CLI_ARGS, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, default=DEFAULT_BIN)
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--skip-ppl", action="store_true")
    ap.add_argument("--types", nargs="+", default=["Q8_0", *DEMO_TYPES],
                    help="demo-model types for perplexity (the recorded rows of the others are kept)")
    args = ap.parse_args()
    if not args.skip_cli:
        rows = cli_goldens(args.bin)
        (GOLDENS / "cli_quant.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if not args.skip_ppl:
        golden = {**ppl_goldens(args.bin, args.types), "completion": demo_completion(args.bin)}
        path = GOLDENS / "perplexity_quant.json"
        golden["rows"] = merged_rows(json.loads(path.read_text()), golden) if path.exists() else golden["rows"]
        path.write_text(json.dumps(golden, indent=1) + "\n")


def merged_rows(old: dict, new: dict) -> list[dict]:
    """--types measures some types again: the recorded rows of the others stay (same text and arguments only), in
    the order of ["Q8_0", *DEMO_TYPES]."""
    if (old["text_sha256"], old["args"]) != (new["text_sha256"], new["args"]):
        sys.exit("perplexity_quant.json was recorded on another text or with other arguments: measure every type")
    rows = {r["type"]: r for r in old["rows"]} | {r["type"]: r for r in new["rows"]}
    order = ["Q8_0", *DEMO_TYPES]
    return sorted(rows.values(), key=lambda r: order.index(r["type"]) if r["type"] in order else len(order))


if __name__ == "__main__":
    main()
