"""ModelConfig: the hyperparameters of a `qwen35` GGUF, read from its `qwen35.*` keys and validated once.

Dimension letters used across the project (DESIGN.md §4):
  T tokens in a batch, D hidden, Hq/Hk attention heads, Dh attention head dim, F ffn,
  K / V GDN key / value heads, Dk / Dv their dims, C = conv channels = 2*K*Dk + V*Dv.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A GGUF's metadata does not describe a model we can run; the message names the key."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    n_layer: int
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

    def is_attention(self, il: int) -> bool:
        return (il + 1) % self.full_attention_interval == 0

    @classmethod
    def from_metadata(cls, kv: dict, n_vocab: int, tied: bool) -> "ModelConfig":
        """Build from GGUF key/values (already decoded to Python values)."""
        arch = kv.get("general.architecture")
        p = f"{arch}."

        def need(key: str):
            if p + key not in kv:
                raise ConfigError(f"GGUF is missing required key '{p + key}'")
            return kv[p + key]

        head_dim = int(need("attention.key_length"))
        if int(kv.get(p + "attention.value_length", head_dim)) != head_dim:
            raise ConfigError(f"'{p}attention.value_length' differs from key_length: not supported")
        ssm_state = int(need("ssm.state_size"))
        v_heads = int(need("ssm.time_step_rank"))
        inner = int(need("ssm.inner_size"))
        if inner != v_heads * ssm_state:
            raise ConfigError(f"'{p}ssm.inner_size' {inner} != time_step_rank*state_size {v_heads * ssm_state}")
        sections = kv.get(p + "rope.dimension_sections", (0, 0, 0, 0))
        return cls(
            n_layer=int(need("block_count")),
            n_embd=int(need("embedding_length")),
            n_ff=int(need("feed_forward_length")),
            n_head=int(need("attention.head_count")),
            n_head_kv=int(need("attention.head_count_kv")),
            head_dim=head_dim,
            n_vocab=n_vocab,
            n_ctx_train=int(kv.get(p + "context_length", 262144)),
            rms_eps=float(need("attention.layer_norm_rms_epsilon")),
            rope_base=float(kv.get(p + "rope.freq_base", 10000.0)),
            n_rot=int(kv.get(p + "rope.dimension_count", head_dim)),
            rope_sections=tuple(int(s) for s in sections),
            conv_kernel=int(need("ssm.conv_kernel")),
            ssm_k_heads=int(need("ssm.group_count")),
            ssm_v_heads=v_heads,
            ssm_head_dim=ssm_state,
            full_attention_interval=int(kv.get(p + "full_attention_interval", 4)),
            tied_embeddings=tied,
            architecture=str(arch),
            name=str(kv.get("general.name", "")),
        )
