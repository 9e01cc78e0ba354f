"""Our tokenizer against llama.cpp's llama-tokenize on the real Qwen3.5 vocabulary (tokenize.jsonl of each oracle,
b8462 and 0c1e570, written by compat/gen_tokenize_goldens.py). Every case must be identical."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from oracle_goldens import per_oracle

from llamacmp.fixtures import qwen_vocab as qv
from llamacmp.tokenizer import Tokenizer

GOLDENS = Path(__file__).resolve().parent.parent / "compat" / "goldens" / "tokenize.jsonl"
ORACLES = per_oracle("tokenize.jsonl")


def _goldens(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Tokenizer]:
    """One tokenizer per pre-tokenizer in the goldens (lines without "pre" are qwen35)."""
    v = qv.load_qwen35_vocab()
    return {pre: Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, pre, v.eos_id, v.bos_id, v.add_bos)
            for pre in ("qwen35", "qwen2")}


@pytest.mark.parametrize("oracle,path", ORACLES)
def test_goldens_are_substantial(oracle, path):
    cases = _goldens(path)
    assert len(cases) >= 2000
    assert {c["parse_special"] for c in cases} == {True, False}
    assert {c.get("pre", "qwen35") for c in cases} == {"qwen35", "qwen2"}


@pytest.mark.parametrize("oracle,path", ORACLES)
def test_every_golden_is_identical(tokenizers, oracle, path):
    mismatches = []
    cases = _goldens(path)
    for c in cases:
        pre = c.get("pre", "qwen35")
        ours = tokenizers[pre].encode(c["text"], parse_special=c["parse_special"])
        if ours != c["ids"]:
            mismatches.append((c["text"], pre, c["parse_special"], ours, c["ids"]))
    detail = "\n".join(f"{t!r} pre={pre} parse_special={p}\n  ours  {o}\n  llama {g}"
                       for t, pre, p, o, g in mismatches[:10])
    assert not mismatches, f"{len(mismatches)}/{len(cases)} goldens differ:\n{detail}"


@pytest.mark.parametrize("oracle,path", ORACLES)
def test_goldens_roundtrip_through_decode(tokenizers, oracle, path):
    for c in _goldens(path):
        if c["parse_special"]:
            assert tokenizers["qwen35"].decode(c["ids"]) == c["text"]


def _llamacpp_tree() -> Path:
    import os
    cache = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
    return cache / "llama.cpp-49bfddeca"


@pytest.mark.skipif(not (_llamacpp_tree() / "src" / "unicode-data.cpp").exists(),
                    reason="llama.cpp tree absent (run compat/build_llamacpp.sh)")
def test_unassigned_remap_matches_llamacpp_tables():
    """The remap table must equal the difference between llama.cpp's Unicode tables and the installed `regex`
    (a new `regex` release with a newer Unicode would add letters llama.cpp does not know)."""
    import sys
    sys.path.insert(0, str(GOLDENS.parent.parent))
    from gen_tokenize_goldens import unicode_diff
    from llamacmp.tokenizer import _UNASSIGNED_IN_LLAMACPP
    assert tuple(unicode_diff(_llamacpp_tree())) == _UNASSIGNED_IN_LLAMACPP
