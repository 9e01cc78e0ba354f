"""The main loop of a kernel in a cuobjdump -sass dump, shared by the per-kernel SASS tools (tools/mma_sass.py,
tools/w16_sass.py): the functions of one kernel template, an instruction's opcode, and the loop that holds a given
instruction (the body between a backward branch and its target)."""
from __future__ import annotations

import re

INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def functions(sass: str, kernel: str) -> dict[str, list[tuple[int, str]]]:
    """mangled name -> [(address, instruction)] of every instantiation of `kernel` in the dump (the first arch's
    copy: a fat binary repeats each name per arch, with addresses from 0 again)."""
    out, cur = {}, None
    for line in sass.splitlines():
        if "Function :" in line:
            name = line.split("Function :", 1)[1].strip()
            cur = out.setdefault(name, []) if kernel in name and name not in out else None
            continue
        m = INSTR.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(ins: str) -> str:
    """The opcode of an instruction, predicate dropped (`@!P0 BRA 0x...` -> BRA)."""
    parts = ins.split()
    return (parts[1] if parts[0].startswith("@") else parts[0]).split(".")[0]


def main_loop(body: list[tuple[int, str]], op: str) -> list[str]:
    """The instructions of the largest backward-branch range that holds an `op` (IMMA, IDP, ...)."""
    best: list[str] = []
    for i, (addr, ins) in enumerate(body):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", ins)
        if not m or int(m.group(1), 16) >= addr:
            continue
        target = int(m.group(1), 16)
        loop = [s for a, s in body[: i + 1] if a >= target]
        if any(opcode(s) == op for s in loop) and len(loop) > len(best):
            best = loop
    return best
