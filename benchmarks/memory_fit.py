"""The largest context (-c) that the memory plan fits on a card of a given size, for llama-quantize's type mixes
of the real Qwen3.5 shapes, on one card or a layer split over several. A CPU plan (llamacmp/memplan.py's
arithmetic), not a measurement on a GPU.

    python3 benchmarks/memory_fit.py [--card-gib 16] [--context-mib 512] [-ub 512] [--cards 1 2]
           [--case 9b:Q4_K_M --case 27b:IQ4_XS ...] [--check-quantize PATH/llama-quantize [--save-golden]]

The arena may take the card minus --context-mib (the CUDA context, kernels and graphs live outside it: memplan's
docstring). Contexts are multiples of 256 up to the model's training context. --check-quantize runs
`llama-quantize --dry-run` (b8462) on a header-only F16 file of each case's shape (its data region a sparse hole:
nothing is read) and checks that preset_types() gives the same type to every tensor; --save-golden keeps
llama-quantize's choices in compat/goldens/quant_mix.json, which tests/test_memory_fit.py checks the rule against.

preset_types() is llama-quantize b8462's choice (src/llama-quant.cpp, llama_tensor_get_type, no imatrix) for a dense
qwen35 file, where every layer has one "attn_v-like" tensor (attn_v in attention layers, the GDN attn_qkv in the
others), so that the counters i_attention_wv and i_ffn_down are the layer index (tensors are visited in layer
order) and use_more_bits(i, n) = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2:
  output.weight        Q6_K (Q8_0 files: Q8_0)
  token_embd.weight    the preset's type (the model is not tied)
  attn_v / attn_qkv    Q4_K_M, Q5_K_M: Q6_K where use_more_bits; IQ4_XS: Q5_K (n_head / n_head_kv >= 4)
  ffn_down             Q4_K_M, Q5_K_M: Q6_K where use_more_bits; IQ4_XS: Q5_K in the first n_layer/8 layers
  other 2-D *.weight   the preset's type (attn_q/k/output, attn_gate, ssm_alpha/beta, ssm_out, ffn_gate/up)
  not quantized        1-D tensors, *_norm.weight, ssm_conv1d (they stay as in the F16/F32 source: F32 here)
  then a row length that is not a multiple of the type's block falls back (Q4_K -> Q5_0, Q5_K -> Q5_1,
  Q6_K -> Q8_0, IQ4_XS -> IQ4_NL); no qwen35 9B/27B tensor needs it.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamacmp import memplan
from llamacmp.fixtures.writer import SHAPES, shape_model, tensor_specs  # noqa: E402
from llamacmp.gguf_file import QUANT_BLOCKS  # noqa: E402

N_VOCAB = 248320
# llama_ftype of each preset (general.file_type)
FILE_TYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "IQ4_XS": 30, "Q8_0": 7}
PRESETS = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K", "IQ4_XS": "IQ4_XS", "Q8_0": "Q8_0"}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}
BLOCK = {**{t: v for t, (v, _) in QUANT_BLOCKS.items()}, "Q8_0": 32}
DEFAULT_CASES = ["9b:Q4_K_M", "27b:IQ4_XS", "27b:Q4_K_M"]
KV = [("f16", "f16"), ("tq3", "tq3")]


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _quantized(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name and "ssm_conv1d" not in name


def _choose(name: str, layer: int, n_layer: int, preset: str, gqa: int) -> str:
    base = PRESETS[preset]
    if name == "output.weight":
        return "Q8_0" if base == "Q8_0" else "Q6_K"
    if name.endswith(("attn_v.weight", "attn_qkv.weight")):
        if preset == "IQ4_XS" and gqa >= 4:
            return "Q5_K"
        if preset in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layer):
            return "Q6_K"
    if name.endswith("ffn_down.weight"):
        if preset in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layer):
            return "Q6_K"
        if preset == "IQ4_XS" and layer < n_layer // 8:
            return "Q5_K"
    return base


def preset_types(shape_name: str, preset: str, mtp: bool = False) -> dict[str, str]:
    """Tensor name -> the GGUF type llama-quantize b8462 gives it for `preset` (see the module docstring); mtp: the
    shape with its MTP block (blk.{n_layer}), typed by the same rules at its layer index."""
    s = replace(SHAPES[shape_name], mtp=mtp)
    out = {}
    for t in tensor_specs(s, N_VOCAB):
        if not _quantized(t.name, t.shape):
            out[t.name] = "F32"
            continue
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1
        typ = _choose(t.name, layer, s.n_layer, preset, s.n_head // s.n_head_kv)
        if t.shape[-1] % BLOCK[typ]:
            typ = FALLBACK[typ]
        out[t.name] = typ
    return out


# -- the fit -------------------------------------------------------------------------------------------------

def fits(tensors, cfg, n_ctx: int, kv: tuple[str, str], n_cards: int, cap: int, n_ubatch: int) -> bool:
    parts = [None] if n_cards == 1 else memplan.split_parts(tensors, cfg, [1.0] * n_cards)
    return all(memplan.plan(tensors, cfg, n_ctx, 1, kv[0], kv[1], n_ubatch, cap=cap, part=p).total <= cap
               for p in parts)


def largest_ctx(tensors, cfg, kv, n_cards: int, cap: int, n_ubatch: int) -> int:
    """The largest multiple of 256 up to the training context that fits (0: not even 256)."""
    lo, hi = 0, cfg.n_ctx_train // 256
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(tensors, cfg, mid * 256, kv, n_cards, cap, n_ubatch):
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


def weights_gib(tensors) -> float:
    return sum(memplan.tensor_bytes(t) for t in tensors) / memplan.GIB


def table(cases: list[str], cards: list[int], cap: int, n_ubatch: int) -> list[str]:
    rows = ["| model | weights | cards | -ctk/-ctv f16 | -ctk/-ctv tq3 |", "|---|---:|---:|---:|---:|"]
    for case in cases:
        shape, preset = case.split(":")
        tensors, cfg = shape_model(shape, N_VOCAB, types=preset_types(shape, preset))
        for n in cards:
            cells = []
            for kv in KV:
                c = largest_ctx(tensors, cfg, kv, n, cap, n_ubatch)
                full = " (full)" if c == cfg.n_ctx_train else ""
                cells.append(f"{c}{full}" if c else "does not fit")
            rows.append(f"| {shape.upper()} {preset} | {weights_gib(tensors):.2f} GiB | {n} | " + " | ".join(cells)
                        + " |")
    return rows


# -- checking the rule against llama-quantize --------------------------------------------------------------------

def header_only_f16(shape_name: str, path: Path) -> Path:
    """A qwen35 F16 GGUF of the shape (matrices F16, vectors F32, the real vocabulary size) whose tensor data is
    a hole: header and tensor infos written, the file then extended to its full length without writing."""
    import gguf
    import numpy as np
    from llamacmp.fixtures.qwen_vocab import tiny_vocab
    from llamacmp.fixtures.writer import _write_metadata, layout
    s = SHAPES[shape_name]
    w = gguf.GGUFWriter(str(path), "qwen35")
    _write_metadata(w, s, "f16", tiny_vocab(), "memory-fit", None)
    end = 0
    for spec in tensor_specs(s, N_VOCAB):
        shape, dtype, nbytes = layout(spec, "f16")
        w.add_tensor_info(spec.name, shape, np.dtype(dtype), nbytes)
        end += -(-nbytes // w.data_alignment) * w.data_alignment
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    start = w.fout[0].tell()
    w.close()
    data_start = -(-start // w.data_alignment) * w.data_alignment
    with open(path, "r+b") as f:
        f.truncate(data_start + end)
    return path


LINE = re.compile(r"\]\s+(\S+)\s+- \[.*type =\s+(\w+),.*?(?:\((\w+)\))?\s*$")


def quantize_types(tool: Path, shape_name: str, preset: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        src = header_only_f16(shape_name, Path(tmp) / "in.gguf")
        run = subprocess.run([str(tool), "--dry-run", str(src), preset], capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"llama-quantize --dry-run failed:\n{run.stderr[-2000:]}")
    out = {}
    for line in (run.stdout + run.stderr).splitlines():
        m = LINE.search(line)
        if m:
            out[m.group(1)] = (m.group(3) or m.group(2)).upper()
    return out


GOLDEN = Path(__file__).resolve().parents[1] / "compat" / "goldens" / "quant_mix.json"


def check_quantize(tool: Path, cases: list[str], save: bool = False) -> list[str]:
    """Compare preset_types() with llama-quantize's choice per tensor; save: also write what llama-quantize chose
    to GOLDEN ({case: types in fixtures.writer.tensor_specs order}) for tests/test_memory_fit.py."""
    report, golden = [], {}
    for case in cases:
        shape, preset = case.split(":")
        got, want = quantize_types(tool, shape, preset), preset_types(shape, preset)
        bad = [f"{n}: llama-quantize {got.get(n)}, rule {t}" for n, t in want.items() if got.get(n) != t]
        report.append(f"{case}: {len(want)} tensors, {len(bad)} differ" + "".join(f"\n  {b}" for b in bad[:10]))
        golden[case] = [got.get(n) for n in want]
    if save:
        import json
        GOLDEN.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
        report.append(f"wrote {GOLDEN}")
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--card-gib", type=float, default=16.0)
    ap.add_argument("--context-mib", type=float, default=512.0, help="left outside the arena for the CUDA context")
    ap.add_argument("-ub", "--ubatch-size", type=int, default=512)
    ap.add_argument("--cards", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--case", action="append", help="SHAPE:PRESET, e.g. 27b:IQ4_XS (default: " +
                    ", ".join(DEFAULT_CASES) + ")")
    ap.add_argument("--check-quantize", type=Path, help="llama-quantize to check preset_types() against")
    ap.add_argument("--save-golden", action="store_true", help="with --check-quantize: write compat/goldens/"
                    "quant_mix.json from llama-quantize's choices")
    args = ap.parse_args(argv)
    cases = args.case or DEFAULT_CASES
    for case in cases:
        shape, _, preset = case.partition(":")
        if shape not in SHAPES or preset not in PRESETS:
            ap.error(f"--case {case}: shape one of {', '.join(SHAPES)}, preset one of {', '.join(PRESETS)}")
    if args.check_quantize:
        print("\n".join(check_quantize(args.check_quantize, cases, args.save_golden)))
    cap = int(args.card_gib * memplan.GIB - args.context_mib * memplan.MIB)
    print(f"arena cap {cap / memplan.GIB:.2f} GiB per card ({args.card_gib:g} GiB card - {args.context_mib:g} MiB), "
          f"-ub {args.ubatch_size}, one slot; largest -c (multiple of 256) that the plan fits:")
    print("\n".join(table(cases, args.cards, cap, args.ubatch_size)))


if __name__ == "__main__":
    main()
