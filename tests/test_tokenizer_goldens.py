"""Our tokenizer against llama.cpp's llama-tokenize on the real Qwen3.5 vocabulary (compat/goldens/tokenize.jsonl,
written by compat/gen_tokenize_goldens.py). Every case must be identical."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamacmp.fixtures import qwen_vocab as qv
from llamacmp.tokenizer import Tokenizer

GOLDENS = Path(__file__).resolve().parent.parent / "compat" / "goldens" / "tokenize.jsonl"

pytestmark = pytest.mark.skipif(not GOLDENS.exists(), reason=f"{GOLDENS} is absent (run compat/gen_tokenize_goldens.py)")


def _goldens() -> list[dict]:
    with GOLDENS.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    v = qv.load_qwen35_vocab()
    return Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, v.pre, v.eos_id, v.bos_id, v.add_bos)


def test_goldens_are_substantial():
    cases = _goldens()
    assert len(cases) >= 2000
    assert {c["parse_special"] for c in cases} == {True, False}


def test_every_golden_is_identical(qwen):
    mismatches = []
    cases = _goldens()
    for c in cases:
        ours = qwen.encode(c["text"], parse_special=c["parse_special"])
        if ours != c["ids"]:
            mismatches.append((c["text"], c["parse_special"], ours, c["ids"]))
    detail = "\n".join(f"{t!r} parse_special={p}\n  ours  {o}\n  llama {g}" for t, p, o, g in mismatches[:10])
    assert not mismatches, f"{len(mismatches)}/{len(cases)} goldens differ:\n{detail}"


def test_goldens_roundtrip_through_decode(qwen):
    for c in _goldens():
        if c["parse_special"]:
            assert qwen.decode(c["ids"]) == c["text"]
