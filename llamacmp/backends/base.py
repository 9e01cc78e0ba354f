"""The backend op interface: every op the model calls, with shapes and dtypes.

Letters (defined once, DESIGN.md §4): T tokens in the batch, D hidden, Hq/Hk attention heads, Dh attention head
dim, F ffn, K/V GDN key/value heads, Dk/Dv their dims, C = 2*K*Dk + V*Dv conv channels, N vocabulary.
Activations are float32 unless stated. `Tensor` is whatever the backend uses (numpy array, device buffer);
the model never looks inside one. `Weight` is what `upload_matrix` returned.

A batch holds several sequences: row-wise ops (norms, projections, FFN) run on all T rows at once, and the
sequence mixers (conv, GDN recurrence, attention) read each sequence's slice and state from `StepBatch`.
numpy_ref.py implements every op plainly and is the specification; cuda.py must match it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..config import ModelConfig

Tensor = Any
Weight = Any



@dataclass(slots=True)
class SeqState:
    """One sequence's memory: KV cache per attention layer, conv + SSM state per GDN layer.

    k[i], v[i]: [n_ctx, Hk, Dh] (cache dtype)   for the i-th attention layer
    conv[j]:    [kernel-1, C] f32                for the j-th GDN layer (the last pre-conv inputs)
    ssm[j]:     [V, Dk, Dv] f32                  (S[h][i][j]: i key dim, j value dim)
    n_past:     tokens already in the state
    k_type, v_type: the cache formats (kv_quant.KV_TYPES); quantized on write, dequantized on read
    """
    n_ctx: int
    k: list
    v: list
    conv: list
    ssm: list
    n_past: int = 0
    k_type: str = "f16"
    v_type: str = "f16"
    # Rotary position minus cache row for the tokens that follow an image (llama.cpp's M-RoPE counting: an
    # image of nx x ny tokens takes nx*ny cache rows but max(nx, ny) positions). 0 for text-only sequences;
    # set by vision.prompt when it evaluates an image; StepBatch.build then fills rope_pos.
    rope_shift: int = 0
    # Backend-private: the conv and SSM states after each token of the last `keep_steps` batch this state ran
    # (speculative verification), until restore_steps() keeps one of them; None otherwise.
    steps: object = None


@dataclass(slots=True)
class Segment:
    """Rows [start, start+length) of the batch belong to `state`, at positions n_past .. n_past+length-1."""
    start: int
    length: int
    state: SeqState


@dataclass(slots=True)
class StepBatch:
    tokens: np.ndarray                 # [T] int32
    positions: np.ndarray              # [T] int32
    segments: list[Segment]
    output_rows: np.ndarray            # [R] int32: rows whose logits are wanted
    device: dict = field(default_factory=dict)  # backend-private copies (e.g. device-side positions)
    # Multimodal (vision) batches; both None for text, which then runs exactly as before.
    # rope_pos [T, 4] int32: per-token rotary positions (t, h, w, e) for IMROPE (rope.dimension_sections); when
    #   set, attention_prep rotates at these instead of `positions` (which stay the KV cache rows and the causal
    #   order). Text tokens carry (p, p, p, p); image tokens (p0, p0 + y, p0 + x, 0) as llama.cpp's mtmd does.
    # embeddings [T, D] float32 host array: when set, the model reads these rows as its input instead of the
    #   token embeddings of `tokens` (an image batch: every row is an image embedding).
    rope_pos: np.ndarray | None = None
    embeddings: np.ndarray | None = None
    # Speculative verification (> 0): conv1d_silu and gdn also keep each segment's state after every token of the
    # batch (on the backend: nothing crosses to the host), so that Backend.restore_steps can keep the first k. The
    # value is the most tokens a verify of this state takes (n_max + 1): the backend sizes its per-token buffers for
    # it at first use, so verifies of every draft length share them (a captured verify bakes their address in).
    keep_steps: int = 0

    @classmethod
    def build(cls, items: Sequence[tuple[SeqState, Sequence[int]]], all_logits: bool = False) -> "StepBatch":
        """items: (state, new tokens) per sequence; logits for the last token of each (or every token)."""
        tokens, positions, segments, out = [], [], [], []
        for state, toks in items:
            start = len(tokens)
            if state.n_past + len(toks) > state.n_ctx:
                raise ValueError(f"sequence needs {state.n_past + len(toks)} positions, its context is {state.n_ctx}")
            tokens.extend(toks)
            positions.extend(range(state.n_past, state.n_past + len(toks)))
            segments.append(Segment(start, len(toks), state))
            out.extend(range(start, start + len(toks)) if all_logits else [start + len(toks) - 1])
        batch = cls(np.asarray(tokens, np.int32), np.asarray(positions, np.int32), segments,
                    np.asarray(out, np.int32))
        if any(seg.state.rope_shift for seg in segments):
            # text after an image: every axis at the shifted position (IMROPE with equal axes = NeoX there)
            shift = np.concatenate([np.full(seg.length, seg.state.rope_shift, np.int32) for seg in segments])
            batch.rope_pos = np.repeat((batch.positions + shift)[:, None], 4, axis=1).astype(np.int32)
        return batch


class Backend(ABC):
    name: str = "abstract"

    # Block-sparse prefill for long prompts (sparse_attn.SparseConfig; None: attention is always dense). The tools
    # set it from --sparse-prefill / --sparse-budget; `attention` then runs chunks with at least cfg.min_len keys
    # sparse, with the per-head pattern chosen by sparse_attn's probe estimate, and counts in sparse_stats.
    sparse = None
    sparse_stats = None

    # -- optional capabilities: what the engine, the models and the tools may ask of any backend ------------------
    # Each has a default meaning "not this backend's business"; a backend that can do more overrides it. Callers
    # ask these, never the backend's name.
    device: int | None = None       # the GPU this backend runs on; None: host memory (no device bridge, no offload)
    captures_graphs = False         # decode_graphs() gives CUDA-graph decode steps (and a layer split may use them)
    arena = None                    # the device arena its tensors come from (None: host memory)
    # The GGUF tensor types its upload_matrix / embed / matmuls take (gguf_file.TYPE_NAMES values); None: every type
    # gguf_file loads. The loader refuses a file with any other type by name before anything is planned or uploaded.
    weight_types: frozenset[str] | None = None

    def activate(self) -> None:
        """Make the calling thread run this backend's work on the backend's device and stream (the engine thread
        after the loader thread). Host backends: nothing to do."""

    def bind_thread(self) -> None:
        """Give the calling thread a device stream of this backend's own (a layer split's part threads)."""

    def synchronize(self) -> None:
        """Wait for the work queued so far (timings). Host backends run synchronously."""

    @contextmanager
    def decode_order(self):
        """Within this block every op computes each row of a batch as the decode path computes it (a captured
        decode step: the same reduction order whatever the batch's size), so a speculative verification of several
        tokens gives each one its decode's logits bit for bit. Host backends compute rows alone anyway."""
        yield

    def decode_graphs(self, model, capacity: int = 8, hidden: bool = False):
        """engine/decode.py's decode steps captured as graphs (backends/cuda_graphs.py; hidden: each step also
        gives the hidden state the MTP head reads); None: run them eagerly."""
        return None

    def spec_graphs(self, model, n_max: int, capacity: int = 8, seqs: int = 1):
        """engine/speculative.py's MTP draft rounds and verify forwards captured as graphs (backends/spec_graphs.py:
        draft(), verify(); seqs: the sequences that draft, each keeping its shapes); None: the Speculator runs them
        eagerly."""
        return None

    def state_ops(self):
        """The prompt cache's copies of this backend's sequence state (backends/state_ops.py's StateOps)."""
        raise NotImplementedError(f"backend '{self.name}' has no state_ops(): prompt-cache checkpoints need it")

    probe_report: dict | None = None   # after pick_routes: the probe's rates and the routes (probe.as_json)

    def pick_routes(self, hw_route: str = "auto") -> list[str]:
        """Choose which unit runs each op family (routes.py): the probe's choice for `auto`, else the forced
        --hw-route; -> the lines for the load log. Host backends have no routes: only `auto` is accepted."""
        if hw_route != "auto":
            from .routes import RouteError
            raise RouteError(f"--hw-route {hw_route}: the {self.name} backend has no hardware routes (they choose "
                             "among the GPU's units; use auto, or run on a GPU)")
        return []

    def device_memory(self) -> tuple[int, int] | None:
        """(free device bytes, the arena's cap) when this backend allocates from a planned device arena, so that
        memplan.py plans and reserves before loading; None: host memory, not planned."""
        return None

    def reserve_persistent(self, nbytes: int, what: str) -> None:
        """Take the long-lived part of the memory plan in one piece (only asked when device_memory() is not None)."""
        raise NotImplementedError(f"backend '{self.name}' does not plan device memory")

    def plan_quant_work(self, nbytes: int) -> None:
        """The block-quantized prefill GEMM's workspace the memory plan made room for: runs of expanded weights
        larger than this go in passes (only asked when device_memory() is not None)."""
        raise NotImplementedError(f"backend '{self.name}' does not plan device memory")

    def gemm_work_bytes(self, type_name: str, T: int, n: int, rows: int) -> int:
        """The workspace that backend's block-quantized GEMM takes a run of `rows` rows (n values each) of this type
        in at T tokens, on its routes: the memory plan's measure (only asked when device_memory() is not None)."""
        raise NotImplementedError(f"backend '{self.name}' does not plan device memory")

    def release_memory(self) -> None:
        """Give back the device memory that no tensor holds any more (the server's sleep, after it dropped the model
        and the slots). Host backends: nothing to do, the dropped arrays are freed by Python."""

    # -- memory -------------------------------------------------------------------------------------------
    @abstractmethod
    def upload_matrix(self, w) -> Weight:
        """w: [out, in] np.float32, np.float16 (kept f16 on the backend), Q8Tensor or QuantTensor (any other block
        type gguf_file loads: the file's blocks), as loaded from the GGUF."""

    def upload_matrices(self, ws: Sequence) -> list[Weight]:
        """Matrices that one op multiplies by the same input (matmuls, rmsnorm_matmuls: the GDN's qkv + z + beta +
        alpha, attention's q + k + v, the FFN's gate + up), each as upload_matrix gives it; a backend may place them
        together so that its GEMM takes them in one launch (CudaBackend)."""
        return [self.upload_matrix(w) for w in ws]

    @abstractmethod
    def row_prefix(self, w: Weight, n: int) -> Weight:
        """The first n rows of an uploaded matrix w [out, in] -> [n, in]: a view of w's memory (every layout keeps
        a row's bytes together, rows in order), so the MTP draft's reduced vocabulary costs no memory."""

    @abstractmethod
    def upload_vector(self, w: np.ndarray) -> Tensor:
        """w: any-shape float32 (norm weights, conv kernels, per-head params)."""

    @abstractmethod
    def new_state(self, cfg: ModelConfig, n_ctx: int, kv_type: str = "f16", v_type: str | None = None) -> SeqState:
        """Zeroed memory for one sequence; `kv_type` for keys, `v_type` (default: the same) for values."""

    @abstractmethod
    def state_to_host(self, state: SeqState) -> dict[str, list[np.ndarray]]:
        """Copies of k, v (f32, first n_past rows), conv and ssm, for tests and checkpoints."""

    @abstractmethod
    def to_host(self, x: Tensor) -> np.ndarray:
        """Any tensor -> float32 numpy copy."""

    # -- row-wise ops ---------------------------------------------------------------------------------------
    @abstractmethod
    def embed(self, table: Weight, ids: np.ndarray) -> Tensor:
        """table [N, D], ids [T] int32 -> [T, D]. A quantized table's rows are dequantized whole (ggml's get_rows:
        the type's to_float), so Q8_0 / QuantTensor tables give the values of gguf.quants' dequantize."""

    @abstractmethod
    def rmsnorm(self, x: Tensor, w: Tensor, eps: float) -> Tensor:
        """x [T, D], w [D] -> x / rms(x) * w."""

    @abstractmethod
    def matmuls(self, x: Tensor, ws: Sequence[Weight]) -> list[Tensor]:
        """x [T, Din], each w [Dout_i, Din] -> [T, Dout_i]. Q8_0 weights see x quantized to 32-blocks of int8
        (q = round-half-even(x * 127/max|x|), d = max|x|/127 stored f16, as ggml's x86 quantize_row_q8_0) once
        for all ws, then integer dots scaled by d_w * d_x.
        QuantTensor weights: the reference (backends/quant_ref.py) quantizes x to the type's CPU vec_dot_type as
        llama.cpp b8462 does on x86-64 (Q8_0 for Q4_0/Q5_0/IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K 256-blocks for the
        K-quants, IQ4_XS and the IQ1-3 grid types), then dots exact in float64 of the dequantized operands. A fast
        backend may quantize x differently (e.g. Q8_0 32-blocks for every type); it is tested against the reference
        within tolerance.
        F16 weights (upload_matrix of an np.float16 array; the mmproj's) see x rounded to f16 first, as ggml's
        CPU mul_mat converts src1 to the F16 vec_dot type, then f16 x f16 products summed in f32 or wider.
        F32 weights: plain dots of f32 x and w."""

    def concat(self, xs: Sequence[Tensor], axis: int) -> Tensor:
        """2-D tensors joined along axis 0 (rows: each [T_i, D] -> [sum T_i, D]) or 1 (columns: each [T, D_i] ->
        [T, sum D_i]), as ggml_concat. This default copies through the host; a device backend overrides it."""
        return self.upload_vector(np.concatenate([self.to_host(x) for x in xs], axis=axis))

    @abstractmethod
    def add(self, x: Tensor, y: Tensor) -> Tensor:
        """x, y [T, D] -> x + y."""

    @abstractmethod
    def swiglu(self, gate: Tensor, up: Tensor) -> Tensor:
        """gate, up [T, F] -> silu(gate) * up."""

    @abstractmethod
    def gather_rows(self, x: Tensor, rows: np.ndarray) -> Tensor:
        """x [T, D], rows [R] -> [R, D]."""

    @abstractmethod
    def rows(self, x: Tensor, start: int, n: int) -> Tensor:
        """x [T, ...] -> rows start .. start + n - 1 [n, ...] without a copy (x's memory, kept alive by them)."""

    @abstractmethod
    def write_rows(self, dst: Tensor, at: int, src: Tensor, start: int, n: int) -> Tensor:
        """Rows start .. start + n - 1 of src [T, ...] copied into rows at .. at + n - 1 of dst [R, ...] (the same
        row shape) -> those rows of dst, a view (as rows())."""

    def copy_rows(self, x: Tensor, start: int, n: int) -> Tensor:
        """x [T, ...] -> rows start .. start + n - 1 [n, ...] in memory of their own: x may be rewritten after (a
        graph's buffer, by its next replay)."""
        return self.concat([self.rows(x, start, n)], axis=0)

    # -- attention -------------------------------------------------------------------------------------------
    @abstractmethod
    def attention_prep(self, qg: Tensor, k: Tensor, q_norm: Tensor, k_norm: Tensor, batch: StepBatch,
                       cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
        """qg [T, Hq*2*Dh] (per head [q | gate]), k [T, Hk*Dh] ->
        q [T, Hq, Dh] and k [T, Hk, Dh] RMS-normed per head then rotated (NeoX pairs on the first n_rot dims,
        base rope_base, at batch.positions), gate [T, Hq*Dh].
        When batch.rope_pos [T, 4] is set: IMROPE (llama.cpp LLAMA_ROPE_TYPE_IMROPE, qwen35) instead. Pair i,
        0 <= i < n_rot/2, still rotates (x[i], x[i + n_rot/2]) by p * rope_base^(-2i/n_rot), where with
        s = cfg.rope_sections, sector = i % sum(s), p = rope_pos[t, axis] and axis =
            1 if sector % 3 == 1 and sector < 3*s1;  2 if sector % 3 == 2 and sector < 3*s2;
            0 if sector % 3 == 0 and sector < 3*s0;  3 otherwise
        (no per-section restart). With all four equal this is exactly the NeoX rotation at that position."""

    @abstractmethod
    def key_prep(self, k: Tensor, k_norm: Tensor, batch: StepBatch, cfg: ModelConfig) -> Tensor:
        """k [T, Hk*Dh] -> attention_prep's k [T, Hk, Dh] alone, the same bits: the MTP head's catch-up writes
        its KV cache only (Qwen35Model.mtp_fill), so it neither projects q and its gate nor prepares them."""

    @abstractmethod
    def attention(self, q: Tensor, k: Tensor, v: Tensor, batch: StepBatch, layer: int, cfg: ModelConfig) -> Tensor:
        """q [T, Hq, Dh], k [T, Hk, Dh], v [T, Hk*Dh] -> [T, Hq*Dh].
        Writes k, v into each segment's cache at its positions (kv_write), then causal softmax(q k^T / sqrt(Dh)) v
        over the cache (GQA: q head h reads kv head h // (Hq/Hk)). `layer` indexes state.k / state.v."""

    @abstractmethod
    def kv_write(self, k: Tensor, v: Tensor, batch: StepBatch, layer: int, cfg: ModelConfig) -> None:
        """k [T, Hk, Dh], v [T, Hk*Dh] -> each segment's rows into its state's k[layer] / v[layer] at its
        positions, in the cache formats: exactly what attention() writes, without the attention (the MTP head's
        catch-up only keeps its cache current: Qwen35Model.mtp_fill). n_past is left as it is."""

    @abstractmethod
    def sigmoid_mul(self, x: Tensor, gate: Tensor) -> Tensor:
        """x, gate [T, n] -> x * sigmoid(gate)."""

    # -- gated delta net -------------------------------------------------------------------------------------
    @abstractmethod
    def gdn_gates(self, alpha: Tensor, beta: Tensor, dt_bias: Tensor, ssm_a: Tensor) -> tuple[Tensor, Tensor]:
        """alpha, beta [T, V] raw projections -> g = softplus(alpha + dt_bias) * ssm_a (log-decay, <= 0),
        b = sigmoid(beta), both [T, V]."""

    @abstractmethod
    def conv1d_silu(self, x: Tensor, w: Tensor, batch: StepBatch, layer: int) -> Tensor:
        """x [T, C], w [C, kernel] -> silu(causal depthwise conv over [state; x]) [T, C]; updates state.conv[layer]
        to the last kernel-1 inputs of each segment."""

    @abstractmethod
    def gdn(self, qkv: Tensor, g: Tensor, b: Tensor, batch: StepBatch, layer: int, cfg: ModelConfig) -> Tensor:
        """qkv [T, C] (after conv), g, b [T, V] -> o [T, V*Dv].
        q, k = L2-normalised per head (eps = rms eps), q scaled by 1/sqrt(Dk); V head h uses K head h % K;
        per token: S = exp(g) S; S += k (b (v - S^T k))^T; o = S^T q. Updates state.ssm[layer]."""

    def restore_steps(self, state: SeqState, k: int) -> None:
        """After a `keep_steps` batch of L tokens of `state`: make its conv and SSM states those after the first k
        tokens of that batch (1 <= k <= L; k = L keeps them as they are) and drop the kept per-token states. The
        KV rows past the kept tokens need no rewind: the caller sets n_past back and later tokens overwrite them."""
        raise NotImplementedError(f"backend '{self.name}' cannot rewind recurrent state (speculative decoding)")

    @abstractmethod
    def gated_rmsnorm(self, o: Tensor, z: Tensor, w: Tensor, eps: float, head_dim: int) -> Tensor:
        """o, z [T, V*Dv], w [Dv] -> rmsnorm per head of o, times w, times silu(z)."""

    # -- the MTP draft's argmax (engine/speculative.py): ids stay on the backend, only they cross ---------------
    def argmax(self, logits: Tensor, out: Tensor | None = None) -> Tensor:
        """logits [R, N] -> [R] int32 on the backend: per row the index of the largest value, the lowest among
        ties, NaN never chosen (a row of NaN: 0). out: an int32 [R] tensor of this backend to write instead (a
        captured graph's buffer)."""
        raise NotImplementedError(f"backend '{self.name}' has no argmax")

    def ids_to_host(self, ids: Tensor) -> np.ndarray:
        """int32 ids on the backend (argmax, coarse_argmax) -> a host int32 array (waits for them)."""
        return np.array(ids, np.int32)

    def coarse_copy(self, w: Weight) -> Weight:
        """The MTP draft's coarse head: w [N, D] (any uploaded matrix, D a multiple of 32) -> a CQ2 matrix [N, D]
        (cq2_ref.py: 0.3125 bytes a weight): each row as embed() dequantizes it, quantized by cq2_ref.quantize_cq2.
        row_prefix takes its first rows. Raises NotImplementedError where the backend cannot (the draft keeps the exact
        head) and MemoryError where it does not fit."""
        raise NotImplementedError(f"backend '{self.name}' has no coarse head")

    def coarse_logits(self, x: Tensor, coarse: Weight) -> Tensor:
        """x [R, D] times coarse [N, D] (coarse_copy's) -> the coarse logits [R, N] f32: x quantized to Q8_0 blocks
        (as for a Q8_0 matrix), then cq2_ref.cq2_gemv."""
        raise NotImplementedError(f"backend '{self.name}' has no coarse head")

    def coarse_argmax(self, x: Tensor, coarse: Weight, exact: Weight, k: int, out: Tensor | None = None) -> Tensor:
        """x [R, D], exact [N, D] a head, coarse [N, D] coarse_copy of it, 1 <= k <= min(N, spec.COARSE_K_MAX) ->
        [R] int32 on the backend: per row the k ids whose logits coarse_logits(x, coarse) are largest (the larger first,
        the lower id among equal ones, NaN as -inf), then of those the id whose exact logit matmuls(x, [exact]) is
        largest (the lowest id among ties, NaN never chosen; all NaN: the coarse best). This is
        argmax(matmuls(x, [exact])) whenever that id is among the k. out: as argmax's."""
        raise NotImplementedError(f"backend '{self.name}' has no coarse head")

    # -- fused ops ---------------------------------------------------------------------------------------------
    # Each is defined as the composition written in its body (numpy_ref.py spells the same composition out as the
    # specification); a backend overrides one to skip the intermediate tensor and the launches between the parts.
    # The model calls these, so the norm output feeding projections and the residual adds never need a pass of
    # their own where the backend fuses them.

    def rmsnorm_matmuls(self, x: Tensor, w: Tensor, eps: float, ws: Sequence[Weight]) -> list[Tensor]:
        """x [T, D], w [D], each ws[i] [Dout_i, D] -> matmuls(rmsnorm(x, w, eps), ws)."""
        return self.matmuls(self.rmsnorm(x, w, eps), ws)

    def matmul_add(self, x: Tensor, w: Weight, residual: Tensor) -> Tensor:
        """x [T, Din], w [Dout, Din], residual [T, Dout] -> residual + matmuls(x, [w])[0]."""
        return self.add(residual, self.matmuls(x, [w])[0])

    def swiglu_matmul_add(self, gate: Tensor, up: Tensor, w: Weight, residual: Tensor) -> Tensor:
        """gate, up [T, F], w [D, F], residual [T, D] -> residual + matmuls(swiglu(gate, up), [w])[0]."""
        return self.matmul_add(self.swiglu(gate, up), w, residual)

    def sigmoid_mul_matmul_add(self, x: Tensor, gate: Tensor, w: Weight, residual: Tensor) -> Tensor:
        """x, gate [T, n], w [D, n], residual [T, D] -> residual + matmuls(sigmoid_mul(x, gate), [w])[0]."""
        return self.matmul_add(self.sigmoid_mul(x, gate), w, residual)

    def gated_rmsnorm_matmul_add(self, o: Tensor, z: Tensor, norm_w: Tensor, eps: float, head_dim: int, w: Weight,
                                 residual: Tensor) -> Tensor:
        """o, z [T, V*Dv], norm_w [Dv], w [D, V*Dv], residual [T, D] ->
        residual + matmuls(gated_rmsnorm(o, z, norm_w, eps, head_dim), [w])[0]."""
        return self.matmul_add(self.gated_rmsnorm(o, z, norm_w, eps, head_dim), w, residual)

    # -- vision encoder (mmproj, projector qwen3vl_merger; llamacmp/vision/encoder.py) ------------------------
    # Letters: P image patches (or merged tokens), E encoder width, H encoder heads, Dh = E / H.
    # matmuls() also takes F16 weights here: upload_matrix(np.float16 array) keeps them f16 (see its docstring).
    def reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """x (row-major, contiguous) -> the same elements as `shape` (same count), e.g. [T, E] -> [T/4, 4E] for the
        patch merger. This default copies through the host; a backend may return a view instead."""
        return self.upload_vector(self.to_host(x).reshape(shape))

    def rope_positions(self, pos: np.ndarray):
        """pos [T, 4] int32 host array -> what rope_vision takes as `pos` for one image, made once and passed to all
        its calls (2 per encoder layer): the host array itself here; a device backend uploads it once."""
        return pos

    @abstractmethod
    def bias_add(self, x: Tensor, b: Tensor) -> Tensor:
        """x [T, N], b [N] -> x + b (b broadcast over rows)."""

    @abstractmethod
    def layernorm(self, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
        """x [T, D], w [D], b [D] -> (x - mean) / sqrt(var + eps) * w + b per row; var = mean((x - mean)^2)
        (biased), as ggml_norm followed by ggml_mul and ggml_add."""

    @abstractmethod
    def gelu(self, x: Tensor) -> Tensor:
        """x [T, N] -> the tanh-approximated GELU as llama.cpp's CPU backend evaluates it, elementwise:
            x <= -10: 0;   x >= 10: x;   otherwise f16( g(f16(x)) ),
            g(v) = 0.5 * v * (1 + tanh(sqrt(2/pi) * v * (1 + 0.044715 * v^2)))   (computed in f32 or wider)
        where f16() rounds to the nearest half (ties to even) and back to f32. This is ggml_gelu (NOT
        ggml_gelu_erf), what clip.cpp's build_ffn applies for FFN_GELU, which qwen3vl uses in the ViT blocks
        (clip.use_gelu = true) and in the merger MLP; ggml-cpu computes it through a 65536-entry f16 table
        (GGML_GELU_FP16), hence the two roundings. Matching them matters: the plain f32 formula moves the tiny
        fixtures' embeddings by ~7e-4 relative, enough to flip near-tied greedy tokens against the goldens."""

    @abstractmethod
    def rope_vision(self, x: Tensor, pos: np.ndarray, n_heads: int, head_dim: int,
                    sections: tuple[int, int, int, int], theta: float) -> Tensor:
        """x [T, H*Dh] (row t, head h at columns h*Dh .. h*Dh+Dh-1), pos [T, 4] int32 host array -> [T, H*Dh].

        ggml_rope_multi with GGML_ROPE_TYPE_VISION (n_dims = Dh/2, freq_scale 1, no YaRN), as qwen3vl.cpp calls it
        with sections = (Dh/4, Dh/4, Dh/4, Dh/4) and theta = 10000. Each head's pair i, 0 <= i < Dh/2, rotates
        (x[i], x[i + Dh/2]) by angle a_i:
            x'[i]        = x[i] cos a - x[i + Dh/2] sin a
            x'[i + Dh/2] = x[i] sin a + x[i + Dh/2] cos a
        With s = sections, S = sum(s), sector = i % S, the axis and its first pair are
            sector <  s0                   -> axis 0, first pair 0
            s0 <= sector < s0+s1           -> axis 1, first pair s0
            s0+s1 <= sector < s0+s1+s2     -> axis 2, first pair s0+s1
            otherwise                      -> axis 3, first pair s0+s1+s2
        and a_i = pos[t, axis] * theta^(-2 * (sector - first) / (Dh/2)): every section restarts the frequency
        ladder (ggml's `indep_sects` for VISION). With qwen3vl's sections only axes 0 (patch row y) and 1 (patch
        column x) are reached; pos columns 2, 3 repeat y, x."""

    @abstractmethod
    def attention_full(self, q: Tensor, k: Tensor, v: Tensor, n_heads: int, head_dim: int, scale: float) -> Tensor:
        """q, k, v [T, H*Dh] (head h at columns h*Dh ..) -> [T, H*Dh]: per head softmax(scale * q k^T) v over all
        T rows (non-causal, no mask, no cache), f32 in and out; the reference accumulates in float64."""


@dataclass(slots=True)
class RowSample:
    """One logits row's draw by the backend (`sample_rows`): llamacmp/sampling.py's default chain (samplers in the
    default order, typical-p off) with the categorical draw made at `u`, the number the host sampler's generator
    gives. Built by engine/decode.py from a Sampler; rows the backend cannot do sample on the host instead.

    bias: logit bias by token id (ignore_eos adds -inf for the EOG ids); window: [n] int32 the penalty window,
    oldest first (empty when the penalties are neutral); top_k: the number of candidates kept, 1..SAMPLE_MAX_K."""
    temp: float
    top_k: int
    top_p: float
    min_p: float
    min_keep: int
    penalty_repeat: float
    penalty_freq: float
    penalty_present: float
    window: np.ndarray
    bias: dict
    u: float
