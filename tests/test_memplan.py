"""Device memory plan: the real 9B arithmetic (262144 context on a 16 GiB card), fixture files, the refusal text,
the option; and on a GPU, the plan against what the arena really takes."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp import kv_quant, memplan
from llamacmp.args import parse_args
from llamacmp.fixtures.writer import shape_model
from llamacmp.gguf_file import GGUFFile

GIB, MIB = memplan.GIB, memplan.MIB


@pytest.fixture(scope="module")
def nine_b():
    return shape_model("9b", 248320)


def test_9b_shape_arithmetic(nine_b):
    tensors, cfg = nine_b
    assert (len(cfg.attn_layers), len(cfg.gdn_layers), cfg.n_head_kv, cfg.head_dim) == (8, 24, 4, 256)
    # weights: the Q8_0 file's 8.86 GiB of tensor data (34 bytes per 32 values) as int8 + f16 scales
    q8_values = sum(int(np.prod(t.shape)) for t in tensors if t.type_name == "Q8_0")
    f32_values = sum(int(np.prod(t.shape)) for t in tensors if t.type_name != "Q8_0")
    data = memplan.weight_bytes(tensors) - memplan.STAGING_PIECE
    assert data - (q8_values * 34 // 32 + f32_values * 4) < 256 * len(tensors) * 2
    assert 8.85 < data / GIB < 8.88
    # KV per token over the 8 attention layers: f16 32 KiB, tq3 0.195x of it
    per_tok = {t: memplan.kv_bytes(cfg, 1024, t, t) // 1024 for t in ("f16", "q8_0", "q4_0", "tq3")}
    assert per_tok == {"f16": 8 * 4 * 256 * 2 * 2, "q8_0": 8 * 4 * 8 * 34 * 2, "q4_0": 8 * 4 * 8 * 18 * 2,
                       "tq3": 8 * 4 * 2 * 50 * 2}
    assert per_tok["tq3"] / per_tok["f16"] <= 0.21
    # GDN state per slot: 24 x (3 x 8192 conv + 32 x 128 x 128 state) f32
    assert memplan.gdn_state_bytes(cfg) == 24 * (3 * 8192 * 4 + 32 * 128 * 128 * 4)


@pytest.mark.parametrize("k, v, fits", [("tq3", "tq3", True), ("q8_0", "tq3", True), ("q8_0", "q8_0", True),
                                         ("f16", "f16", False)])
def test_9b_full_context_under_16_gib(nine_b, k, v, fits):
    tensors, cfg = nine_b
    p = memplan.plan(tensors, cfg, 262144, 1, k, v, 512, cap=16 * GIB)
    per_tok = 8 * (kv_quant.cache_bytes(k, 1, 4, 256) + kv_quant.cache_bytes(v, 1, 4, 256))
    assert p.item("KV cache").nbytes == 262144 * per_tok
    assert len(p.lines()) == len(p.items) + 1 and all(line.startswith("memory plan: ") for line in p.lines())
    if fits:
        memplan.check(p)
        assert p.total < 16 * GIB
    else:
        with pytest.raises(memplan.PlanError) as e:
            memplan.check(p)
        text = str(e.value)
        for must in ("-c", "-ctk q8_0 -ctv tq3", "-np", "-ub", "KV cache 8.00 GiB", "--device-mem-cap"):
            assert must in text, must
    if (k, v) == ("tq3", "tq3"):        # the configuration, with room for the CUDA context on a 16 GB card
        assert p.total < 11.5 * GIB


def test_plan_items_follow_slots_ubatch_logits_and_sparse(nine_b):
    tensors, cfg = nine_b
    base = memplan.plan(tensors, cfg, 8192, 1, "f16", "f16", 512)
    two = memplan.plan(tensors, cfg, 8192, 2, "f16", "f16", 512)
    assert two.item("KV cache").nbytes == 2 * base.item("KV cache").nbytes
    assert two.item("GDN state").nbytes == 2 * base.item("GDN state").nbytes
    assert memplan.plan(tensors, cfg, 8192, 1, "f16", "f16", 2048).item("activations").nbytes > \
        3 * base.item("activations").nbytes
    ppl = memplan.plan(tensors, cfg, 8192, 1, "f16", "f16", 512, all_logits=True)
    assert ppl.item("logits").nbytes >= 512 * 248320 * 4
    from llamacmp.sparse_attn import SparseConfig
    sp = memplan.plan(tensors, cfg, 8192, 1, "f16", "f16", 512, sparse=SparseConfig())
    assert sp.item("scratch").nbytes > base.item("scratch").nbytes
    assert base.cap is None
    memplan.check(base)                  # no cap: nothing to refuse


def test_fixture_file_plan_matches_its_tensors(fixture_gguf):
    f = GGUFFile(fixture_gguf("small", "q8_0"))
    tensors = memplan.tensors_of(f)
    from llamacmp.config import ModelConfig
    cfg = ModelConfig.from_metadata(f.metadata, n_vocab=f.info("token_embd.weight").shape[0],
                                    tied=not f.has("output.weight"))
    ordered = memplan.upload_order(tensors, cfg)
    assert sorted(t.name for t in ordered) == sorted(t.name for t in tensors)
    assert ordered[0].name == "token_embd.weight"
    q8 = [t for t in tensors if t.type_name == "Q8_0"]
    assert q8, "the q8_0 fixture has Q8_0 matrices"
    expect = sum(memplan.exact(t.shape[0] * t.shape[1]) + memplan.exact(t.shape[0] * t.shape[1] // 32 * 2)
                 for t in q8) + sum(memplan.exact(int(np.prod(t.shape)) * 4) for t in tensors if t not in q8)
    assert memplan.weight_bytes(tensors) == expect + memplan.STAGING_PIECE
    p = memplan.plan(ordered, cfg, 4096, 1, "q8_0", "tq3", 64)
    assert p.item("KV cache").nbytes == len(cfg.attn_layers) * (
        memplan.exact(kv_quant.cache_bytes("q8_0", 4096, cfg.n_head_kv, cfg.head_dim))
        + memplan.exact(kv_quant.cache_bytes("tq3", 4096, cfg.n_head_kv, cfg.head_dim)))


def test_cache_bytes_match_kv_quant_bytes_per_value():
    for t in kv_quant.KV_TYPES:
        assert kv_quant.cache_bytes(t, 10, 4, 256) == pytest.approx(10 * 4 * 256 * kv_quant.BYTES_PER_VALUE[t])
    with pytest.raises(ValueError, match="q8_0"):
        kv_quant.cache_bytes("q8_0", 1, 1, 48)


def test_device_mem_cap_option():
    p = parse_args("cli", ["--device-mem-cap", "15.5"]).params
    assert p.device_mem_cap == int(15.5 * GIB)
    assert parse_args("server", ["--device-mem-cap", "15000MiB"]).params.device_mem_cap == 15000 * MIB
    assert parse_args("perplexity", ["--device-mem-cap", "16G"]).params.device_mem_cap == 16 * GIB
    assert parse_args("cli", []).params.device_mem_cap == 0
    from llamacmp.arg_values import ArgError
    with pytest.raises(ArgError, match="--device-mem-cap"):
        parse_args("cli", ["--device-mem-cap", "-1"])


@pytest.mark.cuda
def test_plan_matches_the_arena_on_the_gpu(fixture_gguf, cuda_backend):
    """The long-lived part the plan reserves is what loading and one context really take (on a fresh arena)."""
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.loader import load_model
    path = fixture_gguf("small", "q8_0")
    from llamacmp.loader import open_model
    from llamacmp.run_plan import plan_run
    params = parse_args("completion", ["-c", "4096", "-ctk", "f16", "-ctv", "f16"]).params
    be = CudaBackend(arena_bytes=2 * GIB)
    try:
        mf = open_model(path)
        p = memplan.prepare_device(be, mf, plan_run(params, mf.cfg.n_ctx_train))
        lm = load_model(mf, be)
        state = be.new_state(lm.cfg, 4096, "f16", "f16")
        assert be.arena.reserved == p.persistent                  # one piece, nothing more yet
        # packed exactly up to alignment; the upload staging block is back on its free list once the weights are in.
        # The plan pads every tensor to 256 bytes; matrices uploaded together (upload_matrices: one after another,
        # so the GEMM takes them in one launch) share their pads, so the plan may exceed use by < 256 B a tensor.
        slack = (p.persistent - memplan.STAGING_PIECE) - be.arena.in_use
        assert 0 <= slack < 256 * 2 * len(mf.gguf.names()), slack   # two allocations a Q8_0 tensor: codes, scales
        del state
    finally:
        be.arena.close()


def test_cache_bytes_match_the_cuda_cache_layout():
    """The plan's KV bytes are the CUDA caches' row bytes (llamacmp/kv_layout.py, = cmp_kv_row_bytes)."""
    kv_layout = pytest.importorskip("llamacmp.kv_layout", reason="the quantized-KV layout module is not in yet")
    for t in ("q8_0", "q4_0", "tq3"):
        for dh in (64, 128, 256):
            assert kv_quant.cache_bytes(t, 1, 1, dh) == kv_layout.row_bytes(t, dh), (t, dh)


def test_every_loaded_block_type_counts_its_stored_bytes(tmp_path):
    """A file mixing types: each tensor's plan bytes are its data bytes in the file (256-aligned), F16 widened."""
    import gguf
    from llamacmp.fixtures.quant_blocks import random_blocks
    from llamacmp.gguf_file import QUANT_BLOCKS
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(tmp_path / "mix.gguf"), "qwen35")
    for i, t in enumerate(QUANT_BLOCKS):
        b = random_blocks(t, 4, 512, rng).blocks
        w.add_tensor(f"blk.{i}.ffn_up.weight", b.reshape(4, -1), raw_dtype=gguf.GGMLQuantizationType[t])
    w.add_tensor("output_norm.weight", np.zeros((8, 512), np.float16))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    tensors = memplan.tensors_of(GGUFFile(tmp_path / "mix.gguf"))
    assert {t.type_name for t in tensors} == set(QUANT_BLOCKS) | {"F16"}
    stored = {t.name: memplan.tensor_bytes(t) for t in tensors}
    for i, t in enumerate(QUANT_BLOCKS):
        values, nbytes = QUANT_BLOCKS[t]
        assert stored[f"blk.{i}.ffn_up.weight"] == memplan.exact(4 * 512 // values * nbytes)
    assert stored["output_norm.weight"] == 8 * 512 * 4
    assert memplan.weight_bytes(tensors) == sum(stored.values()) + memplan.STAGING_PIECE
    with pytest.raises(ValueError, match="'x' has type TQ1_0"):
        memplan.tensor_bytes(memplan.TensorDesc("x", "TQ1_0", (4, 256)))


def test_type_mix_changes_the_weights_and_the_detail_names_it(nine_b):
    tensors, cfg = nine_b
    mix = {t.name: "Q4_K" for t in tensors if t.type_name == "Q8_0"}
    q4k, _ = shape_model("9b", 248320, types=mix)
    p8, p4 = (memplan.plan(ts, cfg, 4096) for ts in (tensors, q4k))
    ratio = (p4.item("weights").nbytes - memplan.STAGING_PIECE) / (p8.item("weights").nbytes - memplan.STAGING_PIECE)
    assert 0.52 < ratio < 0.56                    # 144/256 vs 34/32 bytes a value, the F32 vectors aside
    assert "Q4_K" in p4.item("weights").detail and "Q8_0" not in p4.item("weights").detail


def test_split_parts_share_the_model(nine_b):
    tensors, cfg = nine_b
    parts = memplan.split_parts(tensors, cfg, [1, 1])
    assert [p.layers.start for p in parts] == [0, parts[0].layers.stop] and parts[1].layers.stop == cfg.n_layer
    assert (parts[0].embed, parts[0].head, parts[1].embed, parts[1].head) == (True, False, False, True)
    whole = memplan.plan(tensors, cfg, 65536, k_type="q8_0", v_type="q8_0")
    halves = [memplan.plan(tensors, cfg, 65536, k_type="q8_0", v_type="q8_0", part=p) for p in parts]
    staging = memplan.STAGING_PIECE
    assert sum(h.item("weights").nbytes - staging for h in halves) == whole.item("weights").nbytes - staging
    for item in ("KV cache", "GDN state"):
        assert sum(h.item(item).nbytes for h in halves) == whole.item(item).nbytes
    assert halves[0].item("logits").nbytes == 0 and halves[1].item("logits").nbytes == whole.item("logits").nbytes
    assert abs(halves[0].total - halves[1].total) < 0.1 * whole.total         # equal ratios: about equal parts


def q4k(shape: str, **overrides):
    """A shape with every Q8_0 matrix Q4_K (the vectors F32), then the named tensors' types overridden."""
    tensors, cfg = shape_model(shape, 248320)
    mix = {t.name: "Q4_K" for t in tensors if t.type_name == "Q8_0"} | overrides
    return shape_model(shape, 248320, types=mix)[0], cfg


def test_gemm_workspace_holds_the_largest_run(nine_b):
    """The block-quantized GEMM's workspace: the largest run of one type a layer expands in one pass, at the plan's
    micro-batch. The 27B's ffn_gate + ffn_up (2 x 17408 rows of 5120) with mins: 5120 + 5120/16 x 8 bytes a row and
    the activation half sums. Where gate and up differ in type, they are two runs, and the largest is then ffn_down
    (5120 rows of 17408) before the GDN's qkv + gate + beta + alpha (16480 rows of 5120). Q8_0 files have none; a
    block-quantized head alone counts up to the 80 MiB piece (it went in such passes before, with every row's
    logits)."""
    tensors, cfg = q4k("27b")
    rows_gate_up, row, halves = 2 * 17408, 5120 + 5120 // 16 * 8, 512 * (5120 // 16) * 4
    assert memplan.quant_work_bytes(tensors, 512) == halves + 768 + rows_gate_up * row
    assert memplan.quant_work_bytes(tensors, 4096) == 8 * halves + 768 + rows_gate_up * row
    p = memplan.plan(tensors, cfg, 4096)
    assert p.quant_work == memplan.quant_work_bytes(tensors, 512)
    assert f"GEMM workspace {p.quant_work / MIB:.1f} MiB" in p.item("scratch").detail
    up_q5k = {f"blk.{il}.ffn_up.weight": "Q5_K" for il in range(cfg.n_layer)}
    split, _ = q4k("27b", **up_q5k)
    down_halves, down_row = 512 * (17408 // 16) * 4, 17408 + 17408 // 16 * 8
    assert memplan.quant_work_bytes(split, 512) == down_halves + 768 + 5120 * down_row
    assert memplan.plan(*nine_b, 4096).quant_work == 0
    head_q6k, _ = shape_model("9b", 248320, types={"output.weight": "Q6_K"})
    assert memplan.quant_work_bytes(head_q6k, 512) == memplan.QUANT_WORK_PIECE   # 248320 rows: over the piece
    assert memplan.plan(head_q6k, nine_b[1], 4096, all_logits=True).quant_work == memplan.QUANT_WORK_PIECE
    assert memplan.plan(tensors, cfg, 4096, n_ubatch=16).quant_work == 0      # the GEMV's rows need none


def test_gemm_workspace_by_the_backend_s_measure():
    """The plan sizes the workspace by the backend's measure (Backend.gemm_work_bytes): a route that reads Q4_K from
    its planes (as the DP4A and mma GEMMs of compute_80+ code do at 512 tokens; test_quant_cuda checks the CUDA
    backend's answer) needs only the half sums for the 27B's Q4_K runs, so the largest is a Q4_K_M file's Q6_K
    ffn_down (5120 rows of 17408), not ffn_gate + ffn_up."""
    def reads_q4k(type_name: str, T: int, n: int, rows: int) -> int:
        halves = memplan.exact(T * (n // 16) * 4)
        return halves if type_name == "Q4_K" else memplan.expanded_work_bytes(type_name, T, n, rows)
    tensors, cfg = q4k("27b", **{f"blk.{il}.ffn_down.weight": "Q6_K" for il in range(0, 64, 2)})
    down = memplan.expanded_work_bytes("Q6_K", 512, 17408, 5120)
    assert memplan.quant_work_bytes(tensors, 512, reads_q4k) == down
    assert memplan.plan(tensors, cfg, 4096, work_bytes=reads_q4k).quant_work == down
    assert memplan.plan(tensors, cfg, 4096).quant_work > down     # every type expanded: gate + up


def test_gemm_workspace_falls_back_where_the_run_does_not_fit():
    """Under a cap that the largest run's workspace passes, the plan takes QUANT_WORK_PIECE (the run in passes) and
    says so, rather than refusing the run."""
    tensors, cfg = q4k("27b")
    whole = memplan.plan(tensors, cfg, 4096)
    fitted = memplan.plan(tensors, cfg, 4096, cap=whole.total - 1)
    assert fitted.quant_work == memplan.QUANT_WORK_PIECE and fitted.total <= whole.total - 1
    assert any("GEMM workspace" in n and "does not fit" in n for n in fitted.notes)
    memplan.check(fitted)
    assert memplan.plan(tensors, cfg, 4096, cap=whole.total).quant_work == whole.quant_work and \
        not memplan.plan(tensors, cfg, 4096, cap=whole.total).notes


def test_prepare_device_sizes_the_backend_s_gemm_workspace(cuda_backend, tmp_path):
    """prepare_device hands the plan's workspace, by the backend's measure, to the backend: its block-quantized GEMM
    then runs the largest run in one pass (CudaBackend.QUANT_WORK_BYTES, 80 MiB before)."""
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.fixtures.qwen_vocab import tiny_vocab
    from llamacmp.fixtures.writer import SHAPES, write_model
    from llamacmp.loader import open_model
    from llamacmp.run_plan import plan_run
    vocab = tiny_vocab()
    tensors, _ = shape_model("small", len(vocab.tokens))
    path = write_model(tmp_path / "q4k.gguf", SHAPES["small"], "q8_0", vocab,
                       types={t.name: "Q4_K" for t in tensors if t.type_name == "Q8_0"})
    params = parse_args("completion", ["-c", "1024", "-ub", "256"]).params
    be = CudaBackend(arena_bytes=2 * GIB)
    try:
        mf = open_model(path)
        p = memplan.prepare_device(be, mf, plan_run(params, mf.cfg.n_ctx_train))
        tensors = memplan.tensors_of(mf.gguf)
        assert p.quant_work == memplan.quant_work_bytes(tensors, 256, be.gemm_work_bytes) > 0
        assert be.QUANT_WORK_BYTES == p.quant_work != CudaBackend.QUANT_WORK_BYTES
        # where the route reads Q4_K from its planes (compute_80+ code), only the half sums: less than expanded
        reads_planes = be.gemm_work_bytes("Q4_K", 256, 1024, 1024) < memplan.expanded_work_bytes("Q4_K", 256, 1024, 1)
        assert (p.quant_work < memplan.quant_work_bytes(tensors, 256)) == reads_planes
    finally:
        be.arena.close()
