"""The architecture description every loader produces and the model consumes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    architecture: str  # "llama", "mistral", "qwen2" or "qwen3"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    qk_norm: bool = False  # Qwen3: RMSNorm of each q and k head before RoPE
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""
    # generation_config.json's sampling defaults (temperature, top_p, top_k) for requests
    # that leave them unset
    sampling_defaults: dict[str, float] = field(default_factory=dict)

    @property
    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        per_layer += (q + 2 * kv) * self.attention_bias + 2 * self.head_dim * self.qk_norm
        head = 0 if self.tie_word_embeddings else v * h
        return self.num_layers * per_layer + v * h + head + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes
