"""Record llama-server 0c1e570's synthetic acceptance (--spec-synth-len) counts for tests/test_spec.py.

    python3 compat/gen_synth_goldens.py --llama-server BUILD/bin/llama-server --model MTP.gguf

MTP.gguf: any GGUF with an MTP head (the goldens of 2026-12-02 used the tiny fixture with the writer's MTP block,
`python -m llamacmp.fixtures.writer m.gguf --shape tiny --type f32 --mtp`; the counts do not depend on the weights
as long as the head never drafts an end-of-generation token). For each (L, n_predict, seed) one llama-server starts
with --spec-type draft-mtp --spec-draft-n-max 3 --spec-synth-len L and answers one greedy /completion with that
seed and ignore_eos; its timings' draft_n / draft_n_accepted go to compat/goldens/synth_acceptance.json.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import time
from pathlib import Path

import httpx

CASES = ((2.5, 64, 42), (1.5, 100, 7), (3.5, 50, 0), (1.0, 40, 3), (4.0, 40, 3))
N_MAX = 3
OUT = Path(__file__).resolve().parent / "goldens" / "synth_acceptance.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(binary: str, model: str, length: float, n_predict: int, seed: int) -> dict:
    port = free_port()
    argv = [binary, "-m", model, "--port", str(port), "-np", "1", "-c", "1024", "--spec-type", "draft-mtp",
            "--spec-draft-n-max", str(N_MAX), "--spec-synth-len", str(length), "--no-webui", "-t", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        body = {"prompt": [1, 2, 3, 4, 5], "n_predict": n_predict, "temperature": 0, "seed": seed,
                "ignore_eos": True}
        t = httpx.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=600).json()["timings"]
    finally:
        proc.terminate()
        proc.wait()
    return {"synth_len": length, "n_max": N_MAX, "n_predict": n_predict, "seed": seed, "predicted_n": t["predicted_n"],
            "draft_n": t.get("draft_n", 0), "draft_n_accepted": t.get("draft_n_accepted", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True, help="a GGUF with an MTP head")
    a = ap.parse_args()
    rows = [one(a.llama_server, a.model, *case) for case in CASES]
    OUT.write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(map(str, rows)))


if __name__ == "__main__":
    main()
