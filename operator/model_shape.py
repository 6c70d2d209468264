"""A model's shape for the VRAM check, from its Hugging Face `config.json`. Pure.

The catalog (catalog.py) knows a few models by name; any other `hf://` model is sized
from the same numbers its own config.json publishes. The parameter count, when the
safetensors headers gave it, is exact; without it the count is derived from the shape.
"""

from __future__ import annotations

from typing import Any

from llmservice.operator.catalog import Architecture
from llmservice.server.model.sources import dense_mlp_layers

# model_type values whose attention has q/k/v biases without saying so in the config.
BIASED_QKV = frozenset({"qwen2", "qwen2_moe", "qwen2_vl"})
# model_type values with an RMSNorm over head_dim on q and k (tiny, counted for exactness).
QK_NORM = frozenset({"qwen3", "qwen3_moe"})


class ConfigError(ValueError):
    """config.json lacks a number the VRAM check needs (the message names it)."""


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part: multimodal configs nest it under `text_config`."""
    inner = config.get("text_config")
    if isinstance(inner, dict) and "num_hidden_layers" not in config:
        return {"model_type": config.get("model_type"), **inner}
    return config


def _int(cfg: dict[str, Any], *names: str, default: int | None = None) -> int:
    for name in names:
        value = cfg.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if default is not None:
        return default
    raise ConfigError(f"config.json has no positive integer {' / '.join(names)}")


def architecture_from_config(
    config: dict[str, Any], parameter_count: int | None = None
) -> Architecture:
    """Layers, heads, head size, MLP and vocabulary from config.json; MoE experts too
    (all of them: every expert is resident, see Architecture)."""
    cfg = text_config(config)
    heads = _int(cfg, "num_attention_heads", "n_head")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise ConfigError(
            f"config.json: num_attention_heads {heads} is not a multiple of "
            f"num_key_value_heads {kv_heads}"
        )
    experts = _int(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=1)
    mlp = _int(cfg, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    moe = _moe_shape(cfg, layers, mlp) if experts > 1 else {}
    model_type = cfg.get("model_type")
    qkv_bias = cfg.get("qkv_bias")  # transformers' Qwen2-MoE flag (default True)
    biased = bool(qkv_bias) if isinstance(qkv_bias, bool) else model_type in BIASED_QKV
    return Architecture(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=_int(cfg, "head_dim", default=hidden // heads),
        intermediate_size=moe.pop("intermediate_size", mlp),
        vocab_size=_int(cfg, "vocab_size"),
        tie_word_embeddings=bool(
            cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
        ),
        num_experts=experts,
        num_experts_per_token=_int(cfg, "num_experts_per_tok", default=1) if experts > 1 else 1,
        attention_bias=bool(cfg.get("attention_bias")) or biased,
        parameter_count=parameter_count,
        qk_norm=model_type in QK_NORM,
        **moe,
    )


def _moe_shape(cfg: dict[str, Any], layers: int, mlp: int) -> dict[str, Any]:
    """The expert width and the layers without experts, the way transformers builds them.

    Mixtral: every layer has experts of `intermediate_size`. Qwen-MoE: experts of
    `moe_intermediate_size`; layer i keeps a dense MLP of `intermediate_size` when it is in
    `mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`; Qwen2-MoE adds
    a shared expert of `shared_expert_intermediate_size`.
    """
    expert = _int(cfg, "moe_intermediate_size", default=0)
    if not expert:
        return {}
    return {
        "intermediate_size": expert,
        "num_dense_layers": len(dense_mlp_layers(cfg, layers)),
        "dense_intermediate_size": mlp,
        "shared_expert_intermediate_size": _int(cfg, "shared_expert_intermediate_size", default=0),
    }
