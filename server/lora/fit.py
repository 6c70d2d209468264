"""Whether an adapter fits a model: every lora_A/lora_B shape against the model's
projections (from its config alone, so the server checks before loading weights)."""

from __future__ import annotations

from llmservice.server.lora.adapter import LoRAAdapter, LoRAAdapterError
from llmservice.server.model.config import ModelConfig


def projection_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each LoRA-servable projection."""
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }  # fmt: skip


def check_fits(adapter: LoRAAdapter, config: ModelConfig, model_name: str) -> None:
    """Raise LoRAAdapterError naming the adapter, the tensor and both shapes."""
    shapes = projection_shapes(config)
    trained_on = f" (trained on {adapter.base_model!r})" if adapter.base_model else ""
    for (layer, module), (a, b) in sorted(adapter.weights.items()):
        if layer >= config.num_layers:
            raise LoRAAdapterError(
                f"adapter {adapter.name!r}{trained_on} does not fit {model_name!r}: it has layer {layer}, "
                f"the model has {config.num_layers} layers"
            )
        if module in ("gate_proj", "up_proj", "down_proj") and config.is_moe_layer(layer):
            raise LoRAAdapterError(
                f"adapter {adapter.name!r}{trained_on} does not fit {model_name!r}: layer {layer} is a "
                f"mixture-of-experts layer, which has no dense {module} (LoRA serves the attention "
                "projections of MoE layers)"
            )
        fan_in, fan_out = shapes[module]
        if a.shape[1] != fan_in or b.shape[0] != fan_out:
            raise LoRAAdapterError(
                f"adapter {adapter.name!r}{trained_on} does not fit {model_name!r}: layer {layer} {module} "
                f"is {fan_in}->{fan_out} in the model, but lora_A is {list(a.shape)} and lora_B "
                f"{list(b.shape)}"
            )
