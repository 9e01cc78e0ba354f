"""backends/cuda_graphs.RecordedGraph, the one capture mechanism (CapturedStep and the layer split's per-part steps),
on the CPU against a recording fake of the native library: the graph's own arena is current while it records and
only then, `capturing` is set exactly while launches are recorded, a failing record ends the capture and leaves
the backend as it was, and a dropped graph destroys its exec and frees its arena."""
from __future__ import annotations

import pytest

from llamacmp.backends.cuda_graphs import RecordedGraph
from llamacmp.backends.cuda_memory import DeviceArena, DeviceTensor
from llamacmp.lib._native import NativeError


class FakeNative:
    def __init__(self):
        self.calls, self.next_ptr = [], 0x1000

    def malloc(self, nbytes):
        self.next_ptr += 1 << 30
        self.calls.append("malloc")
        return self.next_ptr

    def cmp_free(self, ptr):
        self.calls.append("free")

    def cmp_graph_begin(self):
        self.calls.append("begin")

    def graph_end(self):
        self.calls.append("end")
        return 77

    def cmp_graph_launch(self, exec_):
        self.calls.append(("launch", exec_))

    def cmp_graph_destroy(self, exec_):
        self.calls.append(("destroy", exec_))


class FakeBackend:
    def __init__(self):
        self.native = FakeNative()
        self.arena = DeviceArena(self.native, 1 << 30)
        self.capturing = False


def test_records_into_its_own_arena_and_restores_the_backend():
    be = FakeBackend()
    main, seen = be.arena, {}

    def before():
        seen["before"] = (be.arena, be.capturing, list(be.native.calls))

    def record():
        seen["record"] = (be.arena, be.capturing, list(be.native.calls))
        return DeviceTensor(be.arena, (4,), "f32", "out")

    g = RecordedGraph(be, record, before=before)
    assert seen["before"] == (g.arena, False, [])                  # uploads: before the capture begins
    assert seen["record"] == (g.arena, True, ["begin"])
    assert g.arena is not main and be.arena is main and not be.capturing
    assert g.exec == 77 and g.out.ptr in range(g.arena.chunks[0], g.arena.chunks[0] + (16 << 20))
    g.launch()
    assert be.native.calls[-1] == ("launch", 77)
    del g
    assert be.native.calls[-2:] == [("destroy", 77), "free"]       # the exec, then the graph arena's one chunk


def test_a_failing_record_ends_the_capture_and_restores_the_backend():
    be = FakeBackend()
    main = be.arena

    def record():
        raise RuntimeError("op failed while recording")

    with pytest.raises(RuntimeError, match="op failed while recording"):
        RecordedGraph(be, record)
    assert be.native.calls == ["begin", "end"]
    assert be.arena is main and not be.capturing


def test_a_failing_end_after_a_failing_record_keeps_the_first_error():
    be = FakeBackend()

    def end():
        raise NativeError("cmp_graph_end", 1, "capture invalidated")

    be.native.graph_end = end
    with pytest.raises(ValueError, match="bad shape"):
        RecordedGraph(be, lambda: (_ for _ in ()).throw(ValueError("bad shape")))
    assert not be.capturing
