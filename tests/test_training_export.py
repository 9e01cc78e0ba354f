"""training/export.py: a random tiny Qwen3_5ForCausalLM exported to GGUF gives HF's logits in our numpy forward
(proves the converter transforms), and the exported tokenizer round-trips text like HF `tokenizers` does."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # training/ is a folder of the repo, not installed

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5")

from llamacmp.backends.base import StepBatch  # noqa: E402
from llamacmp.backends.numpy_ref import NumpyBackend  # noqa: E402
from llamacmp.loader import load_model  # noqa: E402
from training import corpus, export, tokenizer  # noqa: E402
from training.model import SIZES, build_model  # noqa: E402

SAMPLE = ("def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n"
          "class Point:\n    \"\"\"A point.\"\"\"\n    def __init__(self, x=0, y=0):\n        self.x, self.y = x, y\n")


@pytest.fixture(scope="module")
def tok():
    return tokenizer.train_tokenizer([SAMPLE * 3, corpus.retrieval_doc(__import__("random").Random(0), 200).text],
                                     vocab_size=384)


def randomize(model, seed: int) -> None:
    """Perturb every parameter (norms, A_log, dt_bias included) so no transform can hide behind a default init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2)


@pytest.mark.parametrize("tied", [False, True])
def test_export_matches_hf_logits(tmp_path, tok, tied):
    from dataclasses import replace
    vocab = tokenizer.gguf_vocab(tok)
    model = build_model(replace(SIZES["test"], tied=tied), len(vocab.tokens), vocab.eos_id, vocab.pad_id).eval()
    randomize(model, seed=1)
    path = export.write_gguf(tmp_path / "m.gguf", model, vocab, "f32")
    ids = tok.encode(SAMPLE).ids[:40]
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].double().numpy()
    lm = load_model(path, NumpyBackend())
    state = lm.backend.new_state(lm.cfg, len(ids), "f32")
    ours = lm.model.forward(StepBatch.build([(state, ids)], all_logits=True)).astype(np.float64)
    rel = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
    assert rel <= 1e-4, rel
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_q8_0_export_loads_and_is_close(tmp_path, tok):
    vocab = tokenizer.gguf_vocab(tok)
    model = build_model(SIZES["test"], len(vocab.tokens), vocab.eos_id, vocab.pad_id).eval()
    path = export.write_gguf(tmp_path / "m.gguf", model, vocab, "q8_0")
    lm = load_model(path, NumpyBackend())
    ids = tok.encode(SAMPLE).ids[:16]
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].double().numpy()
    state = lm.backend.new_state(lm.cfg, len(ids), "f32")
    ours = lm.model.forward(StepBatch.build([(state, ids)], all_logits=True)).astype(np.float64)
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 0.05


def test_exported_tokenizer_round_trips(tmp_path, tok):
    vocab = tokenizer.gguf_vocab(tok)
    model = build_model(SIZES["test"], len(vocab.tokens), vocab.eos_id, vocab.pad_id)
    lm = load_model(export.write_gguf(tmp_path / "m.gguf", model, vocab, "f32"), NumpyBackend())
    text = SAMPLE + "héllo wörld 12345 ✓ <think>x</think>\n\n\tend"
    ids = lm.tokenizer.encode(text, parse_special=True)
    assert ids == tok.encode(text).ids          # same ids as HF tokenizers (same regex, same merges)
    assert lm.tokenizer.decode(ids) == text
    assert lm.tokenizer.decode([vocab.eos_id]) == "<|im_end|>"
    assert lm.metadata["tokenizer.ggml.pre"] == "qwen35"


def test_corpus_split_is_disjoint_and_deterministic():
    files = corpus.stdlib_files()
    root = corpus.stdlib_root()
    held = {p for p in files if corpus.is_heldout(p.relative_to(root).as_posix())}
    assert files == corpus.stdlib_files()
    assert 0 < len(held) < 0.1 * len(files)
    assert not any("site-packages" in p.parts for p in files)


def test_retrieval_doc_asks_for_a_stated_fact():
    import random
    doc = corpus.retrieval_doc(random.Random(3), 300)
    key = doc.prompt.rsplit("code for ", 1)[1].split("?")[0]
    assert f"The code for {key} is{doc.answer}." in doc.prompt
    assert doc.text == doc.prompt + doc.answer and 250 < len(doc.prompt.split()) < 400


def test_retrieval_doc_with_several_questions_answers_each_from_its_fact():
    import random
    import re
    doc = corpus.retrieval_doc(random.Random(5), 200, n_pairs=8, n_questions=8)
    facts = dict(re.findall(r"The code for (\w+) is (\d{4})\.", doc.text))
    asked = re.findall(r"Question: what is the code for (\w+)\?\nAnswer: (\d{4})", doc.text)
    assert len(facts) == 8 and len({k for k, _ in asked}) == 8
    assert all(facts[k] == v for k, v in asked)
    assert doc.prompt.endswith("Answer:") and doc.answer == f" {asked[-1][1]}" and doc.text == doc.prompt + doc.answer


def test_lr_schedule_has_no_jump_when_the_time_budget_ends_the_warmup():
    from dataclasses import replace
    from training import train
    p = replace(train.PRESETS["full"], max_minutes=6.0)
    # slow steps (~2 s each): time, not the 150-step warmup, must end the warmup and drive the cosine
    rates = [train.lr_at(s, p, elapsed_s=2.0 * s) for s in range(183)]
    assert max(a - b for a, b in zip(rates, rates[1:])) < 0.05 * p.lr       # no sudden drop
    assert max(rates) > 0.95 * p.lr and rates[-1] < 0.15 * p.lr
    assert train.lr_at(10, replace(p, max_minutes=1e6)) == p.lr * 11 / p.warmup     # fast steps: by steps
