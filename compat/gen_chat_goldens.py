"""Generate chat-template and output-parsing goldens from llama.cpp (≈ b8462) with the real Qwen3.5 template.

    python3 compat/gen_chat_goldens.py [--llama-chat PATH]

Runs compat/llama_chat (llama.cpp's common_chat_templates_apply + common_chat_parse, as llama-server calls them)
on the cases in compat/chat_cases.py and writes compat/goldens/chat_render.jsonl and chat_parse.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from chat_cases import parse_cases, render_cases

from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
from llamacmp.fixtures.writer import SHAPES, write_model

HERE = Path(__file__).parent
CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
DEFAULT_TOOL = CACHE / "llama.cpp-49bfddeca" / "build-cpu" / "bin" / "llama_chat"


def run_llama_chat(tool: Path, model: Path, cases: list[dict]) -> list[dict]:
    requests = "".join(json.dumps(c) + "\n" for c in cases)
    out = subprocess.run([str(tool), str(model)], input=requests, capture_output=True, text=True, check=True)
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == len(cases), "llama_chat answered a different number of lines"
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--llama-chat", type=Path, default=DEFAULT_TOOL)
    args = p.parse_args()
    out_dir = HERE / "goldens"
    out_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        model = write_model(Path(d) / "vocab.gguf", SHAPES["tiny"], "q8_0", load_qwen35_vocab())
        for name, cases in (("chat_render", render_cases()), ("chat_parse", parse_cases())):
            results = run_llama_chat(args.llama_chat, model, cases)
            with open(out_dir / f"{name}.jsonl", "w") as f:
                for case, res in zip(cases, results):
                    f.write(json.dumps({"case": case, "llama.cpp": res}, ensure_ascii=False) + "\n")
            errors = sum("error" in r for r in results)
            print(f"{name}: {len(cases)} cases, {errors} answered with an error")


if __name__ == "__main__":
    main()
