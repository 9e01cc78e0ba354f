"""Finding and running cuobjdump without a GPU, and what its output may hold, shared by the SASS checks
(test_no_tensor_cores, test_old_arch_builds, test_attention_sass)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

# SASS opcodes of tensor-core instructions: HMMA (fp16/bf16/tf32 mma.sync), IMMA (int8), BMMA (1-bit), DMMA (fp64),
# HGMMA/IGMMA/QGMMA/BGMMA (sm_90 wgmma on fp16, int8, fp8, 1-bit), OMMA and UTC*MMA (sm_100 tcgen05)
TENSOR_CORE_SASS = re.compile(r"\b(HMMA|IMMA|BMMA|DMMA|HGMMA|IGMMA|QGMMA|BGMMA|OMMA|UTC\w*MMA)\b")
TENSOR_CORE_PTX = re.compile(r"\b(mma\.sync|wmma\.|wgmma\.|tcgen05\.mma)")
# Kernels whose job is a tensor-core instruction (name substrings): the probe times int8 mma.sync and f16 HMMA
# (cuda_src/probe.cu), and the mma routes' GEMMs and attention (matmul_mma.cu, Volta's matmul_hmma.cu,
# attention_mma.cu); no route but mma runs any of them.
TENSOR_CORE_KERNELS = ("probe_imma_kernel", "probe_hmma_kernel", "gemm_mma_kernel", "gemm_hmma_kernel",
                       "attn_prefill_mma_kernel")
HMMA_GEMM_KERNEL = "gemm_hmma_kernel"   # Volta's GEMM: 5 instantiations (Q8_0, PER32 +- mins, PER16 +- mins)
# Volta's only mma.sync shape in SASS: HMMA.884 (sm_70 and sm_75 run it on the tensor cores; sm_80+ emulate the
# PTX m8n8k4 with shuffles and FFMA, no tensor-core instruction)
HMMA_884_ARCHS = (70, 75)


def hmma_gemm_findings(sass: str, functions: dict[str, str] | None = None) -> list[str]:
    """What is wrong with Volta's GEMM in cuobjdump -sass text (every arch's copy of each function concatenated):
    fewer than 5 instantiations; where the SASS is for sm_70 or sm_75, one without HMMA.884; where it is older
    than sm_70, one with any tensor-core instruction (its body is empty there). `functions`: the text's
    sass_functions where the caller has them already."""
    funcs = {n: b for n, b in (functions or sass_functions(sass)).items() if HMMA_GEMM_KERNEL in n}
    archs = {int(a) for a in re.findall(r"code for sm_(\d+)", sass)}
    found = [] if len(funcs) >= 5 else [f"{len(funcs)} {HMMA_GEMM_KERNEL} instantiations in the SASS"]
    if archs & set(HMMA_884_ARCHS):
        found += [f"{n}: no HMMA.884" for n, b in funcs.items() if "HMMA.884" not in b]
    if archs and max(archs) < 70:
        found += [f"{n}: {h} below sm_70" for n, b in funcs.items() for h in tensor_core_ops(b)]
    return found


def sass_functions(sass: str) -> dict[str, str]:
    """cuobjdump -sass text -> mangled name -> its SASS (every arch's copy of the function concatenated)."""
    out: dict[str, str] = {}
    for f in sass.split("Function : ")[1:]:
        name, _, body = f.partition("\n")
        out[name.strip()] = out.get(name.strip(), "") + body
    return out


_WORD = re.compile(r"\w*")


def tensor_core_ops(sass: str) -> list[str]:
    """TENSOR_CORE_SASS.findall(sass) in a fraction of its time: that regex crawls through a library's SASS (13 s
    for the 520 MB of one arch's), while every opcode it names ends in "MMA", which str.find jumps to. Only the few
    words holding "MMA" (HFMA2.MMA's MMA, HMMA, ...) are matched, each whole, as the regex's word boundaries do."""
    found, i = [], sass.find("MMA")
    while i != -1:
        start = i
        while start and (sass[start - 1].isalnum() or sass[start - 1] == "_"):
            start -= 1
        end = _WORD.match(sass, i).end()
        if m := TENSOR_CORE_SASS.fullmatch(sass, start, end):
            found.append(m.group(1))
        i = sass.find("MMA", end)
    return found


def tensor_core_hits(sass: str | dict[str, str]) -> list[tuple[str, str]]:
    """(function, opcode) of every tensor-core instruction outside TENSOR_CORE_KERNELS, from cuobjdump -sass text or
    its sass_functions."""
    funcs = sass_functions(sass) if isinstance(sass, str) else sass
    return sorted({(n, h) for n, b in funcs.items() if not any(k in n for k in TENSOR_CORE_KERNELS)
                   for h in tensor_core_ops(b)})


def ptx_mma_hits(ptx: str) -> list[tuple[str, str]]:
    """(entry, instruction) of every matrix instruction in cuobjdump -ptx text outside TENSOR_CORE_KERNELS."""
    entries = {e.split("(", 1)[0]: e for e in ptx.split(".entry ")[1:]}
    return sorted({(n, h) for n, e in entries.items() if not any(k in n for k in TENSOR_CORE_KERNELS)
                   for h in TENSOR_CORE_PTX.findall(e)})

# PTX instructions by the oldest architecture that has them (PTX ISA, "Target ISA notes"): a build for sm_N must
# hold none of a newer one's (ptxas refuses them too; the check names them).
PTX_SINCE = {
    70: re.compile(r"\b(mma\.sync|wmma\.\w+|match\.(any|all)\.sync|nanosleep)\b"),
    75: re.compile(r"\b(ldmatrix|movmatrix)\b"),
    80: re.compile(r"\b(cp\.async|redux\.sync|mbarrier|createpolicy|cvt\.\w+\.bf16\w*)\b"),
    90: re.compile(r"\b(griddepcontrol|wgmma|elect\.sync|setmaxnreg|stmatrix|barrier\.cluster|cp\.async\.bulk)\b"),
}


def ptx_above(ptx: str, arch: int) -> list[str]:
    """The instructions in `ptx` that architectures newer than `arch` (e.g. 61) introduced."""
    return sorted({m.group(0) for since, rx in PTX_SINCE.items() if since > arch for m in rx.finditer(ptx)})


def cuobjdump_candidates(first: Iterable[Path] = ()) -> Iterator[Path]:
    """Executable cuobjdump binaries: `first`, then CUDA_DISASM_PATH, the PyPI nvidia packages, triton's bundled
    copy (CUDA 12.8: still disassembles sm_61 / sm_70) and PATH."""
    def places():
        yield from first
        for d in os.environ.get("CUDA_DISASM_PATH", "").split(os.pathsep):
            if d:
                yield Path(d) / "cuobjdump"
        try:
            import nvidia
            for root in nvidia.__path__:
                for sub in ("cu13/bin", "cuda_cuobjdump/bin", "cu12/bin"):
                    yield Path(root) / sub / "cuobjdump"
        except ImportError:
            pass
        try:
            import triton
            yield Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
        except ImportError:
            pass
        if shutil.which("cuobjdump"):
            yield Path(shutil.which("cuobjdump"))
    return (p for p in places() if p.is_file() and os.access(p, os.X_OK))


def run_cuobjdump(tool: Path, flag: str, lib: Path, *more: str) -> subprocess.CompletedProcess:
    """cuobjdump -sass needs nvdisasm: the one beside it goes first on PATH. The SASS of a library of several archs
    is disassembled one arch per process, as many at once as there are cores (nvdisasm runs on one: 30 s for the
    sm_90 SASS of libcmpkern.so on the 2-core development machine); the text holds the same sections as one call's,
    grouped by arch. `more`: further options for the dump (-fun NAMES)."""
    env = dict(os.environ, PATH=f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(tool), *args, str(lib)], capture_output=True, text=True, env=env, timeout=600)

    archs = _cubin_archs(run("-lelf")) if flag == "-sass" else []
    if len(archs) < 2:
        return run(flag, *more)
    with ThreadPoolExecutor(min(len(archs), os.cpu_count() or 1)) as pool:
        parts = list(pool.map(lambda a: run("-arch", a, "-sass", *more), archs))
    return subprocess.CompletedProcess([str(tool), flag, str(lib)], max(p.returncode for p in parts),
                                       "".join(p.stdout for p in parts), "".join(p.stderr for p in parts))


def _cubin_archs(listing: subprocess.CompletedProcess) -> list[str]:
    """cuobjdump -lelf's cubin names (libcmpkern.3.sm_90.cubin) -> their archs in order; none (one call does all)
    where it failed or a name does not say its arch."""
    lines = listing.stdout.splitlines() if listing.returncode == 0 else []
    archs = [re.fullmatch(r"ELF file\s+\d+: .*\.(sm_\d+[a-z]?)\.cubin", ln.strip()) for ln in lines if ln.strip()]
    return list(dict.fromkeys(m.group(1) for m in archs)) if archs and all(archs) else []


# ---- branches on registers no path wrote ---------------------------------------------------------------------------
# A kernel that reads a variable before every path has set it (C++: undefined) may get SASS that tests a register
# nothing wrote: its value is whatever the warp that last held those registers left, possibly different per lane.
# attention_kernel (cuda_src/attention.cu) read its per-row flags of rows past the end so (3c01277..); lanes of one
# warp then took different sides of the branch around a full-mask __shfl_sync, and the block hung (2026-12-02).

_SASS_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@(!?U?P[T0-9])\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_SASS_REG = re.compile(r"\bR(\d+)\b")
_SASS_PRED = re.compile(r"!?P[0-9]")
# control flow this analysis does not follow (indirect branches): such a function is not analysed
_SASS_UNFOLLOWED = ("BRX", "JMX", "JMP")


def sass_function_copies(sass: str) -> list[tuple[str, str]]:
    """cuobjdump -sass text -> (mangled name, SASS) of each function of each arch, one entry per copy (unlike
    sass_functions, which joins the archs' copies of a name)."""
    out = []
    for f in sass.split("Function : ")[1:]:
        name, _, body = f.partition("\n")
        out.append((name.strip(), body))
    return out


def _sass_instructions(body: str) -> list[tuple[int, str | None, str, list[str]]]:
    """(address, guard predicate or None, opcode, operands) of each instruction."""
    out = []
    for m in _SASS_INS.finditer(body):
        addr, guard, op, rest = m.groups()
        out.append((int(addr, 16), guard, op, [o.strip() for o in rest.split(",")] if rest.strip() else []))
    return out


def _written_registers(op: str, ops: list[str]) -> set[int]:
    """General registers an instruction writes: its first operand, or the second after a predicate output (SHFL
    Pout, Rd; LOP3.LUT Pd, Rd), 2 or 4 of them for 64- / 128-bit results. Stores, branches, barriers: none."""
    if ops and re.fullmatch(r"R\d+", ops[0]):
        d = int(ops[0][1:])
    elif len(ops) > 1 and (ops[0] == "PT" or _SASS_PRED.fullmatch(ops[0])) and re.fullmatch(r"R\d+", ops[1]):
        d = int(ops[1][1:])
    else:
        return set()
    parts = op.split(".")
    wide = ".64" in op or ".WIDE" in op or parts[0] in ("CS2R", "DADD", "DMUL", "DFMA", "DMNMX") or \
        (len(parts) > 1 and parts[1] in ("F64", "S64", "U64"))    # F2F.F64.F32, I2F.F64, FRND.F64: a 64-bit result
    n = 4 if ".128" in op else 2 if wide else 1
    return {d + k for k in range(n)}


def unwritten_branch_reads(body: str) -> list[str] | None:
    """Predicate-setting instructions (ISETP, FSETP, LOP3.LUT Pd, ...: what branches test) in one function's SASS
    that read a general register some path from the entry leaves unwritten; None where the function has control
    flow this does not follow (_SASS_UNFOLLOWED). A must-write analysis over the branches (BRA, BRA.DIV, EXIT,
    RET, and a CALL: sm_75/80 call the divergent shuffles as subroutines, which return to the next instruction
    having written every register written from the callee's entry to its RET, and branch out of loops by a
    guarded CALL that never returns; the callee's own reads are not checked). A WARPSYNC.COLLECTIVE block runs its
    instruction on every lane (its address names where it ends). A write under a guard @P counts for reads under
    the same guard, or by a compare that ANDs that predicate in, until P is written again (the compiler predicates
    a load and its test alike), and for every read after a branch that P decided: @P BRA's target, its fall
    through for @!P."""
    ins = _sass_instructions(body)
    if not ins or any(op.split(".")[0] in _SASS_UNFOLLOWED for _a, _g, op, _o in ins):
        return None
    at = {a: k for k, (a, *_rest) in enumerate(ins)}

    def callee_writes(start: int) -> frozenset[int]:
        regs: set[int] = set()
        for _a, guard, op, ops in ins[start:]:
            regs |= _written_registers(op, ops)
            if op.startswith("RET") and not guard:
                break
        return frozenset(regs)

    def negate(g: str) -> str:
        return g[1:] if g.startswith("!") else "!" + g

    def edges(i: int) -> list[tuple[int, str | None, frozenset[int]]]:
        """(successor, the guard known to hold on that edge, registers the edge writes)."""
        _a, guard, op, ops = ins[i]
        base = op.split(".")[0]
        nxt = i + 1 if i + 1 < len(ins) else None
        target = at.get(int(ops[-1], 16)) if ops and re.fullmatch(r"0x[0-9a-f]+", ops[-1]) else None
        none: frozenset[int] = frozenset()
        out: list[tuple[int | None, str | None, frozenset[int]]]
        if base == "BRA" and target is not None:
            if op == "BRA.DIV":
                out = [(target, None, none), (nxt, None, none)]
            elif not guard:
                out = [(target, None, none)]
            else:   # `@P BRA Q, addr` branches on P && Q: its fall-through knows nothing
                out = [(target, guard, none), (nxt, negate(guard) if len(ops) == 1 else None, none)]
        elif base == "CALL" and target is not None:
            out = [(target, guard, none), (nxt, negate(guard), none) if guard else (nxt, None, callee_writes(target))]
        elif base in ("EXIT", "RET"):
            out = [(nxt, negate(guard), none)] if guard else []
        else:
            out = [(nxt, None, none)]
        return [(s, g, w) for s, g, w in out if s is not None]

    succ = [edges(i) for i in range(len(ins))]
    state: list[tuple[frozenset, frozenset] | None] = [None] * len(ins)   # None: not reached yet
    state[0] = (frozenset(), frozenset())
    work = [0]
    while work:
        i = work.pop()
        _a, guard, op, ops = ins[i]
        must, guarded = state[i]
        dest = _written_registers(op, ops)
        if guard:
            guarded = guarded | {(guard, r) for r in dest}
        else:
            must = must | dest
        preds = {o for o in ops[:2] if re.fullmatch(r"P\d", o)}
        if preds:
            guarded = frozenset((g, r) for g, r in guarded if g.lstrip("!") not in preds)
        for s, known, wrote in succ[i]:
            m = must | wrote | {r for g, r in guarded if g == known}
            new = (m, guarded) if state[s] is None else (state[s][0] & m, state[s][1] & guarded)
            if new != state[s]:
                state[s] = new
                work.append(s)
    found = []
    for i, (a, guard, op, ops) in enumerate(ins):
        if state[i] is None or not ops or not _SASS_PRED.fullmatch(ops[0]) or op.startswith(("SHFL", "PLOP3")):
            continue
        must, guarded = state[i]
        anded = ops[-1] if ".AND" in op else None          # ISETP.GE.AND Pd, PT, Ra, Rb, !P0: (Ra >= Rb) && !P0
        conds = {g for g in (guard, anded) if g and _SASS_PRED.fullmatch(g)}
        first_source = 2 if op.startswith("LOP3") and (ops[1] == "RZ" or re.fullmatch(r"R\d+", ops[1])) else 1
        for o in ops[first_source:]:
            for r in map(int, _SASS_REG.findall(o)):
                if r not in must and not any((g, r) in guarded for g in conds):
                    found.append(f"/*{a:04x}*/ {op} {', '.join(ops)}: R{r} unwritten on some path from the entry")
    return found
