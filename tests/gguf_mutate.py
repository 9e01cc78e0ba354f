"""Take a GGUF apart into keys, tensor infos and data, change any of it, and put it back together: the malformed
files llama.cpp's reader refuses (duplicate keys or names, overlapping offsets, wrong-typed keys, ...), which the
gguf package's writer will not produce."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12


@dataclass
class Tensor:
    name: str
    ne: list[int]
    type: int
    offset: int                  # relative to the data section


@dataclass
class Parts:
    version: int
    kvs: list[tuple[str, bytes]] = field(default_factory=list)   # key, type id + encoded value
    tensors: list[Tensor] = field(default_factory=list)
    data: bytes = b""
    alignment: int = 32

    def index(self, key: str) -> int:
        return next(i for i, (k, _) in enumerate(self.kvs) if k == key)

    def set(self, key: str, typed: bytes) -> None:
        i = self.index(key)
        self.kvs[i] = (key, typed)

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(type_id: int, v) -> bytes:
    """A typed value as stored after a key: type id, then the value (arrays: [(item type, [values])])."""
    return struct.pack("<I", type_id) + _payload(type_id, v)


def _payload(type_id: int, v) -> bytes:
    if type_id in SCALAR:
        return struct.pack(SCALAR[type_id], v)
    if type_id == STR:
        return _str(v)
    item, items = v
    return struct.pack("<IQ", item, len(items)) + b"".join(
        value(item, x)[4:] if item != ARR else value(ARR, x)[4:] for x in items)


class _Reader:
    def __init__(self, b: bytes):
        self.b, self.pos = b, 0

    def take(self, n: int) -> bytes:
        self.pos += n
        return self.b[self.pos - n:self.pos]

    def unpack(self, code: str):
        return struct.unpack(code, self.take(struct.calcsize(code)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode()

    def skip_value(self, type_id: int) -> None:
        if type_id in SCALAR:
            self.take(struct.calcsize(SCALAR[type_id]))
        elif type_id == STR:
            self.take(self.unpack("<Q"))
        else:
            item, n = self.unpack("<I"), self.unpack("<Q")
            for _ in range(n):
                self.skip_value(item)


def parse(b: bytes) -> Parts:
    r = _Reader(b)
    assert r.take(4) == b"GGUF"
    p = Parts(r.unpack("<I"))
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    for _ in range(n_kv):
        key = r.string()
        start = r.pos
        r.skip_value(r.unpack("<I"))
        p.kvs.append((key, b[start:r.pos]))
    for _ in range(n_tensors):
        name = r.string()
        ne = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
        p.tensors.append(Tensor(name, ne, r.unpack("<I"), r.unpack("<Q")))
    p.alignment = 32
    start = -(-r.pos // p.alignment) * p.alignment
    p.data = b[start:]
    return p


def build(p: Parts) -> bytes:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", p.version, len(p.tensors), len(p.kvs)))
    for key, typed in p.kvs:
        out += _str(key) + typed
    for t in p.tensors:
        out += _str(t.name) + struct.pack("<I", len(t.ne)) + b"".join(struct.pack("<Q", d) for d in t.ne)
        out += struct.pack("<IQ", t.type, t.offset)
    out += b"\0" * (-len(out) % p.alignment)
    return bytes(out + p.data)
