"""Layer split over several backends (llama.cpp's `-sm layer`): each backend -- one GPU, or a numpy reference
standing in for one -- holds a contiguous range of layers, and the hidden state x [T, D] f32 crosses from one part
to the next through a `Bridge`.

The model is written once (qwen35.Qwen35Model): each part is a Qwen35Model that uploaded only its layer range
(the first part also the token embedding, the last the output norm and head), and the runner calls its three
steps, embed / run_layers / head, on the part's own thread. Every part has one worker thread for its whole life;
on CUDA that thread binds the part's device and a stream of its own once (CudaBackend.bind_thread), so ctypes calls
never land on another GPU, and two parts on ONE GPU still run on two streams (how the tests prove the split on a
single card).

Placement (what we chose, after llama.cpp's llama_model::load_tensors): the split ratios (-ts, default each
device's free memory, equal for numpy) are applied to the bytes of the repeating layers plus the token embedding
on the first part and the output head on the last part (llama.cpp keeps the embedding on the host and counts the
output layer as one more layer on the last device; we have no CPU layers, so the embedding goes to the first
GPU). Cuts fall between layers where the running byte total crosses each ratio's share.

Prefill is pipelined: a batch of one sequence longer than `micro_batch` (-ub) is cut into micro-batches, and part
p runs micro-batch m while part p+1 runs micro-batch m-1. Flow control is the bridge's two slots (double
buffering): a part runs at most two micro-batches ahead of the next. Each part keeps its own n_past per sequence
(`SplitState.parts`), because part 0 is already at chunk m+1 while part 1 still writes chunk m's keys; the
sequence's own n_past advances when the last part is done. A batch of several sequences (the server's slots)
crosses the parts as one micro-batch.

Bridges (`bridge="auto"|"host"|"peer"`):
  host  x goes device -> pinned host slot -> device (cudaMemcpyAsync on each part's stream). Host-side fences:
        the receiver waits (cudaEventSynchronize) for the slot's device-to-host copy before its host-to-device copy,
        and the sender waits for that copy before refilling the slot (cross-device cudaStreamWaitEvent did not fence
        pinned memory on CMP cards, see reference/PRIOR_ENGINE_QENGINE.md). Works without P2P.
  peer  x is copied into a device staging slot on the sender, then cudaMemcpyPeerAsync on the receiver's stream
        after a device-side wait on the sender's event (NVLink / PCIe P2P; peer access enabled when possible).
  auto  peer where cudaDeviceCanAccessPeer says yes both ways (always on one device), else host.
The numpy parts use `NumpyHostBridge`: the same two-slot protocol over plain host buffers.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence, TextIO

import numpy as np

from ..backends.base import Backend, Segment, SeqState, StepBatch
from ..config import ModelConfig
from ..weights import ModelWeights
from .qwen35 import Qwen35Model

BRIDGES = ("auto", "host", "peer")


# -- placement ------------------------------------------------------------------------------------------------------

def _nbytes(w) -> int:
    if w is None:
        return 0
    if isinstance(w, np.ndarray):
        return w.nbytes
    blocks = getattr(w, "blocks", None)          # Q8Tensor: the file's bytes
    if blocks is not None:
        return blocks.nbytes
    if hasattr(w, "__slots__") or hasattr(w, "__dataclass_fields__"):
        names = getattr(w, "__slots__", None) or w.__dataclass_fields__
        return sum(_nbytes(getattr(w, n)) for n in names)
    return int(np.asarray(w).nbytes)


def weight_bytes(weights: ModelWeights) -> tuple[list[int], int, int]:
    """-> (bytes of each layer, of the token embedding, of the head: output norm + output unless tied)."""
    layers = [_nbytes(lw) for lw in weights.layers]
    embd = _nbytes(weights.token_embd)
    head = _nbytes(weights.output_norm) + (0 if weights.output is weights.token_embd else _nbytes(weights.output))
    return layers, embd, head


def assign_layers(layer_bytes: Sequence[int], ratios: Sequence[float], first_extra: int = 0,
                  last_extra: int = 0) -> list[range]:
    """Contiguous layer ranges, one per ratio, sized so each part's bytes (the first part also `first_extra`, the last
    `last_extra`) follow the ratios. Every part gets at least one layer. ratios: positive, one per part."""
    n, P = len(layer_bytes), len(ratios)
    if P < 1 or any(r <= 0 for r in ratios):
        raise ValueError(f"split ratios must be positive, got {list(ratios)}")
    if n < P:
        raise ValueError(f"cannot split {n} layers over {P} devices")
    total = first_extra + sum(layer_bytes) + last_extra
    share = np.cumsum(np.asarray(ratios, np.float64)) / float(sum(ratios)) * total
    cuts, acc, il = [0], float(first_extra), 0
    for p in range(P - 1):
        # take layers while the part's running total stays nearer its target with the layer than without it;
        # leave at least one layer for each later part, and take at least one
        while il < n - (P - 1 - p) and (il == cuts[-1] or acc + layer_bytes[il] / 2 <= share[p]):
            acc += layer_bytes[il]
            il += 1
        cuts.append(il)
    cuts.append(n)
    return [range(cuts[p], cuts[p + 1]) for p in range(P)]


# -- bridges --------------------------------------------------------------------------------------------------------

class BridgeAborted(RuntimeError):
    """Another part failed during this forward; the pipeline stops."""


class Bridge:
    """Moves x [T, D] from part p (send, on p's thread) to part p+1 (recv, on its thread) through two slots, so that
    the sender fills one slot while the receiver empties the other. Subclasses copy in (`_stage`) and out
    (`_unstage`) and put their fences there."""
    n_slots = 2
    kind = "?"

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.n_sent = 0                          # hidden states handed over since the last reset (one forward)
        self._free: queue.Queue = queue.Queue()
        self._full: queue.Queue = queue.Queue()
        for k in range(self.n_slots):
            self._free.put(k)
        self._abort = threading.Event()

    def abort(self) -> None:
        self._abort.set()

    def _get(self, q: queue.Queue):
        while True:
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                if self._abort.is_set():
                    raise BridgeAborted("the layer split stopped: another part failed") from None

    def send(self, x) -> None:
        k = self._get(self._free)
        self._stage(k, x)
        self.n_sent += 1
        self._full.put((k, tuple(x.shape)))

    def recv(self, out=None):
        """-> x on the receiving side; `out`: a tensor of x's shape to write instead (a captured graph's input)."""
        k, shape = self._get(self._full)
        if out is not None and tuple(out.shape) != shape:
            raise ValueError(f"bridge: received {shape} into a buffer of {tuple(out.shape)}")
        x = self._unstage(k, shape, out)
        self._free.put(k)
        return x

    def _stage(self, k: int, x) -> None:
        raise NotImplementedError

    def _unstage(self, k: int, shape: tuple[int, ...], out=None):
        raise NotImplementedError

    def close(self) -> None:
        pass


class NumpyHostBridge(Bridge):
    """The host bridge over plain numpy buffers (two slots, grown on demand): x is copied in and out, never shared,
    as between two devices."""
    kind = "host"

    def __init__(self):
        super().__init__()
        self.buf = [np.zeros(0, np.float32) for _ in range(self.n_slots)]

    def _stage(self, k, x):
        n = x.size
        if self.buf[k].size < n:
            self.buf[k] = np.zeros(n, np.float32)
        self.buf[k][:n] = np.asarray(x, np.float32).ravel()

    def _unstage(self, k, shape, out=None):
        n = int(np.prod(shape))
        if out is None:
            return self.buf[k][:n].reshape(shape).copy()
        out[...] = self.buf[k][:n].reshape(shape)
        return out


class CudaBridge(Bridge):
    """Between two CudaBackends (two GPUs, or two parts on one GPU). mode "host": pinned host slots; "peer": device
    staging slots on the sender and a peer copy on the receiver's stream. Events are made lazily on the thread (so
    the device) that records them."""

    def __init__(self, src, dst, mode: str):
        if mode not in ("host", "peer"):
            raise ValueError(f"bridge mode must be host or peer, got {mode!r}")
        self.src, self.dst, self.kind = src, dst, mode
        self.native = src.native
        self.cap = [0] * self.n_slots            # bytes in each slot
        self.host = [0] * self.n_slots           # pinned pointers (host mode)
        self.stage = [None] * self.n_slots       # DeviceTensor on src (peer mode)
        self.written = [0] * self.n_slots        # event on src: slot k filled
        self.read = [0] * self.n_slots           # event on dst: slot k emptied
        self._peer_enabled = False
        super().__init__()

    def _stage(self, k, x):
        nat, nbytes = self.native, x.nbytes
        if self.kind == "host":
            if self.read[k]:
                nat.cmp_event_synchronize(self.read[k])    # host fence: the last H2D out of slot k is done
            if self.cap[k] < nbytes:
                if self.host[k]:
                    nat.cmp_host_free(self.host[k])
                self.host[k], self.cap[k] = 0, 0
                self.host[k] = nat.host_alloc(nbytes)
                self.cap[k] = nbytes
            nat.cmp_memcpy_d2h_async(self.host[k], x.ptr, nbytes)
        else:
            if self.read[k]:
                nat.cmp_stream_wait_event(self.read[k])    # the peer copy out of slot k is done before we refill
            if self.cap[k] < nbytes:
                self.stage[k] = self.src.empty((nbytes,), "u8", "the layer-split bridge's staging buffer")
                self.cap[k] = nbytes
            nat.cmp_memcpy_d2d(self.stage[k].ptr, x.ptr, nbytes)
        if not self.written[k]:
            self.written[k] = nat.event_create()
        nat.cmp_event_record(self.written[k])

    def _unstage(self, k, shape, out=None):
        nat = self.native
        if out is None:
            out = self.dst.empty(shape, "f32", "the hidden state crossing the layer split")
        if self.kind == "host":
            nat.cmp_event_synchronize(self.written[k])     # host fence: slot k holds the data
            nat.cmp_memcpy_h2d_async(out.ptr, self.host[k], out.nbytes)
        else:
            if not self._peer_enabled:
                if self.src.device != self.dst.device:
                    nat.cmp_enable_peer_access(self.src.device)
                self._peer_enabled = True
            nat.cmp_stream_wait_event(self.written[k])
            nat.cmp_memcpy_peer_async(out.ptr, self.dst.device, self.stage[k].ptr, self.src.device, out.nbytes)
        if not self.read[k]:
            self.read[k] = nat.event_create()
        nat.cmp_event_record(self.read[k])
        return out

    def close(self) -> None:
        """On the sending part's thread: free the pinned slots, give the staging blocks back to its arena (after the
        copies in flight are done)."""
        for e in self.written + self.read:
            if e:
                self.native.cmp_event_synchronize(e)
        for p in self.host:
            if p:
                self.native.cmp_host_free(p)
        self.host = [0] * self.n_slots
        self.stage = [None] * self.n_slots
        self.cap = [0] * self.n_slots


def choose_bridge(src, dst, mode: str) -> str:
    """auto | host | peer -> host | peer for this pair (numpy: always host)."""
    if mode not in BRIDGES:
        raise ValueError(f"--split-bridge must be one of {', '.join(BRIDGES)}, got {mode!r}")
    if src.device is None:
        if mode == "peer":
            raise ValueError("--split-bridge peer needs CUDA devices (the numpy reference has only the host bridge)")
        return "host"
    can = src.native.can_access_peer(src.device, dst.device) and src.native.can_access_peer(dst.device, src.device)
    if mode == "peer" and not can:
        raise ValueError(f"--split-bridge peer: GPU {src.device} and GPU {dst.device} cannot access each other's "
                         "memory (no P2P); use --split-bridge host or auto")
    return "peer" if mode == "peer" or (mode == "auto" and can) else "host"


# -- states -----------------------------------------------------------------------------------------------------------

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


# SeqState fields beyond the tensors and n_past that a part's state mirrors from its sequence before each step.
_SHARED_STATE_FIELDS = tuple(n for n in getattr(SeqState, "__dataclass_fields__", {})
                             if n not in ("n_ctx", "k", "v", "conv", "ssm", "n_past", "k_type", "v_type"))
# StepBatch fields beyond tokens/positions/segments/output_rows/device that hold one row per token (sliced with the
# micro-batch) -- the vision batches' rope_pos and embeddings where those exist.
_ROW_FIELDS = tuple(n for n in getattr(StepBatch, "__dataclass_fields__", {})
                    if n not in ("tokens", "positions", "segments", "output_rows", "device"))


def _with_rows(dst: StepBatch, src: StepBatch, rows: slice | None = None) -> StepBatch:
    """Copy src's per-token extra fields (sliced to `rows`) onto dst."""
    for name in _ROW_FIELDS:
        val = getattr(src, name)
        if val is not None:
            setattr(dst, name, val if rows is None else val[rows])
    return dst


@dataclass
class Part:
    backend: Backend
    layers: range
    model: Qwen35Model | None = None
    pool: ThreadPoolExecutor | None = None
    bridge_out: Bridge | None = None

    def call(self, fn, *args):
        """Run fn on this part's thread and wait for it."""
        return self.pool.submit(fn, *args).result()


class SplitBackend:
    """What the engine sees as `lm.backend` for a split model: states spread over the parts, host logits."""

    def __init__(self, parts: list[Part], cfg: ModelConfig):
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

    def decode_graphs(self, model, capacity: int = 8):
        """engine/decode.py's decode steps on one CUDA graph per part (SplitDecodeGraphs); None on numpy parts
        (the decoder then runs steps eagerly)."""
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
        from ..backends.state_ops import Checkpoint
        g = self.sb.gdn_slices[p]
        return Checkpoint(ckpt.pos, ckpt.conv[g], ckpt.ssm[g], ckpt.logits, 0)

    def snapshot(self, state: SplitState, logits):
        from ..backends.state_ops import Checkpoint
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
        from ..backends.state_ops import Checkpoint, HostState
        hs = [part.call(self.ops[p].save_host, state.view(p), tokens, None,
                        [self._ckpt_part(c, p) for c in checkpoints]) for p, part in enumerate(self.sb.parts)]
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
        from ..backends.state_ops import HostState
        for p, part in enumerate(self.sb.parts):
            a, g = self.sb.kv_slices[p], self.sb.gdn_slices[p]
            hp = HostState(host.tokens, host.k[a], host.v[a], host.conv[g], host.ssm[g], None)
            part.call(self.ops[p].load_host, state.view(p), hp, None if ckpt is None else self._ckpt_part(ckpt, p))
        state.n_past = len(host.tokens) if ckpt is None else ckpt.pos


# -- the runner -------------------------------------------------------------------------------------------------------

class SplitModel:
    """lm.model for a split: forward(batch) -> host logits [len(batch.output_rows), N], advancing the states."""
    splits_batches = True      # the engine hands it whole -b batches; it cuts them into micro_batch pieces itself

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, backends: Sequence[Backend],
                 ratios: Sequence[float] | None = None, bridge: str = "auto", micro_batch: int = 512):
        if len(backends) < 2:
            raise ValueError("a layer split needs at least two backends")
        if len({be.name for be in backends}) != 1:
            raise ValueError("a layer split runs on backends of one kind (all CUDA, or all numpy)")
        self.cfg, self.micro_batch = cfg, max(1, micro_batch)
        layer_b, embd_b, head_b = weight_bytes(weights)
        self.ratios = list(ratios) if ratios else [1.0] * len(backends)
        if len(self.ratios) != len(backends):
            raise ValueError(f"{len(self.ratios)} split ratios for {len(backends)} devices")
        ranges = assign_layers(layer_b, self.ratios, embd_b, head_b)
        self.parts = [Part(be, rng) for be, rng in zip(backends, ranges)]
        self.weight_bytes = [sum(layer_b[i] for i in rng) + (embd_b if p == 0 else 0)
                             + (head_b if p == len(ranges) - 1 else 0) for p, rng in enumerate(ranges)]
        last = len(self.parts) - 1
        for p, part in enumerate(self.parts):
            part.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llamacmp-split{p}",
                                           initializer=part.backend.bind_thread)
            part.model = part.call(Qwen35Model, cfg, weights, part.backend, part.layers, p == 0, p == last)
        self.set_bridge(bridge)
        self.backend = SplitBackend(self.parts, cfg)

    def set_bridge(self, mode: str) -> None:
        """(Re)make the bridges between the parts: auto | host | peer (a benchmark compares both on one load)."""
        kinds = [choose_bridge(self.parts[p].backend, self.parts[p + 1].backend, mode)
                 for p in range(len(self.parts) - 1)]
        for p, kind in enumerate(kinds):
            part = self.parts[p]
            if part.bridge_out is not None:
                part.call(part.bridge_out.close)
            src, dst = part.backend, self.parts[p + 1].backend
            part.bridge_out = NumpyHostBridge() if src.device is None else CudaBridge(src, dst, kind)
        self.bridge_kinds = kinds

    # -- description --------------------------------------------------------------------------------------------
    def describe(self) -> list[str]:
        """One line per part: device, layers, memory, bridge (printed at start-up)."""
        lines = []
        for p, part in enumerate(self.parts):
            be = part.backend
            where = f"GPU {be.device}" if be.device is not None else f"{be.name} part {p}"
            extra = (" + token embedding" if p == 0 else "") + (" + output head" if p == len(self.parts) - 1 else "")
            mem = f"{self.weight_bytes[p] / 2**20:.0f} MiB of weights"
            arena = be.arena
            if arena is not None:
                mem += f", {arena.reserved / 2**20:.0f} MiB reserved of a {arena.cap / 2**20:.0f} MiB arena"
            rng = part.layers
            bridge = f"bridge to part {p + 1}: {self.bridge_kinds[p]}" if p < len(self.bridge_kinds) else "last part"
            lines.append(f"split: {where}: layers {rng.start}-{rng.stop - 1} ({len(rng)}){extra}; {mem}; {bridge}")
        return lines

    # -- forward ------------------------------------------------------------------------------------------------
    def forward(self, batch: StepBatch) -> np.ndarray:
        micro = self._micro_batches(batch)
        states = {id(s.state): s.state for s in batch.segments}
        for st in states.values():
            if not isinstance(st, SplitState):
                raise TypeError("a split model runs states made by its own backend (SplitBackend.new_state)")
            for ps in st.parts:
                ps.n_past = st.n_past
                for name in _SHARED_STATE_FIELDS:         # fields other features add to SeqState (vision)
                    setattr(ps, name, getattr(st, name))
        logits: list[np.ndarray] = []
        for part in self.parts:
            if part.bridge_out is not None:
                part.bridge_out.reset()
        self._gather([part.pool.submit(self._guarded, self._run_part, p, micro, logits)
                      for p, part in enumerate(self.parts)])
        for seg in batch.segments:
            seg.state.n_past += seg.length
        N = self.cfg.n_vocab
        return np.concatenate(logits) if logits else np.zeros((0, N), np.float32)

    def _micro_batches(self, batch: StepBatch) -> list[StepBatch]:
        """One sequence longer than micro_batch -> consecutive pieces (output rows renumbered); else the batch."""
        T = len(batch.tokens)
        if len(batch.segments) != 1 or T <= self.micro_batch:
            return [batch]
        rows = np.asarray(batch.output_rows)
        if np.any(np.diff(rows) <= 0):
            raise ValueError("output rows must be ascending")
        seg, out = batch.segments[0], []
        for c0 in range(0, T, self.micro_batch):
            c1 = min(T, c0 + self.micro_batch)
            r = rows[(rows >= c0) & (rows < c1)] - c0
            out.append(_with_rows(StepBatch(batch.tokens[c0:c1], batch.positions[c0:c1],
                                            [Segment(0, c1 - c0, seg.state)], r.astype(np.int32)), batch,
                                  slice(c0, c1)))
        return out

    def _guarded(self, fn, *args):
        """Run one part's share of a step on its thread. A failure stops every bridge at once, so that no other
        part waits for a hidden state that will never come."""
        try:
            return fn(*args)
        except BaseException:
            for part in self.parts:
                if part.bridge_out is not None:
                    part.bridge_out.abort()
            raise

    @staticmethod
    def _gather(futures) -> list:
        """Wait for every part; raise the first real failure (not the BridgeAborted of the parts it stopped)."""
        results, errors = [], []
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as e:
                errors.append(e)
        if errors:
            raise next((e for e in errors if not isinstance(e, BridgeAborted)), errors[0])
        return results

    def _run_part(self, p: int, micro: list[StepBatch], logits: list) -> None:
        """On part p's thread: every micro-batch through this part's layers, in order."""
        part = self.parts[p]
        first, last = p == 0, p == len(self.parts) - 1
        inbound = None if first else self.parts[p - 1].bridge_out
        for mb in micro:
            pb = _with_rows(StepBatch(mb.tokens, mb.positions,
                                      [Segment(s.start, s.length, s.state.parts[p]) for s in mb.segments],
                                      mb.output_rows), mb)
            x = part.model.embed(pb) if first else inbound.recv()
            x = part.model.run_layers(x, pb, part.layers)
            for s in pb.segments:
                s.state.n_past += s.length
            if not last:
                part.bridge_out.send(x)
            elif len(mb.output_rows):
                logits.append(part.backend.to_host(part.model.head(x, pb)))
            del x, pb

    def close(self) -> None:
        for part in self.parts:
            if part.bridge_out is not None:
                part.call(part.bridge_out.close)
            part.pool.shutdown(wait=True)


class _PartStep:
    """Part p's share of one captured decode step for a fixed list of states: its own CUDA graph (embed on the first
    part, its layers, the head on the last) over device buffers owned here -- token ids (first part), the hidden
    state coming in (x_in, later parts), positions, output rows -- and the tensors the graph leaves (x_out, logits).
    Made and replayed on the part's thread."""

    def __init__(self, split: "SplitModel", p: int, states: Sequence[SplitState]):
        part = split.parts[p]
        be, model = part.backend, part.model
        self.be, self.first, self.last = be, p == 0, p == len(split.parts) - 1
        B, D = len(states), split.cfg.n_embd
        pos0 = np.asarray([s.n_past for s in states], np.int32)
        self.tokens = be.from_host(np.zeros(B, np.int32), "i32", "graph token ids") if self.first else None
        self.x_in = None if self.first else be.zeros((B, D), "f32", "graph hidden state in")
        self.pos = be.from_host(pos0, "i32", "graph positions")
        self.rows = be.from_host(np.arange(B, dtype=np.int32), "i32", "graph output rows")
        batch = StepBatch(self.tokens if self.first else pos0, pos0,
                          [Segment(i, 1, s.parts[p]) for i, s in enumerate(states)], self.rows)
        batch.device["cuda_pos"] = self.pos
        self.x_out = self.logits = None
        # the captured tensors come from an arena of the graph's own (backends/cuda_graphs.py says why: blocks
        # freed after capture must not go to later long-lived tensors that every replay would overwrite)
        from ..backends.cuda_memory import DeviceArena
        from ..backends.cuda_graphs import GRAPH_ARENA_CAP, GRAPH_CHUNK
        main = be.arena
        self.arena = DeviceArena(be.native, GRAPH_ARENA_CAP, GRAPH_CHUNK)
        be.arena = self.arena
        be.capturing = True
        be.native.cmp_graph_begin()
        try:
            x = model.embed(batch) if self.first else self.x_in
            x = model.run_layers(x, batch, part.layers)
            if self.last:
                self.logits = model.head(x, batch)
            else:
                self.x_out = x
        except BaseException:
            try:
                be.native.graph_end()
            except Exception:
                pass
            raise
        finally:
            be.capturing = False
            be.arena = main
        self.exec = be.native.graph_end()

    def replay(self, positions: np.ndarray, tokens, inbound: Bridge | None, outbound: Bridge | None):
        be = self.be
        if self.first:
            be.copy_from_host(self.tokens, np.asarray(tokens, np.int32))
        else:
            inbound.recv(out=self.x_in)
        be.copy_from_host(self.pos, positions)
        be.native.cmp_graph_launch(self.exec)
        if outbound is not None:
            outbound.send(self.x_out)
            return None
        return be.to_host(self.logits)

    def __del__(self):
        if getattr(self, "exec", 0):
            self.be.native.cmp_graph_destroy(self.exec)
            self.exec = 0
        arena = getattr(self, "arena", None)
        if arena is not None:
            self.x_out = self.logits = None   # blocks of this arena (released into a closed arena: harmless)
            arena.close()


class SplitDecodeGraphs:
    """Decode steps over a CUDA split: per list of states, one captured graph per part (_PartStep), the hidden state
    crossing by the parts' bridges between the replays. Same interface as backends/cuda_graphs.DecodeGraphs, but
    `step` returns host logits [B, N] (they crossed from the last GPU anyway)."""

    def __init__(self, split: "SplitModel", capacity: int = 8):
        if capacity < 1:
            raise ValueError(f"SplitDecodeGraphs needs room for at least one graph (capacity {capacity})")
        self.split, self.capacity = split, capacity
        self._graphs: dict[tuple[int, ...], list[_PartStep]] = {}
        self.n_captured = 0

    def step(self, states: Sequence[SplitState], tokens: Sequence[int]) -> np.ndarray:
        sp = self.split
        if len(tokens) != len(states):
            raise ValueError(f"{len(tokens)} token ids for {len(states)} sequences")
        for s in states:
            if s.n_past >= s.n_ctx:
                raise ValueError(f"sequence needs {s.n_past + 1} positions, its context is {s.n_ctx}")
        key = tuple(id(s) for s in states)
        steps = self._graphs.pop(key, None)
        if steps is None:
            while len(self._graphs) >= self.capacity:
                self._drop(next(iter(self._graphs)))
            # capture one part after the other, each on its own thread
            steps = [part.call(_PartStep, sp, p, states) for p, part in enumerate(sp.parts)]
            self.n_captured += 1
        self._graphs[key] = steps                     # most recently used last
        pos = np.asarray([s.n_past for s in states], np.int32)
        for part in sp.parts:
            if part.bridge_out is not None:
                part.bridge_out.reset()
        last = len(sp.parts) - 1
        futures = [part.pool.submit(sp._guarded, steps[p].replay, pos, tokens,
                                    None if p == 0 else sp.parts[p - 1].bridge_out,
                                    part.bridge_out if p < last else None)
                   for p, part in enumerate(sp.parts)]
        logits = sp._gather(futures)[-1]
        for s in states:
            s.n_past += 1
        return logits

    def _drop(self, key) -> None:
        steps = self._graphs.pop(key)
        for p, part in enumerate(self.split.parts):
            box, steps[p] = [steps[p]], None
            part.call(box.clear)          # the last reference goes on the part's thread (its arena, its device)

    def forget(self, state) -> None:
        for key in [k for k in self._graphs if id(state) in k]:
            self._drop(key)

    def clear(self) -> None:
        for key in list(self._graphs):
            self._drop(key)


def make_cuda_backends(devices: Sequence[int], arena_bytes: int | None = None) -> list:
    """One CudaBackend per device index (the same index twice: two parts on one GPU). Making a CudaBackend selects
    its device for the calling thread; the caller's own device is put back, so that a backend it already uses on
    this thread keeps working (each part binds its device on its own thread)."""
    from ..backends.cuda import CudaBackend
    from ..lib._native import Native
    import ctypes
    nat = Native()
    cur = ctypes.c_int(0)
    nat.cmp_get_device(ctypes.byref(cur))
    try:
        return [CudaBackend(device=d, arena_bytes=arena_bytes, native=nat) for d in devices]
    finally:
        nat.cmp_set_device(cur.value)


def log_split(model: SplitModel, log: TextIO) -> None:
    for line in model.describe():
        log.write(line + "\n")
