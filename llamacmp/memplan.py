"""Device memory plan: what a model, its contexts and one micro-batch take on the GPU, computed before anything
is allocated, so that a run that cannot fit is refused at start-up with the item that did not fit and the flag
that helps, instead of failing in the middle of a long prompt.

Items (one start-up log line each):
  weights      every tensor as the CUDA backend stores it (Q8_0 repacked: int8 + f16 scales, 34/32 B a value;
               the other block types (Q4_K, IQ4_XS, ...) their file bytes; F32/F16/BF16 f32, 256-byte aligned),
               and the upload staging block of the block-quantized tensors; with --spec-type draft-mtp the MTP
               draft's CQ2 coarse head (--spec-draft-coarse, spec.coarse_head) where it fits: where it does not,
               the plan leaves it out, says so, and planned_run turns it off (the draft reads the exact head)
  KV cache     per attention layer K and V [n_ctx, Hk, Dh] in the -ctk / -ctv format, for every slot
  GDN state    per GDN layer the conv window [kernel-1, C] and the recurrent state [V, Dk, Dv] f32, every slot
  activations  the tensors one micro-batch of n_ubatch rows keeps alive in a layer (an upper bound: every
               distinct activation of an attention layer, a GDN layer and the MLP at once), size-class rounded
  logits       the output rows of one step ([n_ubatch, n_vocab] when every row's logits are wanted, perplexity)
  scratch      attention split-K partials for decode, the decode graph's working set (its own arena, outside the
               cap's arena: cuda_graphs.py), the block-quantized GEMM's workspace (a layer's largest run of expanded
               weights in one pass; where that does not fit, 80 MiB in passes), and with sparse prefill the probe
               statistics and block lists of a chunk
Weights, caches and state are long-lived: the arena takes their total in one piece (DeviceArena.reserve) and
packs them exactly; the short-lived rest uses its size classes (up to 1/8 rounding), which the plan counts.
The CUDA context itself (driver, kernels' code, cuda graph objects: a few hundred MiB) lives outside the arena;
`--device-mem-cap` caps the arena, so leave the card that much room.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from . import kv_quant
from .config import ModelConfig
from .gguf_file import QUANT_BLOCKS
from .spec import coarse_head, hidden_rows

GIB = 1 << 30
MIB = 1 << 20

Q8_0_BLOCK = 32


class PlanError(MemoryError):
    """The plan does not fit the device cap; the message says which item and which flags help."""


@dataclass(frozen=True, slots=True)
class TensorDesc:
    name: str
    type_name: str               # GGUF type: F32, F16, BF16, Q8_0 or a gguf_file.QUANT_BLOCKS type
    shape: tuple[int, ...]       # numpy order


@dataclass(slots=True)
class PlanItem:
    name: str
    nbytes: int
    detail: str


@dataclass(slots=True)
class MemoryPlan:
    items: list[PlanItem] = field(default_factory=list)
    cap: int | None = None       # bytes the arena may take (None: no cap given)
    cap_from_flag: bool = True   # the cap is --device-mem-cap (False: what the GPU has free)
    coarse_rows: int = 0         # rows of the MTP draft's CQ2 coarse head counted in the weights (0: none)
    coarse_dropped: bool = False     # the run asked for one, it did not fit: drafting keeps the exact head
    quant_work: int = 0          # the block-quantized GEMM's workspace in the scratch (CudaBackend.QUANT_WORK_BYTES)
    notes: list[str] = field(default_factory=list)   # lines after the items' (what the plan left out, and why)

    @property
    def total(self) -> int:
        return sum(i.nbytes for i in self.items)

    @property
    def persistent(self) -> int:
        """The long-lived part (weights, KV cache, GDN state): what DeviceArena.reserve takes in one piece."""
        return sum(i.nbytes for i in self.items if i.name in ("weights", "KV cache", "GDN state"))

    def item(self, name: str) -> PlanItem:
        return next(i for i in self.items if i.name == name)

    def lines(self) -> list[str]:
        out = [f"memory plan: {i.name:<12} {i.nbytes / MIB:10.1f} MiB  {i.detail}" for i in self.items]
        cap = f" of the {self.cap / GIB:.2f} GiB cap" if self.cap is not None else ""
        out.append(f"memory plan: {'total':<12} {self.total / MIB:10.1f} MiB  ({self.total / GIB:.2f} GiB{cap})")
        return out + [f"memory plan: {n}" for n in self.notes]


# -- the arena's arithmetic ----------------------------------------------------------------------------------------

# what a tensor takes in the arena: long-lived ones exactly (256-aligned), the short-lived rest by size class
from .backends.arena_sizes import exact, size_class  # noqa: E402,F401


# -- items --------------------------------------------------------------------------------------------------------

STAGING_PIECE = 64 * MIB     # CudaBackend.STAGING_BYTES: block-quantized uploads go through one staging block
# CudaBackend.QUANT_WORK_BYTES: a block-quantized prefill GEMM's expanded weights, a run larger than it in passes of
# whole waves (cuda_src/gemm_chunks.h). The plan sizes it for a layer's largest run in one pass (quant_work_bytes,
# by the backend's measure: a route that reads a type's planes takes none of its rows; every type expanded, the
# 27B's ffn_gate + ffn_up, 2 x 17408 x 5120 at 1.5 B a value, 267 MB; in 80 MiB passes its DP4A Q4_K_M prefill
# was 6.5-6.8% slower, H100 2026-12-06), and where that does not fit takes this piece: it holds the 9B's ffn_down
# (4096 x 12288: 75.5 MB) in one launch and ffn_gate / ffn_up's 12288 rows in two of whole waves (the 64 MiB before
# it cost ~20% of a DP4A Q4_K_M pp512 in part-empty waves).
QUANT_WORK_PIECE = 80 * MIB
# The matrices qwen35.py multiplies with one input (rmsnorm_matmuls): those of one block type are expanded into the
# workspace as one run (CudaBackend._launch_groups, up to its MAX_FUSED = 4 a launch).
FUSED_RUNS = (("attn_q", "attn_k", "attn_v"), ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha"),
              ("ffn_gate", "ffn_up"))
QUANT_GEMM_TILE = 128        # cuda_src/smem_plan.h QTILE: a run's rows are expanded in whole tiles


def tensor_bytes(t: TensorDesc) -> int:
    """Arena bytes of one tensor as the CUDA backend stores it. Q8_0: int8 values and f16 scales apart; the other
    block types: their blocks as the file stores them (a repack keeps the bytes); F32/F16/BF16: f32, the 16-bit
    floats widened at load."""
    n = math.prod(t.shape)
    if t.type_name == "Q8_0":
        rows, cols = t.shape
        return exact(rows * cols) + exact(rows * (cols // Q8_0_BLOCK) * 2)
    if t.type_name in QUANT_BLOCKS:
        values, nbytes = QUANT_BLOCKS[t.type_name]
        return exact(n // values * nbytes)
    if t.type_name in ("F32", "F16", "BF16"):
        return exact(n * 4)
    raise ValueError(f"memory plan: tensor '{t.name}' has type {t.type_name}, which llamacmp does not load")


def is_block_quantized(t: TensorDesc) -> bool:
    return t.type_name == "Q8_0" or t.type_name in QUANT_BLOCKS


def weight_bytes(tensors: Sequence[TensorDesc]) -> int:
    """Arena bytes of the weights (tensor_bytes of each), plus the one staging block the block-quantized uploads
    go through."""
    staging = STAGING_PIECE if any(is_block_quantized(t) for t in tensors) else 0
    return sum(tensor_bytes(t) for t in tensors) + staging


def expanded_work_bytes(type_name: str, T: int, n: int, rows: int) -> int:
    """The workspace that expands `rows` rows of n values in one pass at T tokens: cmp_quant_work_bytes' arithmetic
    with every type expanded, as for a type with mins (n + n/16 x 8 bytes a row, the activation half sums): an upper
    bound for every type and route, the plan's measure where no backend is at hand (Backend.gemm_work_bytes)."""
    tile = QUANT_GEMM_TILE
    return exact(T * (n // 16) * 4) + 3 * 256 + -(-rows // tile) * tile * (n + n // 16 * 8)


def quant_work_bytes(tensors: Sequence[TensorDesc], n_ubatch: int, work_bytes=expanded_work_bytes) -> int:
    """The block-quantized GEMM workspace that takes the layers' largest run (FUSED_RUNS of one type, or a matrix
    alone) in one pass at n_ubatch rows, by work_bytes(type_name, T, n, rows): the backend's (a route that reads a
    type's planes needs only the half sums of it), else expanded_work_bytes. The head (output.weight, or a tied
    token_embd.weight: 248320 rows, with every row's logits) counts up to QUANT_WORK_PIECE and goes in passes, as it
    always did."""
    runs: dict[tuple[str, str, str], tuple[int, int]] = {}      # (layer, run, type) -> (rows, n)
    head = 0
    for t in tensors:
        if t.type_name not in QUANT_BLOCKS:   # (Q8_0's GEMM reads it as stored)
            continue
        if not t.name.startswith("blk."):
            head = max(head, min(work_bytes(t.type_name, n_ubatch, t.shape[1], t.shape[0]), QUANT_WORK_PIECE))
            continue
        layer, _, leaf = t.name.removesuffix(".weight").rpartition(".")
        run = next((",".join(r) for r in FUSED_RUNS if leaf in r), leaf)
        rows, n = runs.get((layer, run, t.type_name), (0, t.shape[1]))
        runs[layer, run, t.type_name] = (rows + t.shape[0], n)
    return max([head] + [work_bytes(ty, n_ubatch, n, rows) for (_, _, ty), (rows, n) in runs.items()])


def type_counts(tensors: Sequence[TensorDesc]) -> str:
    """'Q4_K 160, Q6_K 33, F32 300': how many tensors of each type, the most common first."""
    counts: dict[str, int] = {}
    for t in tensors:
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def kv_bytes(cfg: ModelConfig, n_ctx: int, k_type: str, v_type: str, n_layers: int | None = None) -> int:
    """One slot's K and V caches over all attention layers (or `n_layers` of them)."""
    n_layers = len(cfg.attn_layers) if n_layers is None else n_layers
    return n_layers * (exact(kv_quant.cache_bytes(k_type, n_ctx, cfg.n_head_kv, cfg.head_dim))
                                   + exact(kv_quant.cache_bytes(v_type, n_ctx, cfg.n_head_kv, cfg.head_dim)))


def gdn_state_bytes(cfg: ModelConfig, n_layers: int | None = None) -> int:
    conv = exact((cfg.conv_kernel - 1) * cfg.conv_channels * 4)
    ssm = exact(cfg.ssm_v_heads * cfg.ssm_head_dim * cfg.ssm_head_dim * 4)
    return (len(cfg.gdn_layers) if n_layers is None else n_layers) * (conv + ssm)


GDN_CHUNK = 64   # tokens per chunk of the chunked GDN kernels (CudaBackend.GDN_CHUNK, numpy_ref.GDN_CHUNK)


def gdn_chunk_work_bytes(cfg: ModelConfig, T: int) -> int:
    """The chunked GDN kernels' workspace for a segment of T tokens (cmp_gdn_chunked_work_bytes): per chunk and
    value head W [64, Dk], M [64, 64] and 3 x 64 row scales, f32. 0 below one chunk (those take the scan)."""
    if T < GDN_CHUNK:
        return 0
    return 4 * -(-T // GDN_CHUNK) * cfg.ssm_v_heads * (GDN_CHUNK * cfg.ssm_head_dim + GDN_CHUNK * GDN_CHUNK
                                                         + 3 * GDN_CHUNK)


def activation_bytes(cfg: ModelConfig, T: int) -> int:
    """Upper bound of what one forward over T rows keeps reserved for activations: every distinct tensor of an
    attention layer, a GDN layer (with the chunked kernels' workspace) and the MLP (f32 rows, int8 quantized
    inputs with f32 scales), size-class rounded, plus the residual stream twice."""
    D, F, C, Hq, Hk, Dh = cfg.n_embd, cfg.n_ff, cfg.conv_channels, cfg.n_head, cfg.n_head_kv, cfg.head_dim
    V, VD = cfg.ssm_v_heads, cfg.ssm_inner
    f32_widths = ([D, D]                                                     # residual x, x + mixed
                  + [D, 2 * Hq * Dh, Hk * Dh, Hk * Dh, Hq * Dh, Hk * Dh, Hq * Dh, Hq * Dh, Hq * Dh, D]  # attention
                  + [C, VD, V, V, V, V, C, VD, VD, D]                         # GDN
                  + [D, F, F, F, D])                                          # MLP
    q8_widths = [D, Hq * Dh, VD, F]                                          # quantized matmul inputs
    total = sum(size_class(T * w * 4) for w in f32_widths)
    total += sum(size_class(T * w) + size_class(T * w // Q8_0_BLOCK * 4) for w in q8_widths)
    work = gdn_chunk_work_bytes(cfg, T)
    return total + (size_class(work) if work else 0)


@dataclass(frozen=True, slots=True)
class Part:
    """The share of a model one device holds in a layer split: its layers, and the embedding / head or not."""
    layers: range
    embed: bool
    head: bool

    def holds(self, name: str) -> bool:
        if name.startswith("blk."):
            return int(name.split(".")[1]) in self.layers
        return self.embed if name == "token_embd.weight" else self.head


def is_mtp_tensor(name: str, cfg: ModelConfig) -> bool:
    """A tensor of the MTP block (blk.{n_layer}.*), uploaded only when speculative decoding runs it."""
    return cfg.n_nextn > 0 and name.startswith(f"blk.{cfg.n_layer}.")


def spec_steps_bytes(cfg: ModelConfig, n_max: int) -> int:
    """One slot's device scratch of a speculative verification of 1 + n_max tokens (CudaBackend._steps): per GDN
    layer the conv window after every token and the recurrent state after every token but the last."""
    conv = size_class((n_max + 1) * (cfg.conv_kernel - 1) * cfg.conv_channels * 4)
    ssm = size_class(max(n_max, 1) * cfg.ssm_v_heads * cfg.ssm_head_dim * cfg.ssm_head_dim * 4)
    return len(cfg.gdn_layers) * (conv + ssm)


def spec_rows_bytes(cfg: ModelConfig, n_max: int) -> int:
    """One slot's hidden-state rows that feed the MTP head (spec.hidden_rows: its queue, ring and h_last), each
    row a block of its own at worst."""
    return hidden_rows(n_max) * size_class(cfg.n_embd * 4)


def coarse_head_bytes(rows: int, n_embd: int) -> int:
    """The MTP draft's CQ2 coarse head of `rows` rows (--spec-draft-coarse) as the CUDA backend stores it: code
    and scale planes apart (8 + 2 bytes per 32 values)."""
    nb = n_embd // Q8_0_BLOCK
    return exact(rows * nb * 8) + exact(rows * nb * 2)


def mtp_head_type(tensors: Sequence[TensorDesc], cfg: ModelConfig) -> str:
    """The GGUF type of the LM head the MTP block drafts with (weights.py's choice: its own shared_head_head, else
    output, else the tied token embedding)."""
    by = {t.name: t for t in tensors}
    for name in (f"blk.{cfg.n_layer}.nextn.shared_head_head.weight", "output.weight", "token_embd.weight"):
        if name in by:
            return by[name].type_name
    return "F32"


def plan(tensors: Sequence[TensorDesc], cfg: ModelConfig, n_ctx: int, n_slots: int = 1, k_type: str = "f16",
         v_type: str = "f16", n_ubatch: int = 512, all_logits: bool = False, sparse=None,
         cap: int | None = None, part: Part | None = None, spec_n_max: int = 0, coarse_rows: int = 0,
         work_bytes=expanded_work_bytes) -> MemoryPlan:
    """n_ctx: context per slot; sparse: the sparse_attn.SparseConfig in use (adds its per-chunk scratch);
    part: one device's share of a layer split (None: the whole model); spec_n_max: --spec-draft-n-max with
    --spec-type draft-mtp (0: off, and the file's MTP block is not uploaded); coarse_rows: with it, the rows of the
    draft's CQ2 coarse head (spec.coarse_head; 0: none), counted in the weights. The block-quantized GEMM's
    workspace holds the largest run (quant_work_bytes, by work_bytes: the backend's Backend.gemm_work_bytes, or
    every type expanded) where that fits the cap, else QUANT_WORK_PIECE (a note says so)."""
    args = (tensors, cfg, n_ctx, n_slots, k_type, v_type, n_ubatch, all_logits, sparse, cap, part, spec_n_max,
            coarse_rows, work_bytes)
    p = _plan_with(*args, quant_work=None)
    if cap is not None and p.total > cap and p.quant_work > QUANT_WORK_PIECE:
        whole, p = p.quant_work, _plan_with(*args, quant_work=QUANT_WORK_PIECE)
        if p.total <= cap:   # (else the refusal names the items, this one at its smallest)
            p.notes.append(f"the block-quantized GEMM workspace for a layer's largest run in one pass "
                           f"({whole / MIB:.0f} MiB) does not fit: {QUANT_WORK_PIECE // MIB} MiB, that run in passes")
    return p


def _plan_with(tensors, cfg, n_ctx, n_slots, k_type, v_type, n_ubatch, all_logits, sparse, cap, part, spec_n_max,
               coarse_rows, work_bytes, quant_work: int | None) -> MemoryPlan:
    """plan() with the GEMM workspace at quant_work bytes (None: quant_work_bytes' largest run)."""
    if not spec_n_max:
        tensors = [t for t in tensors if not is_mtp_tensor(t.name, cfg)]
    if part is not None:
        tensors = [t for t in tensors if part.holds(t.name)]
        attn = sum(1 for il in cfg.attn_layers if il in part.layers)
        gdn = sum(1 for il in cfg.gdn_layers if il in part.layers)
        return _plan(tensors, cfg, n_ctx, n_slots, k_type, v_type, n_ubatch, all_logits, sparse, cap, attn, gdn,
                     part.head, quant_work, work_bytes)
    p = _plan(tensors, cfg, n_ctx, n_slots, k_type, v_type, n_ubatch, all_logits, sparse, cap,
              len(cfg.attn_layers) + bool(spec_n_max), len(cfg.gdn_layers), True, quant_work, work_bytes)
    if spec_n_max:
        if coarse_rows:
            w = p.item("weights")
            w.nbytes += coarse_head_bytes(coarse_rows, cfg.n_embd)
            w.detail += f", the MTP draft's CQ2 coarse head ({coarse_rows} rows) " \
                        f"{coarse_head_bytes(coarse_rows, cfg.n_embd) / MIB:.1f} MiB"
            p.coarse_rows = coarse_rows
        kv = p.item("KV cache")
        kv.detail += " (the MTP layer's included)"
        steps = spec_steps_bytes(cfg, spec_n_max) * n_slots
        rows = spec_rows_bytes(cfg, spec_n_max) * n_slots
        scratch = p.item("scratch")
        scratch.nbytes += steps + rows
        scratch.detail += f", MTP verification states {steps / MIB:.1f} MiB, the MTP head's hidden rows " \
                          f"{rows / MIB:.1f} MiB"
        logits, rows = p.item("logits"), n_slots * (spec_n_max + 1)    # a verification's every row
        if not all_logits and rows > n_slots:
            logits.nbytes = size_class(rows * cfg.n_vocab * 4)
            logits.detail = f"{rows} row(s) x {cfg.n_vocab} f32 (MTP verification: 1 + {spec_n_max} per slot)"
    return p


def split_parts(tensors: Sequence[TensorDesc], cfg: ModelConfig, ratios: Sequence[float]) -> list[Part]:
    """How split/placement.py places the layers over len(ratios) devices (assign_layers over each layer's bytes, the
    embedding on the first device, the head on the last), from the tensor list alone."""
    from .split.placement import assign_layers
    layer_b = [0] * cfg.n_layer
    embd = head = 0
    for t in tensors:
        if t.name.startswith("blk."):
            layer_b[int(t.name.split(".")[1])] += tensor_bytes(t)
        elif t.name == "token_embd.weight":
            embd += tensor_bytes(t)
        else:
            head += tensor_bytes(t)
    ranges = assign_layers(layer_b, ratios, embd, head)
    return [Part(r, p == 0, p == len(ranges) - 1) for p, r in enumerate(ranges)]


def _plan(tensors, cfg, n_ctx, n_slots, k_type, v_type, n_ubatch, all_logits, sparse, cap, n_attn, n_gdn,
          head, quant_work, work_bytes) -> MemoryPlan:
    p = MemoryPlan(cap=cap)
    wb = weight_bytes(tensors)
    staging = f" + the {STAGING_PIECE // MIB} MiB upload staging block" if any(map(is_block_quantized, tensors)) else ""
    p.items.append(PlanItem("weights", wb, f"{len(tensors)} tensors ({type_counts(tensors)}){staging}"))
    per_tok = kv_quant.cache_bytes(k_type, 1, cfg.n_head_kv, cfg.head_dim) + \
        kv_quant.cache_bytes(v_type, 1, cfg.n_head_kv, cfg.head_dim)
    p.items.append(PlanItem("KV cache", kv_bytes(cfg, n_ctx, k_type, v_type, n_attn) * n_slots,
                            f"-c {n_ctx} x {n_slots} slot(s), -ctk {k_type} -ctv {v_type}: "
                            f"{n_attn} layers x {per_tok} B/token"))
    p.items.append(PlanItem("GDN state", gdn_state_bytes(cfg, n_gdn) * n_slots,
                            f"{n_gdn} layers of conv + recurrent state x {n_slots} slot(s)"))
    p.items.append(PlanItem("activations", activation_bytes(cfg, n_ubatch), f"-ub {n_ubatch} rows"))
    rows = (n_ubatch if all_logits else max(1, n_slots)) if head else 0
    p.items.append(PlanItem("logits", size_class(rows * cfg.n_vocab * 4) if head else 0,
                            f"{rows} row(s) x {cfg.n_vocab} f32" + (" (all logits)" if all_logits else "")
                            if head else "on the last device"))
    splitk = size_class(64 * n_slots * cfg.n_head * (cfg.head_dim + 2) * 4)
    # a decode graph keeps one decode forward's working set in an arena of its own (cuda_graphs.py, 16 MiB chunks)
    graph = -(-(activation_bytes(cfg, n_slots) + size_class(n_slots * cfg.n_vocab * 4)) // (16 * MIB)) * 16 * MIB
    scratch = splitk + graph
    detail = f"decode split-K {splitk / MIB:.1f} MiB, decode graph {graph / MIB:.1f} MiB"
    if n_ubatch > 16 and any(t.type_name in QUANT_BLOCKS for t in tensors):   # the GEMV (<= 16 rows): none
        p.quant_work = quant_work_bytes(tensors, n_ubatch, work_bytes) if quant_work is None else quant_work
        scratch += size_class(p.quant_work)
        detail += f", block-quantized GEMM workspace {p.quant_work / MIB:.1f} MiB"
    if sparse is not None:
        nkb = -(-n_ctx // sparse.block)
        nqb = -(-n_ubatch // sparse.block)
        stats = 2 * size_class(cfg.n_head * (sparse.probe + nqb) * nkb * 4)
        lists = size_class(cfg.n_head * nqb * nkb * 4) + size_class(cfg.n_head * (nqb + 1) * 4)
        scratch += stats + lists
        detail += f", sparse probe stats + block lists {(stats + lists) / MIB:.1f} MiB"
    p.items.append(PlanItem("scratch", scratch, detail))
    return p


def check(p: MemoryPlan) -> None:
    """Raise PlanError when the plan passes its cap, naming the largest items and the flags that shrink them."""
    if p.cap is None or p.total <= p.cap:
        return
    over = p.total - p.cap
    big = sorted(p.items, key=lambda i: -i.nbytes)
    parts = ", ".join(f"{i.name} {i.nbytes / GIB:.2f} GiB" for i in big[:3])
    kv = p.item("KV cache")
    hints = [f"a smaller context (-c): the KV cache is {kv.nbytes / GIB:.2f} GiB ({kv.detail})",
             "a smaller KV cache format (-ctk q8_0 -ctv tq3, or -ctk tq3 -ctv tq3: 0.195x f16)",
             "fewer parallel slots (-np)", "a smaller micro-batch (-ub)"]
    what = "device memory cap (--device-mem-cap)" if p.cap_from_flag else "free device memory"
    raise PlanError(f"the model does not fit the {what}: it needs {p.total / GIB:.2f} GiB, "
                    f"{over / GIB:.2f} GiB more than the {p.cap / GIB:.2f} GiB available (largest: {parts}); "
                    f"use " + "; ".join(hints) + (", or raise --device-mem-cap" if p.cap_from_flag else ""))


def tensors_of(f) -> list[TensorDesc]:
    """The tensors of an open GGUFFile, in file order."""
    return [TensorDesc(n, f.info(n).type_name, tuple(f.info(n).shape)) for n in f.names()]


def upload_order(tensors: Sequence[TensorDesc], cfg: ModelConfig) -> list[TensorDesc]:
    """The order Qwen35Model uploads them (token_embd, output, output_norm, then per layer its mixer, norms, MLP),
    which is the order the arena sees."""
    by = {t.name: t for t in tensors}
    names = ["token_embd.weight", "output.weight", "output_norm.weight"]
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        if cfg.is_attention(il):
            mixer = ["attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight",
                     "attn_k_norm.weight"]
        else:
            mixer = ["attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight",
                     "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_norm.weight", "ssm_out.weight"]
        names += [b + m for m in mixer] + [b + m for m in ("attn_norm.weight", "post_attention_norm.weight",
                                                          "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")]
    ordered = [by[n] for n in names if n in by]
    seen = {t.name for t in ordered}
    return ordered + [t for t in tensors if t.name not in seen]


def parse_gib(s: str) -> int:
    """--device-mem-cap value: GiB as a number ('16', '15.5'), or with a unit: '16G', '16GiB', '15000M', '15000MiB'
    -> bytes."""
    t = s.strip()
    low = t.lower()
    for unit, mult in (("gib", GIB), ("mib", MIB), ("g", GIB), ("m", MIB)):
        if low.endswith(unit):
            value = float(t[:-len(unit)])
            break
    else:
        value, mult = float(t), GIB
    if not value > 0:
        raise ValueError(f"device memory cap must be positive, got '{s}'")
    return int(value * mult)


def host_available() -> int | None:
    """Bytes of host memory available now (Linux MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_host(cfg: ModelConfig, run) -> None:
    """The host backends keep the KV cache in numpy arrays (f16 as f16, any other type dequantized to f32): refuse
    a context whose caches cannot fit in the memory available, before the model is loaded (-c 1000000000 would
    otherwise fail deep in an allocation). run: the run_plan.RunPlan."""
    per_value = sum(2 if t == "f16" else 4 for t in (run.k_type, run.v_type))
    need = run.n_slots * len(cfg.attn_layers) * run.n_ctx * cfg.n_head_kv * cfg.head_dim * per_value
    have = host_available()
    if have is not None and need > have:
        raise PlanError(f"the KV cache for a context of {run.n_ctx} tokens ({run.n_slots} slot(s)) needs "
                        f"{need / 2**30:.1f} GiB of host memory and {have / 2**30:.1f} GiB is available: lower -c "
                        "(or -np)")


def prepare_device(backend, mf, run, device_mem_cap: int = 0, log=None) -> MemoryPlan | None:
    """Before a model is loaded onto a CUDA backend: plan its memory against the arena's cap (--device-mem-cap, or
    what the GPU has free), write one log line per item to `log` (None: silent), raise PlanError when it does not
    fit, and reserve the long-lived part in one piece. Backends whose device_memory() is None (host memory):
    None, not planned.
    mf: the opened loader.ModelFile; run: the run_plan.RunPlan (context, slots, -ctk / -ctv, -ub)."""
    memory = backend.device_memory()
    if memory is None:
        check_host(mf.cfg, run)
        return None
    cfg = mf.cfg
    free, arena_cap = memory
    cap = min(arena_cap, free)
    spec = getattr(run, "spec", None)          # RunPlan.spec (--spec-*), from mtp-engine's parsing
    on = spec is not None and spec.enabled
    tensors = upload_order(tensors_of(mf.gguf), cfg)
    head = coarse_head(spec, cfg.n_vocab, cfg.n_embd, mtp_head_type(tensors, cfg)) if on else None
    coarse = head.rows if head is not None else 0

    def planned(rows: int) -> MemoryPlan:
        return plan(tensors, cfg, run.n_ctx, run.n_slots, run.k_type, run.v_type, run.micro_batch, run.all_logits,
                    backend.sparse, cap, spec_n_max=spec.n_max if on else 0, coarse_rows=rows,
                    work_bytes=backend.gemm_work_bytes)
    p = planned(coarse)
    if coarse and p.total > cap:
        # the draft keeps its exact head rather than the run its context: plan without the copy
        size = coarse_head_bytes(coarse, cfg.n_embd)
        p = planned(0)
        p.coarse_dropped = True
        if p.total <= cap:
            p.notes.append(f"the MTP draft's CQ2 coarse head ({size / MIB:.1f} MiB) does not fit: drafting reads "
                           "the exact LM head (--spec-draft-coarse)")
    p.cap_from_flag = bool(device_mem_cap) and device_mem_cap <= free
    if log is not None:
        log.write("".join(line + "\n" for line in p.lines()))
    check(p)
    backend.reserve_persistent(p.persistent, "the weights, KV cache and recurrent state (memory plan)")
    if p.quant_work:
        backend.plan_quant_work(p.quant_work)
    return p


def planned_run(run, p: MemoryPlan | None):
    """The run plan to load with after prepare_device: --spec-draft-coarse off where the memory plan found no room
    for the draft's coarse head (the notes say so), else `run` as it was."""
    if p is None or not p.coarse_dropped:
        return run
    return replace(run, spec=replace(run.spec, draft_coarse=0))
