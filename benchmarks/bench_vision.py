"""Vision encoder time per image on the CUDA backend, beside llama.cpp's llama-mtmd-cli on the same mmproj.

Part 1 (always, GPU): the qwen3vl_merger tower (llama.cpp tools/mtmd/models/qwen3vl.cpp) run op by op on the CUDA
backend at the real Qwen3-VL / Qwen3.5 vision size -- 27 blocks of width 1152, 16 heads of 72, FFN 4304, patch 16,
2x2 merge, merger MLP 4608 -> 4608 -> --out-dim -- with random f16 weights (distinct device copies per layer, so
nothing is served from L2 that a real model would read from memory). Per image size: the median ms of --reps whole
forwards (device events, no host sync between ops), the FLOP count and the FP32 rate that implies, and one extra
forward timed op by op (a sync per op, so the sum is a little above the whole) for the breakdown by op kind.
This is the encoder's compute only: the image is already patches on the device (preprocessing and upload are
host work, timed by the CLI / server).

Part 2 (with --full): the project's own encoder (llamacmp.vision.encoder.VisionEncoder.encode, as the CLI and
server run it, host-side patchify / position-table resize / round trips included) on a random-weight mmproj of the
same real size written by llamacmp.fixtures.mmproj_writer (f16 matrices, as llama.cpp's converter writes them;
projection to --full-out, 64 by default so that the paired text fixture is the tiny one), on a random normalised
image of each size: median wall ms of --reps encodes after a warm-up. The files go to --workdir (kept).

Part 3 (with --lcpp-bin; the mmproj and text model of --full unless --mmproj / --model name others):
llama.cpp's llama-mtmd-cli on that mmproj and text model, one process per image size, the image given
--lcpp-images times (the first encode warms cuBLAS / kernels up); its "image slice encoded in N ms" lines are
parsed and the median of all but the first reported. The images are
written here as PNGs (noise) of exactly the benchmark sizes; 448 and 1024 are multiples of patch*merge = 32, so
llama.cpp's preprocessing does not resize them (its qwen3vl limit is 8..4096 merged tokens; 1024x1024 is 1024).

    python3 benchmarks/bench_vision.py [--sizes 448 1024] [--reps 3] [--layers 27] [--full --workdir DIR]
        [--lcpp-bin /tmp/lcpp/native/bin [--mmproj MMPROJ.gguf --model TEXT.gguf]] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import struct
import subprocess
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TowerDims:
    layers: int = 27
    width: int = 1152          # E
    heads: int = 16            # H (head dim E/H = 72)
    ffn: int = 4304
    patch: int = 16
    merge: int = 2
    out_dim: int = 4096        # the text model's hidden size (Qwen3.5-9B 4096, 27B 5120)
    eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


def flops(d: TowerDims, P: int) -> dict[str, float]:
    """Multiply-adds x 2 of one forward over P patches: {"matmul": projections, "attention": q k^T and p v}
    (element-wise ops excluded)."""
    E, F = d.width, d.ffn
    patch_in = 3 * d.patch * d.patch
    merger = 2 * (P // 4) * (4 * E * 4 * E + 4 * E * d.out_dim)
    return {"matmul": 2 * 2 * P * patch_in * E + d.layers * 2 * P * E * (3 * E + E + 2 * F) + merger,
            "attention": d.layers * 4 * P * P * E}


class Tower:
    """Random f16 weights of the tower on the device (one host array per shape, uploaded to distinct copies)."""

    def __init__(self, be, d: TowerDims, seed: int = 0):
        self.be, self.d = be, d
        rng = np.random.default_rng(seed)
        E, F, pin = d.width, d.ffn, 3 * d.patch * d.patch
        host: dict[tuple[int, int], np.ndarray] = {}

        def mat(rows, cols):
            if (rows, cols) not in host:
                host[(rows, cols)] = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)
            return be.upload_matrix(host[(rows, cols)])

        def vec(n, scale=0.02, offset=0.0):
            return be.upload_vector((offset + scale * rng.standard_normal(n)).astype(np.float32))

        self.patch_w = [mat(E, pin), mat(E, pin)]   # patch_embeddings_0 / _1 (the two temporal frames of one image)
        self.patch_b = vec(E)
        self.layers = []
        for _ in range(d.layers):
            self.layers.append(dict(
                ln1_w=vec(E, offset=1.0), ln1_b=vec(E), q=mat(E, E), k=mat(E, E), v=mat(E, E), q_b=vec(E),
                k_b=vec(E), v_b=vec(E), o=mat(E, E), o_b=vec(E), ln2_w=vec(E, offset=1.0), ln2_b=vec(E),
                up=mat(F, E), up_b=vec(F), down=mat(E, F), down_b=vec(E)))
        self.post_w, self.post_b = vec(E, offset=1.0), vec(E)
        self.mm0, self.mm0_b = mat(4 * E, 4 * E), vec(4 * E)
        self.mm1, self.mm1_b = mat(d.out_dim, 4 * E), vec(d.out_dim)

    def inputs(self, side: int, seed: int = 1):
        """Patches [P, 3*16*16] (merge-ordered, as the encoder holds them), pos embedding [P, E], rotary
        positions [P, 4] int32 (row y, column x, y, x) for a side x side image, all on the device."""
        d, be = self.d, self.be
        n = side // d.patch
        P = n * n
        rng = np.random.default_rng(seed)
        patches = be.from_host(rng.uniform(-1, 1, (P, 3 * d.patch * d.patch)).astype(np.float32))
        pos_emb = be.from_host((0.02 * rng.standard_normal((P, d.width))).astype(np.float32))
        ys, xs = np.divmod(np.arange(P), n)
        pos = be.from_host(np.stack([ys, xs, ys, xs], axis=1).astype(np.int32))   # uploaded once per image
        return patches, pos_emb, pos

    def forward(self, patches, pos_emb, pos, op_timer=None):
        """qwen3vl.cpp's graph on the backend ops. op_timer(kind, fn) -> fn() wraps each op for the breakdown."""
        be, d = self.be, self.d
        E, H, Dh = d.width, d.heads, d.head_dim
        t = op_timer or (lambda kind, fn: fn())
        p0, p1 = t("matmul", lambda: be.matmuls(patches, self.patch_w))
        x = t("add", lambda: be.add(p0, p1))
        x = t("bias", lambda: be.bias_add(x, self.patch_b))
        x = t("add", lambda: be.add(x, pos_emb))
        sections = (Dh // 4,) * 4
        for L in self.layers:
            h = t("layernorm", lambda: be.layernorm(x, L["ln1_w"], L["ln1_b"], d.eps))
            q, k, v = t("matmul", lambda: be.matmuls(h, [L["q"], L["k"], L["v"]]))
            q = t("bias", lambda: be.bias_add(q, L["q_b"]))
            k = t("bias", lambda: be.bias_add(k, L["k_b"]))
            v = t("bias", lambda: be.bias_add(v, L["v_b"]))
            q = t("rope", lambda: be.rope_vision(q, pos, H, Dh, sections, d.rope_theta))
            k = t("rope", lambda: be.rope_vision(k, pos, H, Dh, sections, d.rope_theta))
            a = t("attention", lambda: be.attention_full(q, k, v, H, Dh, 1.0 / np.sqrt(Dh)))
            a = t("matmul", lambda: be.matmuls(a, [L["o"]])[0])
            a = t("bias", lambda: be.bias_add(a, L["o_b"]))
            x = t("add", lambda: be.add(x, a))
            h = t("layernorm", lambda: be.layernorm(x, L["ln2_w"], L["ln2_b"], d.eps))
            h = t("matmul", lambda: be.matmuls(h, [L["up"]])[0])
            h = t("bias", lambda: be.bias_add(h, L["up_b"]))
            h = t("gelu", lambda: be.gelu(h))
            h = t("matmul", lambda: be.matmuls(h, [L["down"]])[0])
            h = t("bias", lambda: be.bias_add(h, L["down_b"]))
            x = t("add", lambda: be.add(x, h))
        x = t("layernorm", lambda: be.layernorm(x, self.post_w, self.post_b, d.eps))
        P = x.shape[0]
        x.shape = (P // 4, 4 * E)              # row-major: 4 consecutive (merge-ordered) patches per token
        h = t("matmul", lambda: be.matmuls(x, [self.mm0])[0])
        h = t("bias", lambda: be.bias_add(h, self.mm0_b))
        h = t("gelu", lambda: be.gelu(h))
        h = t("matmul", lambda: be.matmuls(h, [self.mm1])[0])
        return t("bias", lambda: be.bias_add(h, self.mm1_b))


def bench_ours(be, tower: Tower, side: int, reps: int) -> dict:
    patches, pos_emb, pos = tower.inputs(side)
    P = patches.shape[0]
    tower.forward(patches, pos_emb, pos)              # warm-up (and the arena's first allocations)
    be.synchronize()
    samples = []
    for _ in range(reps):
        be.native.cmp_timer_start()
        out = tower.forward(patches, pos_emb, pos)
        samples.append(be.native.timer_stop())
    ok = bool(np.isfinite(be.to_host(out)).all())
    by_kind: dict[str, float] = {}

    def op_timer(kind, fn):
        be.native.cmp_timer_start()
        r = fn()
        by_kind[kind] = by_kind.get(kind, 0.0) + be.native.timer_stop()
        return r

    tower.forward(patches, pos_emb, pos, op_timer)
    ms = statistics.median(samples)
    fl = flops(tower.d, P)
    total = sum(fl.values())
    rates = {k: fl[k] / by_kind[k] / 1e9 for k in fl if by_kind.get(k)}     # TFLOP/s of each kind, op by op
    return {"side": side, "patches": P, "tokens": P // 4, "ms": ms, "ms_all": samples, "gflop": total / 1e9,
            "tflops": total / ms / 1e9, "finite": ok, "breakdown_ms": by_kind, "kind_tflops": rates}


# -- the project's encoder on a real-size random mmproj --------------------------------------------------------------

def write_fixture(workdir: Path, layers: int, n_out: int) -> tuple[Path, Path]:
    """A real-size f16 qwen3vl_merger mmproj (projection to n_out) and the qwen35 text fixture it pairs with."""
    from dataclasses import replace

    from llamacmp.fixtures import writer
    from llamacmp.fixtures.mmproj_writer import VisionShape, vision_vocab, write_mmproj
    d = TowerDims()
    shape = VisionShape(n_embd=d.width, n_ff=d.ffn, n_head=d.heads, n_layer=layers, n_out=n_out, n_pos_side=48)
    mmproj, text = workdir / f"mmproj-real-{layers}l-{n_out}.gguf", workdir / f"text-tiny-{n_out}.gguf"
    if not mmproj.exists():
        write_mmproj(mmproj, shape, "f16", name="llamacmp-bench-mmproj-real-size")
    if not text.exists():
        writer.write_model(text, replace(writer.SHAPES["tiny"], n_embd=n_out), "f32", vision_vocab(), 0,
                           name="llamacmp-bench-vl-text")
    return mmproj, text


def bench_full(be, mmproj: Path, sides: list[int], reps: int) -> list[dict]:
    from llamacmp.vision.config import load_mmproj
    from llamacmp.vision.encoder import VisionEncoder
    from llamacmp.vision.preprocess import PreparedImage
    t0 = time.perf_counter()
    cfg, weights = load_mmproj(mmproj)
    enc = VisionEncoder(cfg, weights, be)
    be.synchronize()
    print(f"# llamacmp VisionEncoder on {mmproj.name} (loaded + uploaded in {time.perf_counter() - t0:.1f} s)")
    out = []
    for side in sides:
        img = PreparedImage(np.random.default_rng(side).uniform(-1, 1, (side, side, 3)).astype(np.float32),
                            f"bench-{side}")
        enc.encode(img)                                   # warm-up
        samples = []
        for _ in range(reps):
            t = time.perf_counter()
            emb = enc.encode(img)                         # ends with a device -> host copy: synchronous
            samples.append((time.perf_counter() - t) * 1e3)
        r = {"side": side, "tokens": emb.n_tokens, "ms": statistics.median(samples), "ms_all": samples,
             "finite": bool(np.isfinite(emb.embeddings).all())}
        out.append(r)
        print(f"{side:>5}x{side:<4} llamacmp encode {r['ms']:.1f} ms/image ({r['tokens']} tokens)"
              f"{'' if r['finite'] else '  NON-FINITE OUTPUT'}")
    return out


# -- llama.cpp ------------------------------------------------------------------------------------------------------

def write_png(path: Path, rgb: np.ndarray) -> None:
    """rgb [H, W, 3] uint8 -> an 8-bit RGB PNG (filter 0 rows, one zlib stream; no imaging library needed)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


ENCODED = re.compile(r"image slice encoded in (\d+(?:\.\d+)?) ms")


def bench_llamacpp(bin_dir: Path, model: Path, mmproj: Path, side: int, n_images: int, workdir: Path) -> dict:
    img = workdir / f"noise_{side}.png"
    write_png(img, np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8))
    n_tok = (side // 32) ** 2
    cmd = [str(bin_dir / "llama-mtmd-cli"), "-m", str(model), "--mmproj", str(mmproj), "-ngl", "99",
           "-c", str(n_images * n_tok + 256), "-n", "1", "--temp", "0", "-p", "describe",
           *sum((["--image", str(img)] for _ in range(n_images)), [])]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        rc, log = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = "timeout (300 s)", f"{e.stdout or ''}{e.stderr or ''}"
        log = log.decode(errors="replace") if isinstance(log, bytes) else log
    wall = time.perf_counter() - t0
    times = [float(m) for m in ENCODED.findall(log)]
    res = {"side": side, "cmd": " ".join(cmd), "rc": rc, "encoded_ms": times, "wall_s": wall}
    if times:
        res["ms"] = statistics.median(times[1:] or times)
    else:
        res["log_tail"] = log[-3000:]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[448, 1024], help="square image sides (multiples of 32)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=TowerDims.layers)
    ap.add_argument("--out-dim", type=int, default=TowerDims.out_dim, help="merger output (the text hidden size)")
    ap.add_argument("--lcpp-bin", type=Path, help="folder with llama.cpp's llama-mtmd-cli (a CUDA build)")
    ap.add_argument("--mmproj", type=Path, help="mmproj GGUF for llama-mtmd-cli")
    ap.add_argument("--model", type=Path, help="text model GGUF for llama-mtmd-cli (n_embd = the mmproj's output)")
    ap.add_argument("--lcpp-images", type=int, default=3, help="images per llama-mtmd-cli run (first one warms up)")
    ap.add_argument("--full", action="store_true", help="also time llamacmp's VisionEncoder on a written mmproj")
    ap.add_argument("--full-out", type=int, default=64, help="the written mmproj's projection (text hidden) size")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/llamacmp-bench-vision"),
                    help="where --full writes (and reuses) the mmproj and text fixture")
    ap.add_argument("--skip-ours", action="store_true", help="skip part 1 (the op-level tower)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    for s in args.sizes:
        if s % 32:
            ap.error(f"--sizes: {s} is not a multiple of patch*merge = 32")

    report: dict = {"ours": [], "full": [], "llama.cpp": []}

    def save() -> None:         # after every part, so that a run cut short keeps what it measured
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))

    be = None
    if not args.skip_ours or args.full:
        from llamacmp.backends.cuda import CudaBackend
        be = CudaBackend()
    if not args.skip_ours:
        d = TowerDims(layers=args.layers, out_dim=args.out_dim)
        t0 = time.perf_counter()
        tower = Tower(be, d)
        be.synchronize()
        print(f"# {be.native.device_name()}: tower {d.layers} x {d.width} (heads {d.heads}x{d.head_dim}, ffn {d.ffn}), "
              f"merger -> {d.out_dim}, f16 weights; uploaded in {time.perf_counter() - t0:.1f} s")
        print(f"{'image':>10} {'patches':>7} {'tokens':>6} {'ms/image':>9} {'GFLOP':>8} {'TFLOP/s':>7}  "
              "breakdown (ms, op by op)")
        for side in args.sizes:
            r = bench_ours(be, tower, side, args.reps)
            report["ours"].append(r)
            bd = ", ".join(f"{k} {v:.1f}" + (f" ({r['kind_tflops'][k]:.1f} TFLOP/s)" if k in r["kind_tflops"] else "")
                           for k, v in sorted(r["breakdown_ms"].items(), key=lambda kv: -kv[1]))
            print(f"{side:>5}x{side:<4} {r['patches']:>7} {r['tokens']:>6} {r['ms']:>9.1f} {r['gflop']:>8.0f} "
                  f"{r['tflops']:>7.2f}  {bd}{'' if r['finite'] else '  NON-FINITE OUTPUT'}")
            save()

    if args.full or (args.lcpp_bin and not (args.mmproj and args.model)):
        args.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        mmproj, text = write_fixture(args.workdir, args.layers, args.full_out)
        print(f"# fixture files in {args.workdir} ({time.perf_counter() - t0:.1f} s)")
        args.mmproj, args.model = args.mmproj or mmproj, args.model or text
        if args.full:
            try:        # one device run has to give every part it can: report a failure and go on to llama.cpp
                report["full"] = bench_full(be, args.mmproj, args.sizes, args.reps)
            except Exception:
                report["full_error"] = traceback.format_exc()
                print(f"# llamacmp VisionEncoder FAILED:\n{report['full_error']}")
            save()
    if args.lcpp_bin:
        print(f"# llama.cpp {args.lcpp_bin / 'llama-mtmd-cli'} on {args.mmproj.name} + {args.model.name}")
        with tempfile.TemporaryDirectory() as tmp:
            for side in args.sizes:
                r = bench_llamacpp(args.lcpp_bin, args.model, args.mmproj, side, args.lcpp_images, Path(tmp))
                report["llama.cpp"].append(r)
                save()
                if "ms" in r:
                    print(f"{side:>5}x{side:<4} llama.cpp {r['ms']:.1f} ms/image (encodes {r['encoded_ms']})")
                else:
                    print(f"{side:>5}x{side:<4} llama.cpp: no 'image slice encoded' line (rc {r['rc']}):\n"
                          f"{r['log_tail']}")
    save()


if __name__ == "__main__":
    main()
