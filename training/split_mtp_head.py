"""Split a trained MTP file (training/train_mtp.py's `<stem>-mtp.gguf`) into its head alone, the file bundled as
`llamacmp/data/default-mtp-head.gguf`; llamacmp/demo_model.py joins it back to the trunk.

    python -m training.split_mtp_head out/mtp-full/default-mtp.gguf                  # -> llamacmp/data/default-mtp-head.gguf
    python -m training.split_mtp_head TRAINED.gguf --trunk SRC.gguf --out HEAD.gguf

The trained file must be the trunk plus the head and nothing else: the trunk's tensors first, byte-identical and in
the same order, and the same metadata but `block_count` and `nextn_predict_layers`. The head file holds the
tensors after the trunk's (bytes as stored), the two values the joined file takes, and the trunk's sha256 and
file name (a head is never joined to another trunk).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from llamacmp import demo_model as dm


def check_trained(t_kv: dict, m_kv: dict, t_tensors, m_tensors, trained: Path, trunk: Path) -> None:
    """The trained file is the trunk plus a head: refuses anything else, naming the key or tensor."""
    if dm.NEXTN not in m_kv or int(m_kv[dm.NEXTN][0]) < 1:
        raise ValueError(f"{trained} has no {dm.NEXTN}: not a file with an MTP head")
    changed = {dm.BLOCK_COUNT, dm.NEXTN}
    for key in (set(t_kv) | set(m_kv)) - changed:
        if key not in t_kv or key not in m_kv or t_kv[key][0] != m_kv[key][0]:
            raise ValueError(f"metadata {key} differs between {trunk} and {trained}")
    if len(m_tensors) <= len(t_tensors):
        raise ValueError(f"{trained} has no tensors after the trunk's")
    for t, m in zip(t_tensors, m_tensors):
        if t.name != m.name or t.tensor_type != m.tensor_type or t.data.tobytes() != m.data.tobytes():
            raise ValueError(f"trunk tensor {t.name} is not byte-identical in {trained} (found {m.name})")


def split(trained: Path, trunk: Path, out: Path) -> Path:
    import gguf
    t_reader, m_reader = gguf.GGUFReader(str(trunk)), gguf.GGUFReader(str(trained))
    t_kv, m_kv = dm.read_kv(t_reader), dm.read_kv(m_reader)
    check_trained(t_kv, m_kv, t_reader.tensors, m_reader.tensors, trained, trunk)
    w = gguf.GGUFWriter(str(out), dm.ARCH)
    dm.add_kv(w, dm.HEAD_BLOCK_COUNT, *m_kv[dm.BLOCK_COUNT])
    dm.add_kv(w, dm.HEAD_NEXTN, *m_kv[dm.NEXTN])
    w.add_string(dm.HEAD_TRUNK_SHA256, dm.sha256(trunk))
    w.add_string(dm.HEAD_TRUNK_NAME, trunk.name)
    dm.write_tensors(w, m_reader.tensors[len(t_reader.tensors):])
    dm.close(w)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trained", type=Path, help="the trunk with its MTP head (train_mtp.py --export)")
    p.add_argument("--trunk", type=Path, default=dm.BUNDLED_MODEL)
    p.add_argument("--out", type=Path, default=dm.BUNDLED_MTP_HEAD)
    args = p.parse_args(argv)
    out = split(args.trained, args.trunk, args.out)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, trunk sha256 {dm.sha256(args.trunk)})")


if __name__ == "__main__":
    main()
