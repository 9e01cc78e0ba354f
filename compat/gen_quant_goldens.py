"""Generate the block-quantization goldens from ggml (llama.cpp's CPU build on x86-64, b8462 or 0c1e570).

    python3 compat/gen_quant_goldens.py [--oracle b8462|0c1e570] [--tool PATH]

Two checks need ggml's own numbers (tests/test_quant_goldens.py):
- dequantization: random valid blocks of every type llamacmp loads (llamacmp.fixtures.quant_blocks, at three
  scale magnitudes, the smallest with subnormal f16 scales; the IQ1-3 grid types included), dequantized by
  ggml's `to_float`;
- activation quantization: random float rows (with exact .5 ties, a +max/-max tie and an all-zero block)
  quantized to Q8_0, Q8_1 and Q8_K by the CPU backend's `from_float` (the x86 SIMD versions where there is one),
  as its mul_mat does to the activations;
- the dot products: the amplitude-1 weight rows of every type against those activation rows, by the CPU backend's
  vec_dot after from_float to the type's vec_dot_type (float32 accumulation, so tests allow its rounding).
The tool is compat/ggml_quants.cpp, built by compat/build_oracle_tools.sh [--oracle 0c1e570]. Output: the oracle's
quant_blocks.npz (compat/goldens/, or compat/goldens/0c1e570/; compat/oracles.py). The inputs are the same for both
oracles (fixed seeds), so the two files differ only where ggml's answers do.
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import oracles

from llamacmp.fixtures.quant_blocks import random_blocks
from llamacmp.gguf_file import GRID_TYPES, QUANT_BLOCKS


# Each type's blocks are seeded by its place here: the grid types came later and are appended, so the earlier
# types keep their seeds and their arrays stay byte-identical.
WEIGHT_TYPES = [*(t for t in QUANT_BLOCKS if t not in GRID_TYPES), "Q8_0", *GRID_TYPES]
ACTIVATION_TYPES = ["Q8_0", "Q8_1", "Q8_K"]
AMPLITUDES = (1.0, 1e-5, 300.0)      # 1e-5: d fields in the f16 subnormal range
ROWS, COLS = 2, 512


def run(tool: Path, mode: str, type_name: str, data: bytes, folder: Path, *more: bytes, n: int = 0) -> bytes:
    """The tool on `data` (and `more` inputs, for vec_dot with row length n) -> its output file's bytes."""
    paths = []
    for i, d in enumerate((data, *more)):
        paths.append(folder / f"in{i}.bin")
        paths[-1].write_bytes(d)
    dst = folder / "out.bin"
    subprocess.run([str(tool), mode, type_name, *([str(n)] if n else []), *map(str, paths), str(dst)], check=True)
    return dst.read_bytes()


def weight_blocks(type_name: str, seed: int) -> np.ndarray:
    """[3 * ROWS, COLS / block_values, block_bytes] uint8: ROWS rows per amplitude."""
    parts = [random_blocks(type_name, ROWS, COLS, np.random.default_rng([seed, i]), amplitude=a).blocks
             for i, a in enumerate(AMPLITUDES)]
    return np.concatenate(parts)


def activation_rows(seed: int) -> np.ndarray:
    """[4, COLS] float32 with the cases where quantizers differ: .5 ties after scaling, a tie between +max and
    -max, an all-zero block."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, COLS)).astype(np.float32)
    x[1, :32] = np.arange(32, dtype=np.float32) - 15.5       # amax 16.5: many products land near .5
    x[1, 0] = 127.0                                           # amax 127: x * 127/amax == x, .5 exactly
    x[1, 1:8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5]
    x[2, :256] *= 0.01
    x[2, 10], x[2, 200] = -3.0, 3.0                          # Q8_K: the first of equal magnitudes decides the sign
    x[3, 256:] = 0.0                                          # an all-zero Q8_K block (and eight Q8_0 blocks)
    return x


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    oracles.add_argument(ap)
    ap.add_argument("--tool", type=Path, default=None, help="default: the oracle's build of ggml_quants")
    args = ap.parse_args(argv)
    oracle = oracles.parse(args.oracle)
    args.tool = args.tool or oracle.tool("ggml_quants")
    if not args.tool.exists():
        raise SystemExit(f"{args.tool} missing: run compat/build_llamacpp.sh and compat/build_oracle_tools.sh")
    golden: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i, type_name in enumerate(WEIGHT_TYPES):
            blocks = weight_blocks(type_name, 100 + i)
            values = np.frombuffer(run(args.tool, "to_float", type_name, blocks.tobytes(), folder), np.float32)
            golden[f"blocks_{type_name}"] = blocks
            golden[f"dequant_{type_name}"] = values.reshape(blocks.shape[0], COLS)
        x = activation_rows(7)
        golden["activations"] = x
        for type_name in WEIGHT_TYPES:
            w = golden[f"blocks_{type_name}"][:ROWS]                # the amplitude-1 rows
            out = run(args.tool, "vec_dot", type_name, w.tobytes(), folder, x.tobytes(), n=COLS)
            golden[f"vec_dot_{type_name}"] = np.frombuffer(out, np.float32).reshape(len(x), ROWS)
        for type_name in ACTIVATION_TYPES:
            raw = run(args.tool, "from_float", type_name, x.tobytes(), folder)
            golden[f"quant_{type_name}"] = np.frombuffer(raw, np.uint8).reshape(x.shape[0], -1)
    out = oracle.golden("quant_blocks.npz")
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **golden)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
