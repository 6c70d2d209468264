"""GGUF reader: metadata, tokenizer material and dequantized weights under HF names.

llama.cpp's converter permutes Llama Q/K rows for its interleaved-pair rotary; we undo
that so the model can use the HF (rotate-half) rotary for both GGUF and safetensors.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from llmservice.server.model.dequant import dequantize
from llmservice.server.model.gguf_header import GGUFFile
from llmservice.server.model.gguf_info import (  # noqa: F401  (re-exported: the metadata half)
    SUPPORTED_ARCHS,
    read_config,
    read_gguf_info,
    read_tokenizer,
)
from llmservice.server.model.loaded import LoadedModel, UnsupportedModelError
from llmservice.server.model.quant_weights import PackedWeights, pack_tensor

SUPPORTED_QUANTS = {
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q8_0,
}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert permute: pairs (0,1),(2,3).. back to halves."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize_tensor(
    data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...], name: str, path: Path
) -> torch.Tensor:
    if qtype not in SUPPORTED_QUANTS:
        raise UnsupportedModelError(
            f"{path}: tensor {name!r} uses GGML type {qtype.name}, which is not supported "
            f"(supported: {', '.join(sorted(q.name for q in SUPPORTED_QUANTS))})"
        )
    return dequantize(data, qtype, shape)


def load_gguf(
    path: Path,
    dtype: torch.dtype,
    progress: Callable[[int, int], None] | None = None,
    pack: bool = False,
) -> LoadedModel:
    """`pack=True`: Q4_0/Q4_1/Q8_0 matrices stay in their blocks (quant_weights.PackedWeights,
    for the CPU kernels); otherwise every tensor is dequantized to `dtype`."""
    reader = GGUFFile(path)
    config = read_config(reader, path)
    weights: dict[str, torch.Tensor] | PackedWeights = PackedWeights() if pack else {}
    total = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        name = hf_name(t.name)
        if name is None:
            continue  # e.g. rope_freqs: recomputed from metadata
        qtype = GGMLQuantizationType(t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))  # GGML lists the fastest dim first
        if pack and dtype == torch.float32:
            heads = None
            if config.architecture in ("llama", "mistral") and "attn_q.weight" in t.name:
                heads = config.num_heads
            elif config.architecture in ("llama", "mistral") and "attn_k.weight" in t.name:
                heads = config.num_kv_heads
            packed = pack_tensor(t.data, qtype, shape, heads)
            if packed is not None:
                weights.packed[name] = packed  # type: ignore[union-attr]
                if progress:
                    progress(i + 1, total)
                continue
        tensor = dequantize_tensor(t.data, qtype, shape, t.name, path)
        if config.architecture in ("llama", "mistral"):
            if t.name.endswith("attn_q.weight") or t.name.endswith("attn_q.bias"):
                tensor = unpermute_qk(tensor, config.num_heads)
            elif t.name.endswith("attn_k.weight") or t.name.endswith("attn_k.bias"):
                tensor = unpermute_qk(tensor, config.num_kv_heads)
        weights[name] = tensor.to(dtype)
        if progress:
            progress(i + 1, total)
    return LoadedModel(config=config, weights=weights, tokenizer=read_tokenizer(reader), path=path)
