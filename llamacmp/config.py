"""ModelConfig: the hyperparameters of a `qwen35` GGUF, read from its `qwen35.*` keys and validated once.

Dimension letters used across the project (DESIGN.md §4):
  T tokens in a batch, D hidden, Hq/Hk attention heads, Dh attention head dim, F ffn,
  K / V GDN key / value heads, Dk / Dv their dims, C = conv channels = 2*K*Dk + V*Dv.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A GGUF's metadata does not describe a model we can run; the message names the key."""


def uint32(key: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"'{key}' must be an integer, got {type(v).__name__} {v!r:.40}")
    if not 0 <= v < 2**32:
        raise ConfigError(f"'{key}' = {v} is out of range for an unsigned 32-bit integer")
    return v


@dataclass(frozen=True, slots=True)
class ModelConfig:
    n_layer: int                # main layers (block_count minus the MTP layers)
    n_embd: int                 # D
    n_ff: int                   # F
    n_head: int                 # Hq
    n_head_kv: int              # Hk
    head_dim: int               # Dh
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    n_rot: int                  # rotated dims per attention head (first n_rot of Dh)
    rope_sections: tuple[int, ...]
    conv_kernel: int
    ssm_k_heads: int            # K
    ssm_v_heads: int            # V
    ssm_head_dim: int           # Dk = Dv
    full_attention_interval: int
    tied_embeddings: bool = False
    # MTP (multi-token prediction) layers stored after the main ones (qwen35.nextn_predict_layers): the GGUF's
    # block_count is n_layer + n_nextn and the MTP block is blk.{n_layer} (llama.cpp 0c1e570 llama-model.cpp reads
    # the key into n_layer_nextn; qwen35.cpp's graph_mtp asserts n_layer_nextn == 1 and runs layers[n_layer()]).
    n_nextn: int = 0
    architecture: str = "qwen35"
    name: str = ""
    attn_layers: tuple[int, ...] = field(init=False)
    gdn_layers: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        positive = ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_vocab",
                    "conv_kernel", "ssm_k_heads", "ssm_v_heads", "ssm_head_dim", "full_attention_interval")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        if self.n_head % self.n_head_kv:
            raise ConfigError(f"attention.head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        if self.ssm_v_heads % self.ssm_k_heads:
            raise ConfigError(f"ssm.time_step_rank {self.ssm_v_heads} is not a multiple of ssm.group_count {self.ssm_k_heads}")
        if not (0 < self.n_rot <= self.head_dim and self.n_rot % 2 == 0):
            raise ConfigError(f"rope.dimension_count {self.n_rot} must be even and within head dim {self.head_dim}")
        if not self.rms_eps > 0:
            raise ConfigError(f"attention.layer_norm_rms_epsilon must be positive, got {self.rms_eps}")
        if not self.rope_base > 0:
            raise ConfigError(f"rope.freq_base must be positive, got {self.rope_base}")
        if self.n_nextn not in (0, 1):
            raise ConfigError(f"nextn_predict_layers {self.n_nextn} is not supported (a qwen35 model has at most one "
                              "MTP layer, as in llama.cpp)")
        if self.n_ctx_train <= 0:
            raise ConfigError(f"context_length must be positive, got {self.n_ctx_train}")
        # Layer il is full attention iff (il + 1) % interval == 0 (llama.cpp's rule); the rest are GDN.
        is_attn = [(il + 1) % self.full_attention_interval == 0 for il in range(self.n_layer)]
        object.__setattr__(self, "attn_layers", tuple(i for i, a in enumerate(is_attn) if a))
        object.__setattr__(self, "gdn_layers", tuple(i for i, a in enumerate(is_attn) if not a))

    # Derived sizes, named once so that kernels, caches and the arena planner agree.
    @property
    def conv_channels(self) -> int:       # C
        return 2 * self.ssm_k_heads * self.ssm_head_dim + self.ssm_v_heads * self.ssm_head_dim

    @property
    def ssm_inner(self) -> int:           # V * Dv
        return self.ssm_v_heads * self.ssm_head_dim

    @property
    def block_count(self) -> int:        # the GGUF's block_count: main layers + MTP layers
        return self.n_layer + self.n_nextn

    def is_attention(self, il: int) -> bool:
        return (il + 1) % self.full_attention_interval == 0

    @classmethod
    def from_metadata(cls, kv: dict, n_vocab: int, tied: bool) -> "ModelConfig":
        """Build from GGUF key/values (already decoded to Python values)."""
        arch = kv.get("general.architecture")
        p = f"{arch}."

        def need(key: str, default=None):
            if p + key not in kv and default is None:
                raise ConfigError(f"GGUF is missing required key '{p + key}'")
            return kv.get(p + key, default)

        def u32(key: str, default: int | None = None) -> int:
            """An unsigned 32-bit integer key, as llama.cpp's typed getter reads it: "8", 8.5 or true are not."""
            return uint32(p + key, need(key, default))

        def real(key: str, default: float | None = None) -> float:
            v = need(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"'{p + key}' must be a finite number, got {v!r:.40}")
            return float(v)

        head_dim = u32("attention.key_length")
        if u32("attention.value_length", head_dim) != head_dim:
            raise ConfigError(f"'{p}attention.value_length' differs from key_length: not supported")
        ssm_state = u32("ssm.state_size")
        v_heads = u32("ssm.time_step_rank")
        inner = u32("ssm.inner_size")
        if inner != v_heads * ssm_state:
            raise ConfigError(f"'{p}ssm.inner_size' {inner} != time_step_rank*state_size {v_heads * ssm_state}")
        sections = need("rope.dimension_sections", [0, 0, 0, 0])
        if not isinstance(sections, (list, tuple)) or len(sections) > 4:
            raise ConfigError(f"'{p}rope.dimension_sections' must be an array of at most 4 integers")
        name = kv.get("general.name", "")
        n_nextn = u32("nextn_predict_layers", 0)
        if n_nextn >= u32("block_count"):
            raise ConfigError(f"'{p}nextn_predict_layers' {n_nextn} leaves no main layers of "
                              f"block_count {u32('block_count')}")
        return cls(
            n_layer=u32("block_count") - n_nextn,
            n_nextn=n_nextn,
            n_embd=u32("embedding_length"),
            n_ff=u32("feed_forward_length"),
            n_head=u32("attention.head_count"),
            n_head_kv=u32("attention.head_count_kv"),
            head_dim=head_dim,
            n_vocab=n_vocab,
            n_ctx_train=u32("context_length", 262144),
            rms_eps=real("attention.layer_norm_rms_epsilon"),
            rope_base=real("rope.freq_base", 10000.0),
            n_rot=u32("rope.dimension_count", head_dim),
            rope_sections=tuple(uint32(f"{p}rope.dimension_sections", s) for s in sections),
            conv_kernel=u32("ssm.conv_kernel"),
            ssm_k_heads=u32("ssm.group_count"),
            ssm_v_heads=v_heads,
            ssm_head_dim=ssm_state,
            full_attention_interval=u32("full_attention_interval", 4),
            tied_embeddings=tied,
            architecture=str(arch),
            name=name if isinstance(name, str) else "",
        )
