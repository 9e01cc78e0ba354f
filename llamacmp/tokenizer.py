"""Byte-level BPE tokenizer with llama.cpp's exact behaviour for `tokenizer.ggml.model = "gpt2"` vocabularies.

Text -> ids, the way llama.cpp @49bfddeca does it (src/llama-vocab.cpp, src/unicode.cpp):
  1. special-token partition: each special token, longest text first, cuts every raw fragment at each of its
     occurrences; CONTROL tokens only when parse_special, USER_DEFINED tokens always;
  2. the pre-tokenizer regex (`qwen35` / `qwen2`) splits each raw fragment into words;
  3. each word's UTF-8 bytes go through GPT-2's byte->unicode table and are merged by merge rank.

Why not a `tokenizers.Tokenizer` pipeline: measured here, it is 2-4x too slow (0.5 MB/s on one string, the onig
regex dominates), its added-token matching differs from llama.cpp's partition (USER_DEFINED tokens still split
when parse_special is off), and its Unicode tables are newer than llama.cpp's. We keep `tokenizers` for what it is
good at: the BPE merge loop itself (`tokenizers.models.BPE`, called once per distinct word).

Why the built model is not cached on disk: measured on the 248K-token vocabulary (CPU time, best of 3), building
it from the GGUF's lists takes ~0.9 s, and reading it back from the library's own files (`BPE.save` ->
`BPE.from_file`) ~1.0 s, from its JSON (`Tokenizer.from_str`) longer still: the library rebuilds the same maps
either way, so a cache would cost disk and buy nothing.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from itertools import chain
from typing import Iterable, Sequence

import regex
from tokenizers.models import BPE

# GGUF token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# The upstream patterns (HF tokenizer.json), as documented; llama.cpp runs an ASCII-rewritten form of them.
QWEN35_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
                  r"|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PATTERNS = {"qwen35": QWEN35_PATTERN, "qwen2": QWEN2_PATTERN}

# llama.cpp runs these patterns through std::regex, where `\s` is only the C-locale ASCII set; every non-ASCII
# codepoint in its whitespace table is first collapsed to \v. The net effect is this explicit set. It happens to
# equal the `regex` module's \s (Unicode White_Space) today, but not stdlib re's (which adds \x1c-\x1f), so we
# spell it out rather than depend on a library's Unicode tables.
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

# Codepoints that llama.cpp's Unicode 15.1 tables call unassigned (so neither letter, number nor mark) but that
# the `regex` module, on a newer Unicode, puts in \p{L}/\p{N}/\p{M}. They are remapped to a private-use character
# before splitting. Derived by compat/gen_tokenize_goldens.py --unicode-diff from llama.cpp's src/unicode-data.cpp.
_UNASSIGNED_IN_LLAMACPP = (
    (0x88F, 0x88F), (0x897, 0x897), (0xC5C, 0xC5C), (0xCDC, 0xCDC), (0x1ACF, 0x1ADD), (0x1AE0, 0x1AEB),
    (0x1C89, 0x1C8A), (0xA7CB, 0xA7CF), (0xA7D2, 0xA7D2), (0xA7D4, 0xA7D4), (0xA7DA, 0xA7DC), (0xA7F1, 0xA7F1),
    (0x105C0, 0x105F3), (0x10940, 0x10959), (0x10D40, 0x10D65), (0x10D69, 0x10D6D), (0x10D6F, 0x10D85),
    (0x10EC2, 0x10EC7), (0x10EFA, 0x10EFC), (0x11380, 0x11389), (0x1138B, 0x1138B), (0x1138E, 0x1138E),
    (0x11390, 0x113B5), (0x113B7, 0x113C0), (0x113C2, 0x113C2), (0x113C5, 0x113C5), (0x113C7, 0x113CA),
    (0x113CC, 0x113D3), (0x113E1, 0x113E2), (0x116D0, 0x116E3), (0x11B60, 0x11B67), (0x11BC0, 0x11BE0),
    (0x11BF0, 0x11BF9), (0x11DB0, 0x11DDB), (0x11DE0, 0x11DE9), (0x11F5A, 0x11F5A), (0x13460, 0x143FA),
    (0x16100, 0x16139), (0x16D40, 0x16D6C), (0x16D70, 0x16D79), (0x16EA0, 0x16EB8), (0x16EBB, 0x16ED3),
    (0x16FF2, 0x16FF6), (0x187F8, 0x187FF), (0x18CFF, 0x18CFF), (0x18D09, 0x18D1E), (0x18D80, 0x18DF2),
    (0x1CCF0, 0x1CCF9), (0x1E5D0, 0x1E5FA), (0x1E6C0, 0x1E6DE), (0x1E6E0, 0x1E6F5), (0x1E6FE, 0x1E6FF),
    (0x2B73A, 0x2B73F), (0x2CEA2, 0x2CEAD), (0x323B0, 0x33479),
)
_FIRST_UNASSIGNED = chr(_UNASSIGNED_IN_LLAMACPP[0][0])
_UNASSIGNED_PROXY = "\ue000"  # private use: "other" for both engines

# llama.cpp's end-of-generation rule for these vocabularies: tokens matched by text (llama-vocab.cpp, "maintain
# a list of tokens that cause end-of-generation"), plus the first FIM pad / repo / file-separator token found.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>",
})
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
# Texts llama.cpp recognises as EOT/FIM tokens and forces to CONTROL even when the GGUF says otherwise.
_FORCED_CONTROL_TEXTS = _EOG_TEXTS | {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", *_FIM_PAD_TEXTS, *_FIM_REP_TEXTS, *_FIM_SEP_TEXTS,
}


def _byte_tables() -> tuple[str, dict[int, int]]:
    """GPT-2 byte->unicode table as a str.translate table over latin-1 text, and its inverse."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    to_char = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in to_char:
            to_char[b] = 256 + extra
            extra += 1
    forward = "".join(chr(to_char[b]) for b in range(256))
    inverse = {cp: b for b, cp in to_char.items()}
    return forward, inverse


_BYTE_TO_CHAR, _CHAR_TO_BYTE = _byte_tables()


def _lone_surrogates(e: UnicodeEncodeError) -> tuple[bytes, int]:
    """Text -> UTF-8 for the BPE. U+DC80..U+DCFF is a raw byte (Python's surrogateescape: how a `-p "\\xHH"`
    escape of a byte that forms no character arrives, arg_values.process_escapes); any other lone surrogate
    (possible in JSON input) becomes its 3 bytes, as llama.cpp would also see them."""
    out = b"".join(bytes([ord(c) - 0xDC00]) if 0xDC80 <= ord(c) <= 0xDCFF else c.encode("utf-8", "surrogatepass")
                   for c in e.object[e.start:e.end])
    return out, e.end


codecs.register_error("llamacmp-bytes", _lone_surrogates)


def llamacpp_split_pattern(pre: str) -> regex.Pattern:
    """The pre-tokenizer regex with llama.cpp's whitespace semantics."""
    if pre not in PATTERNS:
        raise ValueError(f"tokenizer.ggml.pre = {pre!r} is not supported (expected one of {sorted(PATTERNS)})")
    ws = _WS
    pattern = (PATTERNS[pre].replace(r"[^\s", "[^" + ws).replace(r"\s*", f"[{ws}]*")
               .replace(r"(?!\S)", f"(?![^{ws}])").replace(r"\s+", f"[{ws}]+"))
    return regex.compile(pattern)


class PreTokenizer:
    """Splits raw text into words exactly where llama.cpp's unicode_regex_split does."""

    def __init__(self, pre: str):
        self._pattern = llamacpp_split_pattern(pre)
        ranges = "".join(f"{chr(a)}-{chr(b)}" for a, b in _UNASSIGNED_IN_LLAMACPP)
        # stdlib re: ~1.6x faster than `regex` for this one character-class scan
        self._unassigned = re.compile(f"[{ranges}]")
        self._proxy_table: dict[int, str] | None = None

    def split(self, text: str) -> list[str]:
        if not text or max(text) < _FIRST_UNASSIGNED or not self._unassigned.search(text):
            return self._pattern.findall(text)
        # The proxy text has one character per codepoint, so piece lengths carry over to the original.
        words, pos = [], 0
        for piece in self._pattern.findall(text.translate(self._proxy())):
            words.append(text[pos:pos + len(piece)])
            pos += len(piece)
        return words

    def _proxy(self) -> dict[int, str]:
        if self._proxy_table is None:
            self._proxy_table = {cp: _UNASSIGNED_PROXY for a, b in _UNASSIGNED_IN_LLAMACPP for cp in range(a, b + 1)}
        return self._proxy_table


class _WordBPE:
    """Merge-rank BPE of one byte-level word, memoised: natural text repeats its words a lot."""

    _CACHE_LIMIT = 200_000

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]):
        self._model = BPE(vocab=vocab, merges=merges, ignore_merges=False)
        self._cache: dict[str, list[int]] = {}

    def encode_words(self, words: list[str]) -> list[int]:
        # Deduplicate first, then flatten with C-level iteration: per-word Python calls would dominate.
        # The per-call dict keeps this safe when several threads share the tokenizer (one may clear the cache).
        cache = self._cache
        local = {w: cache.get(w) for w in set(words)}
        missing = [w for w, ids in local.items() if ids is None]
        if missing:
            if len(cache) + len(missing) > self._CACHE_LIMIT:
                cache.clear()
            for w in missing:
                local[w] = cache[w] = self._word_ids(w)
        return list(chain.from_iterable(map(local.__getitem__, words)))

    def _word_ids(self, word: str) -> list[int]:
        encoded = word.encode("utf-8", "llamacmp-bytes").decode("latin-1").translate(_BYTE_TO_CHAR)
        return [t.id for t in self._model.tokenize(encoded)]


@dataclass(frozen=True)
class _Special:
    id: int
    text: str
    is_control: bool  # CONTROL/UNKNOWN: matched only with parse_special; USER_DEFINED: always


class Tokenizer:
    """llama.cpp-compatible tokenizer for byte-level BPE (`gpt2`) GGUF vocabularies."""

    def __init__(self, tokens: list[str], merges: list[str], token_types: list[int], pre: str,
                 eos_id: int, bos_id: int | None, add_bos: bool):
        if len(tokens) != len(token_types):
            raise ValueError(f"tokenizer.ggml.tokens has {len(tokens)} entries but token_type has {len(token_types)}")
        self.tokens = tokens
        self.pre = pre
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.add_bos = add_bos
        self.n_vocab = len(tokens)
        self._types = _effective_types(tokens, token_types)
        self._pretok = PreTokenizer(pre)
        self._bpe = _WordBPE(_bpe_vocab(tokens, self._types), _parse_merges(merges))
        self._specials = _special_tokens(tokens, self._types)
        self._special_probe = {ps: _probe(self._specials, ps) for ps in (False, True)}
        # filled lazily, one table per `special` setting; list indexing keeps decode at C speed
        self._pieces: dict[bool, list[bytes | None]] = {True: [None] * self.n_vocab, False: [None] * self.n_vocab}
        self.eog_ids = _eog_ids(tokens, eos_id)

    @classmethod
    def from_metadata(cls, tokens: list[str], merges: list[str], token_types: list[int], pre: str,
                      eos_id: int, bos_id: int | None = None, add_bos: bool = False,
                      model: str = "gpt2") -> "Tokenizer":
        """Build from the tokenizer.ggml.* arrays of a GGUF (as plain Python lists)."""
        if model != "gpt2":
            raise ValueError(f"tokenizer.ggml.model = {model!r} is not supported (only 'gpt2' byte-level BPE)")
        return cls(tokens, merges, token_types, pre, eos_id, bos_id, add_bos)

    # -- encoding -------------------------------------------------------------------------------------------

    def encode(self, text: str, parse_special: bool = False, add_special: bool = False) -> list[int]:
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
            else:
                out.extend(self._bpe.encode_words(self._pretok.split(frag)))
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """llama.cpp's tokenizer_st_partition: raw-text fragments (str) and special-token ids (int)."""
        probe = self._special_probe[parse_special]
        if probe is None or not probe.search(text):
            return [text] if text else []
        frags: list[str | int] = [text]
        for sp in self._specials:
            if sp.is_control and not parse_special:
                continue
            frags = _cut_all(frags, sp)
        return [f for f in frags if f != ""]

    # -- decoding -------------------------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes llama_token_to_piece writes (lstrip 0). `special=False` hides CONTROL/UNKNOWN tokens."""
        if not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id {token_id} is out of range [0, {self.n_vocab})")
        table = self._pieces[bool(special)]
        piece = table[token_id]
        if piece is None:
            piece = table[token_id] = self._piece(token_id, special)
        return piece

    def _piece(self, token_id: int, special: bool) -> bytes:
        kind = self._types[token_id]
        text = self.tokens[token_id]
        if kind in (CONTROL, UNKNOWN):
            return text.encode("utf-8") if special else b""
        if kind == USER_DEFINED:
            return text.encode("utf-8")
        if kind == NORMAL:
            return _byte_level_decode(text)
        return b""  # UNUSED ([PAD<id>]) and BYTE tokens print nothing for BPE vocabularies

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """Concatenated pieces, invalid UTF-8 replaced by U+FFFD."""
        ids = ids if isinstance(ids, list) else list(ids)
        table, piece = self._pieces[bool(special)], self.token_to_piece
        try:
            parts = [table[i] if i >= 0 and table[i] is not None else piece(i, special) for i in ids]
        except IndexError:
            parts = [piece(i, special) for i in ids]  # raises the out-of-range error with the id in it
        return b"".join(parts).decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, special)

    # -- token classes --------------------------------------------------------------------------------------

    def is_special(self, token_id: int) -> bool:
        """True for tokens llama.cpp keeps in its special-token cache (CONTROL, USER_DEFINED, UNKNOWN)."""
        return self._types[token_id] in (CONTROL, USER_DEFINED, UNKNOWN)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def token_type(self, token_id: int) -> int:
        return self._types[token_id]


class StreamDecoder:
    """Incremental detokenizer: push ids, get text; a UTF-8 character split across tokens is held back."""

    def __init__(self, tokenizer: Tokenizer, special: bool = True):
        self._tok = tokenizer
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.token_to_piece(token_id, self._special))

    def flush(self) -> str:
        """Whatever is still held (an incomplete character at the end becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)


# ---------------------------------------------------------------------------------------------------------------
# construction helpers
# ---------------------------------------------------------------------------------------------------------------

def _effective_types(tokens: Sequence[str], types: Sequence[int]) -> list[int]:
    """GGUF types, with llama.cpp's override: EOT/FIM-looking tokens become CONTROL whatever the file says."""
    out = list(types)
    for i, text in enumerate(tokens):
        if text in _FORCED_CONTROL_TEXTS and out[i] != CONTROL:
            out[i] = CONTROL
    return out


def _bpe_vocab(tokens: Sequence[str], types: Sequence[int]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, kind in enumerate(types):
        if kind == NORMAL:
            vocab[tokens[i]] = i  # the last id wins for duplicate texts, as in llama.cpp's token_to_id
    return vocab


def _parse_merges(merges: Sequence[str]) -> list[tuple[str, str]]:
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bad = next((m for m, p in zip(merges, pairs) if len(p) != 2), None)
    if bad is not None:
        raise ValueError(f"tokenizer.ggml.merges entry {bad!r} is not 'left right'")
    return pairs  # type: ignore[return-value]


def _special_tokens(tokens: Sequence[str], types: Sequence[int]) -> list[_Special]:
    specials = [_Special(i, tokens[i], types[i] != USER_DEFINED)
                for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED, UNKNOWN) and tokens[i]]
    # longest text first; equal lengths keep id order (llama.cpp's sort is unstable there; no Qwen token cares)
    specials.sort(key=lambda s: -len(s.text.encode("utf-8")))
    return specials


def _probe(specials: list[_Special], parse_special: bool) -> regex.Pattern | None:
    """One alternation over the special texts in play: most inputs contain none, and then we skip the partition."""
    texts = [s.text for s in specials if parse_special or not s.is_control]
    return regex.compile("|".join(regex.escape(t) for t in texts)) if texts else None


def _cut_all(frags: list[str | int], sp: _Special) -> list[str | int]:
    out: list[str | int] = []
    for frag in frags:
        if isinstance(frag, int) or sp.text not in frag:
            out.append(frag)
            continue
        parts = frag.split(sp.text)  # leftmost, non-overlapping: the same cuts as llama.cpp's repeated find()
        for k, part in enumerate(parts):
            if k:
                out.append(sp.id)
            if part:
                out.append(part)
    return out


def _byte_level_decode(text: str) -> bytes:
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ord(ch))
        if b is None:
            # llama.cpp's llama_decode_text marks characters outside the byte table this way
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
        else:
            out.append(b)
    return bytes(out)


def _eog_ids(tokens: Sequence[str], eos_id: int | None) -> frozenset[int]:
    wanted = _EOG_TEXTS.union(_FIM_PAD_TEXTS, _FIM_REP_TEXTS, _FIM_SEP_TEXTS)
    by_text: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in wanted:
            by_text[t] = i  # the last id wins for duplicate texts, as in llama.cpp's token_to_id
    eog = {i for t, i in by_text.items() if t in _EOG_TEXTS}
    for texts in (_FIM_PAD_TEXTS, _FIM_REP_TEXTS, _FIM_SEP_TEXTS):
        ids = [by_text[t] for t in texts if t in by_text]
        if ids:
            # llama.cpp keeps the first match in hash-map order (unspecified); real vocabularies have one of each
            eog.add(min(ids))
    if eos_id is not None and 0 <= eos_id < len(tokens):
        eog.add(eos_id)
    return frozenset(eog)
