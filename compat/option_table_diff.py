"""Every flag of llama.cpp's six tools (b8462 and current 0c1e570) against llamacmp's option table, in one of three
states: honoured, honoured as a no-op (the reason is said once in the log), refused (with a message naming it).

    python3 compat/option_table_diff.py                 # the table on stdout; exit 1 if any flag has no state
    python3 compat/option_table_diff.py --markdown docs/CLI.md   # (re)writes the generated section of docs/CLI.md

llama.cpp's side is read from its sources: common/arg.cpp's add_opt(common_arg(...)) entries (names, negated names,
env var, set_examples / set_excludes scopes), and the hand-written parsers of tools/llama-bench (both versions) and
tools/tokenize (b8462; current llama-tokenize uses common/arg.cpp). Trees: /work/cache/src (llama-cpp-python
0.3.17 = b8462, 0.3.36 = 0c1e570), or LLAMACPP_B8462 / LLAMACPP_CURRENT.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llamacmp import args as our_args  # noqa: E402
from llamacmp.cli import bench_options as our_bench  # noqa: E402

TREES = {
    "b8462": os.environ.get("LLAMACPP_B8462", "/work/cache/src/llama_cpp_python-0.3.17/vendor/llama.cpp"),
    "0c1e570": os.environ.get("LLAMACPP_CURRENT", "/work/cache/src/llama_cpp_python-0.3.36/vendor/llama.cpp"),
}
# our tool -> the LLAMA_EXAMPLE_* its llama.cpp counterpart parses with (None: a parser of its own)
EXAMPLES = {"cli": "CLI", "completion": "COMPLETION", "server": "SERVER", "perplexity": "PERPLEXITY",
            "bench": None, "tokenize": "TOKENIZE"}
OWN_PARSERS = {"bench": "tools/llama-bench/llama-bench.cpp", "tokenize": "tools/tokenize/tokenize.cpp"}
BEGIN, END = "<!-- option_table_diff: begin -->", "<!-- option_table_diff: end -->"


@dataclass
class Flag:
    """One llama.cpp option as a tool sees it: every spelling, and which versions have it."""
    names: tuple[str, ...]
    env: str = ""
    versions: set[str] = field(default_factory=set)


# -- reading C++ ---------------------------------------------------------------------------------------------------

def _strip_comments(src: str) -> str:
    """Comments blanked, string and char literals kept (so a '//' inside a help text survives)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            i = src.find("\n", i) if "\n" in src[i:] else n
        elif src.startswith("/*", i):
            i = src.find("*/", i) + 2
        elif c in "\"'":
            j = _literal_end(src, i)
            out.append(src[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _literal_end(src: str, i: int) -> int:
    quote, j = src[i], i + 1
    while src[j] != quote:
        j += 2 if src[j] == "\\" else 1
    return j + 1


def _balanced_end(src: str, i: int) -> int:
    """src[i] is an opening bracket; the index after its partner (literals skipped)."""
    depth = 0
    while True:
        c = src[i]
        if c in "\"'":
            i = _literal_end(src, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1


def _strings(text: str) -> list[str]:
    return re.findall(r'"((?:[^"\\]|\\.)*)"', text)


def _call_arg(tail: str, method: str) -> str | None:
    m = re.match(r"(?:\s*\.\w+\((?:[^()]|\([^()]*\))*\))*?\s*\." + method + r"\(", tail)
    if not m:
        return None
    start = m.end() - 1
    return tail[start + 1:_balanced_end(tail, start) - 1]


def common_options(arg_cpp: str) -> list[tuple[tuple[str, ...], str, set[str], set[str]]]:
    """(names incl. negated, env, examples, excludes) of every add_opt(common_arg(...)) in common/arg.cpp."""
    src = _strip_comments(arg_cpp)
    macros = {m.group(1): set(re.findall(r"LLAMA_EXAMPLE_(\w+)", m.group(2)))
              for m in re.finditer(r"initializer_list<enum llama_example>\s+(\w+)\s*=\s*\{([^}]*)\}", src)}
    out = []
    for m in re.finditer(r"add_opt\(common_arg\(", src):
        open_arg = m.end() - 1
        body_end = _balanced_end(src, open_arg)
        body = src[open_arg + 1:body_end - 1].lstrip()
        names: list[str] = []
        while body.startswith("{"):                 # {"-x", "--long"} then maybe {"--no-long"}
            end = _balanced_end(body, 0)
            names += _strings(body[:end])
            body = body[end:].lstrip().lstrip(",").lstrip()
        tail = src[body_end:_balanced_end(src, m.start() + len("add_opt"))]
        env = (_strings(_call_arg(tail, "set_env") or "") or [""])[0]
        examples, excludes = {"COMMON"}, set()
        ex = _call_arg(tail, "set_examples")
        if ex is not None:
            examples = set(re.findall(r"LLAMA_EXAMPLE_(\w+)", ex)) or macros.get(ex.strip(), set())
        exc = _call_arg(tail, "set_excludes")
        if exc is not None:
            excludes = set(re.findall(r"LLAMA_EXAMPLE_(\w+)", exc))
        out.append((tuple(names), env, examples, excludes))
    return out


def own_parser_flags(cpp: str) -> list[tuple[str, ...]]:
    """The spellings a hand-written `if (arg == "-x" || arg == "--long")` parser accepts, grouped per branch."""
    src = _strip_comments(cpp)
    return [tuple(re.findall(r'arg == "([^"]+)"', m.group(0)))
            for m in re.finditer(r'if \((?:[^{;]*?arg == "[^"]+")+[^{;]*\)\s*\{', src)]


def llama_flags(tool: str) -> list[Flag]:
    """Every flag `tool`'s llama.cpp counterpart accepts in either version, merged by spelling."""
    by_name: dict[str, Flag] = {}
    for version, tree in TREES.items():
        root = Path(tree)
        example = EXAMPLES[tool]
        own = OWN_PARSERS.get(tool)
        if own and (example is None or not re.search(r"LLAMA_EXAMPLE_" + example + r"\b",
                                                     (root / own).read_text(errors="replace"))):
            groups = [(names, "") for names in own_parser_flags((root / own).read_text(errors="replace"))]
        else:
            groups = [(names, env) for names, env, examples, excludes in
                      common_options((root / "common/arg.cpp").read_text(errors="replace"))
                      if (example in examples or "COMMON" in examples) and example not in excludes]
        for names, env in groups:
            flag = next((by_name[n] for n in names if n in by_name), None)
            if flag is None:
                flag = Flag(names=tuple(names), env=env)
            else:
                flag.names = tuple(dict.fromkeys(flag.names + tuple(names)))
                flag.env = flag.env or env
            flag.versions.add(version)
            for n in flag.names:
                by_name[n] = flag
    return list({id(f): f for f in by_name.values()}.values())


# -- our side ------------------------------------------------------------------------------------------------------

def our_state(tool: str, name: str) -> tuple[str, str]:
    """("honoured" | "no-op" | "refused" | "MISSING", the reason or message)."""
    if tool == "bench":
        opt = next((o for o in our_bench.OPTS if name in o.names), None)
        if opt is None:
            return "MISSING", ""
        if opt.unsupported:
            return "refused", opt.unsupported
        return ("no-op", opt.noop) if opt.noop else ("honoured", "")
    for opt in our_args.options_for(tool):
        if name in opt.names or name in opt.neg:
            if opt.unsupported:
                return "refused", opt.unsupported
            if opt.noop:
                return "no-op", opt.noop
            return "honoured", ""
    return "MISSING", ""


# -- report --------------------------------------------------------------------------------------------------------

ORDER = ("MISSING", "refused", "no-op", "honoured")


def rows(tool: str) -> list[tuple[str, str, str, str]]:
    """(spellings, versions, state, reason) per flag, in llama.cpp's order."""
    out = []
    for flag in llama_flags(tool):
        per_name = {n: our_state(tool, n) for n in flag.names}
        states = sorted(set(per_name.values()), key=lambda s: (ORDER.index(s[0]), s[1]))   # stable across runs
        state, why = states[0]
        if len(states) > 1:             # e.g. --no-context-shift honoured, --context-shift refused
            state = "; ".join(f"{st} ({', '.join(n for n in flag.names if per_name[n][0] == st)})"
                              for st in dict.fromkeys(s[0] for s in states))
            why = "; ".join(w for _, w in states if w)
        versions = "both" if len(flag.versions) == 2 else next(iter(flag.versions)) + " only"
        out.append((", ".join(flag.names), versions, state, why))
    return out


def markdown() -> str:
    lines = [BEGIN, "", "Generated by `python3 compat/option_table_diff.py --markdown docs/CLI.md` from llama.cpp "
             "b8462's and 0c1e570's sources; do not edit by hand.", ""]
    for tool in EXAMPLES:
        table = rows(tool)
        counts = {s: sum(r[2].startswith(s) for r in table) for s in reversed(ORDER)}
        lines += [f"### llamacmp-{tool} (llama-{tool})", "",
                  ", ".join(f"{v} {k}" for k, v in counts.items() if v) + ".", "",
                  "| flag | llama.cpp | llamacmp | why |", "|---|---|---|---|"]
        lines += [f"| `{names}` | {ver} | {state} | {why.replace('|', '/')} |" for names, ver, state, why in table]
        lines.append("")
    return "\n".join(lines + [END]) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", metavar="FILE", help="replace the generated section of FILE (docs/CLI.md)")
    ap.add_argument("--tool", choices=list(EXAMPLES), help="only this tool")
    a = ap.parse_args()
    gaps = 0
    for tool in [a.tool] if a.tool else EXAMPLES:
        for names, ver, state, why in rows(tool):
            gaps += "MISSING" in state
            print(f"{tool:<10} {state:<9} {ver:<13} {names:<45} {why[:90]}")
    if a.markdown:
        path = Path(a.markdown)
        text = path.read_text()
        section = markdown()
        if BEGIN in text:
            text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1:]
        else:
            text = text.rstrip("\n") + "\n\n## Every llama.cpp flag, per tool\n\n" + section
        path.write_text(text)
    print(f"{gaps} flag(s) without a state", file=sys.stderr)
    return 1 if gaps else 0


if __name__ == "__main__":
    raise SystemExit(main())
