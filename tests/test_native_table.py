"""lib/_native.py's ctypes table matches cuda_src/api.h: the same functions, each argument's ctypes type the C
type's, and every table function returns int (no GPU or library needed: both files are read as text)."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np

from llamacmp.lib._native import SIGNATURES

API_H = Path(__file__).resolve().parent.parent / "cuda_src" / "api.h"
DECL = re.compile(r"^\s*((?:const\s+)?\w+\s*\**)\s*(cmp_\w+)\s*\(([^)]*)\)\s*;", re.M)
SCALARS = {"int": ctypes.c_int, "int32_t": ctypes.c_int, "float": ctypes.c_float, "double": ctypes.c_double,
           "size_t": ctypes.c_size_t}


def declarations() -> dict[str, tuple[str, list[str]]]:
    """api.h -> name: (return type, [argument C types]), comments dropped."""
    text = re.sub(r"//[^\n]*", "", API_H.read_text())
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = {}
    for ret, name, args in DECL.findall(text):
        params = [a.strip() for a in " ".join(args.split()).split(",") if a.strip() and a.strip() != "void"]
        out[name] = (" ".join(ret.split()), [p.rsplit(None, 1)[0] if "*" not in p.rsplit(None, 1)[-1] else p
                                            for p in params])
    return out


def ctype_of(c_type: str):
    """The ctypes type a C argument type travels as: every pointer a c_void_p (plain ints or buffers)."""
    if "*" in c_type:
        return ctypes.c_void_p
    base = c_type.replace("const ", "").strip()
    return SCALARS.get(base, f"no ctypes mapping for {c_type!r}")


def test_the_header_parses():
    decl = declarations()
    assert len(decl) > 50 and "cmp_init" in decl and "cmp_last_error" in decl


def test_same_functions():
    decl = declarations()
    in_header = set(decl) - {"cmp_last_error"}      # bound by hand in Native: it returns a string
    assert sorted(in_header - set(SIGNATURES)) == [], "in api.h but not in the ctypes table"
    assert sorted(set(SIGNATURES) - in_header) == [], "in the ctypes table but not in api.h"
    assert decl["cmp_last_error"][0] == "const char*"


def test_argument_and_return_types_match():
    decl = declarations()
    wrong = []
    for name, (argtypes, _proto) in SIGNATURES.items():
        ret, params = decl[name]
        if ret != "int":
            wrong.append(f"{name}: returns {ret}, the table assumes int")
        want = [ctype_of(p) for p in params]
        if list(argtypes) != want:
            wrong.append(f"{name}: table {[getattr(t, '__name__', t) for t in argtypes]} vs api.h {params}")
    assert not wrong, "\n".join(wrong)


def test_copy_region_layout():
    """cmp_copy_regions' table travels as numpy uint64 rows of COPY_REGION_WORDS (llamacmp/backends/cuda.py):
    api.h's CmpCopyRegion must stay that many 8-byte members (pointers and size_t on a 64-bit platform)."""
    from llamacmp.lib._native import COPY_REGION_WORDS
    body = re.search(r"typedef struct CmpCopyRegion \{(.*?)\} CmpCopyRegion;", API_H.read_text(), re.S)
    assert body, "no CmpCopyRegion in api.h"
    members = [m.strip() for m in body.group(1).split(";") if m.strip()]
    assert len(members) == COPY_REGION_WORDS
    assert all("*" in m or m.startswith("size_t ") for m in members), members
    assert ctypes.sizeof(ctypes.c_void_p) == ctypes.sizeof(ctypes.c_size_t) == 8


def test_copy_region_table_bytes():
    """copy_region_table (concat's and restore_steps' tables): region k is (dst, src, bytes) as three uint64 at byte
    k * COPY_REGION_BYTES, whatever the regions are grouped by (restore's rows of `count` regions)."""
    from llamacmp.lib._native import COPY_REGION_BYTES, COPY_REGION_WORDS, copy_region_table
    regions = [(0x1000 + 8 * k, 0x9000 + 16 * k, 24 + k) for k in range(6)]
    table = copy_region_table(iter(regions))
    assert table.dtype == np.uint64 and table.shape == (6, COPY_REGION_WORDS)
    assert COPY_REGION_BYTES == table[0].nbytes == 24
    raw = table.tobytes()
    for k, region in enumerate(regions):
        assert np.frombuffer(raw[k * COPY_REGION_BYTES:(k + 1) * COPY_REGION_BYTES], np.uint64).tolist() == list(region)
