"""Qwen3.5's multi-token-prediction (MTP) head, as llama.cpp 0c1e570 runs it, on top of a frozen trunk.

The block (src/models/qwen35.cpp `graph_mtp`; parameter names as in Qwen3.5 HF checkpoints, which the converter,
conversion/qwen.py `_QwenMtpMixin`, maps to blk.N.nextn.* / blk.N.*):

    x   = fc(concat(pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)))    # nextn.eh_proj / enorm / hnorm
    x   = a full-attention Qwen3.5 decoder block (gated q, q/k norms, partial rope)      # blk.N.attn_* / ffn_*
    out = norm(x)                                                                        # nextn.shared_head_norm
    logits of x_{t+2} = lm_head(out)                                                     # the trunk's output.weight

h_t is the trunk's hidden state after its output norm (qwen35.cpp sets t_h_nextn after output_norm), embed and
lm_head are the trunk's own (the file has no nextn.embed_tokens / shared_head_head). The block attends causally over
the MTP inputs of all earlier positions (llama.cpp fills the MTP KV cache over the prompt, pairing h_{p-1} with
x_p at position p), so training runs it over whole sequences with the next-next-token loss.
"""
from __future__ import annotations

import copy

import torch
from torch import nn


def attention_layer_index(cfg) -> int:
    """Index of a full-attention layer in cfg.layer_types (the decoder layer reads its kind from there)."""
    return max(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")


class MTPHead(nn.Module):
    """state_dict keys: fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0.*, norm (HF's `mtp.*` minus the
    prefix). Norm weights are stored as w with the model's (1 + w) convention, like every Qwen3.5 RMSNorm."""

    def __init__(self, cfg):
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
        super().__init__()
        cfg = copy.deepcopy(cfg)
        cfg._attn_implementation = "sdpa"      # causal without a mask (eager would attend to the future)
        D, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(D, eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(D, eps)
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(cfg, attention_layer_index(cfg))])
        self.norm = Qwen3_5RMSNorm(D, eps)
        nn.init.normal_(self.fc.weight, std=cfg.initializer_range)

    def inputs(self, h: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """h: [B, T, D] hidden state (output-normed) at t; embeds: [B, T, D] embedding of x_{t+1} -> [B, T, D]."""
        return self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(h)], dim=-1))

    def block(self, x: torch.Tensor, position_embeddings, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, D] -> [B, L, D], the input of the LM head. mask: [B or 1, 1, L, L] bool (True: attend);
        None: causal."""
        return self.norm(self.layers[0](x, position_embeddings=position_embeddings, attention_mask=mask))

    def forward(self, h: torch.Tensor, embeds: torch.Tensor, position_embeddings) -> torch.Tensor:
        """position_embeddings: (cos, sin) of x_{t+1}'s positions. Returns [B, T, D], the input of the LM head."""
        return self.block(self.inputs(h, embeds), position_embeddings)

    def init_from_trunk(self, trunk) -> None:
        """Start the block from the trunk's last full-attention layer and the shared norm from its output norm:
        a head that already maps hidden states to the LM head's space trains in fewer steps than a random one."""
        il = attention_layer_index(trunk.config)
        self.layers[0].load_state_dict(trunk.model.layers[il].state_dict())
        self.norm.load_state_dict(trunk.model.norm.state_dict())


class MTPModel(nn.Module):
    """A frozen Qwen3_5ForCausalLM trunk plus a trainable MTPHead."""

    def __init__(self, trunk, head: MTPHead | None = None):
        super().__init__()
        self.trunk = trunk.requires_grad_(False).eval()
        self.head = head if head is not None else MTPHead(trunk.config)

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> [B, T, D]: the trunk's last hidden state after its output norm (what llama.cpp feeds)."""
        return self.trunk.model(input_ids=ids, use_cache=False).last_hidden_state

    def mtp_logits(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """h [B, T, D], ids [B, T] -> [B, T - 1, V]: row t predicts ids[t + 2] (the last row has no label)."""
        nxt = ids[:, 1:]
        # x_{t+1} sits at position t + 1, as in llama.cpp's MTP batch (rope is relative: only consistency matters)
        pos = torch.arange(1, ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        embeds = self.trunk.model.embed_tokens(nxt)
        out = self.head(h[:, :-1].to(embeds.dtype), embeds, self.rope(embeds, pos))
        return self.trunk.lm_head(out)

    def rope(self, like: torch.Tensor, pos: torch.Tensor):
        """(cos, sin) for positions pos [B, L] (the same in the temporal, height and width sections: text)."""
        return self.trunk.model.rotary_emb(like, pos[None].expand(3, -1, -1))

    def chained_logits(self, h: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft steps 1 and 2 as llama.cpp chains them, teacher-forced: ([B, T - 1, V], [B, T - 2, V]).

        Step 1 (stream A) is mtp_logits: row t, at position t + 1, reads (h_t, x_{t+1}) and predicts x_{t+2}.
        Step 2 (stream B): llama.cpp feeds the head's own output back as h (common/speculative.cpp draft()), so
        row t, at position t + 2, reads (A's output o_t, x_{t+2}) and predicts x_{t+3}; its attention sees what
        the MTP KV cache holds then: stream A's entries of positions <= t + 1, and itself."""
        B, T = ids.shape
        dev = ids.device
        emb = self.trunk.model.embed_tokens(ids)
        a = self.head.inputs(h[:, :-1].to(emb.dtype), emb[:, 1:])                       # [B, T-1, D]
        pos_a = torch.arange(1, T, device=dev)
        o = self.head.block(a, self.rope(a, pos_a.expand(B, -1)))                        # [B, T-1, D]
        b = self.head.inputs(o[:, :-1], emb[:, 2:])                                      # [B, T-2, D]
        n_a, n_b = T - 1, T - 2
        mask = torch.zeros(n_a + n_b, n_a + n_b, dtype=torch.bool, device=dev)
        mask[:n_a, :n_a] = torch.ones(n_a, n_a, dtype=torch.bool, device=dev).tril()
        mask[n_a:, :n_a] = torch.ones(n_b, n_a, dtype=torch.bool, device=dev).tril()     # B row t: A rows <= t
        mask[n_a:, n_a:] = torch.eye(n_b, dtype=torch.bool, device=dev)
        pos = torch.cat([pos_a, torch.arange(2, T, device=dev)]).expand(B, -1)
        x = torch.cat([a, b], dim=1)
        out = self.head.block(x, self.rope(x, pos), mask[None, None])
        # stream A's rows attend only to A: out[:, :n_a] equals o (recomputed so both steps share one graph)
        return self.trunk.lm_head(out[:, :n_a]), self.trunk.lm_head(out[:, n_a:])

    def loss(self, h: torch.Tensor, ids: torch.Tensor, chain_weight: float = 0.0) -> torch.Tensor:
        """Mean next-next-token cross-entropy over the T - 2 positions that have a label; with chain_weight > 0
        plus chain_weight x the second draft step's cross-entropy (x_{t+3}, chained_logits)."""
        if chain_weight <= 0:
            logits = self.mtp_logits(h, ids)[:, :-1]
            return nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 2:].flatten())
        first, second = self.chained_logits(h, ids)
        ce = nn.functional.cross_entropy
        return (ce(first[:, :-1].float().flatten(0, 1), ids[:, 2:].flatten())
                + chain_weight * ce(second[:, :-1].float().flatten(0, 1), ids[:, 3:].flatten()))

    @torch.no_grad()
    def metrics(self, h: torch.Tensor, ids: torch.Tensor) -> dict[str, float]:
        """loss; acc: the MTP argmax equals the text's x_{t+2}; agree: it equals the trunk's own argmax for
        x_{t+2} (given the text up to x_{t+1}), which is what greedy draft acceptance counts; trunk_acc: the
        trunk's next-token accuracy, for scale."""
        logits = self.mtp_logits(h, ids)[:, :-1].float()
        target = ids[:, 2:]
        trunk_next = self.trunk.lm_head(h[:, 1:-1].to(logits.dtype)).argmax(-1)       # trunk's guess of x_{t+2}
        pred = logits.argmax(-1)
        _, second = self.chained_logits(h, ids)
        pred2 = second[:, :-1].argmax(-1)                                                # x_{t+3}
        return {"loss": nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()).item(),
                "acc": (pred == target).float().mean().item(),
                "agree": (pred == trunk_next).float().mean().item(),
                # second draft step: accepted when the first is and it equals the trunk's greedy x_{t+3}
                "agree2": ((pred2 == trunk_next[:, 1:]) & (pred[:, :-1] == trunk_next[:, :-1])).float().mean().item(),
                "trunk_acc": (trunk_next == target).float().mean().item()}
