"""Qwen3.5 / 3.6 dense hybrid model (GGUF architecture `qwen35`): 3 Gated DeltaNet layers per gated-attention
layer, each followed by a SwiGLU MLP; optionally the MTP (multi-token prediction) head that drafts for speculative
decoding (engine/speculative.py). Written once against the backend op interface; no kernels here."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..backends.base import Backend, StepBatch
from ..config import ModelConfig
from ..gguf_file import Q8Tensor, QuantTensor
from ..weights import ModelWeights


@dataclass(slots=True)
class _Attn:
    wq: object; wk: object; wv: object; wo: object; q_norm: object; k_norm: object


@dataclass(slots=True)
class _GDN:
    w_in: list; conv: object; dt_bias: object; ssm_a: object; norm: object; w_out: object


@dataclass(slots=True)
class _Layer:
    attn_norm: object; ffn_norm: object; w_gate_up: list; w_down: object
    attn: _Attn | None; gdn: _GDN | None; slot: int   # slot: index into the state's KV or GDN lists


@dataclass(slots=True)
class _Mtp:
    layer: _Layer           # a full-attention decoder block; its KV cache is slot 0 of an MTP state (mtp_state)
    eh_proj: object; enorm: object; hnorm: object; head_norm: object; embed: object; head: object
    head_type: str = "F32"      # the head's GGUF type (spec.coarse_rows: whether a CQ2 copy saves bytes)
    draft_head: object = None   # the head's first rows, the draft vocabulary (set_draft_vocab); None: all of head
    # --spec-draft-coarse (set_draft_coarse): a CQ2 copy of the head's first rows, the candidates each draft step
    # rescores, the fewest rows a draft head must have to use it, and the copy's rows of the draft head now
    coarse: object = None
    coarse_k: int = 0
    coarse_min: int = 1
    draft_coarse: object = None


class Qwen35Model:
    architecture = "qwen35"
    splits_batches = False     # prompt chunks come cut at -ub (a layer split takes whole -b batches: split.py)
    mtp: _Mtp | None = None    # the MTP head, when the file has one (speculative decoding: engine/speculative.py)

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, backend: Backend, layers: range | None = None,
                 embed: bool = True, head: bool = True):
        """layers / embed / head: upload only these parts (default: all). A layer split (llamacmp/split/) holds one
        model per backend, each with its own layer range; the layers it lacks are None."""
        self.cfg, self.be = cfg, backend
        m, ms, v = backend.upload_matrix, backend.upload_matrices, backend.upload_vector
        layers = range(cfg.n_layer) if layers is None else layers
        self.token_embd = m(weights.token_embd) if embed or (head and weights.output is weights.token_embd) else None
        if head:
            self.output = self.token_embd if weights.output is weights.token_embd else m(weights.output)
            self.output_norm = v(weights.output_norm)
        self.layers = []
        for il, lw in enumerate(weights.layers):
            if il not in layers:
                self.layers.append(None)
                continue
            attn = gdn = None
            if lw.attn is not None:
                a = lw.attn
                attn = _Attn(*ms([a.attn_q, a.attn_k, a.attn_v]), m(a.attn_output), v(a.attn_q_norm),
                             v(a.attn_k_norm))
                slot = cfg.attn_layers.index(il)
            else:
                g = lw.gdn
                gdn = _GDN(ms([g.attn_qkv, g.attn_gate, g.ssm_beta, g.ssm_alpha]), v(g.ssm_conv1d),
                           v(g.ssm_dt_bias), v(g.ssm_a), v(g.ssm_norm), m(g.ssm_out))
                slot = cfg.gdn_layers.index(il)
            self.layers.append(_Layer(v(lw.attn_norm), v(lw.post_attention_norm), ms([lw.ffn_gate, lw.ffn_up]),
                                      m(lw.ffn_down), attn, gdn, slot))
        self.mtp = self._upload_mtp(weights) if head and weights.mtp is not None else None

    def _upload_mtp(self, weights: ModelWeights) -> _Mtp:
        """The MTP block; its embedding and LM head are the model's own uploads when the file has no separate ones."""
        m, ms, v, w = self.be.upload_matrix, self.be.upload_matrices, self.be.upload_vector, weights.mtp
        a, b = w.block.attn, w.block
        layer = _Layer(v(b.attn_norm), v(b.post_attention_norm), ms([b.ffn_gate, b.ffn_up]), m(b.ffn_down),
                       _Attn(*ms([a.attn_q, a.attn_k, a.attn_v]), m(a.attn_output), v(a.attn_q_norm),
                             v(a.attn_k_norm)), None, 0)
        embed = self.token_embd if w.embed is weights.token_embd and self.token_embd is not None else m(w.embed)
        head = self.output if w.head is weights.output else m(w.head)
        return _Mtp(layer, m(w.eh_proj), v(w.enorm), v(w.hnorm), v(w.head_norm), embed, head, _type_name(w.head))

    def forward(self, batch: StepBatch):
        """Runs the batch, advances every segment's state, returns logits [len(batch.output_rows), N]."""
        x = self.run_layers(self.embed(batch), batch, range(len(self.layers)))
        for seg in batch.segments:
            seg.state.n_past += seg.length
        return self.head(x, batch)

    def forward_hidden(self, batch: StepBatch):
        """forward, and also the hidden state the MTP head reads: (logits [R, N], h [T, D] = rmsnorm(x, output_norm)
        for every row). llama.cpp 0c1e570 qwen35.cpp: the main graph's t_h_nextn is build_norm(cur, output_norm)
        before the LM head, over all rows (embeddings_nextn_masked is false for the target context)."""
        x = self.run_layers(self.embed(batch), batch, range(len(self.layers)))
        for seg in batch.segments:
            seg.state.n_past += seg.length
        # the logits through the same fused op as forward(), so verified tokens see exactly the decode's logits
        return self.head(x, batch), self.be.rmsnorm(x, self.output_norm, self.cfg.rms_eps)

    def mtp_state(self, n_ctx: int, kv_type: str = "f16", v_type: str | None = None):
        """Zeroed memory of the MTP block for one sequence: one attention layer's KV cache, no recurrent state."""
        cfg = replace(self.cfg, n_layer=1, full_attention_interval=1, n_nextn=0)
        return self.be.new_state(cfg, n_ctx, kv_type, v_type)

    def mtp_forward(self, batch: StepBatch, h, draft_ids: bool = False, out=None):
        """The MTP head over `batch` (whose segments hold MTP states from mtp_state), h [T, D] the main model's
        hidden state (forward_hidden) of the token before each row's token -> (logits [R, N] of batch.output_rows or
        None when R = 0, h_out [T, D]); advances the MTP states' n_past. draft_ids: instead of the logits, the
        draft's ids [R] int32 on the backend (written into `out` when given): the draft head's argmax, through its
        coarse copy where set_draft_coarse set one (Backend.coarse_argmax), else of its logits.

        As llama.cpp 0c1e570 qwen35.cpp graph_mtp: eh_proj(concat(enorm(embed(token)), hnorm(h))) -> one
        full-attention decoder block (its own KV cache, rotary at the token's position) -> shared_head_norm ->
        LM head. h_out is that normed state (graph_mtp's t_h_nextn): common/speculative.cpp's draft() feeds it as h
        of the next draft position, so drafts beyond the first chain on the head's own output."""
        be, t, eps = self.be, self.mtp, self.cfg.rms_eps
        x = self._mlp(self._attention(self._mtp_input(batch, h), t.layer, batch), t.layer)
        for seg in batch.segments:
            seg.state.n_past += seg.length
        h_out = be.rmsnorm(x, t.head_norm, eps)
        if not batch.output_rows.shape[0]:     # (a captured draft's rows are a device tensor)
            return None, h_out
        head = t.head if t.draft_head is None else t.draft_head
        x = be.gather_rows(h_out, batch.output_rows)
        if not draft_ids:
            return be.matmuls(x, [head])[0], h_out
        if t.draft_coarse is not None:
            return be.coarse_argmax(x, t.draft_coarse, head, min(t.coarse_k, head.shape[0]), out), h_out
        return be.argmax(be.matmuls(x, [head])[0], out), h_out

    def mtp_fill(self, batch: StepBatch, h) -> None:
        """What mtp_forward with no output rows leaves behind, alone: the block's K and V rows of `batch` in the MTP
        states' caches (bit for bit mtp_forward's: the same ops up to the write) and their n_past advanced. The
        pairs a sequence queues while it steps plainly or prefills need nothing else; the attention over the
        context, the output projection, the MLP and the head norm are skipped, and so are q and its gate (wq: 45% of
        the FLOPs left on the 9B), which only the attention reads."""
        be, layer = self.be, self.mtp.layer
        # k and v as _attention_inputs makes them: each matrix's GEMM is its own, with or without wq beside it
        k, v = be.rmsnorm_matmuls(self._mtp_input(batch, h), layer.attn_norm, self.cfg.rms_eps,
                                  [layer.attn.wk, layer.attn.wv])
        be.kv_write(be.key_prep(k, layer.attn.k_norm, batch, self.cfg), v, batch, layer.slot, self.cfg)
        for seg in batch.segments:
            seg.state.n_past += seg.length

    def _mtp_input(self, batch: StepBatch, h):
        """The MTP block's input [T, D]: eh_proj(concat(enorm(embed(token)), hnorm(h)))."""
        be, t, eps = self.be, self.mtp, self.cfg.rms_eps
        e = be.rmsnorm(be.embed(t.embed, batch.tokens), t.enorm, eps)
        return be.matmuls(be.concat([e, be.rmsnorm(h, t.hnorm, eps)], axis=1), [t.eh_proj])[0]

    def set_draft_vocab(self, n: int) -> None:
        """--spec-draft-vocab: the MTP head proposes only token ids 0 .. n-1 (0: the whole vocabulary). BPE ids come
        in merge order, roughly most frequent first, so this prefix keeps most drafts while the head reads n rows of
        the LM head instead of all (the verify keeps the full head: outputs do not change, only acceptance may).
        Draft graphs captured after this call use the prefix."""
        rows = self.mtp.head.shape[0]
        if not 0 <= n <= rows:
            raise ValueError(f"--spec-draft-vocab {n}: must be 1 .. {rows} (the vocabulary), or 0 for all of it")
        self.mtp.draft_head = None if n in (0, rows) else self.be.row_prefix(self.mtp.head, n)
        self._pick_coarse()

    def set_draft_coarse(self, k: int, rows: int = 0, min_rows: int = 1) -> bool:
        """--spec-draft-coarse: a draft head of at least min_rows rows (set_draft_vocab's) takes its argmax through a
        CQ2 copy of the head's first `rows` rows (Backend.coarse_copy: made when these rows are first asked for,
        then kept), whose k best ids the exact head rescores (Backend.coarse_argmax); k or rows 0: the exact head,
        and the copy's memory goes back. Draft graphs captured after this call use it. -> whether a copy was made
        now (MemoryError, NotImplementedError from the backend: none was, and the draft keeps the exact head)."""
        t, made = self.mtp, False
        if not 0 <= rows <= t.head.shape[0]:
            raise ValueError(f"coarse head of {rows} rows: the head has {t.head.shape[0]}")
        t.coarse_k, t.coarse_min = (k, min_rows) if rows else (0, min_rows)
        if not t.coarse_k:
            t.coarse = None
        elif t.coarse is None or t.coarse.shape[0] != rows:
            t.coarse = t.draft_coarse = None              # (the old copy's memory goes back before the new one's)
            try:
                t.coarse = self.be.coarse_copy(t.head if rows == t.head.shape[0] else self.be.row_prefix(t.head, rows))
            except (MemoryError, NotImplementedError):
                t.coarse_k = 0
                raise
            made = True
        self._pick_coarse()
        return made

    def _pick_coarse(self) -> None:
        """The coarse copy's rows of the draft head now, when set_draft_coarse applies to it."""
        t = self.mtp
        n = (t.head if t.draft_head is None else t.draft_head).shape[0]
        use = t.coarse_k > 0 and t.coarse is not None and t.coarse_min <= n <= t.coarse.shape[0]
        t.draft_coarse = None if not use else t.coarse if n == t.coarse.shape[0] else self.be.row_prefix(t.coarse, n)

    # The three steps of forward, also run separately by a layer split (each on the backend holding its part).
    def embed(self, batch: StepBatch):
        """-> the hidden state x [T, D] of the batch's tokens (or its image embeddings, for an image batch)."""
        if batch.embeddings is not None:
            return self.be.upload_vector(batch.embeddings)
        return self.be.embed(self.token_embd, batch.tokens)

    def run_layers(self, x, batch: StepBatch, layers: range):
        """x [T, D] through `layers` (which this model holds); the states' n_past is left as it is."""
        for il in layers:
            layer = self.layers[il]
            # Each block takes the residual stream and returns it with its output added: x + mixer(norm(x)), then
            # x + mlp(norm(x)). The norms and adds are fused into the projections (base.Backend's fused ops).
            x = self._attention(x, layer, batch) if layer.attn else self._gated_delta_net(x, layer, batch)
            x = self._mlp(x, layer)
        return x

    def head(self, x, batch: StepBatch):
        """x [T, D] -> logits [len(batch.output_rows), N]."""
        be = self.be
        return be.rmsnorm_matmuls(be.gather_rows(x, batch.output_rows), self.output_norm, self.cfg.rms_eps,
                                  [self.output])[0]

    def _mlp(self, x, layer: _Layer):
        """x [T, D] -> x + down(swiglu(gate(h), up(h))), h = rmsnorm(x)."""
        gate, up = self.be.rmsnorm_matmuls(x, layer.ffn_norm, self.cfg.rms_eps, layer.w_gate_up)
        return self.be.swiglu_matmul_add(gate, up, layer.w_down, x)

    def _attention(self, x, layer: _Layer, batch: StepBatch):
        """x [T, D] -> x + the gated attention of rmsnorm(x)."""
        be, a = self.be, layer.attn
        q, k, v, gate = self._attention_inputs(x, layer, batch)
        # Causal GQA attention over the cache, then the sigmoid output gate.
        o = be.attention(q, k, v, batch, layer.slot, self.cfg)
        return be.sigmoid_mul_matmul_add(o, gate, a.wo, x)

    def _attention_inputs(self, x, layer: _Layer, batch: StepBatch):
        """x [T, D] -> the attention's q [T, Hq, Dh], k [T, Hk, Dh], v [T, Hk*Dh] and output gate [T, Hq*Dh] of
        rmsnorm(x)."""
        be, a = self.be, layer.attn
        # Projections: q and its output gate come interleaved per head from one matrix.
        qg, k, v = be.rmsnorm_matmuls(x, layer.attn_norm, self.cfg.rms_eps, [a.wq, a.wk, a.wv])
        # Per-head q/k RMSNorm, then partial rotary on the first n_rot dims.
        q, k, gate = be.attention_prep(qg, k, a.q_norm, a.k_norm, batch, self.cfg)
        return q, k, v, gate

    def _gated_delta_net(self, x, layer: _Layer, batch: StepBatch):
        """x [T, D] -> x + the Gated DeltaNet of rmsnorm(x)."""
        be, g, cfg = self.be, layer.gdn, self.cfg
        # Projections: mixed qkv, output gate z, and the per-head beta and decay inputs.
        qkv, z, beta, alpha = be.rmsnorm_matmuls(x, layer.attn_norm, cfg.rms_eps, g.w_in)
        decay, beta = be.gdn_gates(alpha, beta, g.dt_bias, g.ssm_a)
        # Causal depthwise conv over q, k and v channels (state carries the last kernel-1 inputs), then SiLU.
        qkv = be.conv1d_silu(qkv, g.conv, batch, layer.slot)
        # Delta rule over the recurrent state.
        o = be.gdn(qkv, decay, beta, batch, layer.slot, cfg)
        # Gated RMSNorm per value head, then the output projection.
        return be.gated_rmsnorm_matmul_add(o, z, g.norm, cfg.rms_eps, cfg.ssm_head_dim, g.w_out, x)


def _type_name(w) -> str:
    """The GGUF type of a loaded matrix: a Q8Tensor, a QuantTensor, or an f32 / f16 array."""
    if isinstance(w, Q8Tensor):
        return "Q8_0"
    if isinstance(w, QuantTensor):
        return w.type_name
    return "F16" if str(w.dtype) == "float16" else "F32"


Model = Qwen35Model
