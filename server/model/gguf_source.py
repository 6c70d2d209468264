"""GGUF weights by HF name, read one shard at a time (tensor-parallel ranks).

GGML stores each row of a matrix as whole quantization blocks, so a slice of rows is a
slice of the memory-mapped bytes, and a slice of columns is a slice of whole blocks in
every row: a rank dequantizes only its shard, never the full tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.gguf_loader import dequantize_tensor, hf_name, unpermute_qk
from llmservice.server.model.loaded import UnsupportedModelError
from llmservice.server.model.parallel_weights import Shard, WeightSource

_FLOAT = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}


def slice_raw(
    raw: np.ndarray, qtype: GGMLQuantizationType, dim: int, shard: Shard, name: str
) -> np.ndarray:
    """The bytes (or elements) of rows / columns [start, end) of one GGML tensor."""
    if dim == 0:
        return raw[shard.start : shard.end]
    if raw.ndim != 2:
        raise UnsupportedModelError(f"{name}: cannot take columns of a {raw.ndim}-d tensor")
    if qtype in _FLOAT:
        return raw[:, shard.start : shard.end]
    block, nbytes = GGML_QUANT_SIZES[qtype]
    if shard.start % block or shard.length % block:
        raise UnsupportedModelError(
            f"{name}: columns [{shard.start}, {shard.end}) do not fall on {qtype.name} blocks of "
            f"{block}; choose a tensor-parallel size that splits the rows into whole blocks"
        )
    return raw[:, shard.start // block * nbytes : shard.end // block * nbytes]


class GGUFSource(WeightSource):
    """Dequantizes only the asked rows or columns; Q/K rows come back un-permuted (whole
    heads, so llama.cpp's per-head permutation is undone on the slice)."""

    def __init__(
        self, path: Path, config: ModelConfig, device: torch.device | str, dtype: torch.dtype
    ):
        super().__init__(device, dtype)
        self.path = path
        self.config = config
        self.reader: GGUFReader | None = GGUFReader(path)
        self.tensors = {hf_name(t.name): t for t in self.reader.tensors if hf_name(t.name)}

    def has(self, name: str) -> bool:
        return name in self.tensors

    def _read(self, name: str, dim: int, shard: Shard | None) -> torch.Tensor:
        t = self.tensors[name]
        qtype = GGMLQuantizationType(t.tensor_type)
        shape = [int(d) for d in reversed(t.shape)]  # GGML lists the fastest dim first
        raw = t.data
        if shard is not None and shard.length != shape[dim]:
            raw = slice_raw(raw, qtype, dim, shard, name)
            shape[dim] = shard.length
        tensor = dequantize_tensor(
            np.ascontiguousarray(raw), qtype, tuple(shape), t.name, self.path
        )
        if self.config.architecture in ("llama", "mistral") and (
            ".self_attn.q_proj." in name or ".self_attn.k_proj." in name
        ):
            tensor = unpermute_qk(tensor, tensor.shape[0] // self.config.head_dim)
        return tensor

    def release(self) -> None:
        self.tensors.clear()
        self.reader = None
