"""The vision encoder's host-side work and the CUDA backend's pure-Python pieces it relies on, without a GPU:
the position-table resize against its formula, the per-grid cache of the resized table, the rotary positions
made once per image, and CudaBackend.reshape's device view (no host round trip)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from llamacmp.backends.cuda_memory import DeviceArena, DeviceTensor
from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.fixtures.mmproj_writer import VISION_SHAPES, write_mmproj
from llamacmp.vision.config import load_mmproj
from llamacmp.vision.encoder import VisionEncoder, _aa_weights, resize_pos_embd
from llamacmp.vision.positions import merge_order
from llamacmp.vision.preprocess import PreparedImage


@pytest.mark.parametrize("n,ph,pw", [(5, 3, 7), (7, 2, 2), (4, 8, 6), (6, 1, 13), (3, 4, 3)])
def test_resize_pos_embd_is_the_separable_filter(n, ph, pw):
    """out[a, b] = sum_y sum_x wy[a, y] wx[b, x] table[y, x] (ggml_interpolate BILINEAR | ANTIALIAS), written
    out as the direct four-index sum."""
    table = np.random.default_rng(n * 100 + ph * 10 + pw).standard_normal((n * n, 5)).astype(np.float32)
    wy, wx = _aa_weights(n, ph), _aa_weights(n, pw)
    grid = table.reshape(n, n, 5).astype(np.float64)
    want = np.zeros((ph, pw, 5))
    for a in range(ph):
        for b in range(pw):
            for y in range(n):
                for x in range(n):
                    want[a, b] += wy[a, y] * wx[b, x] * grid[y, x]
    got = resize_pos_embd(table, ph, pw)
    assert got.shape == (ph * pw, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.reshape(ph * pw, 5), rtol=1e-6, atol=1e-6)


def test_resize_pos_embd_same_grid_is_the_table():
    table = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    assert np.array_equal(resize_pos_embd(table, 4, 4), table)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    mm = write_mmproj(tmp_path_factory.mktemp("mmproj") / "mm.gguf", VISION_SHAPES["tiny"], "f32", 3)
    cfg, weights = load_mmproj(mm)
    return VisionEncoder(cfg, weights, NumpyBackend())


def _image(side_h: int, side_w: int, seed: int) -> PreparedImage:
    pixels = np.random.default_rng(seed).uniform(-1, 1, (side_h, side_w, 3)).astype(np.float32)
    return PreparedImage(pixels, f"test-{seed}")


def test_position_table_resized_once_per_grid(encoder):
    """A second image of the same size reuses the resized table; the output does not depend on the cache."""
    enc = encoder
    enc._pos_resized.clear()
    p = enc.cfg.patch_size * enc.cfg.merge
    first = enc.encode(_image(3 * p, 2 * p, 1)).embeddings
    assert list(enc._pos_resized) == [(6, 4)]
    cached = enc._pos_resized[(6, 4)]
    want = resize_pos_embd(enc.pos_table, 6, 4)[merge_order(6, 4, enc.cfg.merge)]
    assert np.array_equal(cached, want)
    again = enc.encode(_image(3 * p, 2 * p, 1)).embeddings
    assert enc._pos_resized[(6, 4)] is cached and np.array_equal(first, again)
    enc._pos_resized.clear()
    assert np.array_equal(enc.encode(_image(3 * p, 2 * p, 1)).embeddings, first)


def test_position_cache_keeps_the_latest_grids(encoder):
    enc = encoder
    enc._pos_resized.clear()
    grids = [(2, 2), (2, 4), (4, 2), (4, 4), (6, 2), (2, 4)]
    for ph, pw in grids:
        enc._pos_embd(ph, pw, merge_order(ph, pw, enc.cfg.merge))
    # five distinct grids through a cache of four: the oldest (2, 2) went; (2, 4) was used last
    assert len(enc._pos_resized) == enc.POS_CACHE_GRIDS
    assert list(enc._pos_resized) == [(4, 2), (4, 4), (6, 2), (2, 4)]


def test_rope_positions_default_is_the_host_array():
    pos = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert NumpyBackend().rope_positions(pos) is pos


# -- CudaBackend.reshape's view: DeviceTensor / DeviceArena bookkeeping, no device memory touched -------------------

def _arena_with_a_chunk() -> DeviceArena:
    """A real DeviceArena whose one chunk is a made-up address range: alloc / release only do bookkeeping on it
    (nothing is read or written there), and no native library is needed until a second chunk would be."""
    arena = DeviceArena(native=None, cap=1 << 30)
    base = 1 << 40
    arena.chunks.append(base)
    arena.reserved = 1 << 24
    arena._cur, arena._cur_left = base, 1 << 24
    return arena


def test_device_view_shares_the_block_and_keeps_it_alive():
    arena = _arena_with_a_chunk()
    x = DeviceTensor(arena, (8, 6), "f32", "x")
    used = arena.in_use
    v = x.view((2, 24))
    assert (v.ptr, v.shape, v.dtype, v.nbytes) == (x.ptr, (2, 24), "f32", x.nbytes)
    assert v.row_ptr(1) == x.ptr + 24 * 4 and arena.in_use == used          # no allocation, no copy
    w = v.view((48,))                                                         # a view of a view holds the owner
    assert w._base is x and w.ptr == x.ptr
    ptr = x.ptr
    del x, v
    gc.collect()
    assert arena.in_use == used                                               # w still reads the block
    del w
    gc.collect()
    assert arena.in_use == 0 and ptr in arena._free[next(iter(arena._free))]


def test_device_view_needs_the_same_element_count():
    arena = _arena_with_a_chunk()
    x = DeviceTensor(arena, (4, 6), "f32", "x")
    with pytest.raises(ValueError, match=r"view: \(4, 6\) has 24 elements, \(5, 5\) needs 25"):
        x.view((5, 5))
