"""Layer split (llamacmp/split/) on the CPU: numpy backends stand in for devices, NumpyHostBridge for the pinned-host
bridge. The split must give bit-identical logits and greedy tokens to one backend (same micro-batch cuts), for
pipelined prefill, decode, several sequences in one batch and the prompt-cache state operations."""
from __future__ import annotations

import numpy as np
import pytest

from llamacmp.backends.base import StepBatch
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.engine.checkpoints import NumpyStateOps
from llamacmp.engine.client import SlotClient
from llamacmp.engine.sequence import Sequence
from llamacmp.engine.tasks import GenParams
from llamacmp.loader import load_model, load_split_model
from llamacmp.models.qwen35 import Qwen35Model
from llamacmp.split.bridges import CudaBridge, NumpyHostBridge, choose_bridge
from llamacmp.split.model import SplitModel
from llamacmp.split.placement import assign_layers
from llamacmp.sampling import SamplingParams

UB = 8          # micro-batch: a 29-token prompt crosses the split in 4 pieces


@pytest.fixture(scope="module")
def path(fixture_gguf):
    return fixture_gguf("tiny", "q8_0", seed=3)


@pytest.fixture(scope="module")
def one(path):
    return load_model(path, NumpyBackend())


@pytest.fixture(scope="module", params=[2, 3], ids=["2parts", "3parts"])
def split(request, path):
    lm = load_split_model(path, [NumpyBackend() for _ in range(request.param)], micro_batch=UB)
    yield lm
    lm.model.close()


def _prompt(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 200, n)]


# -- placement ------------------------------------------------------------------------------------------------------

def test_assign_layers_follows_ratios_and_extras():
    assert assign_layers([10] * 4, [1, 1]) == [range(0, 2), range(2, 4)]
    assert assign_layers([10] * 8, [3, 1]) == [range(0, 6), range(6, 8)]
    # a big embedding on the first part and head on the last move the cuts
    assert assign_layers([10] * 8, [1, 1], first_extra=40) == [range(0, 2), range(2, 8)]
    assert assign_layers([10] * 8, [1, 1], last_extra=40) == [range(0, 6), range(6, 8)]
    # every part keeps at least one layer, even with a tiny ratio
    assert assign_layers([10] * 3, [100, 1, 1]) == [range(0, 1), range(1, 2), range(2, 3)]
    assert assign_layers([10] * 5, [1, 1, 1]) == [range(0, 2), range(2, 3), range(3, 5)]
    with pytest.raises(ValueError, match="cannot split 2 layers over 3"):
        assign_layers([1, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="positive"):
        assign_layers([1, 1], [1, 0])


def test_split_layout_and_description(split):
    parts = split.model.parts
    assert [p for part in parts for p in part.layers] == list(range(split.cfg.n_layer))
    assert parts[0].model.token_embd is not None and parts[-1].model.output is not None
    assert all(m is None for m in parts[0].model.layers[parts[0].layers.stop:])
    lines = split.model.describe()
    assert len(lines) == len(parts)
    assert "token embedding" in lines[0] and "output head" in lines[-1] and "bridge to part 1: host" in lines[0]
    assert split.model.bridge_kinds == ["host"] * (len(parts) - 1)
    assert all(isinstance(p.bridge_out, NumpyHostBridge) for p in parts[:-1])


def test_numpy_has_only_the_host_bridge():
    a, b = NumpyBackend(), NumpyBackend()
    assert choose_bridge(a, b, "auto") == "host"
    with pytest.raises(ValueError, match="needs CUDA"):
        choose_bridge(a, b, "peer")
    with pytest.raises(ValueError, match="--split-bridge must be"):
        choose_bridge(a, b, "pcie")


class _Buf:
    """A device tensor or host block as the bridge sees it: an address, a size, a shape."""
    def __init__(self, ptr, shape, nbytes):
        self.ptr, self.shape, self.nbytes = ptr, tuple(shape), nbytes


class _RecordingNative:
    """The native calls CudaBridge makes, recorded: which events and pinned blocks live, in what order they go."""
    def __init__(self):
        self.next, self.calls = 0x1000, []
        self.events, self.hosts = set(), set()

    def _new(self, pool):
        self.next += 16
        pool.add(self.next)
        return self.next

    def event_create(self):
        return self._new(self.events)

    def host_alloc(self, nbytes):
        return self._new(self.hosts)

    def cmp_event_destroy(self, e):
        assert e in self.events, "destroyed twice or never made"
        self.events.remove(e)
        self.calls.append(("destroy", e))

    def cmp_host_free(self, p):
        self.hosts.remove(p)

    def __getattr__(self, name):          # copies, records, waits: only their order matters here
        return lambda *args: self.calls.append((name, *args[:1]))


class _FakeDevice:
    def __init__(self, native, device):
        self.native, self.device = native, device

    def empty(self, shape, dtype, what):
        return _Buf(self.native._new(set()), shape, int(np.prod(shape)) * 4)


@pytest.mark.parametrize("mode", ["host", "peer"])
def test_cuda_bridge_close_destroys_its_events(mode):
    """A CudaBridge makes one event per slot and side (filled, emptied) as it goes; close() waits for each and
    destroys it, and frees the pinned slots: a split that is closed (or whose bridge is remade) leaks nothing."""
    nat = _RecordingNative()
    br = CudaBridge(_FakeDevice(nat, 0), _FakeDevice(nat, 1), mode)
    for T in (1, 5, 3):
        br.send(_Buf(0x10, (T, 8), T * 32))
        br.recv()
    made = set(nat.events)
    assert len(made) == 2 * br.n_slots and not any(c[0] == "destroy" for c in nat.calls)
    br.close()
    assert not nat.events and not nat.hosts
    for e in made:                           # each one waited for before it goes
        assert nat.calls.index(("cmp_event_synchronize", e)) < nat.calls.index(("destroy", e))
    br.close()                                # a second close has nothing left to release
    assert sum(c[0] == "destroy" for c in nat.calls) == len(made)


# -- identical results ------------------------------------------------------------------------------------------------

def test_pipelined_prefill_and_greedy_decode_identical(one, split):
    prompt = _prompt(29)
    s1 = Sequence(one, 64, n_batch=64, n_ubatch=UB)         # one backend: 8-token chunks
    s2 = Sequence(split, 64, n_batch=64, n_ubatch=UB)       # split: one 29-token batch, pipelined in 8-token pieces
    l1, l2 = np.asarray(s1.feed(prompt)), np.asarray(s2.feed(prompt))
    assert l1.shape == (one.cfg.n_vocab,) and np.array_equal(l1, l2)
    sent = [p.bridge_out.n_sent for p in split.model.parts[:-1]]
    assert sent == [4] * len(sent)                          # every piece crossed every bridge
    for _ in range(12):                                     # greedy decode, token by token
        tok = int(np.argmax(l1))
        l1, l2 = np.asarray(s1.feed([tok])), np.asarray(s2.feed([tok]))
        assert np.array_equal(l1, l2)
    assert s2.state.n_past == s1.state.n_past and all(p.n_past == s2.state.n_past for p in s2.state.parts)


def test_cli_client_greedy_identical(one, split):
    """The CLIs' slot (engine/client.py): the split takes whole -b batches, one backend -ub pieces; same tokens."""
    from llamacmp.run_plan import RunPlan
    gens = []
    for lm in (one, split):
        c = SlotClient(lm, RunPlan(64, 1, "f16", "f16", 64, UB))
        c.history = _prompt(29)
        gens.append(c.generate(GenParams(SamplingParams(temp=0.0, ignore_eos=True), 12)))
    assert gens[0].tokens == gens[1].tokens and len(gens[0].tokens) == 12


def test_all_logits_rows_identical(one, split):
    prompt = _prompt(21, seed=1)
    a = Sequence(one, 64, 64, UB).feed(prompt, all_logits=True)
    b = Sequence(split, 64, 64, UB).feed(prompt, all_logits=True)
    assert a.shape == b.shape == (21, one.cfg.n_vocab) and np.array_equal(a, b)


def test_several_sequences_in_one_batch(one, split):
    """The server's continuous batching: a decode token of one slot and a prompt chunk of another together."""
    def run(lm):
        sa, sb = lm.backend.new_state(lm.cfg, 64), lm.backend.new_state(lm.cfg, 64)
        lm.model.forward(StepBatch.build([(sa, _prompt(6, 2))]))
        out = lm.backend.to_host(lm.model.forward(StepBatch.build([(sa, [5]), (sb, _prompt(7, 3))])))
        return out, lm.backend.state_to_host(sa), lm.backend.state_to_host(sb), sa.n_past, sb.n_past
    a, b = run(one), run(split)
    assert np.array_equal(a[0], b[0]) and a[3:] == b[3:] == (7, 7)
    for ha, hb in ((a[1], b[1]), (a[2], b[2])):
        for name in ("k", "v", "conv", "ssm"):
            assert len(ha[name]) == len(hb[name])
            assert all(np.array_equal(x, y) for x, y in zip(ha[name], hb[name]))


def test_state_ops_over_the_split(one, split):
    ops_one, ops = NumpyStateOps(), split.backend.state_ops()
    prompt = _prompt(20, seed=4)

    def fwd(lm, st, toks):
        return lm.backend.to_host(lm.model.forward(StepBatch.build([(st, toks)])))[-1]

    st = split.backend.new_state(split.cfg, 64)
    fwd(split, st, prompt[:12])
    ckpt = ops.snapshot(st, None)
    want = fwd(split, st, prompt[12:])
    ops.restore(st, ckpt)
    assert st.n_past == 12
    assert np.array_equal(fwd(split, st, prompt[12:]), want)
    host = ops.save_host(st, prompt, want, [ckpt])
    ref = one.backend.new_state(one.cfg, 64)
    fwd(one, ref, prompt[:12])
    ref_host = ops_one.save_host(ref, prompt[:12], None, [])
    assert len(host.conv) == len(ref_host.conv) and len(host.k) == len(ref_host.k)
    assert len(host.checkpoints) == 1 and len(host.checkpoints[0].ssm) == len(ref.ssm)
    other = split.backend.new_state(split.cfg, 64)
    ops.load_host(other, host, host.checkpoints[0])          # resume at the checkpoint, then the same tokens
    assert other.n_past == 12
    assert np.array_equal(fwd(split, other, prompt[12:]), want)
    ops.reset(other)
    assert other.n_past == 0 and all(not a.any() for a in other.ssm)


def test_a_failing_part_stops_the_pipeline_and_the_next_forward_works(split):
    st = split.backend.new_state(split.cfg, 64)
    bad = [0] * 20 + [10 ** 6]                        # an id past the vocabulary fails in part 0's embedding
    with pytest.raises(IndexError):
        split.model.forward(StepBatch.build([(st, bad)]))
    st = split.backend.new_state(split.cfg, 64)
    assert split.model.forward(StepBatch.build([(st, _prompt(9))])).shape == (1, split.cfg.n_vocab)


def test_split_needs_two_backends_of_one_kind(one, path):
    from llamacmp.loader import _open
    _f, cfg, weights = _open(path, [NumpyBackend()])
    with pytest.raises(ValueError, match="at least two"):
        SplitModel(Qwen35Model, cfg, weights, [NumpyBackend()])
    with pytest.raises(ValueError, match="3 split ratios for 2"):
        SplitModel(Qwen35Model, cfg, weights, [NumpyBackend(), NumpyBackend()], ratios=[1, 1, 1])


# -- flags and device planning ----------------------------------------------------------------------------------------

def test_split_flags_parse():
    from llamacmp.args import parse_args
    p = parse_args("completion", ["-sm", "layer", "-ts", "3,1", "-mg", "1", "-dev", "CUDA0,CUDA1",
                                  "--split-bridge", "host"], {}).params
    assert (p.split_mode, p.tensor_split, p.main_gpu, p.devices, p.split_bridge) == ("layer", (3.0, 1.0), 1, (0, 1),
                                                                                       "host")
    assert parse_args("server", ["-dev", "none"], {}).params.devices == ()
    assert parse_args("server", ["-dev", "0,0"], {}).params.devices == (0, 0)
    assert parse_args("server", [], {"LLAMA_ARG_DEVICE": "CUDA1"}).params.devices == (1,)
    d = parse_args("cli", [], {}).params
    assert (d.devices, d.split_bridge) == (None, "auto")


@pytest.mark.parametrize("argv", [["--split-bridge", "nvlink"], ["-dev", "GPU0"]])
def test_bad_split_flags_are_refused(argv):
    from llamacmp.args import ArgError, parse_args
    with pytest.raises(ArgError):
        parse_args("completion", argv, {})


def test_row_split_is_refused_with_the_reason():
    from llamacmp.cli.common import CliError, check_engine_flags
    from llamacmp.params import Params
    p = Params(tool="completion")
    p.split_mode = "row"
    with pytest.raises(CliError, match="splits the model by layers"):
        check_engine_flags(p)


def test_plan_devices_follows_llamacpp_rules():
    from llamacmp.backends.select import plan_devices
    assert plan_devices(2, None, "layer", 0, ()) == ([0, 1], None)           # every GPU, by free memory
    assert plan_devices(1, None, "layer", 0, ()) == ([0], None)
    assert plan_devices(2, None, "none", 1, ()) == ([1], None)              # -sm none: -mg's device alone
    assert plan_devices(2, None, "layer", 0, (3, 1)) == ([0, 1], [3, 1])
    assert plan_devices(2, None, "layer", 0, (0, 1)) == ([1], None)         # a 0 leaves the device out
    assert plan_devices(4, (2, 3), "layer", 0, (1,)) == ([2], None)
    assert plan_devices(1, None, "layer", 0, (3, 1)) == ([0], None)        # values past the last device ignored
    assert plan_devices(1, (0, 0), "layer", 0, ()) == ([0, 0], None)        # two parts on one GPU
    assert plan_devices(2, (), "layer", 0, ()) == ([], None)
    for args, msg in [((2, None, "row", 0, ()), "row is not supported"), ((1, (1,), "layer", 0, ()), "no CUDA device 1"),
                      ((2, None, "none", 2, ()), "--main-gpu 2"), ((1, None, "layer", 0, (0, 1)), "at least one"),
                      ((2, None, "layer", 0, (0, 0)), "at least one"), ((2, None, "layer", 0, (1, -1)), "non-negative")]:
        with pytest.raises(ValueError, match=msg):
            plan_devices(*args)


def test_numpy_split_has_no_decode_graphs(split):
    assert split.backend.decode_graphs(split.model, 4) is None      # the decoder then runs steps eagerly


def test_server_engine_over_the_split_gives_the_same_tokens(one, split):
    """The server's engine (continuous batching, checkpoints, device-side draws) on a split: three greedy requests
    at once give the tokens each gives on one backend, and the split's prompt chunks span several -ub pieces."""
    import threading
    from llamacmp.engine.scheduler import Engine, EngineConfig
    from llamacmp.engine.tasks import CompletionTask, ErrorResult, FinalResult, GenParams

    def serve(lm):
        eng = Engine(lm, EngineConfig(n_slots=3, n_ctx_slot=96, n_batch=32, n_ubatch=UB, cache_ram_mib=0,
                                      checkpoint_every=24))
        assert eng._chunk_size(32) == (32 if lm is split else UB) and eng._chunk_size(13) == UB
        eng.start()
        done, out = threading.Event(), {}

        def sink_for(i):
            def sink(r):
                if isinstance(r, (FinalResult, ErrorResult)):
                    out[i] = r
                    if len(out) == 3:
                        done.set()
            return sink
        try:
            for i in range(3):
                eng.submit(CompletionTask(_prompt(19 + 7 * i, seed=10 + i),
                                          GenParams(SamplingParams(temp=0.0), n_predict=10), sink_for(i)))
            assert done.wait(120)
        finally:
            eng.stop()
        assert all(isinstance(r, FinalResult) for r in out.values()), out
        return [out[i].tokens for i in range(3)]
    got, want = serve(split), serve(one)
    assert got[0] == want[0] and all(len(t) == 10 for t in want)
    assert got[1] == want[1] and got[2] == want[2]


def test_weight_bytes_count_every_tensor_as_stored():
    """A mixed-type file (K-quants, Q8_0, F32 norms): each layer's bytes are its tensors' stored bytes."""
    from llamacmp.fixtures.quant_blocks import random_blocks
    from llamacmp.split.placement import weight_bytes
    from llamacmp.weights import LayerWeights, ModelWeights
    rng = np.random.default_rng(0)
    mat = {t: random_blocks(t, 8, 256, rng) for t in ("Q4_K", "Q6_K", "Q8_0", "IQ4_XS")}
    norm = np.zeros(256, np.float32)
    layer = LayerWeights(attn_norm=norm, post_attention_norm=norm, ffn_gate=mat["Q4_K"], ffn_up=mat["IQ4_XS"],
                         ffn_down=mat["Q8_0"])
    weights = ModelWeights(token_embd=mat["Q4_K"], output_norm=norm, output=mat["Q6_K"], layers=[layer])
    layers, embd, head = weight_bytes(weights)
    assert layers == [2 * 1024 + 8 * 144 + 8 * 136 + 8 * 8 * 34]
    assert (embd, head) == (8 * 144, 1024 + 8 * 210)
