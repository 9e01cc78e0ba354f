"""CudaBackend.restore_steps on the CPU, against a fake of libcmpkern whose device memory is a host buffer: the
rewind is one cmp_copy_regions launch of a table uploaded once per state, and the copies it describes are the ones
the copy per layer and state made (each GDN layer's conv and ssm state from row k - 1 of its per-token buffer).
The kernel itself against numpy: test_kernels_cuda.py::test_copy_regions_equals_numpy; end to end on a model:
test_mtp_cuda.py."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from llamacmp.backends.base import SeqState
from llamacmp.backends.cuda_memory import DeviceArena
from llamacmp.lib._native import COPY_REGION_WORDS

CudaBackend = pytest.importorskip("llamacmp.backends.cuda").CudaBackend


class MemNative:
    """Device memory as one host array (addresses from BASE): the arena's chunks, uploads, copies, memsets."""
    BASE = 1 << 40

    def __init__(self, size: int = 1 << 23):
        self.mem = np.zeros(size, np.uint8)
        self.top, self.calls = self.BASE, []

    def at(self, ptr: int, nbytes: int) -> np.ndarray:
        assert self.BASE <= ptr and ptr + nbytes <= self.BASE + self.mem.size
        return self.mem[ptr - self.BASE:ptr - self.BASE + nbytes]

    def malloc(self, nbytes: int) -> int:
        ptr, self.top = self.top, self.top + nbytes
        return ptr

    def cmp_free(self, ptr):
        pass

    def cmp_memset(self, ptr, value, nbytes):
        self.at(ptr, nbytes)[:] = value

    def cmp_memcpy_h2d(self, dst, src, nbytes):
        self.calls.append("h2d")
        ctypes.memmove(self.at(dst, nbytes).ctypes.data, src, nbytes)

    def cmp_memcpy_d2d(self, dst, src, nbytes):
        self.calls.append("d2d")
        self.at(dst, nbytes)[:] = self.at(src, nbytes)

    def cmp_copy_regions(self, regions, n, max_bytes):
        """api.h's semantics: n (dst, src, bytes) rows of 8-byte words at `regions` (device memory)."""
        self.calls.append(("copy_regions", n))
        table = self.at(regions, n * COPY_REGION_WORDS * 8).view(np.uint64).reshape(n, COPY_REGION_WORDS)
        for dst, src, nbytes in table.tolist():
            assert nbytes <= max_bytes
            self.at(dst, nbytes)[:] = self.at(src, nbytes)


KERNEL, C, V, DK = 4, 10, 2, 4        # conv state rows of 3 x 10 f32 (120 bytes: not a multiple of 16)


def _backend() -> CudaBackend:
    be = object.__new__(CudaBackend)      # no GPU: only what new states, _steps and restore_steps touch
    be.native = MemNative()
    be.arena = be._state_arena = DeviceArena(be.native, 1 << 23, chunk=1 << 20)
    return be


def _state(be, n_gdn: int, room: int) -> SeqState:
    st = SeqState(n_ctx=16, k=[], v=[], conv=[be.zeros((KERNEL - 1, C), "f32", "conv") for _ in range(n_gdn)],
                  ssm=[be.zeros((V, DK, DK), "f32", "ssm") for _ in range(n_gdn)])
    for layer in range(n_gdn):
        _make_steps(be, st, layer, room)
    return st


def _make_steps(be, st, layer, room):
    """A keep_steps batch's buffers of one layer, as conv1d_silu and gdn make them (room tokens: room - 1 ssm rows)."""
    be._steps(st, "conv", layer, room, room, (KERNEL - 1, C))
    be._steps(st, "ssm", layer, room - 1, room - 1, (V, DK, DK))


def _verify(be, st, L, rng) -> None:
    """What a verify of L tokens leaves: random states after each token, len = L."""
    for t in [*st.conv, *st.ssm, *st.steps["conv"].values(), *st.steps["ssm"].values()]:
        be.native.at(t.ptr, t.nbytes)[:] = rng.integers(0, 256, t.nbytes, dtype=np.uint8)
    st.steps["len"] = L


def _host(be, t) -> np.ndarray:
    return be.native.at(t.ptr, t.nbytes).copy()


@pytest.mark.parametrize("room", [2, 4])
def test_restore_is_one_launch_of_a_table_made_once(room):
    be, rng = _backend(), np.random.default_rng(0)
    st = _state(be, 3, room)
    for i, (L, k) in enumerate([(room, 1), (room, room - 1), (2, 1), (room, room)]):
        _verify(be, st, L, rng)
        if k == L:      # nothing to copy: the states already are the last token's
            want = {name: [_host(be, t) for t in getattr(st, name)] for name in ("conv", "ssm")}
        else:
            want = {name: [_host(be, st.steps[name][layer].rows(k - 1, 1)) for layer in range(3)]
                    for name in ("conv", "ssm")}
        be.native.calls.clear()
        be.restore_steps(st, k)
        launches = [] if k == L else [("copy_regions", 2 * 3)]
        assert be.native.calls == (["h2d"] if i == 0 else []) + launches, f"round {i}"
        for name in ("conv", "ssm"):
            for layer, t in enumerate(getattr(st, name)):
                np.testing.assert_array_equal(_host(be, t), want[name][layer], f"round {i}: {name} {layer}")
        assert st.steps["len"] == 0


def test_a_buffer_made_after_the_table_remakes_it():
    be, rng = _backend(), np.random.default_rng(1)
    st = _state(be, 2, 3)
    st.conv.append(be.zeros((KERNEL - 1, C), "f32", "conv"))
    st.ssm.append(be.zeros((V, DK, DK), "f32", "ssm"))
    _verify(be, st, 3, rng)
    be.restore_steps(st, 1)
    _make_steps(be, st, 2, 3)           # the third layer's buffers, after the table
    _verify(be, st, 3, rng)
    be.native.calls.clear()
    be.restore_steps(st, 2)
    assert be.native.calls == ["h2d", ("copy_regions", 6)]
    for name in ("conv", "ssm"):
        for layer, t in enumerate(getattr(st, name)):
            np.testing.assert_array_equal(_host(be, t), _host(be, st.steps[name][layer].rows(1, 1)))


def test_restore_refuses_what_it_refused():
    be = _backend()
    st = _state(be, 1, 3)
    with pytest.raises(ValueError, match="no keep_steps batch"):
        be.restore_steps(st, 1)
    st.steps["len"] = 3
    with pytest.raises(ValueError, match="outside 1..3"):
        be.restore_steps(st, 4)
    with pytest.raises(ValueError, match="outside 1..3"):
        be.restore_steps(st, 0)
