"""GGUF weights by HF name, read one shard at a time (tensor-parallel ranks).

GGML stores each row of a matrix as whole quantization blocks, so a slice of rows is a
slice of the memory-mapped bytes, and a slice of columns is a slice of whole blocks in
every row: a rank dequantizes only its shard, never the full tensor. With `pack=True`
(CPU, fp32, `--cpu-weights quantized`) a Q4_0/Q4_1/Q8_0 shard is not dequantized at all:
its blocks are copied as they are and multiplied by the CPU kernels (quant_weights.py),
so each rank holds its share of the packed model, as a single process does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from llmservice.kernels import cpu_quant
from llmservice.kernels.cpu_quant import Packed
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.gguf_loader import dequantize_tensor, hf_name, unpermute_qk
from llmservice.server.model.gguf_reader import MappedGGUFReader
from llmservice.server.model.loaded import UnsupportedModelError
from llmservice.server.model.parallel_weights import LinearWeight, Part, Shard, WeightSource
from llmservice.server.model.quant_weights import (
    PackedTable,
    PackedWeight,
    concat_rows,
    pack_tensor,
)

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
        self,
        path: Path,
        config: ModelConfig,
        device: torch.device | str,
        dtype: torch.dtype,
        pack: bool = False,
    ):
        super().__init__(device, dtype)
        self.path = path
        self.config = config
        self.pack = pack
        self.reader: GGUFReader | None = MappedGGUFReader(path)
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
        if self._permuted(name):
            tensor = unpermute_qk(tensor, tensor.shape[0] // self.config.head_dim)
        return tensor

    def _permuted(self, name: str) -> bool:
        """llama.cpp's converter permutes the rows of Q and K of these architectures."""
        return self.config.architecture in ("llama", "mistral") and (
            ".self_attn.q_proj." in name or ".self_attn.k_proj." in name
        )

    def _packed(self, part: Part) -> Packed | None:
        """The part's blocks as they are (rows, or whole-block columns), or None where the
        dense read applies: packing off, a float tensor, or a shard that splits a block
        (the dense read then names it)."""
        t = self.tensors.get(part.name)
        if not self.pack or t is None or int(t.tensor_type) not in cpu_quant.BLOCK_BYTES:
            return None
        qtype = GGMLQuantizationType(t.tensor_type)
        shape = [int(d) for d in reversed(t.shape)]
        if len(shape) != 2:
            return None
        raw = t.data
        shard = part.shard
        if shard is not None and shard.length != shape[part.dim]:
            if part.dim == 1 and (shard.start % cpu_quant.QK or shard.length % cpu_quant.QK):
                return None
            raw = slice_raw(raw, qtype, part.dim, shard, part.name)
            shape[part.dim] = shard.length
        heads = shape[0] // self.config.head_dim if self._permuted(part.name) else None
        return pack_tensor(raw, qtype, (shape[0], shape[1]), heads)

    def linear(self, parts, bias=()) -> LinearWeight:
        """Packed when every part is (fused QKV / gate_up: their rows one after another)."""
        pieces = [self._packed(p) for p in parts]
        fused = concat_rows(pieces) if pieces and None not in pieces else None  # type: ignore[arg-type]
        if fused is None:
            return super().linear(parts, bias)
        b = torch.cat([self.get(p.name, p.dim, p.shard) for p in bias]).contiguous() if bias else None
        return PackedWeight(fused, b)

    def embedding(self, name: str, dim: int = 0, shard: Shard | None = None):
        """This rank's vocabulary rows, packed where they can be (also the tied LM head)."""
        packed = self._packed(Part(name, dim, shard))
        return PackedTable(packed) if packed is not None and dim == 0 else self.get(name, dim, shard)

    def release(self) -> None:
        self.tensors.clear()
        self.reader = None
