"""Random weights of a model's shape (`--load-format dummy`, as in vLLM).

For performance work where the values do not matter: a step's time depends on shapes, not
on weights, so a benchmark can run an 8B-shaped model from its config.json alone, on a
machine the real weights cannot reach. Generated on the target device, in the target
dtype, so an 8B model costs no host memory and no host-to-device copy.
"""

from __future__ import annotations

import torch
from llmservice.server.model.config import ModelConfig


def dummy_weights(
    config: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu", seed: int = 0
) -> dict[str, torch.Tensor]:
    """HF Llama-named weights: N(0, 0.02) matrices (the usual init scale), unit norms."""
    h, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    w = {"model.embed_tokens.weight": rnd(config.vocab_size, h), "model.norm.weight": ones(h)}
    if not config.tie_word_embeddings:
        w["lm_head.weight"] = rnd(config.vocab_size, h)
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        w |= {
            p + "self_attn.q_proj.weight": rnd(q, h),
            p + "self_attn.k_proj.weight": rnd(kv, h),
            p + "self_attn.v_proj.weight": rnd(kv, h),
            p + "self_attn.o_proj.weight": rnd(h, q),
            p + "mlp.gate_proj.weight": rnd(inter, h),
            p + "mlp.up_proj.weight": rnd(inter, h),
            p + "mlp.down_proj.weight": rnd(h, inter),
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        }
        if config.attention_bias:
            w |= {p + f"self_attn.{x}_proj.bias": torch.zeros(d, dtype=dtype, device=device)
                  for x, d in (("q", q), ("k", kv), ("v", kv))}  # fmt: skip
        if config.qk_norm:
            w |= {p + f"self_attn.{x}_norm.weight": ones(config.head_dim) for x in "qk"}
    return w
