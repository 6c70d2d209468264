"""Small random mixture-of-experts models saved by transformers (fp32), with the tiny
tokenizer of hub_endpoint: Mixtral (top-2 of 4, always renormalised), Qwen3-MoE (top-2
of 8, norm_topk_prob, q/k norms, one dense-MLP layer via mlp_only_layers) and Qwen2-MoE
(top-2 of 4 without renormalising, a sigmoid-gated shared expert, q/k/v biases).

Shapes split evenly over two tensor-parallel ranks (heads, KV heads, expert columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.hub_endpoint import save_tiny_model

MOE_SPECS: dict[str, dict[str, Any]] = {
    "mixtral": dict(cls="MixtralForCausalLM", config="MixtralConfig", num_local_experts=4,
                    num_experts_per_tok=2, intermediate_size=96, sliding_window=None,
                    tie_word_embeddings=False, rope_theta=1000000.0, bos_token_id=1, eos_token_id=2),
    "qwen3_moe": dict(cls="Qwen3MoeForCausalLM", config="Qwen3MoeConfig", num_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
                      mlp_only_layers=[1], head_dim=32, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=2, rope_theta=1000000.0),
    "qwen2_moe": dict(cls="Qwen2MoeForCausalLM", config="Qwen2MoeConfig", num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=False,
                      shared_expert_intermediate_size=96, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=2, rope_theta=1000000.0),
}  # fmt: skip

# Qwen3-30B-A3B's published config.json (the numbers that matter for sizing)
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "tie_word_embeddings": False,
}  # fmt: skip


def moe_models(root: Path) -> dict[str, Path]:
    """Every MoE model's folder under `root` (built once; reused when already there)."""
    out = {}
    for i, (name, spec) in enumerate(MOE_SPECS.items()):
        out[name] = Path(root) / name
        if not (out[name] / "config.json").exists():
            save_tiny_model(out[name], spec, seed=20 + i)
    return out
