"""The two llama.cpp builds the goldens come from, where each one's tools are and where its goldens go.

b8462 (commit 49bfddeca, the llama-cpp-python 0.3.17 sdist) is the first oracle: its goldens sit in compat/goldens/
and predate this module, so they carry no commit of their own (they stay byte-identical). 0c1e570 (the 0.3.36 sdist,
current llama.cpp) writes the same file names under compat/goldens/0c1e570/, and every record names its commit.
`compat/build_llamacpp.sh [--version 0.3.36]` and `compat/build_oracle_tools.sh [--oracle 0c1e570]` build them.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

GOLDENS = Path(__file__).resolve().parent / "goldens"
CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))


@dataclass(frozen=True)
class Oracle:
    label: str           # how reports, tests and folder names call it
    commit: str          # the vendored llama.cpp commit
    sdist: str           # the llama-cpp-python release that vendors it
    short: str           # the commit as compat/build_llamacpp.sh names its tree

    @property
    def tree(self) -> Path:
        return CACHE / f"llama.cpp-{self.short}"

    @property
    def bin(self) -> Path:
        return self.tree / "build-cpu" / "bin"

    def tool(self, name: str) -> Path:
        return self.bin / name

    @property
    def goldens(self) -> Path:
        return GOLDENS if self is B8462 else GOLDENS / self.label

    def golden(self, name: str) -> Path:
        return self.goldens / name

    def stamp(self, record: dict) -> dict:
        """The record with the commit it came from (b8462's records never had one; see the module doc)."""
        return record if self is B8462 else {**record, "oracle": self.commit}


B8462 = Oracle("b8462", "49bfddeca18e62fa3d39114a23e9fcbdf8a22388", "llama-cpp-python 0.3.17", "49bfddeca")
CURRENT = Oracle("0c1e570", "0c1e57098bba43ac29e6e3b677cdceebdd22334f", "llama-cpp-python 0.3.36", "0c1e570")
ORACLES = {o.label: o for o in (B8462, CURRENT)}

# Goldens that 0c1e570 does not have, and why (tests skip them by these names; a missing file not named here fails).
NOT_RECORDED: dict[str, dict[str, str]] = {
    CURRENT.label: {
        "cli_quant.jsonl": "not generated yet (gen_quant_file_goldens.py has no --oracle yet)",
        "perplexity_quant.json": "not generated yet (needs the demo model requantized by 0c1e570's llama-quantize)",
        "vision": "llama_mtmd does not build against 0c1e570 (mtmd_helper_bitmap_init_from_file changed)",
        "embeddings.json": "0c1e570's build has no llama-embedding target yet",
        "bench_json_keys.json": "recorded by hand from llama-bench b8462, no generator",
        "quant_mix.json": "recorded by hand from llama-quantize b8462 --dry-run, no generator",
    },
}


# Goldens that 0c1e570 has, but without some of the cases b8462's holds: golden -> (case names, why). None now (the
# IQ1-3 cases were recorded for both); a case added later for b8462 alone is named here until 0c1e570 has it.
NOT_RECORDED_CASES: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {}


def missing_case(label: str, golden: str, case: str) -> str | None:
    """Why oracle `label`'s `golden` has no `case`, or None where it should have it."""
    cases, why = NOT_RECORDED_CASES.get(label, {}).get(golden, ((), ""))
    return why if case in cases else None


@dataclass(frozen=True)
class Divergence:
    """Cases where the two oracles answer differently and llamacmp matches one of them on purpose (or not yet the
    other): tests hold llamacmp to the followed oracle's golden there, and check that the oracles still differ."""
    golden: str                  # the golden file, e.g. "chat_parse.jsonl"
    cases: tuple[str, ...]       # its case ids
    follows: str                 # the label of the oracle llamacmp matches
    why: str


_THINKING = ("plain", "think_answer", "think_only", "think_multiline", "tool", "tool_no_text", "two_tools",
             "content_then_tool", "think_lead_space")
DIVERGENCES: list[Divergence] = [
    Divergence("chat_render.jsonl", tuple(f"content_parts-think{t}-gen{g}" for t in (1, 0) for g in (1, 0)),
               "0c1e570",
               "text content parts: b8462 joins them with a newline before the template runs, 0c1e570 hands the "
               "list to a template that reads typed content, and the Qwen3.5 one concatenates them (as "
               "transformers renders it). llamacmp follows 0c1e570 (compat/DIFFERENCES.md)"),
    Divergence("chat_parse.jsonl", tuple(f"{c}-think1-tools{t}" for c in _THINKING for t in (1, 0)), "0c1e570",
               "reasoning_content: b8462 keeps the newline the generation prompt leaves after <think> (and any "
               "whitespace the model writes there), 0c1e570 drops all of it. llamacmp follows 0c1e570; llama-cli "
               "0c1e570 writes the blank line after '[Start thinking]' itself, so the CLI's output is unchanged "
               "(compat/DIFFERENCES.md)"),
]


def followed(golden: str, case_id: str, oracle: Oracle) -> tuple[Oracle, str]:
    """The oracle whose answer llamacmp must give for this case (itself unless a Divergence says otherwise)."""
    for d in DIVERGENCES:
        if d.golden == golden and case_id in d.cases and d.follows != oracle.label:
            return ORACLES[d.follows], d.why
    return oracle, ""


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--oracle", choices=list(ORACLES), default=B8462.label,
                        help="the llama.cpp build to record (default b8462; 0c1e570 writes compat/goldens/0c1e570/)")


def parse(label: str) -> Oracle:
    return ORACLES[label]


def recorded(name: str) -> list[tuple[Oracle, Path | None, str]]:
    """(oracle, path of its golden `name` or None, why it is absent) for each oracle, for tests and the report.
    A golden absent without a reason in NOT_RECORDED is an error: it must be generated or named there."""
    out = []
    for o in ORACLES.values():
        path = o.golden(name)
        if path.exists():
            out.append((o, path, ""))
        elif name in NOT_RECORDED.get(o.label, {}):
            out.append((o, None, NOT_RECORDED[o.label][name]))
        else:
            raise FileNotFoundError(f"{path} is missing and compat/oracles.py NOT_RECORDED gives no reason")
    return out
