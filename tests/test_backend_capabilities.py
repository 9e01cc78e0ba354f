"""The backend interface says what a backend can do: engine, models, server and the memory plan ask base.Backend's
capabilities, never a backend's name, and memplan reads no private name of the CUDA backend nor a fixture writer."""
from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest

from llamacmp import memplan
from llamacmp.args import parse_args
from llamacmp.backends.base import Backend
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.backends.state_ops import NumpyStateOps
from llamacmp.fixtures import writer
from llamacmp.fixtures.qwen_vocab import tiny_vocab
from llamacmp.loader import open_model
from llamacmp.run_plan import plan_run

PKG = Path(__file__).resolve().parent.parent / "llamacmp"


def sources(*folders: str):
    for folder in folders:
        yield from sorted((PKG / folder).glob("*.py"))


@pytest.mark.parametrize("path", list(sources("engine", "models", "split", "server", "cli")) + [PKG / "memplan.py"],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_backend_name_checks_or_probes(path):
    """No `.name == "cuda"` style test and no getattr(<backend or model>, ...) probe for an undeclared feature."""
    tree = ast.parse(path.read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "name":
            consts = [c.value for c in node.comparators if isinstance(c, ast.Constant)]
            if any(v in ("cuda", "numpy") or str(v).endswith("-split") for v in consts):
                bad.append(f"line {node.lineno}: backend name test")
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr") and node.args:
            target = ast.unparse(node.args[0])
            if any(w in target for w in ("backend", "be", "model", "self.be")) and target.split(".")[-1] in \
                    ("backend", "be", "model", "lm.model", "src", "dst"):
                bad.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert not bad, bad


def test_memplan_imports_no_private_cuda_name_or_fixture_writer():
    tree = ast.parse((PKG / "memplan.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert "fixtures" not in (node.module or ""), node.module
            if (node.module or "").endswith("cuda"):
                assert not any(a.name.startswith("_") for a in node.names), ast.unparse(node)


def test_state_ops_live_with_their_backend():
    assert isinstance(NumpyBackend().state_ops(), NumpyStateOps)
    assert not (PKG / "engine" / "checkpoints.py").read_text().count("class CudaStateOps")
    assert "class CudaStateOps" in (PKG / "backends" / "cuda_state.py").read_text()


def test_defaults_mean_a_host_backend():
    be = NumpyBackend()
    assert be.device is None and be.arena is None and not be.captures_graphs
    assert be.device_memory() is None and be.decode_graphs(None) is None and be.spec_graphs(None, 3) is None
    be.activate(), be.bind_thread(), be.synchronize()          # no-ops, declared on base.Backend
    assert Backend.state_ops is not NumpyBackend.state_ops


class PlannedNumpy(NumpyBackend):
    """A host backend that declares a device arena: the memory plan applies to it by capability alone."""
    def __init__(self, free: int):
        self.free, self.reserved = free, []

    def device_memory(self):
        return self.free, self.free

    def reserve_persistent(self, nbytes, what):
        self.reserved.append(nbytes)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return writer.write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", writer.SHAPES["tiny"], "f32", tiny_vocab())


def test_memory_plan_follows_the_capability_and_names_the_kv_types(model):
    p = parse_args("server", ["-m", str(model), "-c", "1024", "-np", "2", "-ctk", "q4_0", "-ctv", "tq3"]).params
    mf = open_model(model)
    be, log = PlannedNumpy(1 << 34), io.StringIO()
    plan = memplan.prepare_device(be, mf, plan_run(p, mf.cfg.n_ctx_train), log=log)
    assert be.reserved == [plan.persistent]
    assert "-c 512 x 2 slot(s), -ctk q4_0 -ctv tq3" in log.getvalue()
    with pytest.raises(memplan.PlanError, match="-ctk"):
        memplan.prepare_device(PlannedNumpy(1 << 10), mf, plan_run(p, mf.cfg.n_ctx_train))
    assert memplan.prepare_device(NumpyBackend(), mf, plan_run(p, mf.cfg.n_ctx_train)) is None


# -- weight types: a backend declares the GGUF types it has kernels for, the loader refuses the rest by name ----------

def _grid_model(tmp_path, qtype: str):
    """The q256 shape (every row 256 long) in Q8_0 with one IQ1-3 grid-type matrix."""
    from llamacmp.fixtures.writer import SHAPES
    return writer.write_model(tmp_path / f"one-{qtype}.gguf", SHAPES["q256"], "q8_0", tiny_vocab(), seed=5,
                              types={"blk.0.ffn_up.weight": qtype})


def test_cuda_backend_declares_every_loaded_type():
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.gguf_file import TYPE_NAMES
    assert NumpyBackend.weight_types is None
    assert CudaBackend.weight_types == set(TYPE_NAMES.values())


class _NoGridBackend(NumpyBackend):
    """A backend that declares fewer types than the file holds: the loader's refusal, whichever backend it is."""
    name = "nogrid"
    weight_types = frozenset({"F32", "F16", "Q8_0"})


@pytest.mark.parametrize("qtype", ["IQ2_S", "IQ1_M"])
def test_a_type_the_backend_does_not_declare_is_refused_at_load_by_name(tmp_path, qtype):
    from llamacmp.gguf_file import GGUFError
    from llamacmp.loader import check_weight_types, load_model
    path = _grid_model(tmp_path, qtype)
    want = (rf"{path.name}: tensor 'blk.0.ffn_up.weight' has type {qtype}, which the nogrid backend does not run "
            rf"yet: {qtype} runs on the numpy backend only so far \(-ngl 0\)")
    with pytest.raises(GGUFError, match=want):
        load_model(path, _NoGridBackend())
    with pytest.raises(GGUFError, match=want):
        check_weight_types(open_model(path).gguf, [NumpyBackend(), _NoGridBackend()])
    check_weight_types(open_model(path).gguf, [NumpyBackend()])              # the numpy reference takes every type


@pytest.mark.parametrize("qtype", ["IQ2_S", "IQ1_M"])
def test_cuda_backend_takes_a_grid_type(tmp_path, qtype):
    """A Q8_0 file with a grid-type matrix: no refusal before anything touches the device (a CudaBackend never
    started: no GPU here)."""
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.loader import check_weight_types
    check_weight_types(open_model(_grid_model(tmp_path, qtype)).gguf, [object.__new__(CudaBackend)])
