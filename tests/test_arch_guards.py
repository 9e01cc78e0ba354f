"""CI compiles the kernels for sm_75 and sm_90 only (.ci/run), not sm_80: every 8.x path must be compiled by the
sm_90 build. That holds while each `__CUDA_ARCH__` test in cuda_src/ gives the same answer on 8.0, 8.6, 8.7 and 8.9,
and the same on 9.0 except in one form: `#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900` with no #elif / #else
(code added on sm_90, e.g. common.cuh's PDL instructions, never code taken instead of an 8.x one). A change that
breaks it fails here: then CI must build sm_80 again (`make CUDA_ARCH="75 80 90"`) or the guard take this form.
Nor may an instruction that sm_80 lacks (sass_tools.PTX_SINCE[90]: griddepcontrol, wgmma, ...) appear outside that
form: sm_75 compiles the `>= 800` paths out and sm_90 accepts the instruction, so no CI build would reject it."""
from __future__ import annotations

import re
from pathlib import Path

from sass_tools import PTX_SINCE

ROOT = Path(__file__).resolve().parents[1]
SM8X, SM90 = (800, 860, 870, 890), 900
ADDED_ON_SM90 = re.compile(r"#\s*if\s+defined\s*\(\s*__CUDA_ARCH__\s*\)\s*&&\s*__CUDA_ARCH__\s*>=\s*900")
COMPARISON = re.compile(r"__CUDA_ARCH__\s*(>=|<=|==|!=|>|<)\s*(\d+)")
OPS = {">=": int.__ge__, "<=": int.__le__, "==": int.__eq__, "!=": int.__ne__, ">": int.__gt__, "<": int.__lt__}


def arch_guard_findings(name: str, text: str) -> tuple[list[str], int]:
    """(what breaks the rule above, how many `__CUDA_ARCH__` comparisons were read) for one source file."""
    found, compared, stack = [], 0, []       # stack: per open #if, whether it is the sm_90-only form
    for no, line in enumerate(text.splitlines(), 1):
        where, d = f"{name}:{no}: {line.strip()}", line.strip()
        if re.match(r"#\s*(if|ifdef|ifndef|elif)\b", d):
            for op, n in COMPARISON.findall(d):
                compared += 1
                on = {a: OPS[op](a, int(n)) for a in (*SM8X, SM90)}
                if len({on[a] for a in SM8X}) > 1:
                    found.append(f"{where}: 8.x cards differ")
                elif on[SM90] != on[800] and not (ADDED_ON_SM90.fullmatch(d) and d.startswith("#if")):
                    found.append(f"{where}: sm_80 and sm_90 differ other than by the sm_90-only #if form")
            if re.match(r"#\s*elif\b", d) and stack and stack[-1]:
                found.append(f"{where}: #elif after an sm_90-only #if (code for 8.x that sm_90 does not compile)")
            if not re.match(r"#\s*elif\b", d):
                stack.append(bool(ADDED_ON_SM90.fullmatch(d)))
        elif re.match(r"#\s*else\b", d):
            if stack and stack[-1]:
                found.append(f"{where}: #else of an sm_90-only #if (code for 8.x that sm_90 does not compile)")
        elif re.match(r"#\s*endif\b", d):
            stack.pop()
        elif (m := PTX_SINCE[90].search(line.split("//")[0])) and not any(stack):     # code, not its comments
            found.append(f"{where}: {m.group(0)} (sm_90+) outside an sm_90-only #if")
        if re.search(r"\bNV_(IF|PROVIDES|IS)_|__CUDA_ARCH_(FEAT|SPECIFIC|LIST)", line):
            found.append(f"{where}: an architecture test this check does not read")
    return found, compared


def test_sm90_build_compiles_every_8x_path():
    sources = sorted(p for p in (ROOT / "cuda_src").iterdir() if p.suffix in (".cu", ".cuh", ".h"))
    results = [arch_guard_findings(p.name, p.read_text()) for p in sources]
    findings = [f for fs, _ in results for f in fs]
    assert not findings, "\n".join(findings)
    assert sum(n for _, n in results) >= 20, "hardly any __CUDA_ARCH__ test read: is the parser still right?"


def test_the_check_catches_8x_only_code():
    ok = ("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n  asm(\"griddepcontrol.wait;\");\n#endif\n"
          "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n  cp_async();\n#else\n  plain();\n#endif\n"
          "#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)\n#endif\n#if __CUDA_ARCH__ < 750\n#endif\n")
    assert arch_guard_findings("ok.cu", ok) == ([], 4)
    for bad in ("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n a();\n#else\n b();\n#endif\n",
                "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n a();\n#elif __CUDA_ARCH__ >= 800\n b();\n"
                "#endif\n",
                "#if __CUDA_ARCH__ >= 800 && __CUDA_ARCH__ < 900\n b();\n#endif\n",
                "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860\n b();\n#endif\n",
                "#if __CUDA_ARCH__ == 800\n b();\n#endif\n",
                "#if __CUDA_ARCH__ >= 1000\n#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n#else\n#endif\n",
                "NV_IF_TARGET(NV_PROVIDES_SM_90, (a();), (b();))\n",
                "#if __CUDA_ARCH__ >= 800\n  asm(\"griddepcontrol.wait;\");\n#endif\n"):
        assert arch_guard_findings("bad.cu", bad)[0], bad
