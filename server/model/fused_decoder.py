"""Which models the one-call C decoder (kernels/cpu_decoder.py) runs, and its weights.

It takes a model on CPU in fp32 on one rank whose every layer is packed GGUF blocks
(the default load of a Q4_0/Q4_1/Q8_0 GGUF); anything else (dense fp32 weights from
`--cpu-weights fp32` or safetensors, mixture-of-experts layers, tensor parallelism,
CUDA) keeps the Python loop.
Both give the same bits, so the choice changes speed only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from llmservice.kernels import cpu_decoder
from llmservice.server.model.quant_weights import PackedWeight

if TYPE_CHECKING:
    from llmservice.server.model.llama import LlamaModel

log = logging.getLogger(__name__)


def decoder_weights(model: LlamaModel) -> cpu_decoder.DecoderWeights | None:
    """The C decoder's view of `model`'s layers, or None where it does not apply."""
    if model.device.type != "cpu" or model.dtype != torch.float32 or model.world.size > 1:
        return None
    if any(layer.moe is not None for layer in model.layers):  # its C layer loop has no experts
        return None
    layers = []
    for layer in model.layers:
        linears = (layer.qkv.weight, layer.o_proj.weight, layer.gate_up.weight, layer.down.weight)
        if not all(isinstance(w, PackedWeight) for w in linears) or any(
            w.bias is not None for w in linears[1:]
        ):
            return None
        qkv, o, gate_up, down = (w.packed for w in linears)
        layers.append(cpu_decoder.LayerWeights(
            qkv, o, gate_up, down, layer.input_norm, layer.post_attn_norm, linears[0].bias, layer.q_norm, layer.k_norm,
        ))  # fmt: skip
    if not layers or not cpu_decoder.available():
        return None
    try:
        return cpu_decoder.DecoderWeights(layers, model.final_norm, model.cos_sin_cache, model.num_heads,
                                          model.num_kv_heads, model.config.head_dim, model.config.rms_norm_eps,
                                          model.scale)  # fmt: skip
    except ValueError as e:  # a tensor the kernel cannot read as it is: the Python loop runs
        log.info("one-call CPU decoder not used: %s", e)
        return None
