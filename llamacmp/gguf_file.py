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
TYPE_NAMES = {0: "F32", 1: "F16", 30: "BF16", 8: "Q8_0", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 20: "IQ4_NL", 23: "IQ4_XS", 16: "IQ2_XXS",
              17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 21: "IQ3_S", 22: "IQ2_S", 29: "IQ1_M"}
# The grid-codebook types (ggml-common.h: 8 values from a grid of small integers per index, with signs; CUDA decoders
# in cuda_src/quant_blocks_iq.cuh).
GRID_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ3_S", "IQ2_S", "IQ1_M")
# Block-quantized types other than Q8_0 (which keeps its own Q8Tensor): (values, bytes) per block.
QUANT_BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q2_K": (256, 84),
                "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
                "IQ4_NL": (32, 18), "IQ4_XS": (256, 136), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74),
                "IQ3_XXS": (256, 98), "IQ1_S": (256, 50), "IQ3_S": (256, 110), "IQ2_S": (256, 82),
                "IQ1_M": (256, 56)}
ALL_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
                  10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
                  17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
                  23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
                  30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}


# llama.cpp's llama_model_ftype_name for general.file_type (llama_ftype in include/llama.h)
FILE_TYPE_NAMES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
                   11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small",
                   15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K",
                   19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 21: "Q2_K - Small",
                   22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw", 25: "IQ4_NL - 4.5 bpw",
                   26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw", 28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw",
                   30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw", 32: "BF16"}


def file_type_name(metadata: dict) -> str:
    ft = metadata.get("general.file_type")
    return "unknown, may not work" if ft is None else FILE_TYPE_NAMES.get(ft, "unknown, may not work")


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
class QuantTensor:
    """A block-quantized matrix other than Q8_0, as stored: per row, `cols / block_values` blocks of the type's
    layout (ggml's block_q4_K etc.). blocks: [rows, n_blocks, block_bytes] uint8, the file's bytes (a memory-mapped
    view). The backends read the blocks themselves; dequantize() is gguf.quants' reading of them."""
    type_name: str
    blocks: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        rows, nb, _ = self.blocks.shape
        return rows, nb * QUANT_BLOCKS[self.type_name][0]

    @property
    def block_values(self) -> int:
        return QUANT_BLOCKS[self.type_name][0]

    def dequantize(self, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """[rows, cols] float32 (all rows, or the selected ones)."""
        from gguf.quants import dequantize
        from gguf.constants import GGMLQuantizationType
        b = self.blocks if rows is None else self.blocks[rows]
        flat = np.ascontiguousarray(b).reshape(b.shape[0], -1)
        return dequantize(flat, GGMLQuantizationType[self.type_name]).astype(np.float32, copy=False)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_name: str
    shape: tuple[int, ...]           # numpy order: slowest dimension first (ggml's ne reversed)


@dataclass(frozen=True, slots=True)
class _TensorRecord:
    name: str
    type_id: int
    ne: tuple[int, ...]          # ggml order: fastest dimension first
    offset: int                  # absolute byte offset in the file
    n_bytes: int


class GGUFFile:
    """A validated, memory-mapped GGUF: `metadata` (key -> python value) and tensors by name.

    The header is parsed here rather than with gguf.GGUFReader: that reader builds numpy views for every array
    element and takes ~40 s on a real Qwen3.5 file (750k vocabulary strings); this parser takes well under a
    second. Every read is bounds-checked, so a corrupt file gives a GGUFError naming what was being read."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        _precheck_header(self.path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        reader = _HeaderReader(self._map, self.path)
        self.metadata, self._tensors = reader.read()
        self._validate_tensors(reader.alignment, reader.data_start)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: missing or invalid 'general.architecture'")
        return arch

    # -- tensors -------------------------------------------------------------------------------------------
    def _validate_tensors(self, alignment: int, expected: int) -> None:
        """Types we load, and llama.cpp's layout rule: each tensor's data starts where the one before it ends,
        padded to the alignment (so a misaligned or overlapping offset, or a type relabelled to one of another
        byte size, is refused instead of read as the wrong bytes)."""
        size = len(self._map)
        for t in self._tensors.values():
            if t.type_id not in TYPE_NAMES:
                raise GGUFError(f"{self.path}: tensor '{t.name}' has type "
                                f"{ALL_TYPE_NAMES.get(t.type_id, f'#{t.type_id}')}, which llamacmp does not load "
                                f"(supported: {', '.join(TYPE_NAMES.values())})")
            if t.offset != expected:
                raise GGUFError(f"{self.path}: tensor '{t.name}' data is at offset {t.offset}, expected {expected}: "
                                f"tensor data must follow one another in order, each aligned to {alignment} bytes "
                                "(misaligned, overlapping, or a type or shape that does not match the bytes)")
            expected = t.offset + -(-t.n_bytes // alignment) * alignment
            if t.offset + t.n_bytes > size:
                raise GGUFError(f"{self.path}: tensor '{t.name}' extends past the end of the file "
                                f"(needs byte {t.offset + t.n_bytes}, file has {size}): truncated?")

    def names(self) -> list[str]:
        return list(self._tensors)

    @property
    def version(self) -> int:
        """The GGUF format version (2 or 3), from the header."""
        return int(struct.unpack("<I", self._map[4:8].tobytes())[0])

    def nbytes(self, name: str) -> int:
        """A tensor's size in the file, in bytes."""
        return self._get(name).n_bytes

    def has(self, name: str) -> bool:
        return name in self._tensors

    def info(self, name: str) -> TensorInfo:
        t = self._get(name)
        return TensorInfo(name, TYPE_NAMES[t.type_id], tuple(reversed(t.ne)))

    def _get(self, name: str) -> _TensorRecord:
        if name not in self._tensors:
            raise GGUFError(f"{self.path}: tensor '{name}' is missing")
        return self._tensors[name]

    def tensor(self, name: str) -> np.ndarray | Q8Tensor | QuantTensor:
        """F32 as a zero-copy view; F16/BF16 widened to float32; Q8_0 as a Q8Tensor and the other quantized types
        as a QuantTensor over the mapped bytes."""
        t = self._get(name)
        shape = tuple(reversed(t.ne))
        kind = TYPE_NAMES[t.type_id]
        raw = self._map[t.offset:t.offset + t.n_bytes]
        if kind == "F32":
            return raw.view(np.float32).reshape(shape)
        if kind == "F16":
            return raw.view(np.float16).reshape(shape).astype(np.float32)
        if kind == "BF16":
            bits = raw.view(np.uint16).reshape(shape).astype(np.uint32) << 16
            return bits.view(np.float32)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        if kind == "Q8_0":
            return Q8Tensor(raw.reshape(rows, shape[-1] // Q8_0_BLOCK, Q8_0_BYTES))
        values, nbytes = QUANT_BLOCKS[kind]
        return QuantTensor(kind, raw.reshape(rows, shape[-1] // values, nbytes))


# GGUF value types -> (struct code, size) for scalars; 8 = string, 9 = array.
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}
_BYTES_PER_VALUE = {0: 4, 1: 2, 30: 2}     # plain types; the block types are (values, bytes) per block
_BLOCKS = {8: (Q8_0_BLOCK, Q8_0_BYTES)} | {tid: QUANT_BLOCKS[n] for tid, n in TYPE_NAMES.items() if n in QUANT_BLOCKS}


_U64 = struct.Struct("<Q")


class _HeaderReader:
    """Sequential, bounds-checked reads over the mapped file."""

    def __init__(self, buf: np.ndarray, path: Path):
        self.buf, self.path, self.pos = memoryview(buf), path, 24
        self.what = "header"

    def _need(self, n: int) -> int:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF while reading {self.what} "
                            f"(needs {n} bytes at offset {self.pos}, file has {len(self.buf)})")
        at = self.pos
        self.pos += n
        return at

    def scalar(self, type_id: int):
        code, size = _SCALARS[type_id]
        return struct.unpack_from(code, self.buf, self._need(size))[0]

    def string(self) -> str:
        n = self.scalar(10)
        at = self._need(n)
        try:
            return str(self.buf[at:at + n], "utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: invalid UTF-8 in {self.what}") from None

    def value(self, type_id: int):
        if type_id in _SCALARS:
            return self.scalar(type_id)
        if type_id == 8:
            return self.string()
        if type_id != 9:
            raise GGUFError(f"{self.path}: unknown value type {type_id} in {self.what}")
        item_type, count = self.scalar(4), self.scalar(10)
        if item_type == 9:                            # llama.cpp's reader has no arrays of arrays either
            raise GGUFError(f"{self.path}: nested array in {self.what}")
        if item_type in _NUMPY:
            size = np.dtype(_NUMPY[item_type]).itemsize
            at = self._need(count * size)
            return np.frombuffer(self.buf, _NUMPY[item_type], count, at).tolist()
        if count > len(self.buf):                     # every element needs at least one byte
            raise GGUFError(f"{self.path}: corrupt array length {count} in {self.what}")
        if item_type == 8:
            return self.strings(count)
        return [self.value(item_type) for _ in range(count)]

    def strings(self, count: int) -> list[str]:
        """`count` strings in one tight loop: the vocabulary's 750K strings took ~2 s through string()."""
        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        append, unpack = out.append, _U64.unpack_from
        try:
            for _ in range(count):
                n = unpack(buf, pos)[0]
                pos += 8
                if pos + n > end:
                    raise struct.error
                append(str(buf[pos:pos + n], "utf-8"))
                pos += n
        except struct.error:
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF while reading {self.what} "
                            f"(string #{len(out)} at offset {pos}, file has {end} bytes)") from None
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: invalid UTF-8 in {self.what}") from None
        self.pos = pos
        return out

    def read(self) -> tuple[dict, dict[str, _TensorRecord]]:
        n_tensors, n_kv = struct.unpack_from("<QQ", self.buf, 8)
        metadata = {}
        for i in range(n_kv):
            self.what = f"metadata key #{i}"
            key = self.string()
            self.what = f"metadata key '{key}'"
            if key in metadata:                       # one value wins silently otherwise (an appended block_count)
                raise GGUFError(f"{self.path}: duplicate key '{key}'")
            metadata[key] = self.value(self.scalar(4))
        infos, seen = [], set()
        for i in range(n_tensors):
            self.what = f"tensor info #{i}"
            name = self.string()
            self.what = f"tensor info '{name}'"
            if name in seen:
                raise GGUFError(f"{self.path}: duplicate tensor name '{name}'")
            seen.add(name)
            n_dims = self.scalar(4)
            if not 1 <= n_dims <= 4:
                raise GGUFError(f"{self.path}: tensor '{name}' has {n_dims} dimensions")
            ne = tuple(self.scalar(10) for _ in range(n_dims))
            infos.append((name, ne, self.scalar(4), self.scalar(10)))
        alignment = metadata.get("general.alignment", 32)
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or \
                alignment & (alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment {alignment} is not a power of two")
        data_start = -(-self.pos // alignment) * alignment
        self.alignment, self.data_start = alignment, data_start
        return metadata, {name: self._record(name, ne, tid, off, data_start) for name, ne, tid, off in infos}

    def _record(self, name: str, ne: tuple[int, ...], type_id: int, offset: int, data_start: int) -> _TensorRecord:
        n = 1
        for d in ne:
            n *= d
        if type_id in _BLOCKS:
            values, per_block = _BLOCKS[type_id]
            if ne[0] % values:
                raise GGUFError(f"{self.path}: {TYPE_NAMES[type_id]} tensor '{name}' row length {ne[0]} is not a "
                                f"whole number of {values}-value blocks")
            n_bytes = n // values * per_block
        else:                                         # an unknown type is refused later, with its name
            n_bytes = n * _BYTES_PER_VALUE.get(type_id, 0)
        return _TensorRecord(name, type_id, ne, data_start + offset, n_bytes)


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
