"""The CUDA backend: every op of base.Backend on libcmpkern.so kernels (DP4A / FP32 / HFMA2; tensor cores only on
the "mma" prefill route of `routes.Routes`: the int8 mma.sync GEMM of matmul_mma.cu, on Volta the f16 HMMA GEMM of
matmul_hmma.cu).

Tensors live in one arena per device (cuda_memory.py): device memory taken in large chunks up to a cap fixed when
the backend is made, and handed out through per-size free lists, so the repeated shapes of a forward pass reuse
the same blocks without a cudaMalloc per op. Decode steps replay as CUDA graphs (cuda_graphs.py), and prompt-cache
copies of a sequence's state are cuda_state.py's.
Numerics follow numpy_ref.py (the specification): fp32 activations and residual, fp32 GDN state, KV f16 or f32,
Q8_0 weights against Q8 activations with integer dots.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..config import ModelConfig
from ..gguf_file import Q8_0_BLOCK, Q8Tensor, QuantTensor
from ..lib._native import (CMP_ERR_UNSUPPORTED, CMP_F16, CMP_F32, CmpSamplerParams, Native, NativeError,
                           cuda_available)
from ..lib._native import CMP_BINARY_SIGMOID_MUL, CMP_BINARY_SWIGLU, CMP_MM_GEMM2, CMP_MM_GEMV2
from ..lib._native import CMP_MM_GEMV_PDL, CMP_MM_MMA, CMP_MM_MMA_F16
from ..lib._native import CMP_KV_TYPES, CMP_QUANT_TYPES, COPY_REGION_BYTES, copy_region_table
from ..lib._native import CMP_DOTS, CMP_MM_GEMM_DOT_SHIFT, CMP_MM_GEMV_DOT_SHIFT
from .. import kv_layout
from ..memplan import QUANT_WORK_PIECE
from . import routes as _routes
from .base import Backend, Segment, SeqState, StepBatch
from .cq2_ref import CQ2_VALUES
from .cuda_graphs import DecodeGraphs
from .cuda_memory import DTYPES, MIB, DeviceArena, DeviceTensor
from .cuda_state import CudaStateOps, HostCopies
from .spec_graphs import SpecGraphs

__all__ = ["CudaBackend", "DenseMatrix", "Q8Matrix", "QuantMatrix", "cuda_available"]

_KV_CODES = {"f32": CMP_F32, "f16": CMP_F16}
# cmp_gated_rmsnorm_q8 holds a head in one warp, 8 values a lane (quantize.cu GRMSQ_MAXK): wider heads run unfused
GATED_Q8_MAX_DV = 256


def _persistent(method):
    """CudaBackend methods whose allocations are long-lived (weights, states): made inside arena.persistent()."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.arena.persistent():
            return method(self, *args, **kwargs)
    return run


@dataclass(slots=True)
class Q8Matrix:
    """Q8_0 weights repacked at load: qs [rows, cols] int8 (16-byte aligned rows) and d [rows, cols/32] f16."""
    qs: DeviceTensor
    d: DeviceTensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.qs.shape


@dataclass(slots=True)
class QuantMatrix:
    """A block type other than Q8_0 (gguf_file.QUANT_BLOCKS) rewritten at load into per-row planes of its quants,
    body [rows, n_blocks * body_bytes] u8, and of its scales, head [rows, n_blocks * head_bytes] u8: the layout of
    cuda_src/quant_blocks.cuh (head None where a type has no head bytes)."""
    type_name: str
    body: DeviceTensor
    head: DeviceTensor | None
    shape: tuple[int, int]

    @property
    def type_id(self) -> int:
        return CMP_QUANT_TYPES[self.type_name]

    @property
    def head_ptr(self) -> int:
        return self.head.ptr if self.head is not None else 0


@dataclass(slots=True)
class CQ2Matrix:
    """The MTP draft's coarse head (CudaBackend.coarse_copy; cq2_ref.py's format): codes [rows, cols/4] u8 and
    scales [rows, cols/32 * 2] u8 (f16 values)."""
    codes: DeviceTensor
    scales: DeviceTensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * 4


@dataclass(slots=True)
class DenseMatrix:
    """f32 or f16 weights [rows, cols]."""
    w: DeviceTensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.w.shape


class CudaBackend(Backend):
    name = "cuda"
    captures_graphs = True
    # every type gguf_file loads (the IQ1-3 grid types' decoders: cuda_src/quant_blocks_iq.cuh)
    weight_types = frozenset({"F32", "F16", "BF16", "Q8_0", *CMP_QUANT_TYPES})

    MAX_FUSED = 4   # matrices per cmp_matmul_q8_multi launch
    GEMV_MAX_ROWS = 8  # rows cmp_matmul_q8_multi runs on its GEMV path (matmul_q8.cu GEMV_MAX_T), each row alone
    DENSE_GEMV_MAX_ROWS = 8  # the same for cmp_matmul_dense (dense.cu DENSE_GEMV_MAX_T)

    GDN_CHUNK = 64  # segments at least this long take the chunked GDN kernel (when gdn_chunked is on)

    def __init__(self, device: int = 0, arena_bytes: int | None = None, native: Native | None = None,
                 fuse_projections: bool = True, gdn_chunked: bool = True, fuse_ops: bool = True,
                 gemv_v2: bool = True, gemm_v2: bool = True, routes: _routes.Routes = _routes.DEFAULT):
        """arena_bytes: the most device memory this backend may take (default: what is free now, less 512 MiB).
        fuse_projections: Q8 projections of one input share one launch (off only to measure what it saves).
        gdn_chunked: prefill segments of >= GDN_CHUNK tokens use the chunked WY/UT delta-rule kernel (off: the
        sequential scan everywhere, the proven fallback).
        fuse_ops: the fused ops of base.Backend (RMSNorm / SwiGLU / sigmoid gate / gated RMSNorm writing Q8
        activations directly, residual adds in the projections' epilogue); off: the unfused kernels.
        gemv_v2, gemm_v2: the fused ops' projections use the v2 GEMV (T <= 16, batch invariant) and the 128x128
        GEMM (T >= 96) of matmul_q8.cu; off: the v1 kernels. All three are attributes that may be flipped later
        (benchmarks compare old and new; a faulty kernel can be switched off).
        routes: the unit each op family runs on (routes.Routes; an attribute that may be set later); a route this
        backend or this device cannot run is refused, naming it."""
        self.fuse_projections = fuse_projections
        self.gdn_chunked = gdn_chunked
        self.fuse_ops, self.gemv_v2, self.gemm_v2 = fuse_ops, gemv_v2, gemm_v2
        # With gemv_v2 on: gemv_pdl launches the GEMV with programmatic dependent launch on sm_90+ (it starts
        # streaming weights while the previous kernel finishes; below sm_90 a plain launch). An attribute that may
        # be flipped like the ones above. (The v3 / v4 GEMV switches are gone: v3 and v4 under v1's launch bound
        # lost to the GEMV kept, benchmarks/RESULTS.md 2026-11-30 14:18.)
        self.gemv_pdl = True
        self.native = native or Native()
        self.native.cmp_init(device)
        self.device = device
        # Which unit the quantized matmuls use (routes.py; set from the probe or --hw-route at load by pick_routes):
        # the GEMVs (T <= 16) take routes.matmul_decode, the GEMMs routes.matmul_prefill.
        self.routes = routes
        self.mma_gemm = "auto"
        self.launch_pdl = True
        free, _total = self.native.mem_info()
        self.arena = DeviceArena(self.native, arena_bytes if arena_bytes is not None else max(free - 512 * MIB, 0))
        self._state_arena = self.arena  # (a graph's capture swaps self.arena; per-token states outlive graphs)
        self.host_copies = HostCopies(self.native)      # the host-RAM prompt cache's copies (cuda_state.py)
        # set by cuda_graphs.RecordedGraph while it records a decode step (and by DecodeGraphs' eager steps):
        # attention splits sized for the whole context, Q8 projections in launches of at most GEMV_MAX_ROWS rows
        # (both: a row's result independent of the batch)
        self.capturing = False
        self._decode_order = False      # decode_order(): eager batches computed in the captured step's order

    @property
    def row_order(self) -> bool:
        """Rows computed as a captured decode step computes them: Q8 / dense projections in GEMV launches of a few
        rows (each row alone), attention splits sized for the whole context."""
        return self.capturing or self._decode_order

    @contextlib.contextmanager
    def decode_order(self):
        self._decode_order = True
        try:
            yield
        finally:
            self._decode_order = False

    # -- helpers ----------------------------------------------------------------------------------------------
    def empty(self, shape, dtype: str = "f32", what: str = "an activation") -> DeviceTensor:
        return DeviceTensor(self.arena, shape, dtype, what)

    def from_host(self, a: np.ndarray, dtype: str | None = None, what: str = "an input") -> DeviceTensor:
        dtype = dtype or {np.dtype(v): k for k, v in DTYPES.items()}[a.dtype]
        a = np.ascontiguousarray(a, dtype=DTYPES[dtype])
        t = self.empty(a.shape, dtype, what)
        if a.nbytes:
            self.native.cmp_memcpy_h2d(t.ptr, a.ctypes.data, a.nbytes)
        return t

    def copy_from_host(self, t: DeviceTensor, a: np.ndarray) -> None:
        """Overwrite all of `t` with `a` (converted to t's dtype; same number of elements)."""
        a = np.ascontiguousarray(a, dtype=DTYPES[t.dtype])
        if a.size != t.size:
            raise ValueError(f"copy_from_host: {a.size} elements into a tensor of {t.size}")
        self.native.cmp_memcpy_h2d(t.ptr, a.ctypes.data, a.nbytes)

    def zeros(self, shape, dtype: str, what: str) -> DeviceTensor:
        t = self.empty(shape, dtype, what)
        self.native.cmp_memset(t.ptr, 0, t.nbytes)
        return t

    # The routes this backend has kernels for, per Routes field (issue 20; the others are refused, not ignored).
    ROUTES_BUILT = {"matmul_prefill": ("dp4a", "dp2a", "imad", "mma"), "matmul_decode": ("dp4a", "dp2a", "imad"),
                    "attn_prefill": ("fp32", "mma"), "attn_decode": ("fp32",)}

    @property
    def routes(self) -> _routes.Routes:
        """Which unit each op family runs on; matmul_prefill "mma" multiplies the quantized projections of more
        tokens than the GEMV takes (8 or 16; Q8_0 and every expanded block type) on the tensor cores (mma_gemm:
        int8 mma.sync, matmul_mma.cu; Volta's f16 HMMA, matmul_hmma.cu); attn_prefill "mma" runs the dense prefill over f16 K and V caches with f16 mma.sync
        (attention_mma.cu: Q and the probabilities rounded to f16); the other cache types and block-sparse lists
        have no tensor-core kernel and keep the fp32 one."""
        return self._routes

    @routes.setter
    def routes(self, r: _routes.Routes) -> None:
        for field, built in self.ROUTES_BUILT.items():
            if getattr(r, field) not in built:
                raise ValueError(f"the CUDA backend has no {getattr(r, field)!r} route for {field} (built: "
                                 f"{', '.join(built)})")
        if r.matmul_prefill == "mma" and not self.native.mma_available():
            raise ValueError(f"the mma route for matmul_prefill needs tensor cores (int8 mma.sync from compute "
                             f"capability 7.5, f16 HMMA on 7.0) and this library's code for them; device "
                             f"{self.device} runs none (use dp4a)")
        if r.attn_prefill == "mma" and not self.native.attn_mma_available():
            raise ValueError(f"the mma route for attn_prefill needs f16 mma.sync (compute capability 8.0+), this "
                             f"library's code for it and 99 KB of shared memory per block; device {self.device} "
                             f"lacks them (use fp32)")
        self._routes = r

    MMA_GEMMS = ("auto", "hmma")

    @property
    def mma_gemm(self) -> str:
        """Which tensor-core GEMM the mma prefill route runs: "auto" the int8 mma.sync one where the device runs
        compute_75+ code, else (compute_70: V100, CMP 100-210) Volta's f16 HMMA one; "hmma" Volta's on any card
        whose code is compute_70+ (slow past sm_75: for the tests, which run it against the same reference)."""
        return self._mma_gemm

    @mma_gemm.setter
    def mma_gemm(self, kind: str) -> None:
        if kind not in self.MMA_GEMMS:
            raise ValueError(f"mma_gemm {kind!r}: not one of {', '.join(self.MMA_GEMMS)}")
        if kind == "hmma" and not self.native.hmma_available():
            raise ValueError(f"mma_gemm 'hmma': device {self.device} runs no compute_70+ code of this library "
                             f"(f16 HMMA mma.sync)")
        self._mma_gemm = kind

    def _route_bits(self) -> int:
        """The routes in cmp_matmul_q8_ex / cmp_matmul_quant's kernel bits: the int8 dots, and CMP_MM_MMA for the
        prefill GEMM on the tensor cores (with CMP_MM_MMA_F16 where mma_gemm asks for Volta's)."""
        if self._routes.matmul_prefill != "mma":
            return self._dot_bits()
        return self._dot_bits() | CMP_MM_MMA | (CMP_MM_MMA_F16 if self._mma_gemm == "hmma" else 0)

    @property
    def launch_pdl(self) -> bool:
        """Programmatic dependent launch of the small kernels (norms, gates, conv, scan, sampling; cmp_set_pdl): each
        may start while the kernel before it drains. On only where the device runs compute_90+ code (False
        elsewhere whatever was asked); may be flipped like the GEMV attributes (benchmarks compare both)."""
        return self._launch_pdl

    @launch_pdl.setter
    def launch_pdl(self, on: bool) -> None:
        self._launch_pdl = self.native.set_pdl(self.device, on)

    def synchronize(self) -> None:
        self.native.cmp_synchronize()

    @property
    def TENSOR_CORE_FAMILIES(self) -> frozenset:
        """The op families this build runs on tensor cores for this device: the prefill GEMM where the library has
        int8 mma code for it (matmul_mma.cu, compute_75+) or Volta's f16 HMMA code (matmul_hmma.cu, compute_70),
        the attention prefill where it has f16 mma code
        (attention_mma.cu, compute_80+); a route choosing `mma` elsewhere runs on the int8 dot / FP32 instead, and
        says so."""
        return frozenset(f for f, on in (("matmul_prefill", self.native.mma_available()),
                                         ("attn_prefill", self.native.attn_mma_available())) if on)

    def pick_routes(self, hw_route: str = "auto") -> list[str]:
        from . import probe
        from .routes import MMA_FAMILIES, RouteError, choose_routes, forced_routes, without_mma
        cur = ctypes.c_int(0)
        self.native.cmp_get_device(ctypes.byref(cur))
        self.activate()           # the probe times this backend's GPU; the caller's device is put back after
        try:
            result = probe.probe_device(self.native)
        finally:
            self.native.cmp_set_device(cur.value)
        if hw_route == "auto":
            routes, how = choose_routes(result.rates, result.cc), "probe"
        else:
            routes, how = forced_routes(hw_route, result.cc, result.card), f"--hw-route {hw_route}"
        wanted = {f for f in MMA_FAMILIES if getattr(routes, f) == "mma"}
        missing = sorted(wanted - self.TENSOR_CORE_FAMILIES)
        if missing:
            if hw_route == "mma" and len(missing) == len(wanted):
                raise RouteError(f"--hw-route mma: this build of libcmpkern.so has no tensor-core kernels for "
                                 f"{', '.join(missing)} on this device (its code is older than compute_70)")
            routes = without_mma(routes, missing)
            how += f"; tensor cores chosen, but this build has no tensor-core kernels for {', '.join(missing)}"
        self.routes, self.probe_report = routes, probe.as_json(result, routes, how)
        return probe.table_lines(result, routes, how)

    def device_memory(self) -> tuple[int, int]:
        return self.native.mem_info()[0], self.arena.cap

    def reserve_persistent(self, nbytes: int, what: str) -> None:
        self.arena.reserve(nbytes, what)

    def plan_quant_work(self, nbytes: int) -> None:
        self.QUANT_WORK_BYTES = nbytes

    def gemm_work_bytes(self, type_name: str, T: int, n: int, rows: int) -> int:
        return self.native.quant_work_bytes(CMP_QUANT_TYPES[type_name], T, n, rows, self._route_bits())

    def release_memory(self) -> None:
        """The arena's chunks go back to the driver (cudaFree) only when no block is in use: a tensor still alive
        (an -mm projector's weights) would otherwise point into freed memory; then the chunks stay and one line
        says how much."""
        self.host_copies.close()
        if self.arena.in_use:
            logging.getLogger("llamacmp.engine").warning(
                "sleeping: %.0f MiB of device memory are still in use, the arena keeps its %.0f MiB",
                self.arena.in_use / MIB, self.arena.reserved / MIB)
            return
        self.arena.close()

    def state_ops(self):
        return CudaStateOps(self)

    def _positions(self, batch: StepBatch) -> DeviceTensor:
        """batch.positions on the device, uploaded once per batch (kernels read positions there, for graphs)."""
        pos = batch.device.get("cuda_pos")
        if pos is None:
            pos = batch.device["cuda_pos"] = self.from_host(batch.positions.astype(np.int32), "i32", "positions")
        return pos

    # -- memory -------------------------------------------------------------------------------------------
    STAGING_BYTES = 64 << 20   # Q8_0 uploads go through one staging block of this size (memplan.STAGING_PIECE)

    @_persistent
    def upload_matrix(self, w):
        if isinstance(w, Q8Tensor):
            m = self._q8_matrix(*w.shape)
            self._fill_q8(m, w)
            return m
        if isinstance(w, QuantTensor):
            return self._upload_quant(w)
        w = np.asarray(w)
        dtype = "f16" if w.dtype == np.float16 else "f32"
        return DenseMatrix(self.from_host(w, dtype, f"weights {tuple(w.shape)}"))

    @_persistent
    def upload_matrices(self, ws):
        """Q8_0 matrices of one width one after another in memory (codes, and scales): the prefill GEMMs (DP4A and
        tensor cores) read such a run as one matrix in one launch (cuda_src/gemm_out.cuh), so small matrices stop
        costing a whole wave each. Other types need nothing: their GEMM expands a group into one workspace anyway."""
        if len(ws) < 2 or not all(isinstance(w, Q8Tensor) for w in ws) or len({w.shape[1] for w in ws}) > 1:
            return [self.upload_matrix(w) for w in ws]
        whole = self._q8_matrix(sum(w.shape[0] for w in ws), ws[0].shape[1])
        out, r0 = [], 0
        for w in ws:
            out.append(self._row_slice(whole, r0, w.shape[0]))
            self._fill_q8(out[-1], w)
            r0 += w.shape[0]
        return out

    def _q8_matrix(self, rows: int, cols: int) -> Q8Matrix:
        return Q8Matrix(self.empty((rows, cols), "i8", f"Q8_0 weights [{rows}, {cols}]"),
                        self.empty((rows, cols // Q8_0_BLOCK), "f16", f"Q8_0 scales [{rows}, {cols // 32}]"))

    def _fill_q8(self, m: Q8Matrix, w: Q8Tensor) -> None:
        """w's blocks repacked into m. Row pieces through one fixed-size staging block (the same block every time,
        from the free list): staging a whole matrix would leave a dead block of every matrix size behind (1 GiB for
        the output)."""
        rows, cols = w.shape
        row_bytes = cols // Q8_0_BLOCK * 34
        step = max(1, self.STAGING_BYTES // row_bytes)
        staging = self.empty((max(self.STAGING_BYTES, row_bytes),), "u8", "the Q8_0 upload staging block")
        blocks = w.blocks.reshape(rows, row_bytes)
        for r0 in range(0, rows, step):
            piece = np.ascontiguousarray(blocks[r0:r0 + step])
            self.native.cmp_memcpy_h2d(staging.ptr, piece.ctypes.data, piece.nbytes)
            self.native.cmp_q8_repack(staging.ptr, m.qs.row_ptr(r0), m.d.row_ptr(r0), len(piece), cols)

    def _upload_quant(self, w: QuantTensor) -> QuantMatrix:
        """The file's blocks in row pieces through the staging block, split on the device (cmp_quant_repack)."""
        rows, cols = w.shape
        tid = CMP_QUANT_TYPES[w.type_name]
        bv, nbytes, body_b, head_b = self.native.quant_layout(tid)
        nb = cols // bv
        what = f"{w.type_name} weights [{rows}, {cols}]"
        body = self.empty((rows, nb * body_b), "u8", what)
        head = self.empty((rows, nb * head_b), "u8", what + " (scales)") if head_b else None
        row_bytes = nb * nbytes
        step = max(1, self.STAGING_BYTES // row_bytes)
        staging = self.empty((max(self.STAGING_BYTES, row_bytes),), "u8", f"the {w.type_name} upload staging block")
        blocks = w.blocks.reshape(rows, row_bytes)
        for r0 in range(0, rows, step):
            piece = np.ascontiguousarray(blocks[r0:r0 + step])
            self.native.cmp_memcpy_h2d(staging.ptr, piece.ctypes.data, piece.nbytes)
            self.native.cmp_quant_repack(tid, staging.ptr, body.row_ptr(r0), head.row_ptr(r0) if head else 0,
                                         len(piece), cols)
        return QuantMatrix(w.type_name, body, head, (rows, cols))

    def row_prefix(self, w, n: int):
        return self._row_slice(w, 0, n)

    @staticmethod
    def _row_slice(w, r0: int, n: int):
        """Rows r0 .. r0 + n - 1 of an uploaded matrix, a view of its memory (every layout keeps rows in order)."""
        if isinstance(w, Q8Matrix):
            return Q8Matrix(w.qs.rows(r0, n), w.d.rows(r0, n))
        if isinstance(w, QuantMatrix):
            head = w.head.rows(r0, n) if w.head is not None else None
            return QuantMatrix(w.type_name, w.body.rows(r0, n), head, (n, w.shape[1]))
        if isinstance(w, CQ2Matrix):
            return CQ2Matrix(w.codes.rows(r0, n), w.scales.rows(r0, n))
        return DenseMatrix(w.w.rows(r0, n))

    @_persistent
    def upload_vector(self, w):
        return self.from_host(np.asarray(w, np.float32), "f32", f"weights {tuple(np.shape(w))}")

    @_persistent
    def new_state(self, cfg: ModelConfig, n_ctx: int, kv_type: str = "f16", v_type: str | None = None) -> SeqState:
        v_type = v_type or kv_type
        for t in (kv_type, v_type):
            if t not in CMP_KV_TYPES:
                raise ValueError(f"KV cache type '{t}' is not supported by the CUDA backend ({', '.join(CMP_KV_TYPES)})")
        if (v_type != kv_type or kv_type not in _KV_CODES) and cfg.head_dim not in self.V2_HEAD_DIMS:
            # refused here, before any compute, rather than at the first attention call
            raise ValueError(self._kv_type_head_dim_error(kv_type, v_type, cfg.head_dim))
        n_attn, n_gdn = len(cfg.attn_layers), len(cfg.gdn_layers)
        return SeqState(
            n_ctx=n_ctx,
            k=[self._kv_cache(cfg, n_ctx, kv_type, "K") for _ in range(n_attn)],
            v=[self._kv_cache(cfg, n_ctx, v_type, "V") for _ in range(n_attn)],
            conv=[self.zeros((cfg.conv_kernel - 1, cfg.conv_channels), "f32", "the GDN conv state")
                  for _ in range(n_gdn)],
            ssm=[self.zeros((cfg.ssm_v_heads, cfg.ssm_head_dim, cfg.ssm_head_dim), "f32", "the GDN recurrent state")
                 for _ in range(n_gdn)],
            k_type=kv_type, v_type=v_type,
        )

    def _kv_cache(self, cfg: ModelConfig, n_ctx: int, kv_type: str, which: str) -> DeviceTensor:
        """One layer's K or V cache: [n_ctx, Hk, Dh] of f32/f16, or [n_ctx, Hk, row bytes] u8 for the quantized
        types (kv_layout.py; kv_layout.row_bytes(type, Dh) == cmp_kv_row_bytes)."""
        what = f"the {kv_type} {which} cache for n_ctx={n_ctx}"
        if kv_type in _KV_CODES:
            return self.zeros((n_ctx, cfg.n_head_kv, cfg.head_dim), kv_type, what)
        return self.zeros((n_ctx, cfg.n_head_kv, kv_layout.row_bytes(kv_type, cfg.head_dim)), "u8", what)

    def kv_rows_raw(self, t: DeviceTensor, n: int) -> np.ndarray:
        """The first n rows of a KV cache as stored (f32 / f16 values or the quantized bytes): what a host copy
        (prompt cache, slot file) keeps and copies back byte for byte."""
        out = np.empty((n,) + t.shape[1:], DTYPES[t.dtype])
        if out.nbytes:
            self.native.cmp_memcpy_d2h(out.ctypes.data, t.ptr, out.nbytes)
        return out

    def state_to_host(self, state: SeqState) -> dict[str, list[np.ndarray]]:
        """KV rows as float32 [n_past, Hk, Dh] (quantized caches decoded: what attention reads), GDN states."""
        n = state.n_past

        def kv(a: DeviceTensor, kv_type: str) -> np.ndarray:
            if kv_type in _KV_CODES:
                return self._rows_to_host(a, n)
            return kv_layout.decode(self.kv_rows_raw(a, n), kv_type, kv_layout.head_dim_of(kv_type, a.shape[2]))
        return {"k": [kv(a, state.k_type) for a in state.k], "v": [kv(a, state.v_type) for a in state.v],
                "conv": [self.to_host(a) for a in state.conv], "ssm": [self.to_host(a) for a in state.ssm]}

    def _rows_to_host(self, t: DeviceTensor, n: int) -> np.ndarray:
        out = np.empty((n,) + t.shape[1:], DTYPES[t.dtype])
        if out.nbytes:
            self.native.cmp_memcpy_d2h(out.ctypes.data, t.ptr, out.nbytes)
        return out.astype(np.float32, copy=False)

    def to_host(self, x) -> np.ndarray:
        if isinstance(x, DenseMatrix):
            x = x.w
        return self._rows_to_host(x, x.shape[0]) if x.shape else np.zeros((), np.float32)

    # -- row-wise ops ---------------------------------------------------------------------------------------
    def _index_tensor(self, idx, what: str) -> DeviceTensor:
        """Host indices are uploaded; a DeviceTensor of int32 (a captured graph's input buffer) is used as is."""
        return idx if isinstance(idx, DeviceTensor) else self.from_host(np.asarray(idx, np.int32), "i32", what)

    def embed(self, table, ids):
        ids_d = self._index_tensor(ids, "token ids")
        T, D = ids_d.shape[0], table.shape[1]
        out = self.empty((T, D))
        if isinstance(table, Q8Matrix):
            self.native.cmp_embed_q8(ids_d.ptr, table.qs.ptr, table.d.ptr, out.ptr, T, D)
        elif isinstance(table, QuantMatrix):
            self.native.cmp_embed_quant(table.type_id, ids_d.ptr, table.body.ptr, table.head_ptr, out.ptr, T, D)
        else:
            self.native.cmp_embed_f(ids_d.ptr, table.w.ptr, _KV_CODES[table.w.dtype], out.ptr, T, D)
        return out

    def rmsnorm(self, x, w, eps):
        T, D = x.shape
        y = self.empty((T, D))
        self.native.cmp_rmsnorm(x.ptr, w.ptr, y.ptr, T, D, eps)
        return y

    def quantize(self, x: DeviceTensor) -> tuple[DeviceTensor, DeviceTensor]:
        """x [T, n] -> (q [T, n] int8, d [T, n/32] f32), shared by every Q8 projection of x."""
        T, n = x.shape
        q, d = self.empty((T, n), "i8"), self.empty((T, n // Q8_0_BLOCK), "f32")
        self.native.cmp_quantize_q8(x.ptr, q.ptr, d.ptr, T, n)
        return q, d

    # -- fused ops (base.Backend) -------------------------------------------------------------------------------
    # The producer of a projection's input writes its Q8 activations directly, and residual adds happen in the
    # projection's epilogue: per decode layer 6 launches fewer than rmsnorm, quantize, matmul, ..., add.
    GEMV2_MAX_ROWS = 16  # rows the v2 GEMV takes in one launch (matmul_q8.cu GEMV2_MAX_T; the v1 GEMV takes 8)
    CONCAT_TABLE_MIN = 8     # concat along rows: from this many pieces, one cmp_copy_regions launch
    COPY_REGIONS_MAX = 65535  # regions one cmp_copy_regions launch takes (api.h)

    def _fusable(self, ws: Sequence, n: int) -> bool:
        return self.fuse_ops and n % Q8_0_BLOCK == 0 and all(isinstance(w, (Q8Matrix, QuantMatrix)) for w in ws)

    def _q8_project(self, xq: DeviceTensor, xd: DeviceTensor, ws: Sequence, residuals: Sequence | None = None):
        """Q8 activations (xq [T, n] int8, xd [T, n/32] f32) times Q8 weights ws[i] [rows_i, n] -> [T, rows_i],
        plus residuals[i] [T, rows_i] where given; MAX_FUSED matrices per launch (cmp_matmul_q8_ex)."""
        T, n = xq.shape
        outs = []
        for i, w in enumerate(ws):
            if w.shape[1] != n:
                raise ValueError(f"matmul: input has {n} columns, weight {w.shape} expects {w.shape[1]}")
            if residuals is not None and residuals[i].shape != (T, w.shape[0]):
                raise ValueError(f"matmul: residual {residuals[i].shape} for an output of {(T, w.shape[0])}")
            outs.append(self.empty((T, w.shape[0])))
        kernels = (CMP_MM_GEMV2 if self.gemv_v2 else 0) | (CMP_MM_GEMM2 if self.gemm_v2 else 0) | self._route_bits()
        if self.gemv_v2 and self.gemv_pdl:
            kernels |= CMP_MM_GEMV_PDL
        # A captured decode step launches at most as many rows as the GEMV takes: it computes each row in the
        # single-row order (v2: guaranteed, matmul_q8.cu), so a sequence's logits do not depend on the others.
        step = max(1, min(T, self.GEMV2_MAX_ROWS if self.gemv_v2 else 8)) if self.row_order else max(T, 1)
        for idx in self._launch_groups(ws):
            k = len(idx)
            for t0 in range(0, T, step):
                res = None if residuals is None else (ctypes.c_void_p * k)(*(residuals[i].row_ptr(t0) for i in idx))
                if isinstance(ws[idx[0]], QuantMatrix):
                    self._quant_launch(xq, xd, [ws[i] for i in idx], [outs[i] for i in idx], res, t0,
                                       min(step, T - t0))
                    continue
                self.native.cmp_matmul_q8_ex(
                    xq.row_ptr(t0), xd.row_ptr(t0), k, (ctypes.c_void_p * k)(*(ws[i].qs.ptr for i in idx)),
                    (ctypes.c_void_p * k)(*(ws[i].d.ptr for i in idx)),
                    (ctypes.c_void_p * k)(*(outs[i].row_ptr(t0) for i in idx)), res,
                    (ctypes.c_int * k)(*(ws[i].shape[0] for i in idx)), min(step, T - t0), n, kernels)
        return outs

    def _dot_bits(self) -> int:
        """The routes' int8 dots in cmp_matmul_q8_ex / cmp_matmul_quant's kernel bits (api.h CmpMatmulDotField). With
        the matmul prefill on `mma` (set by pick_routes only where TENSOR_CORE_FAMILIES has it), a GEMM the
        tensor-core kernels leave to the int8 kernels runs on DP4A."""
        prefill = self.routes.matmul_prefill if self.routes.matmul_prefill != "mma" else "dp4a"
        return (CMP_DOTS[self.routes.matmul_decode] << CMP_MM_GEMV_DOT_SHIFT
                | CMP_DOTS[prefill] << CMP_MM_GEMM_DOT_SHIFT)

    def _launch_groups(self, ws: Sequence) -> list[list[int]]:
        """Indices of ws in launches: matrices of one kind (Q8_0, or one block type) together, MAX_FUSED at most
        (1 without fuse_projections), in order of first appearance."""
        kinds: dict[str, list[int]] = {}
        for i, w in enumerate(ws):
            kinds.setdefault(w.type_name if isinstance(w, QuantMatrix) else "Q8_0", []).append(i)
        group = self.MAX_FUSED if self.fuse_projections else 1
        return [idx[g0:g0 + group] for idx in kinds.values() for g0 in range(0, len(idx), group)]

    # workspace of one cmp_matmul_quant GEMM call at most (more rows: in chunks); the memory plan's where it made one
    # (plan_quant_work: a layer's largest run in one pass, where that fits)
    QUANT_WORK_BYTES = QUANT_WORK_PIECE

    def _quant_launch(self, xq, xd, ws: Sequence["QuantMatrix"], outs: Sequence[DeviceTensor], res, t0: int,
                      tn: int) -> None:
        """cmp_matmul_quant over rows [t0, t0 + tn) of the Q8 activations for matrices of one block type; above the
        GEMV's 16 rows a workspace for the expanded weights (QUANT_WORK_BYTES, or what 128 rows need if more; the
        half sums alone where the GEMM reads the type's planes)."""
        n, k, tid, bits = xq.shape[1], len(ws), ws[0].type_id, self._route_bits()
        work, work_bytes = 0, 0
        if tn > self.GEMV2_MAX_ROWS:
            rows = sum(w.shape[0] for w in ws)   # the GEMMs expand them all into one run (gemm_quant_run)
            work_bytes = max(min(self.native.quant_work_bytes(tid, tn, n, rows, bits), self.QUANT_WORK_BYTES),
                             self.native.quant_work_bytes(tid, tn, n, 1, bits))
            work_t = self.empty((work_bytes,), "u8", f"the {ws[0].type_name} GEMM workspace")
            work = work_t.ptr
        self.native.cmp_matmul_quant(
            tid, xq.row_ptr(t0), xd.row_ptr(t0), k, (ctypes.c_void_p * k)(*(w.body.ptr for w in ws)),
            (ctypes.c_void_p * k)(*(w.head_ptr for w in ws)), (ctypes.c_void_p * k)(*(o.row_ptr(t0) for o in outs)),
            res, (ctypes.c_int * k)(*(w.shape[0] for w in ws)), tn, n, work, work_bytes, bits)

    def _q8_buffers(self, T: int, n: int) -> tuple[DeviceTensor, DeviceTensor]:
        return self.empty((T, n), "i8"), self.empty((T, n // Q8_0_BLOCK), "f32")

    def rmsnorm_matmuls(self, x, w, eps, ws):
        T, D = x.shape
        if not self._fusable(ws, D):
            return super().rmsnorm_matmuls(x, w, eps, ws)
        q, d = self._q8_buffers(T, D)
        self.native.cmp_rmsnorm_q8(x.ptr, w.ptr, q.ptr, d.ptr, T, D, eps)
        return self._q8_project(q, d, ws)

    def matmul_add(self, x, w, residual):
        if not self._fusable([w], x.shape[1]):
            return super().matmul_add(x, w, residual)
        return self._q8_project(*self.quantize(x), [w], [residual])[0]

    def _binary_matmul_add(self, op: int, a, b, w, residual, fallback):
        if a.shape != b.shape:
            raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
        T, n = a.shape
        if not self._fusable([w], n):
            return fallback(a, b, w, residual)
        q, d = self._q8_buffers(T, n)
        self.native.cmp_binary_q8(a.ptr, b.ptr, op, q.ptr, d.ptr, T, n)
        return self._q8_project(q, d, [w], [residual])[0]

    def swiglu_matmul_add(self, gate, up, w, residual):
        return self._binary_matmul_add(CMP_BINARY_SWIGLU, gate, up, w, residual, super().swiglu_matmul_add)

    def sigmoid_mul_matmul_add(self, x, gate, w, residual):
        return self._binary_matmul_add(CMP_BINARY_SIGMOID_MUL, x, gate, w, residual, super().sigmoid_mul_matmul_add)

    def gated_rmsnorm_matmul_add(self, o, z, norm_w, eps, head_dim, w, residual):
        T, n = o.shape
        fits = head_dim % Q8_0_BLOCK == 0 and head_dim <= GATED_Q8_MAX_DV
        if not (self._fusable([w], n) and fits) or z.shape != o.shape:
            return super().gated_rmsnorm_matmul_add(o, z, norm_w, eps, head_dim, w, residual)
        q, d = self._q8_buffers(T, n)
        self.native.cmp_gated_rmsnorm_q8(o.ptr, z.ptr, norm_w.ptr, q.ptr, d.ptr, T, n // head_dim, head_dim, eps)
        return self._q8_project(q, d, [w], [residual])[0]

    def matmuls(self, x, ws: Sequence):
        T, n = x.shape
        outs = []
        for w in ws:
            if w.shape[1] != n:
                raise ValueError(f"matmul: input has {n} columns, weight {w.shape} expects {w.shape[1]}")
            outs.append(self.empty((T, w.shape[0])))
        q8 = [i for i, w in enumerate(ws) if isinstance(w, Q8Matrix)]
        quant = [i for i, w in enumerate(ws) if isinstance(w, QuantMatrix)]
        if q8 or quant:
            xq, xd = self.quantize(x)
        if quant:   # the batch-invariant GEMV (16 rows a launch in a captured step) or the GEMM, as fused ops do
            for i, o in zip(quant, self._q8_project(xq, xd, [ws[i] for i in quant])):
                outs[i] = o
        if q8:
            group = self.MAX_FUSED if self.fuse_projections else 1
            # A captured decode step launches at most GEMV_MAX_ROWS rows at a time: the GEMV computes each row with
            # the single-row reduction order, so a sequence's logits do not depend on which others share the step
            # (the tiled GEMM for more rows sums in another order).
            step = max(1, min(T, self.GEMV_MAX_ROWS) if self.row_order else T)
            for g0 in range(0, len(q8), group):
                idx = q8[g0:g0 + group]
                k = len(idx)
                for t0 in range(0, T, step):
                    tn = min(step, T - t0)
                    self.native.cmp_matmul_q8_ex(    # the v1 kernels (cmp_matmul_q8_multi's) on the routes' dots
                        xq.row_ptr(t0), xd.row_ptr(t0), k,
                        (ctypes.c_void_p * k)(*(ws[i].qs.ptr for i in idx)),
                        (ctypes.c_void_p * k)(*(ws[i].d.ptr for i in idx)),
                        (ctypes.c_void_p * k)(*(outs[i].row_ptr(t0) for i in idx)), None,
                        (ctypes.c_int * k)(*(ws[i].shape[0] for i in idx)), tn, n, self._route_bits())
        # Dense (f32 / f16) weights: cmp_matmul_dense's GEMV takes up to DENSE_GEMV_MAX_ROWS rows, each summed alone;
        # a captured decode step stays within it for the same batch invariance as the Q8 path above.
        dense_step = max(1, min(T, self.DENSE_GEMV_MAX_ROWS) if self.row_order else T)
        for i, w in enumerate(ws):
            if isinstance(w, DenseMatrix):
                for t0 in range(0, T, dense_step):
                    self.native.cmp_matmul_dense(x.row_ptr(t0), w.w.ptr, _KV_CODES[w.w.dtype], outs[i].row_ptr(t0),
                                                 min(dense_step, T - t0), w.shape[0], n)
        return outs

    def _binary(self, fn, x, y):
        if x.shape != y.shape:
            raise ValueError(f"shape mismatch {x.shape} vs {y.shape}")
        out = self.empty(x.shape)
        fn(x.ptr, y.ptr, out.ptr, x.size)
        return out

    def add(self, x, y):
        return self._binary(self.native.cmp_add, x, y)

    def swiglu(self, gate, up):
        return self._binary(self.native.cmp_swiglu, gate, up)

    def sigmoid_mul(self, x, gate):
        return self._binary(self.native.cmp_sigmoid_mul, x, gate)

    def rows(self, x, start, n):
        return x.rows(start, n)

    def write_rows(self, dst, at, src, start, n):
        out, rows = dst.rows(at, n), src.rows(start, n)          # (bounds-checked views: the copy's addresses)
        if out.shape != rows.shape or out.dtype != rows.dtype:
            raise ValueError(f"write_rows: rows {rows.shape} {rows.dtype} into {out.shape} {out.dtype}")
        self.native.cmp_memcpy_d2d(out.ptr, rows.ptr, out.nbytes)
        return out

    def copy_rows(self, x, start, n):
        src = x.rows(start, n)
        out = self.empty(src.shape, x.dtype)
        self.native.cmp_memcpy_d2d(out.ptr, src.ptr, out.nbytes)
        return out

    def gather_rows(self, x, rows):
        rows_d = self._index_tensor(rows, "row indices")
        R = rows_d.shape[0]
        out = self.empty((R,) + x.shape[1:])
        self.native.cmp_gather_rows(x.ptr, rows_d.ptr, out.ptr, R, x.size // x.shape[0])
        return out

    # -- attention -------------------------------------------------------------------------------------------
    def attention_prep(self, qg, k, q_norm, k_norm, batch, cfg):
        T, Hq, Dh = qg.shape[0], cfg.n_head, cfg.head_dim
        q_out, gate = self.empty((T, Hq, Dh)), self.empty((T, Hq * Dh))
        k_out = self._prep(qg.ptr, q_norm.ptr, q_out.ptr, gate.ptr, Hq, k, k_norm, batch, cfg)
        return q_out, k_out, gate

    def key_prep(self, k, k_norm, batch, cfg):
        return self._prep(0, 0, 0, 0, 0, k, k_norm, batch, cfg)     # (the kernels take Hq = 0: k heads alone)

    def _prep(self, qg: int, q_norm: int, q_out: int, gate: int, Hq: int, k, k_norm, batch, cfg):
        """attention_prep's kernel over Hq q heads at the pointers given (0 of them: none) and the k heads -> k."""
        T, Hk, Dh = k.shape[0], cfg.n_head_kv, cfg.head_dim
        k_out = self.empty((T, Hk, Dh))
        if batch.rope_pos is not None:      # IMROPE at per-token (t, h, w, e) positions (image batches)
            pos4 = batch.device.get("cuda_rope_pos")
            if pos4 is None:
                pos4 = batch.device["cuda_rope_pos"] = self._rope_pos(batch.rope_pos, T, "image rotary positions")
            s = (tuple(cfg.rope_sections) + (0, 0, 0, 0))[:4]
            self.native.cmp_attention_prep_mrope(qg, k.ptr, q_norm, k_norm.ptr, pos4.ptr, q_out, k_out.ptr, gate, T,
                                                 Hq, Hk, Dh, cfg.n_rot, *s, cfg.rope_base, cfg.rms_eps)
        else:
            self.native.cmp_attention_prep(qg, k.ptr, q_norm, k_norm.ptr, self._positions(batch).ptr, q_out,
                                           k_out.ptr, gate, T, Hq, Hk, Dh, cfg.n_rot, cfg.rope_base, cfg.rms_eps)
        return k_out

    DECODE_MAX_L = 8               # segments of at most this many tokens take the split-K decode kernel
    # Head dims of the v2 kernels (cmp_attn_prefill / cmp_attn_decode, every KV type). The round-1 kernel
    # (cmp_attention) takes 32, 96 and 192, f16/f32 caches of one type; it lost to v2 at these three.
    V2_HEAD_DIMS = (64, 128, 256)

    def _kv_type_head_dim_error(self, k_type: str, v_type: str, head_dim: int) -> str:
        """What the user reads when a quantized or mixed K/V cache meets a head dim only the round-1 kernels
        take: the problem, then the fix."""
        return (f"KV cache -ctk {k_type} -ctv {v_type} is not supported by the CUDA backend for this model's head "
                f"dim {head_dim}: quantized or mixed K/V types need the v2 attention kernels, which take head dims "
                f"{', '.join(map(str, self.V2_HEAD_DIMS))}; use one f16 or f32 type for both (-ctk f16 -ctv f16)")

    def attention(self, q, k, v, batch, layer, cfg, block_lists=None):
        """block_lists: None, or per segment None / (blocks [Hk, nqb, max_blocks], counts [Hk, nqb]) int32 (host
        arrays or device tensors; api.h cmp_attn_prefill) for a block-sparse prefill of that segment. Without
        them a prefill segment asks sparse_lists (when block-sparse prefill is configured)."""
        T, Hq, Dh = q.shape
        Hk = cfg.n_head_kv
        if Dh in self.V2_HEAD_DIMS:
            return self._attention_v2(q, k, v, batch, layer, cfg, block_lists)
        if block_lists is not None and any(b is not None for b in block_lists):
            raise ValueError(f"block-sparse prefill needs the v2 attention kernels (head dim {Dh})")
        self.kv_write(k, v, batch, layer, cfg)
        pos = self._positions(batch)
        out = self.empty((T, Hq * Dh))
        for seg in batch.segments:
            st, L = seg.state, seg.length
            kc, vc = st.k[layer], st.v[layer]
            code = _KV_CODES[kc.dtype]
            pos_ptr = pos.row_ptr(seg.start)
            n_split = self._n_split(L, Hq, Hk, st.n_ctx if self.row_order else st.n_past + L)
            work = self.empty((n_split, L * Hq, Dh + 2), what="attention split-K partials") if n_split > 1 else None
            self.native.cmp_attention(q.row_ptr(seg.start), kc.ptr, vc.ptr, code, pos_ptr, out.row_ptr(seg.start),
                                      work.ptr if work is not None else None, L, Hq, Hk, Dh, 1.0 / math.sqrt(Dh),
                                      n_split)
        return out

    def _attention_v2(self, q, k, v, batch, layer, cfg, block_lists):
        T, Hq, Dh = q.shape
        Hk = cfg.n_head_kv
        self.kv_write(k, v, batch, layer, cfg)
        pos = self._positions(batch)
        out = self.empty((T, Hq * Dh))
        scale = 1.0 / math.sqrt(Dh)
        for i, seg in enumerate(batch.segments):
            st, L = seg.state, seg.length
            kc, vc = st.k[layer], st.v[layer]
            kt, vt = CMP_KV_TYPES[st.k_type], CMP_KV_TYPES[st.v_type]
            pos_ptr = pos.row_ptr(seg.start)
            lists = block_lists[i] if block_lists is not None else None
            if lists is None and L > self.DECODE_MAX_L and getattr(self, "sparse", None) is not None:
                lists = self.sparse_lists(q, seg, layer, cfg)
            if lists is None and L <= self.DECODE_MAX_L and Hq // Hk <= 8:
                # The grid covers every row up to the context the step may reach; each row uses its own split
                # count (a function of its own key count, computed on the device): batch- and graph-invariant.
                n_split = self.decode_splits(st.n_ctx if self.capturing else st.n_past + L)
                work = self.empty((n_split, L * Hq, Dh + 2), what="attention split-K partials") if n_split > 1 else None
                self.native.cmp_attn_decode(q.row_ptr(seg.start), kc.ptr, vc.ptr, kt, vt, pos_ptr,
                                            out.row_ptr(seg.start), work.ptr if work is not None else None, L, Hq,
                                            Hk, Dh, scale, n_split)
                continue
            if lists is None and self._routes.attn_prefill == "mma" and st.k_type == st.v_type == "f16":
                self.native.cmp_attn_prefill_mma(q.row_ptr(seg.start), kc.ptr, vc.ptr, pos_ptr,
                                                 out.row_ptr(seg.start), L, Hq, Hk, Dh, scale)
                continue
            blocks = counts = None
            max_blocks = 0
            if lists is not None:
                blocks, counts = lists[0], lists[1]
                if isinstance(blocks, np.ndarray):
                    blocks = self.from_host(np.ascontiguousarray(blocks, np.int32), "i32", "sparse block lists")
                    counts = self.from_host(np.ascontiguousarray(counts, np.int32), "i32", "sparse block counts")
                nqb = (st.n_past + L - 1) // 64 - st.n_past // 64 + 1
                if blocks.shape[:2] != (Hk, nqb) or counts.shape != (Hk, nqb):
                    raise ValueError(f"block lists {blocks.shape} / counts {counts.shape} for {Hk} kv heads and "
                                     f"{nqb} query blocks")
                max_blocks = blocks.shape[2]
            # every head dim fits every card: cmp_attn_prefill takes fewer rows per block where shared memory is
            # short (smem_plan.h)
            self.native.cmp_attn_prefill(q.row_ptr(seg.start), kc.ptr, vc.ptr, kt, vt, pos_ptr,
                                         out.row_ptr(seg.start), L, Hq, Hk, Dh, scale,
                                         blocks.ptr if blocks is not None else None,
                                         counts.ptr if counts is not None else None, max_blocks)
        return out

    def kv_write(self, k, v, batch, layer, cfg):
        """Each segment's rows at the rows its device positions name (the positions a captured graph's replay
        uploads): the v2 kernels' write (every KV type) at their head dims, else the round-1 kernel's (one f16 or
        f32 type for both)."""
        Hk, Dh = cfg.n_head_kv, cfg.head_dim
        v2 = Dh in self.V2_HEAD_DIMS
        if not v2:
            for seg in batch.segments:
                if seg.state.k_type not in _KV_CODES or seg.state.v_type != seg.state.k_type:
                    raise ValueError(self._kv_type_head_dim_error(seg.state.k_type, seg.state.v_type, Dh))
        pos = self._positions(batch)
        for seg in batch.segments:
            st = seg.state
            ptrs = (k.row_ptr(seg.start), v.row_ptr(seg.start), pos.row_ptr(seg.start), st.k[layer].ptr,
                    st.v[layer].ptr)
            if v2:
                self.native.cmp_kv_write_q(*ptrs, CMP_KV_TYPES[st.k_type], CMP_KV_TYPES[st.v_type], seg.length, Hk,
                                           Dh)
            else:
                self.native.cmp_kv_write(*ptrs, _KV_CODES[st.k[layer].dtype], seg.length, Hk, Dh)

    def decode_splits(self, n_kv: int) -> int:
        """The split-K grid that covers rows of up to n_kv keys (cmp_attn_decode_splits)."""
        return self.native.attn_decode_splits(max(1, n_kv))

    @staticmethod
    def _n_split(L: int, Hq: int, Hk: int, n_kv: int) -> int:
        """Split the keys across blocks when the rows alone give too few blocks to fill the GPU (decode)."""
        blocks = -(-L * (Hq // Hk) // 16) * Hk
        if blocks >= 256 or n_kv < 512:
            return 1
        return max(1, min(64, n_kv // 256, -(-256 // blocks)))

    # -- block-sparse prefill (sparse_attn; the lists go to cmp_attn_prefill) -----------------------------------
    # True: the selection runs on the device (cmp_sparse_select, the host's choice exactly: tests/test_sparse_cuda.py
    # passed on an H200, 2026-11-30 11:37) instead of on the host from copied statistics; one sparse attention
    # layer at 128K took 2.83 s instead of 3.60 s (benchmarks/RESULTS.md, session 3).
    sparse_device_select = True

    def sparse_lists(self, q: DeviceTensor, seg: Segment, layer: int, cfg: ModelConfig):
        """After this segment's keys are in the cache: its block lists for cmp_attn_prefill -> (blocks [Hk, nqb,
        max_blocks] int32, counts [Hk, nqb] int32, max_blocks) on the device, or None when the chunk stays dense
        (sparse off, below sparse.min_len keys, fewer rows than a block, or a decode graph being captured).
        The probe statistics come from cmp_sparse_probe (a few small kernels); the choice is sparse_attn's, on
        the host, on [Hq, G, nkb] arrays (G = probe rows + query blocks, nkb = keys / 64)."""
        from .. import sparse_attn as sa
        sp, st, L = self.sparse, seg.state, seg.length
        if sp is None or self.capturing:
            return None
        if self.sparse_stats is None:
            self.sparse_stats = sa.SparseStats()
        p0 = st.n_past
        if p0 + L < sp.min_len or L < sp.block:
            self.sparse_stats.chunks_dense += 1
            return None
        Hq, Hk, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
        chunk = sa.Chunk(p0, L, sp.block)
        rows = sa.probe_rows(L, sp.probe)
        start, end, limit = chunk.groups(rows)
        G, nkb = len(start), chunk.nkb
        g_d = self.from_host(np.stack([start, end, limit]).astype(np.int32), "i32", "sparse probe groups")
        mass = self.empty((Hq, G, nkb), what="sparse probe mass")
        mean = self.empty((Hq, G, nkb), what="sparse probe scores")
        work = self.empty((G * Hq * Dh + 4 * Hq * G * nkb,), what="sparse probe scratch")
        self.native.cmp_sparse_probe(q.row_ptr(seg.start), st.k[layer].ptr, CMP_KV_TYPES[st.k_type],
                                     g_d.ptr, g_d.row_ptr(1), g_d.row_ptr(2), mass.ptr, mean.ptr, work.ptr, L, G,
                                     Hq, Hk, Dh, 1.0 / math.sqrt(Dh), nkb, p0 + L)
        group = Hq // Hk
        if self.sparse_device_select and sp.per_kv_head:
            # the selection on the device (cmp_sparse_select, same choice): only pattern and counts come back
            args = sa.select_args(rows, chunk, sp)
            P, nqb = len(rows), chunk.nqb
            pattern_d = self.empty((Hk,), "i32", "sparse patterns")
            blocks = self.empty((Hk, nqb, nkb), "i32", "sparse block lists")
            counts = self.empty((Hk, nqb), "i32", "sparse block counts")
            sel_work = self.empty((sa.select_work_bytes(Hk, P, nqb, nkb),), "u8", "sparse selection scratch")
            pqb = self.from_host(args["pqb"], "i32", "sparse probe blocks")
            self.native.cmp_sparse_select(mass.ptr, mean.ptr, pqb.ptr, pattern_d.ptr, blocks.ptr, counts.ptr,
                                          sel_work.ptr, Hq, Hk, P, nqb, nkb, chunk.qb0, args["keep"], args["sink"],
                                          args["total"])
            self.sparse_stats.add_lists(self.to_host(pattern_d), self.to_host(counts), chunk)
            return blocks, counts, nkb
        pattern, mask = sa.select_from_stats(self.to_host(mass), self.to_host(mean), rows, chunk, sp,
                                             group if sp.per_kv_head else 1)
        if not sp.per_kv_head:        # one list per kv head: the union of its q heads' lists
            mask = mask.reshape(Hk, group, *mask.shape[1:]).any(1)
        self.sparse_stats.add(pattern, mask, chunk)
        blocks, counts = sa.block_lists(mask)
        return (self.from_host(blocks, "i32", "sparse block lists"),
                self.from_host(counts, "i32", "sparse block counts"), blocks.shape[2])

    # -- gated delta net -------------------------------------------------------------------------------------
    def gdn_gates(self, alpha, beta, dt_bias, ssm_a):
        T, V = alpha.shape
        g, b = self.empty((T, V)), self.empty((T, V))
        self.native.cmp_gdn_gates(alpha.ptr, beta.ptr, dt_bias.ptr, ssm_a.ptr, g.ptr, b.ptr, T, V)
        return g, b

    # Decode batches (several sequences, one token each) run every sequence's conv and GDN scan of a layer in one
    # launch (cmp_conv1d_silu_rows / cmp_gdn_rows: the same per-sequence arithmetic as one launch per sequence,
    # so results are unchanged and batch invariant) instead of 2 x S launches per layer, each filling only V * Dk/32
    # warps. tests/test_decode_cuda.py's rows tests passed on an H200 (2026-11-30, session 3).
    gdn_rows = True

    def state_tables(self, batch: StepBatch) -> None:
        """A decode batch's per-sequence state addresses on the device for the one-launch conv / GDN:
        batch.device["conv_ptrs"], ["ssm_ptrs"] ([n_gdn_layers, S] pointers, as u8 rows of S * 8 bytes). Uploaded
        by CapturedStep before it records (an upload cannot be recorded), else on first use."""
        states = [seg.state for seg in batch.segments]
        for key, attr in (("conv_ptrs", "conv"), ("ssm_ptrs", "ssm")):
            per_layer = zip(*(getattr(st, attr) for st in states))      # layer i: every sequence's tensor
            table = np.array([[t.ptr for t in layer] for layer in per_layer], np.uint64)
            batch.device[key] = self.from_host(table.view(np.uint8), "u8", "state pointer table")

    def _rows_table(self, batch: StepBatch, key: str) -> DeviceTensor | None:
        """The pointer table for a one-launch decode step of `batch`, or None: not a decode batch of several
        sequences (row i = segment i, one token each), gdn_rows off, or a step being captured without its table."""
        segs = batch.segments
        if not self.gdn_rows or len(segs) < 2 or any(sg.length != 1 or sg.start != i for i, sg in enumerate(segs)):
            return None
        if key not in batch.device and not self.capturing:
            self.state_tables(batch)
        return batch.device.get(key)

    def conv1d_silu(self, x, w, batch, layer):
        C, kernel = w.shape
        out = self.empty(x.shape)
        if batch.keep_steps:            # speculative verification: every token's state kept on the device
            for seg in batch.segments:
                steps = self._steps(seg.state, "conv", layer, seg.length, batch.keep_steps, (kernel - 1, C))
                self.native.cmp_conv1d_silu_keep(x.row_ptr(seg.start), w.ptr, seg.state.conv[layer].ptr, steps.ptr,
                                                 out.row_ptr(seg.start), seg.length, C, kernel)
            return out
        table = self._rows_table(batch, "conv_ptrs")
        if table is not None:
            self.native.cmp_conv1d_silu_rows(x.ptr, w.ptr, table.row_ptr(layer), out.ptr, len(batch.segments), C,
                                             kernel)
            return out
        for seg in batch.segments:
            self.native.cmp_conv1d_silu(x.row_ptr(seg.start), w.ptr, seg.state.conv[layer].ptr,
                                        out.row_ptr(seg.start), seg.length, C, kernel)
        return out

    def gdn(self, qkv, g, b, batch, layer, cfg, chunked: bool | None = None):
        """chunked: None follows self.gdn_chunked for segments of >= GDN_CHUNK tokens; True/False forces the
        chunked kernel / the scan for every segment (tests compare both against numpy_ref)."""
        K, V, Dk = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_head_dim
        o = self.empty((qkv.shape[0], V * Dk))
        if batch.keep_steps:            # the decode step's arithmetic per token, each state kept (cmp_gdn_keep)
            for seg in batch.segments:
                steps = self._steps(seg.state, "ssm", layer, seg.length - 1, batch.keep_steps - 1, (V, Dk, Dk))
                self.native.cmp_gdn_keep(qkv.row_ptr(seg.start), g.row_ptr(seg.start), b.row_ptr(seg.start),
                                         seg.state.ssm[layer].ptr, steps.ptr, o.row_ptr(seg.start), seg.length, K, V,
                                         Dk, cfg.rms_eps)
                seg.state.steps["len"] = seg.length
            return o
        table = self._rows_table(batch, "ssm_ptrs") if chunked is not True else None
        if table is not None:
            self.native.cmp_gdn_rows(qkv.ptr, g.ptr, b.ptr, table.row_ptr(layer), o.ptr, len(batch.segments), K, V,
                                     Dk, cfg.rms_eps)
            return o
        use_chunks = [self.gdn_chunked and seg.length >= self.GDN_CHUNK if chunked is None else chunked
                      for seg in batch.segments]
        work = None
        if any(use_chunks):   # one workspace for the longest such segment: the segments run in turn on the stream
            n = max(seg.length for seg, c in zip(batch.segments, use_chunks) if c)
            work = self.empty((self.native.gdn_chunked_work_bytes(n, V, Dk),), "u8", "the chunked GDN workspace")
        for seg, chunks in zip(batch.segments, use_chunks):
            args = (qkv.row_ptr(seg.start), g.row_ptr(seg.start), b.row_ptr(seg.start), seg.state.ssm[layer].ptr,
                    o.row_ptr(seg.start), seg.length, K, V, Dk, cfg.rms_eps)
            if chunks:
                try:
                    self.native.cmp_gdn_chunked(*args, work.ptr, work.nbytes)
                    continue
                except NativeError as e:   # the device lacks the shared memory (sm_75 at Dk 128): nothing ran
                    if e.code != CMP_ERR_UNSUPPORTED or chunked:
                        raise
            self.native.cmp_gdn(*args)
        return o

    def _steps(self, state: SeqState, kind: str, layer: int, rows: int, room: int,
               shape: tuple[int, ...]) -> DeviceTensor:
        """The device buffer [room, *shape] for one layer's per-token states of keep_steps batches, made at the
        state's first one for `room` rows (its keep_steps: n_max + 1 tokens, the memory plan's spec scratch) and
        never replaced, so a captured verify's address of it stays valid. (Sized by the first batch's own length,
        captures of draft lengths 1, 2, 3 in turn each replaced it and the shorter verifies' graphs wrote into
        freed memory: adaptive drafting's greedy output left MTP off's.)"""
        if state.steps is None:
            state.steps = {"conv": {}, "ssm": {}, "len": 0}
        buf = state.steps[kind].get(layer)
        if buf is None:
            # From the backend's own arena even while a verify graph is captured (spec_graphs.py): the buffer lives
            # with the state.
            buf = state.steps[kind][layer] = DeviceTensor(self._state_arena, (max(room, 1),) + shape, "f32",
                                                          f"the speculative {kind} steps")
        if rows > buf.shape[0]:
            raise ValueError(f"a verify of {rows + (kind == 'ssm')} tokens exceeds the {buf.shape[0] + (kind == 'ssm')}"
                             f" its state's per-token buffers were made for (StepBatch.keep_steps)")
        return buf

    def restore_steps(self, state, k):
        steps = state.steps
        n = steps["len"] if steps is not None else 0
        if not n:
            raise ValueError("restore_steps: the state ran no keep_steps batch since its last restore")
        if not 1 <= k <= n:
            raise ValueError(f"restore_steps: k={k} outside 1..{n} (the batch's tokens)")
        steps["len"] = 0
        if k == n:
            return                      # the states already are the last token's
        table, regions, max_bytes = self._restore_table(state)
        if k > table.shape[0]:
            raise ValueError(f"restore_steps: k={k} past the {table.shape[0]} rows the state's per-token buffers hold")
        self.native.cmp_copy_regions(table.row_ptr(k - 1), regions, max_bytes)

    def _restore_table(self, state: SeqState) -> tuple[DeviceTensor, int, int]:
        """restore_steps' copies for every k as one device table [k, regions] of api.h CmpCopyRegion (row k - 1:
        each GDN layer's conv and ssm state from row k - 1 of its per-token buffer), its regions per row and its
        largest copy: a rewind is one cmp_copy_regions launch (a copy per layer and state was 48 launches on the 9B
        shape, ~0.15 ms of host time per rejecting sequence and round). Made at the state's first restore and kept
        on state.steps: neither the per-token buffers (_steps) nor the state's conv / ssm tensors are ever
        replaced, so the addresses hold; remade if a layer's buffer was made after it (not in the engine: one
        verify forward makes every layer's)."""
        steps = state.steps
        count = len(steps["conv"]) + len(steps["ssm"])
        made = steps.get("restore")
        if made is None or made[1] != count:
            pairs = [(getattr(state, name)[layer], buf) for name in ("conv", "ssm")
                     for layer, buf in steps[name].items()]
            rows = min(buf.shape[0] for _, buf in pairs)
            regions = copy_region_table((dst.ptr, buf.row_ptr(k), dst.nbytes)
                                        for k in range(rows) for dst, buf in pairs)
            table = DeviceTensor(self._state_arena, (rows, count * COPY_REGION_BYTES), "u8", "the restore copy table")
            self.native.cmp_memcpy_h2d(table.ptr, regions.ctypes.data, regions.nbytes)
            made = steps["restore"] = (table, count, max(dst.nbytes for dst, _ in pairs))
        return made

    def concat(self, xs, axis):
        xs = [x if isinstance(x, DeviceTensor) else self.from_host(np.asarray(x, np.float32)) for x in xs]
        if axis == 0:
            out = self.empty((sum(x.shape[0] for x in xs),) + xs[0].shape[1:])
            if len(xs) < self.CONCAT_TABLE_MIN or self.capturing:
                dst = out.ptr                   # (the rows follow one another: no row_ptr per piece)
                for x in xs:
                    self.native.cmp_memcpy_d2d(dst, x.ptr, x.nbytes)
                    dst += x.nbytes
                return out
            starts = list(itertools.accumulate((x.shape[0] for x in xs[:-1]), initial=0))   # (np.cumsum: 2 us)
            # Many pieces (the MTP head's catch-up: one hidden row per plainly stepped token, 256 per sequence):
            # one cmp_copy_regions launch from a table uploaded with it, instead of a copy call per piece.
            table = copy_region_table((out.row_ptr(int(row)), x.ptr, x.nbytes) for x, row in zip(xs, starts))
            table_d = self.empty((table.nbytes,), "u8", "concat's copy table")
            self.native.cmp_memcpy_h2d(table_d.ptr, table.ctypes.data, table.nbytes)
            for k in range(0, len(xs), self.COPY_REGIONS_MAX):
                n = min(self.COPY_REGIONS_MAX, len(xs) - k)
                self.native.cmp_copy_regions(table_d.ptr + k * COPY_REGION_BYTES, n,
                                             max(x.nbytes for x in xs[k:k + n]))
            return out
        T = xs[0].shape[0]
        width = sum(x.shape[1] for x in xs)
        out, col = self.empty((T, width)), 0
        for x in xs:          # [T, D_i] into columns col .. col + D_i of [T, width]
            self.native.cmp_memcpy2d_d2d(out.ptr + col * 4, width * 4, x.ptr, x.shape[1] * 4, x.shape[1] * 4, T)
            col += x.shape[1]
        return out

    # -- sampling ----------------------------------------------------------------------------------------------
    def argmax(self, logits: DeviceTensor, out: DeviceTensor | None = None) -> DeviceTensor:
        """logits [R, N] -> [R] int32 on the device: greedy token per row (lowest id among ties). `out`: an
        existing int32 [R] buffer to write (a captured graph's token input)."""
        R, N = logits.shape
        out = out if out is not None else self.empty((R,), "i32", "argmax ids")
        if out.shape != (R,) or out.dtype != "i32":
            raise ValueError(f"argmax: output must be int32 [{R}], got {out.dtype} {out.shape}")
        self.native.cmp_argmax(logits.ptr, out.ptr, R, N)
        return out

    # -- the MTP draft's coarse head (cuda_src/coarse_head.cu; numpy_ref.py's coarse_copy / coarse_argmax) ------
    def coarse_copy(self, w):
        """Made on the device: row pieces of STAGING_BYTES of f32 (the upload staging block's size, so its freed
        block is reused and the memory plan's count holds) dequantized by the embed kernels, then quantized by
        cmp_quantize_cq2 (cq2_ref.py). The 9B's head (248320 x 4096): 61 pieces of 4096 rows, 318 MB of CQ2 (a few
        ms on an H200: the head read once, 64 MiB written and read per piece)."""
        rows, cols = w.shape
        if cols % CQ2_VALUES:
            raise ValueError(f"coarse_copy: rows of {cols} values are not CQ2 blocks of 32")
        nb = cols // CQ2_VALUES
        with self.arena.persistent():
            codes = self.empty((rows, nb * 8), "u8", f"the MTP draft's CQ2 coarse head [{rows}, {cols}]")
            scales = self.empty((rows, nb * 2), "u8", f"the MTP draft's CQ2 coarse head [{rows}, {cols}] (scales)")
        step = max(1, min(rows, self.STAGING_BYTES // (cols * 4)))
        ids = self.from_host(np.arange(step, dtype=np.int32), "i32", "the coarse head's row ids")
        for r0 in range(0, rows, step):
            # the last piece ends at the last row, overlapping the one before (its rows get the same bytes again):
            # every piece the same size, so that the one freed block serves all of them
            r0 = min(r0, rows - step)
            x = self.embed(self._row_slice(w, r0, step), ids)
            self.native.cmp_quantize_cq2(x.ptr, codes.row_ptr(r0), scales.row_ptr(r0), step, cols)
        return CQ2Matrix(codes, scales)

    def coarse_logits(self, x, coarse):
        """cmp_quantize_q8, then cmp_cq2_gemv on the decode route's int8 dot."""
        return self._coarse_gemv(*self.quantize(x), coarse)

    def _coarse_gemv(self, xq, xd, coarse):
        """Q8 activations xq [T, n] int8, xd [T, n/32] times the CQ2 matrix [N, n] -> [T, N] f32."""
        T, n = xq.shape
        N = coarse.shape[0]
        if coarse.shape[1] != n:
            raise ValueError(f"coarse GEMV: input has {n} columns, the coarse head {coarse.shape} expects "
                             f"{coarse.shape[1]}")
        y = self.empty((T, N), "f32", "the coarse head's logits")
        self.native.cmp_cq2_gemv(xq.ptr, xd.ptr, coarse.codes.ptr, coarse.scales.ptr, y.ptr, T, N, n,
                                 CMP_DOTS[self.routes.matmul_decode])
        return y

    def coarse_argmax(self, x, coarse, exact, k, out=None):
        """The CQ2 GEMV (cmp_cq2_gemv), cmp_topk, the candidates' exact rows by the embed kernels,
        cmp_coarse_rescore: four launches after the activations' quantization, which the exact rescoring shares
        (the exact head's GEMV would read the same Q8 blocks)."""
        R, D = x.shape
        N = coarse.shape[0]
        if exact.shape != coarse.shape or coarse.shape[1] != D or not 1 <= k <= N:
            raise ValueError(f"coarse_argmax: x {x.shape}, coarse {coarse.shape}, exact {exact.shape}, k {k}")
        out = out if out is not None else self.empty((R,), "i32", "draft ids")
        if out.shape != (R,) or out.dtype != "i32":
            raise ValueError(f"coarse_argmax: output must be int32 [{R}], got {out.dtype} {out.shape}")
        xq, xd = self.quantize(x)
        logits = self._coarse_gemv(xq, xd, coarse)
        cand = self.empty((R, k), "i32", "the coarse head's candidates")
        work = self.empty((self.native.topk_work_bytes(R, N, k),), "u8", "the coarse head's top-k lists")
        self.native.cmp_topk(logits.ptr, cand.ptr, work.ptr, R, N, k)
        rows = self.embed(exact, cand.view((R * k,)))
        # the activations as the exact head's GEMV reads them: its Q8 blocks, or x (in f16 for an f16 head)
        quantized = isinstance(exact, (Q8Matrix, QuantMatrix))
        f16 = isinstance(exact, DenseMatrix) and exact.w.dtype == "f16"
        self.native.cmp_coarse_rescore(xq.ptr if quantized else None, xd.ptr if quantized else None, x.ptr, int(f16),
                                       rows.ptr, cand.ptr, out.ptr, R, k, D)
        return out

    SAMPLE_MAX_K = 1024      # candidates the device chain keeps after top-k (cmp_sample)
    SAMPLE_MAX_WINDOW = 4096  # penalty window

    def sample(self, logits: DeviceTensor, row: int, params, history: Sequence[int], u: float,
               eog_ids: frozenset[int] = frozenset(), out: DeviceTensor | None = None) -> DeviceTensor:
        """The reference chain (llamacmp/sampling.py) on the device for logits row `row` [N]: logit bias (and
        ignore_eos), penalties over the last penalty_last_n of `history`, top-k, top-p, min-p, temperature, then the
        draw at `u` (what the host sampler's rng.random() gives). -> int32 [1] on the device.
        Raises ValueError for what the kernel does not do (a non-default sampler order, typical-p, the samplers of
        SamplingParams.plain, no top-k or top_k > SAMPLE_MAX_K, a longer penalty window): those sample on the host."""
        from ..sampling import DEFAULT_SAMPLERS
        N = logits.shape[-1]
        if tuple(params.samplers) != DEFAULT_SAMPLERS or params.typ_p < 1.0 or not params.plain:
            raise ValueError("device sampling runs the default sampler order without typical-p, DRY, top-n-sigma, "
                             "XTC, dynamic temperature or Mirostat")
        k = min(max(params.top_k, params.min_keep), N) if params.top_k > 0 else N
        if not 1 <= k <= self.SAMPLE_MAX_K:
            raise ValueError(f"device sampling keeps at most {self.SAMPLE_MAX_K} top-k candidates (got {k})")
        neutral = params.penalty_repeat == 1.0 and params.penalty_freq == 0.0 and params.penalty_present == 0.0
        hist = [] if neutral or params.penalty_last_n == 0 else \
            list(history) if params.penalty_last_n < 0 else list(history)[-params.penalty_last_n:]
        if len(hist) > self.SAMPLE_MAX_WINDOW:
            raise ValueError(f"device sampling takes a penalty window of at most {self.SAMPLE_MAX_WINDOW} tokens")
        bias = {int(t): float(v) for t, v in params.logit_bias.items()}
        if params.ignore_eos:
            bias.update({int(t): -np.inf for t in eog_ids})
        out = out if out is not None else self.empty((1,), "i32", "sampled id")
        cp = CmpSamplerParams(params.temp, params.top_p, params.min_p, params.penalty_repeat, params.penalty_freq,
                              params.penalty_present, k, params.min_keep)
        self._sample_launch(logits, row, cp, np.asarray(hist, np.int32), bias, u, out.ptr, None,
                            self.empty((N,), what="sampling scratch"))
        return out

    def _sample_launch(self, logits: DeviceTensor, row: int, cp, window: np.ndarray, bias: dict, u: float,
                       out_ptr: int, n_ptr: int | None, work: DeviceTensor) -> None:
        """cmp_sample on row `row` of logits [R, N]: writes the id at out_ptr (and the candidates left at n_ptr)."""
        N = logits.shape[-1]
        hist_d = self.from_host(np.asarray(window if len(window) else [0], np.int32), "i32", "penalty window")
        ids_d = self.from_host(np.asarray(list(bias) or [0], np.int32), "i32", "logit bias ids")
        vals_d = self.from_host(np.asarray(list(bias.values()) or [0.0], np.float32), "f32", "logit bias values")
        # a double just below 1 rounds to 1.0f; the kernel wants [0, 1)
        u32 = min(float(np.float32(u)), float(np.nextafter(np.float32(1), np.float32(0))))
        self.native.cmp_sample(logits.ptr + row * N * 4, work.ptr, hist_d.ptr, len(window), ids_d.ptr, vals_d.ptr,
                               len(bias), ctypes.byref(cp), u32, out_ptr, n_ptr, N)

    def sample_rows(self, logits: DeviceTensor, specs: Sequence) -> tuple[np.ndarray, np.ndarray]:
        """logits [R, N] on the device; specs [R]: a base.RowSample (the chain at its u) or None (argmax) ->
        (ids [R] int32, candidates left for each draw [R] int32; 1 for argmax rows), the only bytes that cross.
        One argmax launch covers every row; chain rows then overwrite their id (same stream, so in order).
        Specs must respect SAMPLE_MAX_K / SAMPLE_MAX_WINDOW (engine/decode.py sends other rows to the host)."""
        R, N = logits.shape
        if len(specs) != R:
            raise ValueError(f"sample_rows: {len(specs)} specs for {R} rows")
        out = self.empty((2 * R,), "i32", "sampled ids")      # ids, then candidates left
        self.native.cmp_argmax(logits.ptr, out.ptr, R, N)
        chain = [(r, sp) for r, sp in enumerate(specs) if sp is not None]
        if chain:
            # Every chain row's penalty window and bias ids go up in one int32 upload, the bias values in one f32
            # upload (not three uploads and arena blocks per row and step); each launch points into them.
            wins = [np.asarray(sp.window, np.int32).reshape(-1) for _, sp in chain]
            bids = [np.fromiter(sp.bias.keys(), np.int32, len(sp.bias)) for _, sp in chain]
            bvals = [np.fromiter(sp.bias.values(), np.float32, len(sp.bias)) for _, sp in chain]
            ints = self.from_host(np.concatenate(wins + bids + [np.zeros(1, np.int32)]), "i32",
                                  "penalty windows and logit bias ids")
            vals = self.from_host(np.concatenate(bvals + [np.zeros(1, np.float32)]), "f32", "logit bias values")
            w_at = np.cumsum([0] + [len(w) for w in wins]).tolist()
            b_at = np.cumsum([0] + [len(b) for b in bids]).tolist()
            work = self.empty((N,), what="sampling scratch")
            below_one = float(np.nextafter(np.float32(1), np.float32(0)))
            for j, (r, sp) in enumerate(chain):
                cp = CmpSamplerParams(sp.temp, sp.top_p, sp.min_p, sp.penalty_repeat, sp.penalty_freq,
                                      sp.penalty_present, sp.top_k, sp.min_keep)
                u32 = min(float(np.float32(sp.u)), below_one)    # as _sample_launch: the kernel wants [0, 1)
                self.native.cmp_sample(logits.ptr + r * N * 4, work.ptr, ints.ptr + 4 * w_at[j], len(wins[j]),
                                       ints.ptr + 4 * (w_at[-1] + b_at[j]), vals.ptr + 4 * b_at[j], len(bids[j]),
                                       ctypes.byref(cp), u32, out.ptr + 4 * r, out.ptr + 4 * (R + r), N)
        both = self.ids_to_host(out)
        n = both[R:].copy()
        n[[sp is None for sp in specs]] = 1
        return both[:R].copy(), n

    def row_to_host(self, logits: DeviceTensor, row: int) -> np.ndarray:
        """logits [R, N] -> float32 copy of row `row` [N] (one row crosses, not the batch)."""
        N = logits.shape[-1]
        out = np.empty(N, np.float32)
        self.native.cmp_memcpy_d2h(out.ctypes.data, logits.ptr + row * N * 4, out.nbytes)
        return out

    def decode_graphs(self, model, capacity: int = 8, hidden: bool = False):
        """engine/decode.py's decode steps on CUDA graphs (backends/cuda_graphs.DecodeGraphs)."""
        return DecodeGraphs(self, model, capacity, hidden)

    def spec_graphs(self, model, n_max: int, capacity: int = 8, seqs: int = 1):
        """engine/speculative.py's draft rounds and verify forwards on CUDA graphs (backends/spec_graphs.py)."""
        return SpecGraphs(self, model, n_max, capacity, seqs)

    def ids_to_host(self, ids: DeviceTensor) -> np.ndarray:
        """int32 [R] device ids -> host (waits for the stream)."""
        out = np.empty(ids.shape, np.int32)
        if out.nbytes:
            self.native.cmp_memcpy_d2h(out.ctypes.data, ids.ptr, out.nbytes)
        return out

    def gated_rmsnorm(self, o, z, w, eps, head_dim):
        T, n = o.shape
        out = self.empty((T, n))
        self.native.cmp_gated_rmsnorm(o.ptr, z.ptr, w.ptr, out.ptr, T, n // head_dim, head_dim, eps)
        return out

    # -- vision encoder (cuda_src/vision.cu) -------------------------------------------------------------------
    def reshape(self, x, shape):
        """A view of x's device block (the base class copies through the host: a sync and two copies)."""
        return x.view(shape)

    def rope_positions(self, pos):
        """Uploaded once, so that the encoder's 2 x n_layer rope_vision calls read one device copy."""
        return self._rope_pos(pos, len(pos), "vision rotary positions")

    def _rope_pos(self, pos, T: int, what: str) -> DeviceTensor:
        """pos [T, 4] int32: a host array is uploaded; a DeviceTensor (uploaded once by the caller) used as is."""
        if not isinstance(pos, DeviceTensor):
            pos = self.from_host(np.ascontiguousarray(pos, np.int32), "i32", what)
        if pos.shape != (T, 4) or pos.dtype != "i32":
            raise ValueError(f"{what}: need int32 [{T}, 4], got {pos.dtype} {pos.shape}")
        return pos

    def bias_add(self, x, b):
        T, N = x.shape
        if b.shape != (N,):
            raise ValueError(f"bias_add: bias {b.shape} for rows of {N}")
        out = self.empty((T, N))
        self.native.cmp_bias_add(x.ptr, b.ptr, out.ptr, T, N)
        return out

    def layernorm(self, x, w, b, eps):
        T, D = x.shape
        y = self.empty((T, D))
        self.native.cmp_layernorm(x.ptr, w.ptr, b.ptr, y.ptr, T, D, eps)
        return y

    def gelu(self, x):
        """Through ggml-cpu's f16 table (Backend.gelu), built once per backend from numpy_ref's formula."""
        table = getattr(self, "_gelu_table", None)
        if table is None:
            from .numpy_ref import gelu_tanh
            h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):     # inf / nan halves: never looked up
                vals = gelu_tanh(h).astype(np.float16)
            table = self._gelu_table = self.from_host(vals, "f16", "the GELU f16 table")
        out = self.empty(x.shape)
        self.native.cmp_gelu(x.ptr, table.ptr, out.ptr, x.size)
        return out

    def rope_vision(self, x, pos, n_heads, head_dim, sections, theta):
        """As Backend.rope_vision; `pos` may also be an int32 [T, 4] DeviceTensor (upload once per image)."""
        T = x.shape[0]
        if x.shape[1] != n_heads * head_dim:
            raise ValueError(f"rope_vision: rows of {x.shape[1]} for {n_heads} heads of {head_dim}")
        pos_d = self._rope_pos(pos, T, "vision rotary positions")
        out = self.empty(x.shape)
        self.native.cmp_rope_vision(x.ptr, pos_d.ptr, out.ptr, T, n_heads, head_dim, *(int(s) for s in sections),
                                    theta)
        return out

    def attention_full(self, q, k, v, n_heads, head_dim, scale):
        T, E = q.shape
        if E != n_heads * head_dim or k.shape != q.shape or v.shape != q.shape:
            raise ValueError(f"attention_full: q {q.shape}, k {k.shape}, v {v.shape} for {n_heads} heads of {head_dim}")
        out = self.empty((T, E))
        self.native.cmp_attention_full(q.ptr, k.ptr, v.ptr, out.ptr, T, n_heads, head_dim, E, E, E, scale)
        return out

    # -- several devices (llamacmp/split/) ----------------------------------------------------------------------
    def activate(self) -> None:
        """Select this backend's device for the calling thread (CUDA's current device is per thread), keeping the
        device's library stream: for a thread that takes over a backend made on another one (the server's engine
        thread after the loader thread), so that its work queues behind the loading on the same stream."""
        self.native.cmp_set_device(self.device)

    def bind_thread(self) -> None:
        """Make the calling thread run this backend's work: its device, and a stream of this backend's own (made on
        the first call). A layer split gives each part one thread that calls this once, so that two backends --
        two GPUs, or two parts on one GPU -- never queue work on each other's device or stream."""
        self.native.cmp_set_device(self.device)
        if getattr(self, "stream", 0) == 0:
            self.stream = self.native.stream_create()
        self.native.cmp_set_stream(self.stream)
