"""Training text: the CPython standard library sources of the running interpreter (PSF License) and a synthetic
long-context retrieval task (key -> value pairs hidden in filler text, recalled at the end).

The train / held-out split is by a hash of each file's path relative to Lib/, so it is the same on every machine
with the same Python version, whatever the file order on disk.
"""
from __future__ import annotations

import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

EOT = "<|endoftext|>"
HELDOUT_PERCENT = 3        # ~3% of files held out: enough for a perplexity slice, little lost for training
SKIP_DIRS = {"site-packages", "__pycache__", "idlelib", "lib2to3", "ensurepip", "config-3.11-x86_64-linux-gnu"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel_path: str) -> bool:
    return int(hashlib.sha1(rel_path.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every .py file under Lib/ except third-party packages and caches, in a fixed (sorted) order."""
    root = root or stdlib_root()
    files = [p for p in root.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):   # a few test files are deliberately not UTF-8
        return None


def corpus_texts(split: str, max_chars: int | None = None, root: Path | None = None) -> Iterator[str]:
    """Source files of one split ("train" or "heldout"), stopping once max_chars have been yielded."""
    root = root or stdlib_root()
    total = 0
    for path in stdlib_files(root):
        if is_heldout(path.relative_to(root).as_posix()) != (split == "heldout"):
            continue
        text = read_text(path)
        if not text:
            continue
        yield text
        total += len(text)
        if max_chars is not None and total >= max_chars:
            return


# --- synthetic retrieval ---------------------------------------------------------------------------------------

FILLER_WORDS = ("the river runs past a quiet town where people keep gardens and read old books by the window "
                "every morning a baker opens the shop and the smell of bread fills the narrow street while "
                "children walk to school and the clock on the tower strikes the hour").split()


@dataclass(frozen=True)
class RetrievalDoc:
    text: str          # the whole document, answer included (what the model trains on)
    prompt: str        # everything up to the answer
    answer: str


def _key(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(3))


def _filler_sentence(rng: random.Random) -> str:
    words = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(6, 14))]
    return " ".join(words).capitalize() + "."


def retrieval_doc(rng: random.Random, n_words: int, n_pairs: int = 4, n_questions: int = 1) -> RetrievalDoc:
    """~n_words of filler with n_pairs `key = value` facts at random places; the end asks for n_questions of them,
    each followed by its answer, and the document stops after the last answer.

    Several questions per document give the task several recall targets per long document (more training signal
    for the same tokens, and a worked example of the format before the scored last question). Filler words are
    common words, so n_words tracks the token count (~1.2 tokens a word with an 8K BPE)."""
    if not 1 <= n_questions <= n_pairs:
        raise ValueError(f"n_questions must be in 1..n_pairs ({n_pairs}), got {n_questions}")
    pairs = {}
    while len(pairs) < n_pairs:
        pairs[_key(rng)] = str(rng.randint(1000, 9999))
    sentences, count = [], 0
    while count < n_words:
        s = _filler_sentence(rng)
        sentences.append(s)
        count += len(s.split())
    for k, v in pairs.items():
        sentences.insert(rng.randrange(len(sentences) + 1), f"The code for {k} is {v}.")
    asked = [rng.choice(list(pairs))] if n_questions == 1 else rng.sample(list(pairs), n_questions)
    prompt = " ".join(sentences)
    for i, key in enumerate(asked):
        prompt += f"\nQuestion: what is the code for {key}?\nAnswer:"
        if i < len(asked) - 1:
            prompt += f" {pairs[key]}"
    answer = f" {pairs[asked[-1]]}"
    return RetrievalDoc(prompt + answer, prompt, answer)


def retrieval_docs(seed: int, lengths: tuple[int, int], count: int) -> list[RetrievalDoc]:
    """`count` documents with word counts drawn log-uniformly in `lengths` (so short and long both appear)."""
    import math
    rng = random.Random(seed)
    lo, hi = math.log(lengths[0]), math.log(lengths[1])
    return [retrieval_doc(rng, int(math.exp(rng.uniform(lo, hi)))) for _ in range(count)]
