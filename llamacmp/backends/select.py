"""Pick the compute backend: CUDA when its library and a GPU are present, else the numpy reference (one warning)."""
from __future__ import annotations

import sys
from typing import TextIO

from .base import Backend


def cuda_backend_or_none(device: int = 0, mem_cap: int | None = None) -> Backend | None:
    """The CUDA backend on `device` if cuda.py imports and reports a usable GPU; never raises. mem_cap: the most
    device memory its arena may take, in bytes (--device-mem-cap; default: what is free, less 512 MiB)."""
    try:
        from . import cuda
    except ImportError:
        return None
    try:
        return cuda.CudaBackend(device=device, arena_bytes=mem_cap) if cuda.cuda_available() else None
    except Exception as e:  # a broken driver or library: fall back, but say why
        print(f"warning: CUDA backend failed to start ({e})", file=sys.stderr)
        return None


def select_backend(log: TextIO | None = None, device: int = 0, cpu_only: bool = False,
                   mem_cap: int | None = None) -> Backend:
    """CUDA if possible; otherwise the numpy reference, announced with one line on `log` (stderr by default).
    cpu_only (llama.cpp's -ngl 0) asks for the numpy reference directly."""
    backend = None if cpu_only else cuda_backend_or_none(device, mem_cap)
    if backend is not None:
        return backend
    from .numpy_ref import NumpyBackend
    reason = "-ngl 0" if cpu_only else "no CUDA GPU or libcmpkern.so found"
    print(f"warning: {reason}: using the numpy reference backend (slow)", file=log or sys.stderr)
    return NumpyBackend()


def plan_devices(n_visible: int, devices: tuple[int, ...] | None, split_mode: str, main_gpu: int,
                 tensor_split: tuple[float, ...]) -> tuple[list[int], list[float] | None]:
    """Which CUDA devices hold the model, after llama.cpp's -dev / -sm / -mg / -ts rules -> (device indices, split
    ratios or None). One device: no split. Several: a layer split; ratios None means "by free memory" (the
    caller measures it). -mg picks the one device of -sm none (an index into the -dev list, or into the visible
    GPUs); -ts gives one proportion per listed device (extra values ignored), and a 0 leaves that device out.
    ValueError on what cannot be
    done, naming the flag."""
    if split_mode == "row":
        raise ValueError("--split-mode row is not supported: llamacmp splits the model by layers "
                         "(-sm layer, the default) or keeps it on one GPU (-sm none)")
    cands = list(devices) if devices is not None else list(range(n_visible))
    for d in cands:
        if not 0 <= d < n_visible:
            raise ValueError(f"-dev: no CUDA device {d} ({n_visible} visible)")
    if not cands:
        return [], None
    if split_mode == "none":
        if not 0 <= main_gpu < len(cands):
            raise ValueError(f"--main-gpu {main_gpu}: only {len(cands)} device(s) to choose from")
        return [cands[main_gpu]], None
    if tensor_split:
        # as llama.cpp: one value per device in order, values past the last device ignored, missing ones 0
        ratios = (list(tensor_split) + [0.0] * len(cands))[:len(cands)]
        if any(r < 0 for r in ratios) or not any(r > 0 for r in ratios):
            raise ValueError("--tensor-split needs non-negative proportions, at least one of them positive for "
                             f"the {len(cands)} device(s) in use")
        kept = [(d, r) for d, r in zip(cands, ratios) if r > 0]
        if len(kept) == 1:
            return [kept[0][0]], None
        return [d for d, _ in kept], [r for _, r in kept]
    return cands, None


def select_backends(p, log: TextIO | None = None) -> tuple[list[Backend], list[float] | None]:
    """The backends the tools' Params ask for (-ngl 0 / -dev none: the numpy reference; -sm / -dev / -mg / -ts) ->
    (backends, split ratios). Several backends mean a layer split; ratios None there means by free memory."""
    log = log or sys.stderr
    cpu_only = p.n_gpu_layers == "0" or p.devices == ()
    if cpu_only:
        return _with_routes([select_backend(log, cpu_only=True)], p, log), None
    try:
        from . import cuda
        n_visible = cuda.Native().device_count() if cuda.cuda_available() else 0
    except ImportError:
        n_visible = 0
    if n_visible == 0:
        if p.devices:
            raise ValueError(f"-dev {','.join(f'CUDA{d}' for d in p.devices)}: no CUDA device is visible")
        return _with_routes([select_backend(log)], p, log), None
    devices, ratios = plan_devices(n_visible, p.devices, p.split_mode, p.main_gpu, p.tensor_split)
    if len(devices) == 1:
        be = cuda_backend_or_none(devices[0], getattr(p, "device_mem_cap", 0) or None)
        return _with_routes([be if be is not None else select_backend(log)], p, log), None
    from ..split.devices import make_cuda_backends
    backends = make_cuda_backends(devices)
    if ratios is None:      # llama.cpp's default: each device's free memory (equal for one GPU listed twice)
        free = {d: b.native.mem_info()[0] for d, b in zip(devices, backends)}
        ratios = [float(free[d]) for d in devices]
    return _with_routes(backends, p, log), ratios


def _with_routes(backends: list[Backend], p, log: TextIO) -> list[Backend]:
    """Each backend's routes from --hw-route (auto: the probe), the table and choice in the load log (unless quiet).
    RouteError (a ValueError naming the flag) where a backend cannot run the forced route."""
    quiet = getattr(p, "log_disable", False) or getattr(p, "verbosity", 3) < 2
    for be in backends:
        lines = be.pick_routes(getattr(p, "hw_route", "auto"))
        if not quiet:
            for line in lines:
                print(line, file=log)
    return backends
