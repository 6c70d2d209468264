"""The architecture description every loader produces and the model consumes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    architecture: str  # "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"
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
    # Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE); num_experts 0: a dense model
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's MLP width
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: one always-on expert, sigmoid-gated
    dense_mlp_layers: list[int] = field(default_factory=list)  # layers that keep a dense MLP

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        return self.is_moe and layer not in self.dense_mlp_layers

    def expert_params_per_layer(self) -> int:
        """Router, every expert (all stay resident) and the shared expert of one MoE layer."""
        h = self.hidden_size
        experts = self.num_experts * 3 * h * self.moe_intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size
        shared_gate = h if self.shared_expert_intermediate_size else 0
        return self.num_experts * h + experts + shared + shared_gate

    @property
    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 2 * h
        per_layer += (q + 2 * kv) * self.attention_bias + 2 * self.head_dim * self.qk_norm
        mlps = sum(
            self.expert_params_per_layer() if self.is_moe_layer(n) else 3 * h * i
            for n in range(self.num_layers)
        )
        head = 0 if self.tie_word_embeddings else v * h
        return self.num_layers * per_layer + mlps + v * h + head + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes
