"""GGUF reader: metadata, tokenizer material and dequantized weights under HF names.

llama.cpp's converter permutes Llama Q/K rows for its interleaved-pair rotary; we undo
that so the model can use the HF (rotate-half) rotary for both GGUF and safetensors.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.dequant import dequantize
from llmservice.server.model.gguf_reader import MappedGGUFReader
from llmservice.server.model.loaded import LoadedModel, TokenizerSource, UnsupportedModelError
from llmservice.server.model.quant_weights import PackedWeights, pack_tensor

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")
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


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


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


def read_config(reader: GGUFReader, path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    g: Callable = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    n_heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    names = {t.name for t in reader.tensors}
    scaling = None
    scaling_type = g("rope.scaling.type")
    if scaling_type and scaling_type != "none":
        scaling = {"rope_type": scaling_type, "factor": float(g("rope.scaling.factor", 1.0))}
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = [int(x) for x in (eos, eot) if x is not None]
    return ModelConfig(
        architecture=arch,
        num_layers=int(g("block_count")),
        hidden_size=hidden,
        num_heads=n_heads,
        num_kv_heads=int(g("attention.head_count_kv", n_heads)),
        head_dim=int(g("attention.key_length", hidden // n_heads)),
        intermediate_size=int(g("feed_forward_length")),
        vocab_size=int(g("vocab_size", len(tokens))),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        max_position_embeddings=int(g("context_length", 2048)),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=sorted(set(eos_ids)),
        name=str(_field(reader, "general.name", path.stem)),
    )


def read_tokenizer(reader: GGUFReader) -> TokenizerSource:
    return TokenizerSource(
        tokens=list(_field(reader, "tokenizer.ggml.tokens") or []),
        merges=list(_field(reader, "tokenizer.ggml.merges") or []),
        token_types=[int(t) for t in (_field(reader, "tokenizer.ggml.token_type") or [])],
        pre=str(_field(reader, "tokenizer.ggml.pre", "")),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        chat_template=_field(reader, "tokenizer.chat_template"),
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    )


def read_gguf_info(path: Path) -> tuple[ModelConfig, TokenizerSource]:
    """Architecture and tokenizer from the metadata; the tensors stay unread (mmap)."""
    reader = MappedGGUFReader(path)
    return read_config(reader, path), read_tokenizer(reader)


def load_gguf(
    path: Path,
    dtype: torch.dtype,
    progress: Callable[[int, int], None] | None = None,
    pack: bool = False,
) -> LoadedModel:
    """`pack=True`: Q4_0/Q4_1/Q8_0 matrices stay in their blocks (quant_weights.PackedWeights,
    for the CPU kernels); otherwise every tensor is dequantized to `dtype`."""
    reader = MappedGGUFReader(path)
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
