"""Files llama.cpp's GGUF reader refuses are refused here too, with one line naming the problem (issue 22), and a
fuzz of >= 500 malformed variants of these families: each loads or gives that one-line error, nothing else."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

import gguf_mutate as g
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.gguf_file import GGUFError
from llamacmp.loader import load_model
from llamacmp.models import UnsupportedModel

A = "qwen35."


@pytest.fixture(scope="module")
def src(fixture_gguf) -> bytes:
    return fixture_gguf("tiny", "q8_0").read_bytes()


def _set(key, type_id, v):
    return lambda p: p.set(key, g.value(type_id, v))


def _append(key, type_id, v):
    return lambda p: p.kvs.append((key, g.value(type_id, v)))


def _tensor(i, **changes):
    def f(p):
        for k, v in changes.items():
            setattr(p.tensors[i], k, v(p) if callable(v) else v)
    return f


def _q8_as_f16(p):
    t = next(t for t in p.tensors[:-1] if t.type == 8)
    t.type = 1


def _nested(p):
    p.kvs.append(("general.tags", g.value(g.ARR, (g.ARR, [(g.U32, [1, 2]), (g.U32, [3])]))))


def _layer_beyond(p):
    for t in p.tensors:
        if t.name.startswith("blk.3."):
            t.name = "blk.4." + t.name[len("blk.3."):]


# family -> (mutation, a piece of the expected message)
FAMILIES = {
    "duplicate key": (_append(A + "block_count", g.U32, 2), "duplicate key 'qwen35.block_count'"),
    "duplicate tensor": (_tensor(2, name=lambda p: p.tensors[1].name), "duplicate tensor name"),
    "misaligned offset": (_tensor(3, offset=lambda p: p.tensors[3].offset + 4), "expected"),
    "overlapping offset": (_tensor(3, offset=lambda p: p.tensors[2].offset), "expected"),
    "q8_0 relabelled f16": (_q8_as_f16, "expected"),
    "block_count string": (_set(A + "block_count", g.STR, "4"), "block_count' must be an integer"),
    "block_count float": (_set(A + "block_count", g.F32, 4.5), "block_count' must be an integer"),
    "block_count bool": (_set(A + "block_count", g.BOOL, True), "block_count' must be an integer"),
    "block_count 2^31": (_set(A + "block_count", g.U32, 2**31), "file has tensors for 4 layers"),
    "block_count 2^63": (_set(A + "block_count", g.U64, 2**63), "file has tensors for 4 layers"),
    "block_count larger": (_set(A + "block_count", g.U32, 5), "file has tensors for 4 layers"),
    "block_count smaller": (_set(A + "block_count", g.U32, 2), "file has tensors for 4 layers"),
    "layer beyond block_count": (_layer_beyond, "file has tensors for 5 layers"),
    "rope.freq_base nan": (_set(A + "rope.freq_base", g.F32, math.nan), "rope.freq_base' must be a finite"),
    "rope.freq_base inf": (_set(A + "rope.freq_base", g.F32, math.inf), "rope.freq_base' must be a finite"),
    "rms_eps nan": (_set(A + "attention.layer_norm_rms_epsilon", g.F32, math.nan), "epsilon' must be a finite"),
    "rms_eps -inf": (_set(A + "attention.layer_norm_rms_epsilon", g.F64, -math.inf), "epsilon' must be a finite"),
    "context_length -1": (_set(A + "context_length", g.I32, -1), "context_length' = -1 is out of range"),
    "context_length 2^63": (_set(A + "context_length", g.U64, 2**63), "context_length' = 9223372036854775808"),
    "eos float": (_set("tokenizer.ggml.eos_token_id", g.F32, 2.0), "eos_token_id' must be a token id"),
    "eos out of vocab": (_set("tokenizer.ggml.eos_token_id", g.U32, 10**6), "eos_token_id' must be a token id"),
    "template not a string": (_set("tokenizer.chat_template", g.U32, 5), "chat_template' must be a string"),
    "nested array": (_nested, "nested array"),
    "alignment string": (_append("general.alignment", g.STR, "32"), "general.alignment"),
    "tokens not strings": (_set("tokenizer.ggml.tokens", g.ARR, (g.U32, [1, 2, 3])), "must be an array of strings"),
}


def _load(path):
    try:
        load_model(path, NumpyBackend())
    except (GGUFError, UnsupportedModel) as e:
        return str(e)
    return None


@pytest.mark.parametrize("family", list(FAMILIES))
def test_refused_with_one_line(src, tmp_path, family):
    mutate, piece = FAMILIES[family]
    parts = g.parse(src)
    mutate(parts)
    path = tmp_path / "bad.gguf"
    path.write_bytes(g.build(parts))
    t0 = time.monotonic()
    msg = _load(path)
    assert msg is not None, f"{family}: loaded"
    assert piece in msg and "\n" not in msg and str(path) in msg, msg
    assert time.monotonic() - t0 < 10, "a bad count must not be trusted (2^31 layers, ...)"


def test_the_unmutated_file_loads(src, tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(g.build(g.parse(src)))
    assert _load(path) is None


def _random_variant(parts: g.Parts, rng: np.random.Generator) -> str:
    """One random mutation: a family above with random values, or random tensor/key damage."""
    kind = int(rng.integers(0, 6))
    if kind == 0:
        mutate, _ = FAMILIES[list(FAMILIES)[int(rng.integers(0, len(FAMILIES)))]]
        mutate(parts)
    elif kind == 1:                              # a tensor's offset moved by any amount
        t = parts.tensors[int(rng.integers(0, len(parts.tensors)))]
        t.offset = max(0, t.offset + int(rng.choice([-64, -32, -1, 1, 2, 32, 64, 2**40])))
    elif kind == 2:                              # a tensor's type or shape changed
        t = parts.tensors[int(rng.integers(0, len(parts.tensors)))]
        if rng.random() < 0.5:
            t.type = int(rng.choice([0, 1, 2, 8, 12, 14, 16, 30, 99]))
        else:
            t.ne[int(rng.integers(0, len(t.ne)))] = int(rng.choice([0, 1, 31, 33, 2**31, 2**62]))
    elif kind == 3:                              # a key given another type / value
        i = int(rng.integers(0, len(parts.kvs)))
        key = parts.kvs[i][0]
        typed = [g.value(g.STR, "8"), g.value(g.F32, float(rng.choice([8.5, math.nan, math.inf, -1.0]))),
                 g.value(g.BOOL, True), g.value(g.I32, -1), g.value(g.U64, 2**63), g.value(g.U32, 0),
                 g.value(g.ARR, (g.U32, [1, 2])), g.value(g.ARR, (g.ARR, [(g.U8, [1])]))]
        parts.kvs[i] = (key, typed[int(rng.integers(0, len(typed)))])
    elif kind == 4:                              # a key duplicated / a tensor dropped or duplicated
        if rng.random() < 0.5:
            parts.kvs.append(parts.kvs[int(rng.integers(0, len(parts.kvs)))])
        elif rng.random() < 0.5:
            del parts.tensors[int(rng.integers(0, len(parts.tensors)))]
        else:
            parts.tensors.append(parts.tensors[int(rng.integers(0, len(parts.tensors)))])
    else:                                        # bytes of the data section flipped: may well still load
        data = bytearray(parts.data)
        for pos in rng.integers(0, len(data), 8):
            data[pos] ^= 0xFF
        parts.data = bytes(data)
    return ["family", "offset", "type/shape", "key type", "duplicate/drop", "data"][kind]


def test_fuzz_500_variants(src, tmp_path):
    rng = np.random.default_rng(22)
    outcomes: dict[str, list[int]] = {}
    path = tmp_path / "fuzz.gguf"
    for case in range(520):
        parts = g.parse(src)
        kind = _random_variant(parts, rng)
        path.write_bytes(g.build(parts))
        msg = _load(path)
        loaded, refused = outcomes.setdefault(kind, [0, 0])
        if msg is None:
            outcomes[kind][0] += 1
        else:
            assert "\n" not in msg and (str(path) in msg or "architecture" in msg), f"case {case} ({kind}): {msg}"
            outcomes[kind][1] += 1
    assert sum(r for _, r in outcomes.values()) >= 350, outcomes
    assert outcomes["family"][0] == 0, outcomes            # every family member is refused
