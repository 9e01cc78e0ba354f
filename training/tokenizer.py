"""A compact byte-level BPE in Qwen3.5's form, trained with HF `tokenizers`, and its GGUF tokenizer fields.

Pre-tokenization is Qwen3.5's own regex (the one llama.cpp selects for tokenizer.ggml.pre = "qwen35") followed
by GPT-2's byte -> unicode mapping, so the GGUF arrays have exactly the shape of a converted Qwen3.5 vocabulary
and llama.cpp, our tokenizer and HF `tokenizers` split text the same way.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from llamacmp.fixtures.qwen_vocab import CONTROL, NORMAL, USER_DEFINED, Vocab
from llamacmp.tokenizer import QWEN35_PATTERN

# Qwen3.5's added tokens that a chat model uses; appended after the BPE vocabulary, as in Qwen's own layout.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<think>", "</think>", "<|fim_prefix|>",
                  "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|file_sep|>")
# Like the Qwen3.5 converter: these are matched in plain text (USER_DEFINED), the <|...|> ones are CONTROL.
USER_DEFINED_TOKENS = frozenset({"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                                 "<think>", "</think>"})
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|endoftext|>"


def new_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """BPE over all 256 bytes; vocab_size counts the special tokens too."""
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def gguf_vocab(tok: Tokenizer) -> Vocab:
    """tokenizer.ggml.{tokens,merges,token_type} in id order, merges as 'a b' strings as GGUF stores them."""
    model = json.loads(tok.to_str())["model"]
    by_id = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    tokens = [by_id[i] for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [_token_type(t) for t in tokens]
    return Vocab(tokens=tokens, merges=merges, token_types=types, eos_id=tokens.index(EOS_TOKEN),
                 pad_id=tokens.index(PAD_TOKEN))


def from_vocab(v: Vocab) -> Tokenizer:
    """The inverse of gguf_vocab: a `tokenizers` Tokenizer from a GGUF's arrays (a file whose tokenizer.json is
    gone). The special tokens must follow the BPE entries, as train_tokenizer lays them out."""
    n_bpe = len(v.tokens) - len(SPECIAL_TOKENS)
    if tuple(v.tokens[n_bpe:]) != SPECIAL_TOKENS:
        raise ValueError(f"the vocabulary does not end with training/tokenizer.py's special tokens {SPECIAL_TOKENS}")
    tok = new_tokenizer()
    tok.model = models.BPE(vocab={t: i for i, t in enumerate(v.tokens[:n_bpe])},
                           merges=[tuple(m.split(" ")) for m in v.merges])
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def _token_type(token: str) -> int:
    if token in USER_DEFINED_TOKENS:
        return USER_DEFINED
    return CONTROL if token in SPECIAL_TOKENS else NORMAL


def load(path: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))
