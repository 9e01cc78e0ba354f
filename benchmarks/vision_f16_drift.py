"""How far the vision path can drift between two correct implementations, measured without a GPU.

tests/test_vision_model_cuda.py compares the CUDA vision path with numpy_ref. The reference sums in float64, the
kernels in fp32, and both round activations to f16 before every f16-weight matmul and around the GELU table. An
fp32-level difference that moves a value across an f16 rounding boundary becomes a whole f16 step (~2^-11
relative), and each further rounding stage turns a difference d into about sqrt(d * 2^-11): after a few layers the
two paths differ at the f16 noise level, which the random-weight text model then amplifies in the logits.

This script runs the reference twice, as is and with fp32 sums (the same roundings, CUDA's accumulation width), on
the test's cases and prints the relative differences it must tolerate. Run: python3 benchmarks/vision_f16_drift.py
Measured (2026-11-30, this CPU): tiny f32 emb 1.2e-4 logits 1.5e-4 steps 1.6e-4; tiny f16 emb 3.9e-4 logits
3.6e-4 steps 1.26e-3; small f16 emb 5.2e-4 logits 3.0e-3 steps 3.0e-3 (the H200 run: 1.26e-3 and 3.3e-3)."""
import pathlib
import tempfile

import numpy as np

from llamacmp.backends.numpy_ref import NumpyBackend, RefQ8
from llamacmp.fixtures.mmproj_writer import VISION_SHAPES, write_mmproj, write_text_model
from llamacmp.fixtures.vision_path import VISION_PATH_CASES, random_png, run_vision_path


class Fp32SumNumpy(NumpyBackend):
    """The reference's roundings (f16 activations for f16 weights, the GELU table) with float32 sums, as the
    kernels accumulate: a second correct implementation, to measure how far two of them may drift apart."""

    def matmuls(self, x, ws):
        outs = []
        for w in ws:
            if isinstance(w, RefQ8):
                outs.append(super().matmuls(x, [w])[0])
                continue
            xx = x.astype(np.float16).astype(np.float32) if w.dtype == np.float16 else x.astype(np.float32)
            outs.append(xx @ w.T.astype(np.float32))       # x [T, n] @ w^T [n, rows] -> [T, rows], fp32 sums
        return outs

    def layernorm(self, x, w, b, eps):                     # x [T, D], w, b [D]
        c = x - x.mean(axis=-1, keepdims=True, dtype=np.float32)
        n = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + np.float32(eps))
        return (n * w + b).astype(np.float32)

    def attention_full(self, q, k, v, n_heads, head_dim, scale):   # q, k, v [T, H*Dh]
        T = len(q)
        qh, kh, vh = (a.reshape(T, n_heads, head_dim).astype(np.float32) for a in (q, k, v))
        s = np.einsum("thd,shd->hts", qh, kh) * np.float32(scale)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return np.einsum("hts,shd->thd", p, vh).reshape(T, n_heads * head_dim).astype(np.float32)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> None:
    for shape, dtype, size in VISION_PATH_CASES:
        tmp = pathlib.Path(tempfile.mkdtemp())
        text = write_text_model(tmp / "text.gguf", shape, "f32", 9)
        mm = write_mmproj(tmp / "mm.gguf", VISION_SHAPES[shape], dtype, 9)
        image = random_png(*size, seed=size[0])
        e0, l0, s0, _ = run_vision_path(NumpyBackend(), text, mm, image)
        e1, l1, s1, _ = run_vision_path(Fp32SumNumpy(), text, mm, image)
        print(f"{shape} {dtype} {size}: emb {rel(e1, e0):.2e}  logits {rel(l1, l0):.2e}  "
              f"steps max {max(rel(a, b) for (_, a), (_, b) in zip(s1, s0)):.2e}", flush=True)


if __name__ == "__main__":
    main()
