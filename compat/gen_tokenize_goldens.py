#!/usr/bin/env python3
"""Tokenizer goldens from llama.cpp's own llama-tokenize, over the real Qwen3.5 vocabulary.

    python compat/gen_tokenize_goldens.py [--oracle b8462|0c1e570] [--bin DIR] [--out FILE]
    python compat/gen_tokenize_goldens.py --unicode-diff   # re-derive tokenizer._UNASSIGNED_IN_LLAMACPP

Steps: write a metadata-only GGUF (architecture qwen35, the rebuilt vocabulary, no tensors: llama-tokenize loads
with vocab_only), generate a fixed corpus of strings, and tokenize them all with one llama-tokenize call per
parse_special mode. Strings are joined by a separator that is itself a special token (`</tool_response>`,
USER_DEFINED, so it is cut in both modes): llama.cpp tokenizes each raw fragment on its own, so splitting the
output ids at the separator's id gives exactly the per-string results. The separator text is kept out of the
corpus. Lines without a "pre" field are for `qwen35`; the first strings are repeated with "pre": "qwen2".
The default --bin and --out are the oracle's build and its goldens folder (compat/oracles.py).
Build llama.cpp first with compat/build_llamacpp.sh.
"""
from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import oracles  # noqa: E402
from llamacmp.fixtures import qwen_vocab as qv  # noqa: E402

SEPARATOR = "</tool_response>"


# ---------------------------------------------------------------------------------------------------------------
# vocab-only GGUF
# ---------------------------------------------------------------------------------------------------------------

def write_vocab_gguf(path: Path, vocab: qv.Vocab) -> Path:
    """A qwen35 GGUF with hyperparameters (a small 8-layer shape) and the tokenizer, but no tensors."""
    import gguf
    w = gguf.GGUFWriter(str(path), "qwen35")
    arch = "qwen35"
    w.add_uint32(f"{arch}.block_count", 8)
    w.add_uint32(f"{arch}.context_length", 262144)
    w.add_uint32(f"{arch}.embedding_length", 256)
    w.add_uint32(f"{arch}.feed_forward_length", 512)
    w.add_uint32(f"{arch}.attention.head_count", 4)
    w.add_uint32(f"{arch}.attention.head_count_kv", 2)
    w.add_uint32(f"{arch}.attention.key_length", 64)
    w.add_uint32(f"{arch}.attention.value_length", 64)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{arch}.rope.freq_base", 1e7)
    w.add_uint32(f"{arch}.rope.dimension_count", 16)
    w.add_array(f"{arch}.rope.dimension_sections", [3, 3, 2, 0])
    w.add_uint32(f"{arch}.ssm.conv_kernel", 4)
    w.add_uint32(f"{arch}.ssm.state_size", 32)
    w.add_uint32(f"{arch}.ssm.group_count", 2)
    w.add_uint32(f"{arch}.ssm.time_step_rank", 4)
    w.add_uint32(f"{arch}.ssm.inner_size", 128)
    w.add_uint32(f"{arch}.full_attention_interval", 4)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_eos_token_id(vocab.eos_id)
    if vocab.pad_id is not None:
        w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------------------------
# corpus
# ---------------------------------------------------------------------------------------------------------------

PROSE = [
    "The quick brown fox jumps over the lazy dog.", "I've been told he's there; 'RE you sure? We'Ve a'lL",
    "Ça va? Où est la bibliothèque? L'été dernier, j'ai visité Montréal.", "Größe, Übermaß und Straße.",
    "¿Dónde está el baño? ¡Qué día tan bonito!", "Não sei, mas você pode perguntar à avó.",
    "нещо на Български. Съвсем обикновен текст.", "Привет, мир! Как дела? Ёлка и щука.",
    "Ελληνικά: Καλημέρα κόσμε, τι κάνεις;", "我想在apple工作1314151天～ 今天天气很好，我们去公园吧。",
    "日本語のテキスト：東京は大きな都市です。カタカナもひらがなも。", "안녕하세요, 세계! 한국어 문장입니다. 감사합니다.",
    "مرحبا بالعالم، كيف حالك؟ ١٢٣٤٥", "שלום עולם! מה שלומך היום?", "हिन्दी में एक वाक्य: क्षत्रिय और ज्ञान।",
    "ภาษาไทยเป็นภาษาที่สวยงาม", "កាន់តែពិសេសអាច", "Tiếng Việt có nhiều dấu: ắ ặ ẳ ẵ ờ ở ỡ.",
    "ქართული ენა", "Հայերեն լեզու", "አማርኛ ቋንቋ", "தமிழ் மொழி அழகானது", "ಕನ್ನಡ ಭಾಷೆ", "ᠮᠣᠩᠭᠣᠯ",
    "Türkçe: ışık, İstanbul, çiçek, ğüşö.", "Polski: zażółć gęślą jaźń.", "Čeština: příliš žluťoučký kůň.",
    "Zalgo: Z\u0335\u0321a\u0337\u0327l\u0336g\u0338o\u0334 t\u0301e\u0300x\u0302t",
    "Decomposed: A\u030a e\u0301 n\u0303 o\u0308 — composed: Å é ñ ö",
]
CODE = [
    "def f(x):\n    if x > 0:\n        return x * 2\n    return None\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "const x = {a: [1, 2, 3], 'b': \"c\"};\r\nconsole.log(x?.a ?? []);\r\n",
    "<div class=\"x\">&nbsp;<a href='/y?z=1&w=2'>link</a></div>",
    "{\"key\": [1.5e-3, -2, true, null], \"nested\": {\"k\": \"v\"}}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "    \t  mixed\t\tindent\n\t    here\n", "#!/bin/bash\nfor i in $(seq 1 10); do echo \"$i\"; done\n",
    "x = a+b*c/d-e%f**g//h; y = ~i & j | k ^ l << 2 >> 3",
]
EMOJI = [
    "🚀", "😶\u200d🌫️", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "👋🏽", "🦙", "✅", "❤️", "🇯🇵🇺🇸", "🧑🏿\u200d💻",
    "1️⃣", "©️", "🫠", "🤌🏻",
]
SPECIAL_TEXTS = [t for t in qv.QWEN35_ADDED_TOKENS if t != SEPARATOR]
PARTIAL_SPECIALS = ["<|im_end", "im_end|>", "<|", "|>", "<think", "think>", "</think", "<<|im_start|>>",
                    "<|im_start|><|im_start|>", "[PAD248100]", "<|endoftext|", "<tool_call", "<|im_end|>>"]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\u3000", "\xa0", "\x85", "\u2028", "\u2009",
              "\x1c", "\x1f", "\u200b", "\ufeff", "\u200d", "\u200e"]
DIGITS = ["0123456789", "١٢٣", "１２３", "²³", "Ⅻ", "৩", "3.14", "1,000", "0x1F"]
# Ranges for random mixtures, chosen to hit category edges: marks, format characters, private use, unassigned,
# and letters new in Unicode 16/17 (unassigned to llama.cpp's 15.1 tables).
RANDOM_RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1AB0, 0x1AFF), (0x1C80, 0x1C8F), (0x2000, 0x206F),
    (0x20A0, 0x20CF), (0x2100, 0x218F), (0x2190, 0x23FF), (0x3000, 0x30FF), (0x4E00, 0x4EFF), (0xA7C0, 0xA7FF),
    (0xAC00, 0xACFF), (0xE000, 0xE00F), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x10D40, 0x10D8F),
    (0x11380, 0x113FF), (0x13460, 0x1347F), (0x1D400, 0x1D4FF), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF),
    (0x20000, 0x2001F), (0x2EBF0, 0x2EC0F), (0x31350, 0x3136F), (0x323B0, 0x323CF), (0xE0001, 0xE007F),
]


def _random_char(rng: random.Random) -> str:
    lo, hi = rng.choice(RANDOM_RANGES)
    return chr(rng.randint(lo, hi))


def _pick(rng: random.Random, pool: list[str], k: int, sep: str = " ") -> str:
    return sep.join(rng.choice(pool) for _ in range(k))


def _mixture(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(2, 8)):
        kind = rng.randrange(7)
        if kind == 0:
            parts.append(rng.choice(PROSE))
        elif kind == 1:
            parts.append(rng.choice(CODE))
        elif kind == 2:
            parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))))
        elif kind == 3:
            parts.append(rng.choice(WHITESPACE) * rng.randint(1, 12))
        elif kind == 4:
            parts.append(rng.choice(DIGITS) * rng.randint(1, 4))
        elif kind == 5:
            parts.append(rng.choice(SPECIAL_TEXTS + PARTIAL_SPECIALS))
        else:
            parts.append("".join(_random_char(rng) for _ in range(rng.randint(1, 10))))
    return "".join(rng.choice(["", " ", "\n"]) + p for p in parts)


def _slices(rng: random.Random, text: str) -> str:
    a = rng.randrange(len(text))
    return text[a:a + rng.randint(1, 60)]


def corpus(n_random: int = 2200, seed: int = 20261130) -> list[str]:
    """Deterministic test strings: every fixed sample, slices of them, and random mixtures."""
    rng = random.Random(seed)
    fixed = PROSE + CODE + EMOJI + SPECIAL_TEXTS + PARTIAL_SPECIALS + WHITESPACE + DIGITS
    fixed += ["", " ", "a", "'s", "'S", "'ll", "'LL", "'Re", "x'd", "don't", "''", "' s"]
    fixed += [" " * n for n in (2, 3, 7, 16, 33)] + ["\n" * n for n in (2, 5)] + ["9" * n for n in (4, 17)]
    fixed += [w + s + "x" for w in WHITESPACE for s in ("", " ", "\n")]
    out = list(fixed)
    everything = "".join(PROSE + CODE)
    for _ in range(300):
        out.append(_slices(rng, everything))
    for _ in range(n_random):
        out.append(_mixture(rng))
    return [s.replace(SEPARATOR, "") for s in out]


# ---------------------------------------------------------------------------------------------------------------
# running llama-tokenize
# ---------------------------------------------------------------------------------------------------------------

def tokenize_all(binary: Path, gguf_path: Path, texts: list[str], parse_special: bool, sep_id: int) -> list[list[int]]:
    joined = SEPARATOR.join(texts)
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(joined.encode("utf-8"))
        prompt = f.name
    cmd = [str(binary), "-m", str(gguf_path), "-f", prompt, "--ids", "--log-disable", "--no-escape", "--no-bos"]
    if not parse_special:
        cmd.append("--no-parse-special")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    finally:
        os.unlink(prompt)
    ids = json.loads(res.stdout.strip().splitlines()[-1])
    return _split_ids(ids, sep_id, len(texts))


def _split_ids(ids: list[int], sep_id: int, n: int) -> list[list[int]]:
    groups: list[list[int]] = [[]]
    for i in ids:
        if i == sep_id:
            groups.append([])
        else:
            groups[-1].append(i)
    if len(groups) != n:
        raise RuntimeError(f"expected {n} strings between separators, got {len(groups)}")
    return groups


N_QWEN2 = 400  # the older `qwen2` pre-tokenizer (no \p{M}) is checked on the first strings of the corpus


def generate(bin_dir: Path, out: Path, oracle: oracles.Oracle) -> None:
    vocab = qv.load_qwen35_vocab()
    sep_id = vocab.tokens.index(SEPARATOR)
    texts = corpus()
    tool = bin_dir / "llama-tokenize"
    with tempfile.TemporaryDirectory() as tmp:
        gguf_path = write_vocab_gguf(Path(tmp) / "qwen35-vocab.gguf", vocab)
        on = tokenize_all(tool, gguf_path, texts, True, sep_id)
        off = tokenize_all(tool, gguf_path, texts, False, sep_id)
        qwen2_path = write_vocab_gguf(Path(tmp) / "qwen2-vocab.gguf", dataclasses.replace(vocab, pre="qwen2"))
        qwen2 = tokenize_all(tool, qwen2_path, texts[:N_QWEN2], True, sep_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open("w", encoding="utf-8") as f:
        for text, a, b in zip(texts, on, off):
            n += _write(f, oracle.stamp({"text": text, "parse_special": True, "ids": a}))
            if "<" in text or a != b:  # without special-looking text the two modes cannot differ; save space
                n += _write(f, oracle.stamp({"text": text, "parse_special": False, "ids": b}))
        for text, ids in zip(texts, qwen2):
            n += _write(f, oracle.stamp({"text": text, "parse_special": True, "ids": ids, "pre": "qwen2"}))
    print(f"wrote {n} goldens ({len(texts)} strings) to {out} ({out.stat().st_size / 1e6:.2f} MB)")


def _write(f, case: dict) -> int:
    f.write(json.dumps(case, ensure_ascii=False) + "\n")
    return 1


# ---------------------------------------------------------------------------------------------------------------
# Unicode table difference (llama.cpp's 15.1 tables vs the `regex` module)
# ---------------------------------------------------------------------------------------------------------------

def unicode_diff(tree: Path) -> list[tuple[int, int]]:
    """Ranges where llama.cpp's category is 'other' but `regex` says letter/number/mark."""
    import regex
    src = (tree / "src" / "unicode-data.cpp").read_text()
    body = src[src.index("unicode_ranges_flags"):]
    body = body[:body.index("};")]
    ranges = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}", body)]
    starts = [a for a, _ in ranges]
    lnm = regex.compile(r"[\p{L}\p{N}\p{M}]")
    out: list[tuple[int, int]] = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        flags = ranges[bisect.bisect_right(starts, cp) - 1][1]
        theirs = bool(flags & (0x2 | 0x4 | 0x10))  # NUMBER | LETTER | ACCENT_MARK
        if theirs != bool(lnm.match(chr(cp))):
            if theirs:
                raise RuntimeError(f"U+{cp:04X}: llama.cpp has it as L/N/M but regex does not; extend the remap")
            if out and out[-1][1] == cp - 1:
                out[-1] = (out[-1][0], cp)
            else:
                out.append((cp, cp))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    oracles.add_argument(ap)
    ap.add_argument("--bin", type=Path, help="default: the oracle's build")
    ap.add_argument("--out", type=Path, help="default: the oracle's tokenize.jsonl")
    ap.add_argument("--unicode-diff", action="store_true", help="print the remap table for llamacmp/tokenizer.py")
    ap.add_argument("--tree", type=Path, help="default: the oracle's tree")
    args = ap.parse_args()
    oracle = oracles.parse(args.oracle)
    if args.unicode_diff:
        for a, b in unicode_diff(args.tree or oracle.tree):
            print(f"(0x{a:X}, 0x{b:X}),")
        return
    generate(args.bin or oracle.bin, args.out or oracle.golden("tokenize.jsonl"), oracle)


if __name__ == "__main__":
    main()
