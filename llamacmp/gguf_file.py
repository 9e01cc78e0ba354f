"""Open and validate a GGUF file (memory-mapped, through the `gguf` package).

Everything that can be wrong with a file is caught here and reported as a GGUFError that names the file and
the key or tensor at fault: later stages may assume a well-formed file.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
Q8_0_BLOCK = 32                      # values per Q8_0 block: one f16 scale + 32 int8
Q8_0_BYTES = 34

# ggml type ids we load; anything else is refused by name.
TYPE_NAMES = {0: "F32", 1: "F16", 8: "Q8_0", 30: "BF16"}
ALL_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
                  10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
                  17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
                  23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
                  30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}


class GGUFError(ValueError):
    """The file is not a GGUF we can read; the message says which file and what is wrong."""


@dataclass(frozen=True, slots=True)
class Q8Tensor:
    """Q8_0 weights as stored: per row, blocks of 32 int8 with one f16 scale each.

    blocks: [rows, cols/32, 34] uint8, the file's bytes (a memory-mapped view; nothing is copied until used).
    """
    blocks: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        rows, nb, _ = self.blocks.shape
        return rows, nb * Q8_0_BLOCK

    @property
    def d(self) -> np.ndarray:
        """[rows, cols/32] float32 scales."""
        return np.ascontiguousarray(self.blocks[:, :, :2]).view(np.float16)[:, :, 0].astype(np.float32)

    @property
    def qs(self) -> np.ndarray:
        """[rows, cols] int8 quants."""
        return np.ascontiguousarray(self.blocks[:, :, 2:]).view(np.int8).reshape(self.shape)

    @classmethod
    def quantize(cls, w: np.ndarray) -> "Q8Tensor":
        """llama-quantize's Q8_0: d = max|x|/127 per block (stored f16), q = round(x/d)."""
        rows, cols = w.shape
        x = w.reshape(rows, cols // Q8_0_BLOCK, Q8_0_BLOCK).astype(np.float32)
        d = np.abs(x).max(axis=-1) / 127.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
        v = x * inv[..., None]
        q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)  # C roundf: half away from zero
        blocks = np.empty((rows, cols // Q8_0_BLOCK, Q8_0_BYTES), np.uint8)
        blocks[:, :, :2] = d.astype(np.float16)[..., None].view(np.uint8)
        blocks[:, :, 2:] = q.view(np.uint8)
        return cls(blocks)

    def dequantize(self) -> np.ndarray:
        rows, cols = self.qs.shape
        return (self.qs.reshape(rows, -1, Q8_0_BLOCK).astype(np.float32) * self.d[:, :, None]).reshape(rows, cols)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_name: str
    shape: tuple[int, ...]           # numpy order: slowest dimension first (ggml's ne reversed)


class GGUFFile:
    """A validated, memory-mapped GGUF: `metadata` (key -> python value) and tensors by name."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        _precheck_header(self.path)
        try:
            from gguf import GGUFReader
            self._reader = GGUFReader(self.path, "r")
        except GGUFError:
            raise
        except Exception as e:  # the reader raises many kinds on corrupt data; one clear error instead
            raise GGUFError(f"{self.path}: corrupt GGUF ({type(e).__name__}: {e})") from None
        self.metadata = self._decode_metadata()
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._validate_tensors()

    # -- metadata ------------------------------------------------------------------------------------------
    def _decode_metadata(self) -> dict:
        out = {}
        for name, field in self._reader.fields.items():
            if name.startswith("GGUF."):
                continue
            try:
                out[name] = field.contents()
            except Exception as e:
                raise GGUFError(f"{self.path}: metadata key '{name}' cannot be decoded ({e})") from None
        return out

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: missing or invalid 'general.architecture'")
        return arch

    # -- tensors -------------------------------------------------------------------------------------------
    def _validate_tensors(self) -> None:
        size = self.path.stat().st_size
        for t in self._reader.tensors:
            tid = int(t.tensor_type)
            if tid not in TYPE_NAMES:
                raise GGUFError(f"{self.path}: tensor '{t.name}' has type "
                                f"{ALL_TYPE_NAMES.get(tid, f'#{tid}')}, which llamacmp does not load "
                                f"(supported: {', '.join(TYPE_NAMES.values())})")
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise GGUFError(f"{self.path}: tensor '{t.name}' extends past the end of the file "
                                f"(needs byte {end}, file has {size}): truncated?")

    def names(self) -> list[str]:
        return list(self._tensors)

    def has(self, name: str) -> bool:
        return name in self._tensors

    def info(self, name: str) -> TensorInfo:
        t = self._get(name)
        return TensorInfo(name, TYPE_NAMES[int(t.tensor_type)], tuple(int(x) for x in reversed(t.shape)))

    def _get(self, name: str):
        if name not in self._tensors:
            raise GGUFError(f"{self.path}: tensor '{name}' is missing")
        return self._tensors[name]

    def tensor(self, name: str) -> np.ndarray | Q8Tensor:
        """F32 as a zero-copy view; F16/BF16 widened to float32; Q8_0 as a Q8Tensor."""
        t = self._get(name)
        shape = tuple(int(x) for x in reversed(t.shape))
        kind = TYPE_NAMES[int(t.tensor_type)]
        raw = np.asarray(t.data)
        if kind == "F32":
            return raw.view(np.float32).reshape(shape)
        if kind == "F16":
            return raw.view(np.float16).reshape(shape).astype(np.float32)
        if kind == "BF16":
            bits = raw.view(np.uint16).reshape(shape).astype(np.uint32) << 16
            return bits.view(np.float32)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        cols = shape[-1]
        if cols % Q8_0_BLOCK:
            raise GGUFError(f"{self.path}: Q8_0 tensor '{name}' row length {cols} is not a multiple of 32")
        return Q8Tensor(raw.view(np.uint8).reshape(rows, cols // Q8_0_BLOCK, Q8_0_BYTES))


def _precheck_header(path: Path) -> None:
    """Check magic, version and counts before the reader trusts them (a corrupt count must not allocate GBs)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as e:
        raise GGUFError(f"{path}: cannot open ({e.strerror})") from None
    if len(head) < 24:
        raise GGUFError(f"{path}: too short to be a GGUF file ({size} bytes)")
    if head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    # Each tensor info needs >= 24 bytes and each key/value >= 13: counts beyond that are corrupt.
    if n_tensors * 24 > size or n_kv * 13 > size:
        raise GGUFError(f"{path}: corrupt header (claims {n_tensors} tensors and {n_kv} keys in {size} bytes)")
