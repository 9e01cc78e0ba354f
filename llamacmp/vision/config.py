"""The mmproj GGUF (llama.cpp's multimodal projector file) parsed and validated into a typed config + weights.

Only projector `qwen3vl_merger` (Qwen3-VL / Qwen3.5 vision tower without deepstack) is supported. Keys and tensor
names are llama.cpp's (tools/mtmd/clip-impl.h); hyperparameter defaults as clip.cpp's load_hparams sets them for
this projector: spatial merge 2 unless `clip.vision.spatial_merge_size` says otherwise, and the image limits
8 .. 4096 merged tokens (min/max pixels = tokens * (patch * merge)^2)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..gguf_file import GGUFError, GGUFFile

SUPPORTED_PROJECTORS = ("qwen3vl_merger",)
# clip.cpp: hparams.set_limit_image_tokens(8, 4096) for the Qwen-VL projectors.
MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS = 8, 4096


class MmprojError(ValueError):
    """A missing, unreadable, mismatched or unsupported mmproj file; the message names the problem."""


@dataclass(frozen=True, slots=True)
class VisionConfig:
    projector: str
    n_embd: int                 # encoder width E
    n_ff: int
    n_head: int
    n_layer: int
    n_out: int                  # projection_dim: must equal the text model's hidden size
    patch_size: int
    merge: int                  # spatial merge (2: 2x2 patches -> one token)
    image_size: int             # the learned position table covers (image_size / patch_size)^2 patches
    eps: float
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    min_pixels: int
    max_pixels: int

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def align(self) -> int:
        """Resized images are multiples of this (patch * 2: clip.cpp aligns qwen3vl to patch_size * 2)."""
        return self.patch_size * 2


@dataclass(slots=True)
class VisionLayerWeights:
    ln1_w: np.ndarray; ln1_b: np.ndarray; qkv_w: np.ndarray; qkv_b: np.ndarray; o_w: np.ndarray; o_b: np.ndarray
    ln2_w: np.ndarray; ln2_b: np.ndarray; up_w: np.ndarray; up_b: np.ndarray; down_w: np.ndarray; down_b: np.ndarray


@dataclass(slots=True)
class VisionWeights:
    """Host arrays as the GGUF holds them: matrices [out, in] in float32 or float16 (F16 files stay f16)."""
    patch_w0: np.ndarray        # [E, 3*p*p] (conv kernel [E, 3, p, p] flattened c, ky, kx)
    patch_w1: np.ndarray        # the second temporal frame's kernel, same layout
    patch_b: np.ndarray         # [E]
    pos_embd: np.ndarray        # [n_side^2, E] float32
    layers: list[VisionLayerWeights] = field(default_factory=list)
    pre_ln: tuple[np.ndarray, np.ndarray] | None = None
    post_ln: tuple[np.ndarray, np.ndarray] | None = None
    mm0_w: np.ndarray | None = None
    mm0_b: np.ndarray | None = None
    mm2_w: np.ndarray | None = None
    mm2_b: np.ndarray | None = None


def load_mmproj(path: str | Path, text_hidden: int | None = None, min_tokens: int = 0,
                max_tokens: int = 0) -> tuple[VisionConfig, VisionWeights]:
    """Parse + validate an mmproj GGUF; `text_hidden` (the text model's embedding length) is checked against the
    projector's output width. min_tokens / max_tokens (> 0) replace the 8 / 4096 merged-token image limits, as
    llama.cpp's --image-min-tokens / --image-max-tokens do."""
    path = Path(path)
    if not path.exists():
        raise MmprojError(f"mmproj file not found: {path}")
    try:
        f = GGUFFile(path)
    except GGUFError as e:
        raise MmprojError(f"cannot read mmproj {path}: {e}") from e
    kv = f.metadata
    if kv.get("general.architecture") != "clip":
        raise MmprojError(f"{path} is not an mmproj file (general.architecture is "
                          f"{kv.get('general.architecture')!r}, expected 'clip'); pass it with -m, not --mmproj")
    proj = kv.get("clip.projector_type") or kv.get("clip.vision.projector_type")
    if proj not in SUPPORTED_PROJECTORS:
        raise MmprojError(f"{path}: projector type {proj!r} is not supported by llamacmp "
                          f"(supported: {', '.join(SUPPORTED_PROJECTORS)})")
    if not kv.get("clip.has_vision_encoder", False):
        raise MmprojError(f"{path}: the mmproj has no vision encoder (clip.has_vision_encoder is not set)")

    def need(key: str):
        if key not in kv:
            raise MmprojError(f"{path}: mmproj key '{key}' is missing")
        return kv[key]

    v = "clip.vision."
    n_embd, n_head = int(need(v + "embedding_length")), int(need(v + "attention.head_count"))
    patch, merge = int(need(v + "patch_size")), int(kv.get(v + "spatial_merge_size", 2))
    mean, std = list(need(v + "image_mean")), list(need(v + "image_std"))
    if len(mean) < 3 or len(std) < 3:
        raise MmprojError(f"{path}: image_mean / image_std need 3 values")
    if n_head <= 0 or n_embd % n_head or (n_embd // n_head) % 4:
        raise MmprojError(f"{path}: embedding_length {n_embd} / head_count {n_head} must give a head dim "
                          f"divisible by 4 (2-D rotary in four sections)")
    if merge != 2:
        raise MmprojError(f"{path}: spatial_merge_size {merge} is not supported (llama.cpp's qwen3vl graph "
                          f"merges 2x2 patches)")
    if any(kv.get(v + "is_deepstack_layers", []) or []):
        raise MmprojError(f"{path}: deepstack layers are not supported (Qwen3.5's projector has none)")
    area = patch * patch * merge * merge
    cfg = VisionConfig(
        projector=proj, n_embd=n_embd, n_ff=int(need(v + "feed_forward_length")), n_head=n_head,
        n_layer=int(need(v + "block_count")), n_out=int(need(v + "projection_dim")), patch_size=patch,
        merge=merge, image_size=int(need(v + "image_size")), eps=float(need(v + "attention.layer_norm_epsilon")),
        image_mean=tuple(float(x) for x in mean[:3]), image_std=tuple(float(x) for x in std[:3]),
        min_pixels=(min_tokens if min_tokens > 0 else MIN_IMAGE_TOKENS) * area,
        max_pixels=(max_tokens if max_tokens > 0 else MAX_IMAGE_TOKENS) * area)
    if cfg.min_pixels > cfg.max_pixels:
        raise MmprojError(f"--image-min-tokens {cfg.min_pixels // area} is above --image-max-tokens "
                          f"{cfg.max_pixels // area}")
    if text_hidden is not None and cfg.n_out != text_hidden:
        raise MmprojError(f"{path}: the projector outputs {cfg.n_out}-wide embeddings but the text model's hidden "
                          f"size is {text_hidden}: this mmproj belongs to another model")
    return cfg, _load_weights(f, cfg, path)


def _load_weights(f: GGUFFile, cfg: VisionConfig, path: Path) -> VisionWeights:
    E, p = cfg.n_embd, cfg.patch_size

    def get(name: str, shape: tuple[int, ...], required: bool = True):
        if not f.has(name):
            if required:
                raise MmprojError(f"{path}: tensor '{name}' is missing")
            return None
        info = f.info(name)
        if info.type_name not in ("F32", "F16"):
            raise MmprojError(f"{path}: tensor '{name}' is {info.type_name}; llamacmp loads F32 or F16 mmproj tensors")
        a = f.tensor(name)
        if tuple(a.shape) != shape:
            raise MmprojError(f"{path}: tensor '{name}' has shape {tuple(a.shape)}, expected {shape}")
        # F16 tensors come back widened; narrowing is exact, and keeps the backend's F16 matmul path.
        return a.astype(np.float16) if info.type_name == "F16" and len(shape) >= 2 else np.asarray(a, np.float32)

    n_side = int(round(np.sqrt(f.info("v.position_embd.weight").shape[0]))) if f.has("v.position_embd.weight") else 0
    w = VisionWeights(
        patch_w0=get("v.patch_embd.weight", (E, 3, p, p)).reshape(E, 3 * p * p),
        patch_w1=get("v.patch_embd.weight.1", (E, 3, p, p)).reshape(E, 3 * p * p),
        patch_b=get("v.patch_embd.bias", (E,)),
        pos_embd=np.asarray(get("v.position_embd.weight", (n_side * n_side, E)), np.float32))
    if n_side * n_side == 0:
        raise MmprojError(f"{path}: tensor 'v.position_embd.weight' is empty")
    for il in range(cfg.n_layer):
        b = f"v.blk.{il}."
        w.layers.append(VisionLayerWeights(
            get(b + "ln1.weight", (E,)), get(b + "ln1.bias", (E,)),
            get(b + "attn_qkv.weight", (3 * E, E)), get(b + "attn_qkv.bias", (3 * E,)),
            get(b + "attn_out.weight", (E, E)), get(b + "attn_out.bias", (E,)),
            get(b + "ln2.weight", (E,)), get(b + "ln2.bias", (E,)),
            get(b + "ffn_up.weight", (cfg.n_ff, E)), get(b + "ffn_up.bias", (cfg.n_ff,)),
            get(b + "ffn_down.weight", (E, cfg.n_ff)), get(b + "ffn_down.bias", (E,))))
    if f.has("v.pre_ln.weight"):
        w.pre_ln = (get("v.pre_ln.weight", (E,)), get("v.pre_ln.bias", (E,)))
    if f.has("v.post_ln.weight"):
        w.post_ln = (get("v.post_ln.weight", (E,)), get("v.post_ln.bias", (E,)))
    M = E * cfg.merge * cfg.merge
    w.mm0_w, w.mm0_b = get("mm.0.weight", (M, M)), get("mm.0.bias", (M,))
    w.mm2_w, w.mm2_b = get("mm.2.weight", (cfg.n_out, M)), get("mm.2.bias", (cfg.n_out,))
    return w
