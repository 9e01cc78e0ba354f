"""Make the quantized fixture files with llama.cpp's own llama-quantize (the b8462 tree of compat/build_llamacpp.sh).

    python3 compat/make_quant_fixtures.py [--bin DIR] [--only NAME ...] [--demo] [--check]

Fixtures (committed, compat/fixtures/quant/): the fixture writer's `q256` shape (every matrix row 256 long, so the
K-quants and IQ4_XS really apply instead of llama-quantize's fallbacks), tiny vocabulary, seed 21, written as F32 and
quantized once per preset in PRESETS. MANIFEST.json records each file's command, bytes, sha256 and its tensors per
type as our GGUFFile reads them; tests/test_quant_fixtures.py checks the files against it. IQ3_XXS, IQ2_XXS, IQ2_XS,
IQ2_S, IQ1_S and IQ1_M need an importance matrix (llama-quantize refuses them without one), so those files'
imatrix comes from llama-imatrix on a fixed text.
TQ1_0 (ternary) is a type llamacmp still refuses: that file is the refusal test's fixture.

--demo: the bundled demo model (llamacmp/data/default.gguf, Q8_0) requantized (--allow-requantize) to DEMO_TYPES
into $LLAMACMP_CACHE/quant-demo/, for compat/gen_quant_file_goldens.py's perplexity comparison (not committed: no F32/F16
export of it exists, and every file is 13-20 MB).

--check: regenerate into a temporary folder and compare the bytes with the committed files (llama-quantize is
deterministic for a given input).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))          # this checkout's llamacmp, not an installed copy elsewhere

FIXTURES = HERE / "fixtures" / "quant"
CACHE = Path(os.environ.get("LLAMACMP_CACHE", Path.home() / ".cache" / "llamacmp"))
DEFAULT_BIN = CACHE / "llama.cpp-49bfddeca" / "build-cpu" / "bin"
DEMO = ROOT / "llamacmp" / "data" / "default.gguf"
DEMO_OUT = CACHE / "quant-demo"
SHAPE, SEED = "q256", 21


@dataclass(frozen=True)
class Preset:
    name: str                   # file name part
    ftype: str                  # llama-quantize's type argument
    main: str                   # the block type the preset is named after: most matrices must hold it
    extra: tuple[str, ...] = ()
    imatrix: bool = False       # llama-quantize refuses this type without an importance matrix
    loads: bool = True          # False: llamacmp refuses the file (it is the refusal test's fixture)


# unsloth's UD-Q4_K_XL style: a Q4_K_M base with some tensors kept at higher precision (F16, BF16, Q8_0, Q5_K)
UD_OVERRIDES = ("--tensor-type", "ssm_alpha=f16", "--tensor-type", "ssm_beta=bf16", "--tensor-type", "attn_gate=q8_0",
                "--tensor-type", "attn_k=q8_0", "--tensor-type", "attn_v=q8_0", "--tensor-type", "ssm_out=q5_k")

# unsloth's UD-Q2_K_XL style (their Qwen3.5/3.6-27B files: IQ3_XXS, IQ2_S, IQ2_XXS, IQ1_S and IQ3_S bodies among
# Q4_K, Q6_K and Q8_0 tensors): an IQ3_XXS base with the FFN and some attention matrices overridden
UD_Q2_OVERRIDES = ("--tensor-type", "ffn_gate=iq2_s", "--tensor-type", "ffn_down=iq1_s", "--tensor-type",
                   "ssm_out=iq2_xxs", "--tensor-type", "attn_output=iq3_s", "--tensor-type", "attn_k=q8_0",
                   "--tensor-type", "attn_v=q8_0", "--tensor-type", "attn_gate=q4_k")

PRESETS = [
    Preset("Q4_0", "Q4_0", "Q4_0"), Preset("Q4_1", "Q4_1", "Q4_1"), Preset("Q5_0", "Q5_0", "Q5_0"),
    Preset("Q5_1", "Q5_1", "Q5_1"), Preset("Q2_K", "Q2_K", "Q2_K"), Preset("Q3_K_M", "Q3_K_M", "Q3_K"),
    Preset("Q4_K_S", "Q4_K_S", "Q4_K"), Preset("Q5_K_S", "Q5_K_S", "Q5_K"), Preset("Q6_K", "Q6_K", "Q6_K"),
    Preset("IQ4_NL", "IQ4_NL", "IQ4_NL"), Preset("IQ4_XS", "IQ4_XS", "IQ4_XS"),
    Preset("Q4_K_M", "Q4_K_M", "Q4_K"), Preset("Q5_K_M", "Q5_K_M", "Q5_K"),
    Preset("UD-Q4_K_XL", "Q4_K_M", "Q4_K", UD_OVERRIDES),
    Preset("IQ2_XXS", "IQ2_XXS", "IQ2_XXS", imatrix=True),
    # llama-quantize's IQ2_S file type is mostly IQ2_XS tensors; its IQ2_M is mostly IQ2_S
    Preset("IQ2_XS", "IQ2_XS", "IQ2_XS", imatrix=True), Preset("IQ2_M", "IQ2_M", "IQ2_S", imatrix=True),
    Preset("IQ3_XXS", "IQ3_XXS", "IQ3_XXS", imatrix=True), Preset("IQ3_S", "IQ3_S", "IQ3_S"),
    Preset("IQ1_S", "IQ1_S", "IQ1_S", imatrix=True), Preset("IQ1_M", "IQ1_M", "IQ1_M", imatrix=True),
    Preset("UD-Q2_K_XL", "IQ3_XXS", "IQ3_XXS", UD_Q2_OVERRIDES, imatrix=True),
    Preset("TQ1_0", "TQ1_0", "TQ1_0", loads=False),
]
DEMO_TYPES = ("Q4_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_M", "IQ2_XS",
              "IQ2_XXS", "IQ1_M", "IQ1_S")
# file types whose tensors llama-quantize b8462 refuses to make without one (llama-quant.cpp tensor_requires_imatrix)
DEMO_IMATRIX = ("IQ3_XXS", "IQ2_M", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S")


def fixture_name(preset: Preset) -> str:
    return f"{SHAPE}-{preset.name}.gguf"


def run(cmd: list, what: str, cwd: Path | None = None) -> None:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd)
    if r.returncode:
        sys.exit(f"{what} failed (exit {r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr[-3000:]}")


def write_source(folder: Path) -> Path:
    from llamacmp.fixtures.qwen_vocab import tiny_vocab
    from llamacmp.fixtures.writer import SHAPES, write_model
    return write_model(folder / f"{SHAPE}-f32.gguf", SHAPES[SHAPE], "f32", tiny_vocab(), seed=SEED,
                       name=f"compat-quant-{SHAPE}")


def imatrix_text() -> str:
    """A fixed text for llama-imatrix (the tiny vocabulary's own training text, ~4200 tokens)."""
    from llamacmp.fixtures.qwen_vocab import _tiny_corpus
    return _tiny_corpus()


IMATRIX_ARGS = ("-c", "128", "--chunks", "8", "-t", "2")


def make_imatrix(bin_dir: Path, src: Path, folder: Path) -> Path:
    """Run in `folder` with relative names: the imatrix records its text's path and the quantized file the
    imatrix's, so absolute temporary paths would make every run's bytes different."""
    (folder / "imatrix.txt").write_text(imatrix_text())
    run([bin_dir / "llama-imatrix", "-m", src, "-f", "imatrix.txt", "-o", "imatrix.gguf", *IMATRIX_ARGS],
        "llama-imatrix", cwd=folder)
    return folder / "imatrix.gguf"


def quantize(bin_dir: Path, src: Path, dst: Path, preset: Preset, imatrix: Path | None,
             requantize: bool = False) -> list[str]:
    args = (["--allow-requantize"] if requantize else []) + list(preset.extra)
    im = ["--imatrix", imatrix.name] if preset.imatrix else []           # relative: see make_imatrix
    run([bin_dir / "llama-quantize", *args, *im, src.resolve(), dst.resolve(), preset.ftype, "2"],
        f"llama-quantize {preset.name}", cwd=imatrix.parent if im else None)
    made_by = ["llama-imatrix -m SRC -f TEXT -o IMATRIX", *IMATRIX_ARGS, ";"] if preset.imatrix else []
    return [*made_by, "llama-quantize", *args, *(["--imatrix", "IMATRIX"] if im else []), "SRC", dst.name,
            preset.ftype]


def census(path: Path) -> dict[str, int]:
    """Tensors per type, read by our own GGUFFile; a type it refuses is read with the gguf package instead."""
    from llamacmp.gguf_file import GGUFError, GGUFFile
    try:
        f = GGUFFile(path)
        counts = Counter(f.info(n).type_name for n in f.names())
    except GGUFError:
        import gguf
        counts = Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    return dict(sorted(counts.items()))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_fixtures(bin_dir: Path, out: Path, presets: list[Preset]) -> dict:
    manifest = {}
    with tempfile.TemporaryDirectory() as d:
        src = write_source(Path(d))
        imatrix = make_imatrix(bin_dir, src, Path(d)) if any(p.imatrix for p in presets) else None
        for p in presets:
            dst = out / fixture_name(p)
            cmd = quantize(bin_dir, src, dst, p, imatrix)
            manifest[dst.name] = {"preset": p.name, "command": " ".join(cmd), "bytes": dst.stat().st_size,
                                  "sha256": sha256(dst), "types": census(dst)}
            print(f"{dst.name:26} {dst.stat().st_size / 1e6:6.3f} MB  {manifest[dst.name]['types']}", flush=True)
    return manifest


def make_demo(bin_dir: Path) -> None:
    DEMO_OUT.mkdir(parents=True, exist_ok=True)
    imatrix = make_imatrix(bin_dir, DEMO, DEMO_OUT)          # the demo model's own, on the same fixed text
    for t in DEMO_TYPES:
        dst = DEMO_OUT / f"default-{t}.gguf"
        quantize(bin_dir, DEMO, dst, Preset(t, t, t, imatrix=t in DEMO_IMATRIX), imatrix, requantize=True)
        print(f"{dst} {dst.stat().st_size / 1e6:.2f} MB  {census(dst)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, default=DEFAULT_BIN, help="folder with llama-quantize and llama-imatrix")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these presets (names as in PRESETS)")
    ap.add_argument("--demo", action="store_true", help="also requantize the demo model into $LLAMACMP_CACHE")
    ap.add_argument("--check", action="store_true", help="regenerate to a temporary folder and compare bytes")
    args = ap.parse_args()
    unknown = set(args.only or ()) - {p.name for p in PRESETS}
    if unknown:
        sys.exit(f"unknown preset(s): {', '.join(sorted(unknown))} (known: {', '.join(p.name for p in PRESETS)})")
    presets = [p for p in PRESETS if not args.only or p.name in args.only]
    manifest_path = FIXTURES / "MANIFEST.json"
    if args.check:
        with tempfile.TemporaryDirectory() as d:
            fresh = make_fixtures(args.bin, Path(d), presets)
        committed = json.loads(manifest_path.read_text())
        bad = [n for n, m in fresh.items() if committed.get(n, {}).get("sha256") != m["sha256"]]
        sys.exit(f"differ from the committed files: {', '.join(bad)}" if bad else None)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() and args.only else {}
    manifest |= make_fixtures(args.bin, FIXTURES, presets)
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    if args.demo:
        make_demo(args.bin)


if __name__ == "__main__":
    main()
