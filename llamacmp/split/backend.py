"""The split as the engine sees it (lm.backend): sequence states spread over the parts, each part's tensors on its
own device, and their prompt-cache copies (StateOps), each part's work on that part's thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backends.base import SeqState
from ..backends.state_ops import Checkpoint, HostState
from ..config import ModelConfig
from .graphs import SplitDecodeGraphs


@dataclass(slots=True)
class SplitState(SeqState):
    """A sequence over a split: k/v/conv/ssm hold every layer's tensors in layer order, each on its part's device.
    parts[p] shares those lists and keeps part p's own n_past while a pipelined prefill is under way."""
    parts: list = field(default_factory=list)
    kv_slices: list = field(default_factory=list)     # per part: slice of k/v it owns
    gdn_slices: list = field(default_factory=list)    # per part: slice of conv/ssm it owns

    def view(self, p: int) -> SeqState:
        """Part p's tensors alone (new lists, same tensors) at the sequence's n_past: for that part's StateOps."""
        a, g = self.kv_slices[p], self.gdn_slices[p]
        return SeqState(self.n_ctx, self.k[a], self.v[a], self.conv[g], self.ssm[g], self.n_past, self.k_type,
                        self.v_type)


class SplitBackend:
    """What the engine sees as `lm.backend` for a split model: states spread over the parts, host logits."""

    def __init__(self, parts: list, cfg: ModelConfig):     # parts: model.Part
        self.parts, self.cfg = parts, cfg
        self.name = parts[0].backend.name + "-split"
        self.kv_slices, self.gdn_slices = [], []
        for part in parts:
            a = [i for i, il in enumerate(cfg.attn_layers) if il in part.layers]
            g = [i for i, il in enumerate(cfg.gdn_layers) if il in part.layers]
            self.kv_slices.append(slice(a[0], a[-1] + 1) if a else slice(0, 0))
            self.gdn_slices.append(slice(g[0], g[-1] + 1) if g else slice(0, 0))

    def new_state(self, cfg: ModelConfig, n_ctx: int, kv_type: str = "f16", v_type: str | None = None) -> SplitState:
        k, v, conv, ssm = [], [], [], []
        for p, part in enumerate(self.parts):
            # the part's backend makes a whole state; we keep its own layers' tensors and drop the rest (on CUDA
            # their blocks go back to the part's arena free lists, where the next state's tensors reuse them)
            st = part.call(part.backend.new_state, cfg, n_ctx, kv_type, v_type)
            a, g = self.kv_slices[p], self.gdn_slices[p]
            k += st.k[a]
            v += st.v[a]
            conv += st.conv[g]
            ssm += st.ssm[g]
            part.call(_drop, st)
        kt, vt = kv_type, v_type or kv_type
        parts = [SeqState(n_ctx, k, v, conv, ssm, 0, kt, vt) for _ in self.parts]
        return SplitState(n_ctx, k, v, conv, ssm, 0, kt, vt, parts=parts, kv_slices=self.kv_slices,
                          gdn_slices=self.gdn_slices)

    def state_to_host(self, state: SplitState) -> dict[str, list[np.ndarray]]:
        out = {"k": [], "v": [], "conv": [], "ssm": []}
        for p, part in enumerate(self.parts):
            h = part.call(part.backend.state_to_host, state.view(p))
            for name in out:
                out[name] += h[name]
        return out

    def to_host(self, x) -> np.ndarray:
        """The split model's logits are host arrays already."""
        return np.asarray(x, np.float32)

    # Drawing tokens (engine/decode.py): the logits are on the host, so the numpy reference's draw (the spec the
    # device chain follows) does it; only [R, N] f32 crossed from the last GPU.
    SAMPLE_MAX_K = 1024
    SAMPLE_MAX_WINDOW = 4096

    def sample_rows(self, logits, specs):
        from ..backends.numpy_ref import NumpyBackend
        return NumpyBackend.sample_rows(NumpyBackend(), np.asarray(logits, np.float32), specs)

    def row_to_host(self, logits, row: int) -> np.ndarray:
        return np.array(logits[row], np.float32)

    def state_ops(self):
        return SplitStateOps(self)

    # the capabilities of base.Backend the engine asks (each part's own device work runs on the part's thread)
    device, captures_graphs, arena = None, False, None

    def activate(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def spec_graphs(self, model, n_max: int, capacity: int = 8, seqs: int = 1):
        """None: a layer split does not run the MTP head (engine/speculative.py refuses it)."""
        return None

    def decode_graphs(self, model, capacity: int = 8, hidden: bool = False):
        """engine/decode.py's decode steps on one CUDA graph per part (SplitDecodeGraphs); None on numpy parts
        (the decoder then runs steps eagerly). hidden (the MTP head's input) is not given by a split, which does
        not run the head."""
        if hidden:
            raise ValueError("decode_graphs(hidden=True): a layer split does not run the MTP head")
        if not self.parts[0].backend.captures_graphs:
            return None
        return SplitDecodeGraphs(model, capacity)


def _drop(st: SeqState) -> None:
    """Release a state's lists on the part's own thread (DeviceTensor blocks return to that part's arena)."""
    st.k.clear(), st.v.clear(), st.conv.clear(), st.ssm.clear()


class SplitStateOps:
    """engine.checkpoints.StateOps over a SplitState: each part's own StateOps on its slice, on its thread."""

    def __init__(self, sb: SplitBackend):
        self.sb = sb
        self.ops = [part.call(part.backend.state_ops) for part in sb.parts]

    def _ckpt_part(self, ckpt, p: int):
        g = self.sb.gdn_slices[p]
        return Checkpoint(ckpt.pos, ckpt.conv[g], ckpt.ssm[g], ckpt.logits, 0)

    def snapshot(self, state: SplitState, logits):
        parts = [part.call(self.ops[p].snapshot, state.view(p), None) for p, part in enumerate(self.sb.parts)]
        lg = None if logits is None else np.array(logits, np.float32)
        conv = [a for c in parts for a in c.conv]
        ssm = [a for c in parts for a in c.ssm]
        return Checkpoint(state.n_past, conv, ssm, lg, sum(c.nbytes for c in parts) + (lg.nbytes if lg is not None else 0))

    def restore(self, state: SplitState, ckpt) -> None:
        for p, part in enumerate(self.sb.parts):
            part.call(self.ops[p].restore, state.view(p), self._ckpt_part(ckpt, p))
        state.n_past = ckpt.pos

    def reset(self, state: SplitState) -> None:
        for p, part in enumerate(self.sb.parts):
            part.call(self.ops[p].reset, state.view(p))
        state.n_past = 0

    def save_host(self, state: SplitState, tokens, logits, checkpoints):
        # (.ready(): the merged HostState has no job of its own, so each part's copies finish here)
        hs = [part.call(self.ops[p].save_host, state.view(p), tokens, None,
                        [self._ckpt_part(c, p) for c in checkpoints]).ready() for p, part in enumerate(self.sb.parts)]
        ckpts = []
        for i, c0 in enumerate(hs[0].checkpoints):
            conv = [a for h in hs for a in h.checkpoints[i].conv]
            ssm = [a for h in hs for a in h.checkpoints[i].ssm]
            lg = next((o.logits for o in checkpoints if o.pos == c0.pos), None)   # not split: the original's
            nbytes = sum(a.nbytes for a in conv + ssm) + (lg.nbytes if lg is not None else 0)
            ckpts.append(Checkpoint(c0.pos, conv, ssm, lg, nbytes))
        return HostState(list(hs[0].tokens), [a for h in hs for a in h.k], [a for h in hs for a in h.v],
                         [a for h in hs for a in h.conv], [a for h in hs for a in h.ssm],
                         None if logits is None else np.array(logits, np.float32), ckpts)

    def load_host(self, state: SplitState, host, ckpt) -> None:
        host.ready()
        for p, part in enumerate(self.sb.parts):
            a, g = self.sb.kv_slices[p], self.sb.gdn_slices[p]
            hp = HostState(host.tokens, host.k[a], host.v[a], host.conv[g], host.ssm[g], None)
            part.call(self.ops[p].load_host, state.view(p), hp, None if ckpt is None else self._ckpt_part(ckpt, p))
        state.n_past = len(host.tokens) if ckpt is None else ckpt.pos
