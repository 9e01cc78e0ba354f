"""MTP draft acceptance of a GGUF with an MTP block, per prompt, from a server's own timings.

    python3 compat/mtp_acceptance.py -m out/mtp-full/default-mtp.gguf                      # llama.cpp 0c1e570
    python3 compat/mtp_acceptance.py -m FILE --server llamacmp                             # llamacmp-server
    python3 compat/mtp_acceptance.py -m FILE --server-bin PATH --json out.json --n-predict 128 --draft-max 3

Starts the server on 127.0.0.1 (a free port) with `--spec-type draft-mtp --spec-draft-n-max N -np 1`, sends each
prompt to /completion greedily (temperature 0, no prompt cache reuse), and reads `timings.draft_n` /
`timings.draft_n_accepted` (what llama-server reports for drafts) and the generated text. The prompts are held-out
text the model never trained on: the start of each of the first --prompts files of training/corpus.py's held-out
split of this interpreter's standard library, cut at a line end near --prompt-chars. Both servers get the same
prompts and flags, so their figures compare directly. The server is stopped at the end, whatever happens.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
from gen_server_goldens import free_port, wait_ready  # noqa: E402

CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
LLAMA_SERVER = CACHE / "llama.cpp-0c1e570" / "build-cpu" / "bin" / "llama-server"


def heldout_prompts(count: int, chars: int) -> list[str]:
    """The first `chars` characters (to the last line end) of the first `count` non-trivial held-out files."""
    from training import corpus
    prompts = []
    for text in corpus.corpus_texts("heldout"):
        head = text[:chars]
        head = head[:head.rfind("\n") + 1] if "\n" in head else head
        if len(head) >= chars // 2:
            prompts.append(head)
        if len(prompts) == count:
            break
    if len(prompts) < count:
        raise SystemExit(f"only {len(prompts)} held-out files of >= {chars // 2} characters")
    return prompts


def server_command(kind: str, binary: Path | None, model: Path, port: int, draft_max: int, ctx: int) -> list[str]:
    flags = ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx), "-np", "1",
             "--spec-type", "draft-mtp", "--spec-draft-n-max", str(draft_max)]
    if kind == "llama.cpp":
        return [str(binary or LLAMA_SERVER), "--no-webui", *flags]
    return [str(binary) if binary else "llamacmp-server", *flags]


def measure(client: httpx.Client, base: str, prompts: list[str], n_predict: int) -> list[dict]:
    """One greedy /completion per prompt; the row holds the server's draft counts and the text."""
    rows = []
    for i, prompt in enumerate(prompts):
        r = client.post(base + "/completion", json={"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                                                    "cache_prompt": False})
        r.raise_for_status()
        body = r.json()
        t = body["timings"]
        if "draft_n" not in t:      # llama-server leaves the fields out when nothing was drafted
            raise SystemExit(f"prompt {i}: the server reported no draft_n (was MTP drafting on?): {t}")
        rows.append({"prompt": i, "prompt_n": t["prompt_n"], "predicted_n": t["predicted_n"],
                     "draft_n": t["draft_n"], "draft_n_accepted": t["draft_n_accepted"],
                     "acceptance": t["draft_n_accepted"] / max(1, t["draft_n"]),
                     "predicted_per_second": t["predicted_per_second"], "content": body["content"]})
    return rows


def report(rows: list[dict]) -> str:
    lines = ["| prompt | prompt tokens | generated | drafted | accepted | acceptance | tg t/s |", "|" + "---|" * 7]
    for r in rows:
        lines.append(f"| {r['prompt']} | {r['prompt_n']} | {r['predicted_n']} | {r['draft_n']} | "
                     f"{r['draft_n_accepted']} | {r['acceptance']:.3f} | {r['predicted_per_second']:.1f} |")
    drafted, accepted = sum(r["draft_n"] for r in rows), sum(r["draft_n_accepted"] for r in rows)
    lines.append(f"| all | | {sum(r['predicted_n'] for r in rows)} | {drafted} | {accepted} | "
                 f"{accepted / max(1, drafted):.3f} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("--server", choices=("llama.cpp", "llamacmp"), default="llama.cpp")
    ap.add_argument("--server-bin", type=Path, help=f"the server executable (default: {LLAMA_SERVER} for "
                                                      "llama.cpp, llamacmp-server on PATH for llamacmp)")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-chars", type=int, default=1200)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=3, help="--spec-draft-n-max given to the server")
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--json", type=Path, help="also write the rows (texts included) here")
    args = ap.parse_args()
    prompts = heldout_prompts(args.prompts, args.prompt_chars)
    port = free_port()
    cmd = server_command(args.server, args.server_bin, args.model, port, args.draft_max, args.ctx)
    with tempfile.TemporaryDirectory() as d:
        log_path = Path(d) / "server.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                wait_ready(f"http://127.0.0.1:{port}", proc, timeout=300)
            except RuntimeError:
                print(log_path.read_text()[-4000:], file=sys.stderr)
                raise
            with httpx.Client(timeout=600) as client:
                rows = measure(client, f"http://127.0.0.1:{port}", prompts, args.n_predict)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"{args.server}: {' '.join(cmd[1:])}")
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps({"server": args.server, "command": cmd, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
