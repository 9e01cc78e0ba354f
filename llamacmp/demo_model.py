"""The bundled demo model: `data/default.gguf` (the trunk, what runs without -m) and `data/default-mtp-head.gguf`
(its trained MTP head alone, training/split_mtp_head.py), joined on demand into the user cache for
`--spec-type draft-mtp`.

The joined file is not bundled: llama.cpp b8462 cannot load a file with an MTP block (our b8462 goldens run
default.gguf), and the repository stays small (the head is 2.2 MB, the joined file 25.5 MB). The join is the
inverse of the split: the trunk's metadata with `block_count` and `nextn_predict_layers` set from the head, the
trunk's tensors then the head's, every tensor's bytes as stored: the trained file training/train_mtp.py wrote.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .user_cache import cache_dir

DATA = Path(__file__).resolve().parent / "data"
BUNDLED_MODEL = DATA / "default.gguf"
BUNDLED_MTP_HEAD = DATA / "default-mtp-head.gguf"

ARCH = "qwen35"
# the head file's own keys: what the joined file takes, and the trunk it was trained on (never join another)
HEAD_KEY = "llamacmp.mtp_head."
HEAD_BLOCK_COUNT = HEAD_KEY + "block_count"
HEAD_NEXTN = HEAD_KEY + "nextn_predict_layers"
HEAD_TRUNK_SHA256 = HEAD_KEY + "trunk_sha256"
HEAD_TRUNK_NAME = HEAD_KEY + "trunk_file"
BLOCK_COUNT = f"{ARCH}.block_count"
NEXTN = f"{ARCH}.nextn_predict_layers"


class DemoModelError(Exception):
    """The head cannot be joined to this trunk (the message says why)."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_kv(reader) -> dict[str, tuple[object, list]]:
    """key -> (value, GGUF value types) of a gguf.GGUFReader, in file order, without the GGUF.* header fields."""
    return {k: (f.contents(), list(f.types)) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def add_kv(w, key: str, value, types: list) -> None:
    """One key as the source file typed it (an array keeps its element type)."""
    import gguf
    w.add_key_value(key, value, types[0], types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None)


def write_tensors(w, tensors) -> None:
    """gguf.GGUFReader tensors, bytes as stored (quantized blocks are not decoded)."""
    for t in tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)


def close(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_head(head_kv: dict, trunk: Path, trunk_sha: str) -> None:
    """Refuses a head trained on another trunk (its recorded sha256 is the trunk file's)."""
    want = head_kv.get(HEAD_TRUNK_SHA256, (None,))[0]
    if want is None:
        raise DemoModelError(f"the MTP head file has no {HEAD_TRUNK_SHA256}: not written by training/split_mtp_head.py")
    if want != trunk_sha:
        raise DemoModelError(f"the MTP head was trained on a trunk with sha256 {want} "
                             f"({head_kv.get(HEAD_TRUNK_NAME, ('?',))[0]}), but {trunk} has sha256 {trunk_sha}: "
                             "not joining them (remake the head with training/split_mtp_head.py)")


def join(trunk: Path, head: Path, out: Path) -> Path:
    """trunk + head -> out, written to a temporary name then renamed (a reader never sees half a file)."""
    import gguf
    t_reader, h_reader = gguf.GGUFReader(str(trunk)), gguf.GGUFReader(str(head))
    t_kv, h_kv = read_kv(t_reader), read_kv(h_reader)
    check_head(h_kv, trunk, sha256(trunk))
    if NEXTN in t_kv:
        raise DemoModelError(f"{trunk} already has {NEXTN}: it is not a trunk")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(str(tmp), ARCH)
    for key, (value, types) in t_kv.items():
        if key == "general.architecture":          # GGUFWriter writes it
            continue
        if key == BLOCK_COUNT:                      # where llama.cpp's converter (and export.write_with_mtp) puts them
            add_kv(w, key, h_kv[HEAD_BLOCK_COUNT][0], types)
            add_kv(w, NEXTN, *h_kv[HEAD_NEXTN])
        else:
            add_kv(w, key, value, types)
    write_tensors(w, t_reader.tensors)
    write_tensors(w, h_reader.tensors)
    try:
        close(w)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def joined_is_valid(path: Path, trunk: Path, head: Path) -> bool:
    """A cached join has the trunk's then the head's tensor names, and the file holds its last tensor's bytes
    (a join is renamed into place whole; this catches a file damaged since)."""
    import gguf
    try:
        got = gguf.GGUFReader(str(path)).tensors
    except (OSError, ValueError):
        return False
    want = [t.name for r in (gguf.GGUFReader(str(trunk)), gguf.GGUFReader(str(head))) for t in r.tensors]
    return [t.name for t in got] == want and path.stat().st_size >= got[-1].data_offset + got[-1].n_bytes


def with_mtp_head(trunk: Path = BUNDLED_MODEL, head: Path = BUNDLED_MTP_HEAD, cache: Path | None = None) -> Path:
    """The demo model with its trained MTP head: joined once into the user cache ($LLAMACMP_CACHE/demo/), named by
    the head file's sha256 (a new head gets a new file), reused while valid."""
    import gguf
    check_head(read_kv(gguf.GGUFReader(str(head))), trunk, sha256(trunk))    # a cached join too: default.gguf may change
    head_sha = sha256(head)
    folder = (cache or cache_dir()) / "demo"
    out = folder / f"{trunk.stem}-mtp-{head_sha[:16]}.gguf"
    if out.exists() and joined_is_valid(out, trunk, head):
        return out
    folder.mkdir(parents=True, exist_ok=True)
    return join(trunk, head, out)
