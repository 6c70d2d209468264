"""Random weights of a model's shape (`--load-format dummy`, as in vLLM).

For performance work where the values do not matter: a step's time depends on shapes, not
on weights, so a benchmark can run an 8B-shaped model from its config.json alone, on a
machine the real weights cannot reach. Generated on the target device, in the target
dtype, so an 8B model costs no host memory and no host-to-device copy.
"""

from __future__ import annotations

import torch
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.moe import NAMES


def dummy_weights(
    config: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu", seed: int = 0
) -> dict[str, torch.Tensor]:
    """HF-named weights: N(0, 0.02) matrices (the usual init scale), unit norms; a
    mixture-of-experts layer gets its family's router and expert names instead of mlp.*."""
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
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        }
        w |= _moe_weights(config, p, rnd) if config.is_moe_layer(n) else {
            p + "mlp.gate_proj.weight": rnd(inter, h),
            p + "mlp.up_proj.weight": rnd(inter, h),
            p + "mlp.down_proj.weight": rnd(h, inter),
        }
        if config.attention_bias:
            w |= {p + f"self_attn.{x}_proj.bias": torch.zeros(d, dtype=dtype, device=device)
                  for x, d in (("q", q), ("k", kv), ("v", kv))}  # fmt: skip
        if config.qk_norm:
            w |= {p + f"self_attn.{x}_norm.weight": ones(config.head_dim) for x in "qk"}
    return w


def _moe_weights(config: ModelConfig, prefix: str, rnd) -> dict[str, torch.Tensor]:
    """One MoE layer's router, experts and shared expert, under its family's names."""
    names, h, inter = NAMES[config.architecture], config.hidden_size, config.moe_intermediate_size
    w = {prefix + names.router + ".weight": rnd(config.num_experts, h)}
    for e in range(config.num_experts):
        p = prefix + names.expert.format(e)
        w |= {p + names.gate + ".weight": rnd(inter, h), p + names.up + ".weight": rnd(inter, h),
              p + names.down + ".weight": rnd(h, inter)}  # fmt: skip
    shared = config.shared_expert_intermediate_size
    if names.shared and shared:
        s = prefix + names.shared + "."
        w |= {s + "gate_proj.weight": rnd(shared, h), s + "up_proj.weight": rnd(shared, h),
              s + "down_proj.weight": rnd(h, shared), prefix + names.shared + "_gate.weight": rnd(1, h)}  # fmt: skip
    return w
