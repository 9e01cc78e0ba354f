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
    # A CPU generator for every device (numbers drawn on the CPU, then moved): a CUDA model gets the same
    # perturbation as a CPU one, and torch.randn with a CPU generator cannot write CUDA tensors.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g).to(p.device))
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g).to(p.device) * 2)


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


def test_retrieval_curriculum_grows_and_batches_label_only_the_questions(tok):
    import random
    from dataclasses import replace
    from training import train
    p = replace(train.PRESETS["smoke"], batch=4, seq_len=256)
    ends = [train.retrieval_max_words(p, f) for f in (0.0, 0.3, train.CURRICULUM_END, 1.0)]
    assert ends[0] == p.retrieval_start_words and ends[0] < ends[1] < ends[2] == ends[3] == p.retrieval_words[1]
    shares = [train.retrieval_share(p, f) for f in (0.0, 0.25, train.SHARE_RAMP_END, 1.0)]
    assert shares[0] == p.retrieval_share[0] < shares[1] < shares[2] == shares[3] == p.retrieval_share[1]
    pad = tok.token_to_id(tokenizer.PAD_TOKEN)
    ids, labels, words = train.retrieval_batch(tok, p, random.Random(0), 0.0, pad)
    assert p.retrieval_words[0] <= words <= p.retrieval_start_words
    assert ids.shape[0] > 1 and ids.numel() <= 2 * p.batch * p.seq_len      # several documents packed
    for row, lab in zip(ids.tolist(), labels.tolist()):
        text = tok.decode([t for t in row if t != pad])
        target = tok.decode([t for t in lab if t != train.IGNORE])
        assert target.strip() == text[text.index("\nQuestion:"):].strip()     # only the Q/A tail is a target
        assert text.count("Question:") == p.retrieval_questions


def test_gdn_kernel_switch_on_cpu():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    from training.model import gdn_kernel, resolve_gdn_kernel
    assert resolve_gdn_kernel("auto", "cpu") == "torch" and resolve_gdn_kernel("torch", "cuda") == "torch"
    with pytest.raises(RuntimeError, match="needs CUDA"):
        resolve_gdn_kernel("fla", "cpu")
    bound = mq.torch_chunk_gated_delta_rule
    with gdn_kernel("torch"):
        assert mq.torch_chunk_gated_delta_rule.__name__ == "torch_chunk_gated_delta_rule"
    assert mq.torch_chunk_gated_delta_rule is bound


def _need_fla():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: fla's gated delta rule is a Triton kernel")
    from training.model import fla_chunk_rule
    if fla_chunk_rule() is None:
        pytest.skip("fla is not importable (pip install --no-deps --target /tmp/site .whl/fla/fla_core-0.6.0-*.whl)")


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


# fla runs its dots in TF32 (10-bit mantissa: ~5e-4 per product, chained over chunks), so fp32 inputs agree with
# transformers' fp32 reference to ~1e-3, not 1e-5: 1e-2 on values, 2e-2 on gradients.
@pytest.mark.cuda
@pytest.mark.parametrize("T", [1, 63, 64, 65, 257])
def test_fla_gated_delta_rule_matches_transformers_reference(T):
    _need_fla()
    import inspect
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    from training.model import fla_gated_delta_rule
    reference = inspect.unwrap(mq.torch_chunk_gated_delta_rule)
    g0 = torch.Generator(device="cuda").manual_seed(T)
    B, Hk, Hv, D = 2, 2, 4, 32
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g0)     # noqa: E731
    q, k, v = rnd(B, T, Hk, D), rnd(B, T, Hk, D), rnd(B, T, Hv, D)
    g = torch.nn.functional.logsigmoid(rnd(B, T, Hv) + 2)              # log decay <= 0, mostly near 0
    beta, h0 = torch.sigmoid(rnd(B, T, Hv)), 0.1 * rnd(B, Hv, D, D)
    w_out, w_state = rnd(B, T, Hv, D), rnd(B, Hv, D, D)
    results = []
    for fn, group in ((reference, True), (fla_gated_delta_rule, False)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
        qq, kk, vv, gg, bb, hh = leaves
        if group:      # transformers 5.17 repeats q/k heads before the call; fla must do the same by itself
            qq, kk = qq.repeat_interleave(Hv // Hk, dim=2), kk.repeat_interleave(Hv // Hk, dim=2)
        out, state = fn(qq, kk, vv, g=gg, beta=bb, initial_state=hh, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
        ((out * w_out).sum() + (state * w_state).sum()).backward()
        results.append((out.detach(), state.detach(), [x.grad for x in leaves]))
    (o_ref, s_ref, g_ref), (o_fla, s_fla, g_fla) = results
    assert o_fla.shape == o_ref.shape == (B, T, Hv, D) and o_fla.dtype == o_ref.dtype
    assert _rel(o_fla, o_ref) < 1e-2 and _rel(s_fla, s_ref) < 1e-2
    for name, a, b in zip("q k v g beta h0".split(), g_fla, g_ref):
        assert _rel(a, b) < 2e-2, name


@pytest.mark.cuda
def test_fla_kernel_trains_like_the_torch_reference(tok):
    """The tiny model's loss and every parameter's gradient are the same with either kernel (the next training
    run's first check: fla is what makes it fast)."""
    _need_fla()
    from training.model import gdn_kernel
    model = build_model(SIZES["test"], tok.get_vocab_size(), 0, 1, seed=3).cuda().float()
    randomize(model, 4)
    ids = torch.randint(0, tok.get_vocab_size(), (2, 150), generator=torch.Generator().manual_seed(5)).cuda()
    runs = {}
    for name in ("torch", "fla"):
        model.zero_grad(set_to_none=True)
        with gdn_kernel(name):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        runs[name] = (loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()})
    (l_ref, g_ref), (l_fla, g_fla) = runs["torch"], runs["fla"]
    assert abs(l_fla - l_ref) < 1e-3 * abs(l_ref)
    flat = [torch.cat([g.flatten() for g in grads.values()]) for grads in (g_fla, g_ref)]
    assert _rel(*flat) < 1e-2
    # A_log and dt_bias get sums of cancelling per-token terms: with exact fp32 dots (fla under Triton's CPU
    # interpreter) they already differed by 3e-4 where every other gradient agreed to ~1e-6, so TF32 moves them
    # most; 0.3 still catches a wrong sign, scale or head mapping (>= 1). Everything else: 5e-2.
    errors = {n: _rel(g_fla[n], g_ref[n]) for n in g_ref}
    bad = {n: e for n, e in errors.items() if e > (0.3 if n.endswith(("A_log", "dt_bias")) else 5e-2)}
    assert not bad, bad
