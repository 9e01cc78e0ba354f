"""How the hidden state x [T, D] f32 crosses from one part of a split to the next.

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

import numpy as np

BRIDGES = ("auto", "host", "peer")


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
        """On the sending part's thread: once the copies in flight are done, destroy the slots' events (cudaEventDestroy
        takes an event of either device), free the pinned slots and give the staging blocks back to its arena."""
        nat = self.native
        for e in self.written + self.read:
            if e:
                nat.cmp_event_synchronize(e)
        for e in self.written + self.read:
            if e:
                nat.cmp_event_destroy(e)
        for p in self.host:
            if p:
                nat.cmp_host_free(p)
        self.written = [0] * self.n_slots
        self.read = [0] * self.n_slots
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
