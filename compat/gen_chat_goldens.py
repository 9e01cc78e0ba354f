"""Generate chat-template and output-parsing goldens from llama.cpp with the real Qwen3.5 template.

    python3 compat/gen_chat_goldens.py [--oracle b8462|0c1e570] [--llama-chat PATH]

Runs compat/llama_chat (llama.cpp's common_chat_templates_apply + common_chat_parse, as llama-server calls them)
on the cases in compat/chat_cases.py and writes chat_render.jsonl and chat_parse.jsonl into the oracle's goldens
folder (compat/oracles.py; `compat/build_oracle_tools.sh --oracle L` builds its llama_chat).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import oracles
from chat_cases import parse_cases, render_cases

from llamacmp.fixtures.qwen_vocab import load_qwen35_vocab
from llamacmp.fixtures.writer import SHAPES, write_model


def run_llama_chat(tool: Path, model: Path, cases: list[dict]) -> list[dict]:
    requests = "".join(json.dumps(c) + "\n" for c in cases)
    out = subprocess.run([str(tool), str(model)], input=requests, capture_output=True, text=True, check=True)
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == len(cases), "llama_chat answered a different number of lines"
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    oracles.add_argument(p)
    p.add_argument("--llama-chat", type=Path, help="default: the oracle's build")
    args = p.parse_args()
    oracle = oracles.parse(args.oracle)
    tool = args.llama_chat or oracle.tool("llama_chat")
    out_dir = oracle.goldens
    out_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        model = write_model(Path(d) / "vocab.gguf", SHAPES["tiny"], "q8_0", load_qwen35_vocab())
        for name, cases in (("chat_render", render_cases()), ("chat_parse", parse_cases())):
            results = run_llama_chat(tool, model, cases)
            with open(out_dir / f"{name}.jsonl", "w") as f:
                for case, res in zip(cases, results):
                    f.write(json.dumps(oracle.stamp({"case": case, "llama.cpp": res}), ensure_ascii=False) + "\n")
            errors = sum("error" in r for r in results)
            print(f"{name}: {len(cases)} cases, {errors} answered with an error")


if __name__ == "__main__":
    main()
