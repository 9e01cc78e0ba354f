"""No import cycles in llamacmp: the graph of its imports (module level and inside functions) has none, and every
module imports on its own in an interpreter where no other llamacmp module is loaded yet."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "llamacmp"


def module_files() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def imported(name: str, f: Path, known: dict) -> set[str]:
    """The llamacmp modules `name` imports anywhere in its file, plus its parent package (imported first)."""
    here = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
    out = {".".join(name.split(".")[:-1])} - {""}
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            prefix = ".".join(base + node.module.split(".") if node.module else base)
            for a in node.names:
                sub = f"{prefix}.{a.name}"
                out.add(sub if sub in known else prefix)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_import_graph_has_no_cycle():
    known = module_files()
    graph = {name: imported(name, f, known) for name, f in known.items()}
    assert len(graph) > 50 and graph["llamacmp.backends.cuda"] >= {"llamacmp.backends.cuda_graphs",
                                                                    "llamacmp.backends.cuda_memory"}
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    """The check above is not vacuous: a two-module and a three-module cycle are reported, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_every_module_imports_alone():
    """One interpreter; before each module, every llamacmp module loaded so far is dropped, so each import starts
    from nothing of ours (third-party packages stay loaded: they cannot be part of our cycles)."""
    names = sorted(module_files())
    code = ("import importlib, sys, traceback\n"
            "bad = []\n"
            f"for name in {names!r}:\n"
            "    for m in [m for m in sys.modules if m == 'llamacmp' or m.startswith('llamacmp.')]:\n"
            "        del sys.modules[m]\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except Exception as e:\n"
            "        bad.append(f'{name}: {type(e).__name__}: {e}')\n"
            "print('\\n'.join(bad))\n"
            "sys.exit(1 if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
