"""GGUF Q4_0 / Q4_1 / Q8_0 matrices kept packed on CPU, behind the model's weight seam.

The loader (`load_gguf(..., pack=True)`) returns a `PackedWeights` mapping: float tensors
stay dense, block-quantized matrices stay in their GGUF bytes (`kernels.cpu_quant.Packed`,
Q/K rows already un-permuted). Reading an entry by name (`weights[name]`) still gives its
fp32 tensor, so code that inspects weights by name keeps working; the model takes its
weights through `PackedTensorSource`, which hands out `PackedWeight`s (matmul on the
blocks) and a `PackedTable` for the embedding (and the tied LM head) instead.

Why only on CPU in fp32: the kernels are CPU C code with fp32 activations and fp32
accumulation, which keeps greedy parity with HF (which dequantizes the same blocks to
fp32). Anything else (CUDA, bf16, a shard that splits a block) gets dense tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping, Sequence

import torch
from llmservice.kernels import cpu_quant
from llmservice.kernels.cpu_quant import Packed
from llmservice.server.config import CPU_WEIGHTS
from llmservice.server.model.parallel_weights import (
    LinearWeight,
    Part,
    Shard,
    TensorSource,
)
from llmservice.server.model.safetensors_weights import SafetensorsWeights, SafetensorsWeightsSource

log = logging.getLogger(__name__)


class PackedWeights(MutableMapping):
    """HF-named weights, some of them packed. `weights[name]` is always a dense fp32
    tensor (dequantized on each access for a packed one); `packed` holds the blocks."""

    def __init__(
        self, dense: dict[str, torch.Tensor] | None = None, packed: dict[str, Packed] | None = None
    ):
        self.dense = dense or {}
        self.packed = packed or {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.packed:
            return cpu_quant.dequantize(self.packed[name])
        return self.dense[name]

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self.packed.pop(name, None)
        self.dense[name] = value

    def __delitem__(self, name: str) -> None:
        if name in self.packed:
            del self.packed[name]
        else:
            del self.dense[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.dense
        yield from self.packed

    def __len__(self) -> int:
        return len(self.dense) + len(self.packed)

    def __contains__(self, name: object) -> bool:
        return name in self.dense or name in self.packed

    @property
    def nbytes(self) -> int:
        """Bytes held: packed blocks as stored, dense tensors as they are."""
        return sum(p.nbytes for p in self.packed.values()) + sum(
            t.numel() * t.element_size() for t in self.dense.values()
        )


def weights_nbytes(weights: MutableMapping) -> int:
    """Bytes of a loader's weights without dequantizing packed ones."""
    if isinstance(weights, (PackedWeights, SafetensorsWeights)):
        return weights.nbytes
    return sum(t.numel() * t.element_size() for t in weights.values())


class PackedWeight:
    """A LinearWeight on GGUF blocks: x @ W.T (+ bias) by `cpu_quant.matmul`."""

    def __init__(self, packed: Packed, bias: torch.Tensor | None = None):
        self.packed = packed
        self.bias = bias

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_quant.matmul(x, self.packed, self.bias)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + (
            self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        )


class PackedTable:
    """An embedding table on GGUF blocks: rows dequantized as they are looked up; as the
    tied LM head it is the same blocks (no second copy)."""

    def __init__(self, packed: Packed):
        self.packed = packed

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return cpu_quant.embedding(ids, self.packed)

    def as_linear(self) -> LinearWeight:
        return PackedWeight(self.packed)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes


def _packed_slice(p: Packed, dim: int, shard: Shard | None) -> Packed | None:
    """Rows or whole-block columns of p; None when the shard splits a block."""
    if shard is None or (shard.start == 0 and shard.length == (p.rows if dim == 0 else p.cols)):
        return p
    if dim == 0:
        return Packed(p.kind, p.data[shard.start : shard.end].contiguous(), p.cols)
    if shard.start % cpu_quant.QK or shard.length % cpu_quant.QK:
        return None
    return p.narrow_cols(shard.start, shard.length)


def concat_rows(parts: Sequence[Packed]) -> Packed | None:
    """Fused QKV / gate_up: the parts' rows one after the other (same format and width)."""
    if len({(p.kind, p.cols) for p in parts}) != 1:
        return None
    if len(parts) == 1:
        return parts[0]
    return Packed(parts[0].kind, torch.cat([p.data for p in parts]).contiguous(), parts[0].cols)


class PackedTensorSource(TensorSource):
    """A TensorSource over `PackedWeights` that keeps packed matrices packed (CPU, fp32)."""

    def __init__(
        self,
        weights: PackedWeights,
        device: torch.device | str,
        dtype: torch.dtype,
        consume: bool = False,
    ):
        super().__init__(weights.dense, device, dtype, consume)
        self.packed = weights.packed if consume else dict(weights.packed)
        self.keep_packed = torch.device(device).type == "cpu" and dtype == torch.float32

    def has(self, name: str) -> bool:
        return name in self.packed or super().has(name)

    def _read(self, name: str, dim: int, shard: Shard | None) -> torch.Tensor:
        if name in self.packed:
            p = self.packed.pop(name)
            dense = cpu_quant.dequantize(p)
            if shard is None or (shard.start == 0 and shard.length == dense.shape[dim]):
                return dense
            return dense.narrow(dim, shard.start, shard.length).clone()
        return super()._read(name, dim, shard)

    def _take_packed(self, part: Part) -> Packed | None:
        p = self.packed.get(part.name)
        if p is None or not self.keep_packed:
            return None
        return _packed_slice(p, part.dim, part.shard)

    def linear(self, parts: Sequence[Part], bias: Sequence[Part] = ()) -> LinearWeight:
        pieces = [self._take_packed(p) for p in parts]
        fused = concat_rows(pieces) if all(x is not None for x in pieces) else None  # type: ignore[arg-type]
        if fused is None:
            return super().linear(parts, bias)
        for p in parts:
            self.packed.pop(p.name)
        b = (
            torch.cat([self.get(p.name, p.dim, p.shard) for p in bias]).contiguous()
            if bias
            else None
        )
        return PackedWeight(fused, b)

    def embedding(
        self, name: str, dim: int = 0, shard: Shard | None = None
    ) -> torch.Tensor | PackedTable:
        """The embedding table: a PackedTable when it is packed and whole (one rank)."""
        p = self.packed.get(name)
        if p is not None and self.keep_packed and shard is None:
            return PackedTable(self.packed.pop(name))
        return self.get(name, dim, shard)

    def release(self) -> None:
        super().release()
        self.packed.clear()


def source_for(
    weights, device: torch.device | str, dtype: torch.dtype, consume: bool = False
) -> TensorSource:
    """The WeightSource the model builds from a loader's weights (a dict, GGUF's packed
    weights, or an HF directory's shards read in place)."""
    if isinstance(weights, PackedWeights):
        return PackedTensorSource(weights, device, dtype, consume)
    if isinstance(weights, SafetensorsWeights):
        return SafetensorsWeightsSource(weights, device, dtype, consume)
    return TensorSource(weights, device, dtype, consume)


def pack_tensor(raw, qtype: int, shape: tuple[int, ...], heads: int | None = None) -> Packed | None:
    """A GGUF tensor's bytes as a Packed matrix (a copy: the file is mapped read-only), or
    None when it is not a 2-D Q4_0/Q4_1/Q8_0 matrix. `heads`: undo llama.cpp's Q/K row
    permutation for that many heads (a permutation of whole rows, so of whole blocks)."""
    import numpy as np
    from llmservice.server.model.gguf_loader import unpermute_qk

    if int(qtype) not in cpu_quant.BLOCK_BYTES or len(shape) != 2 or shape[1] % cpu_quant.QK:
        return None
    rows, cols = shape
    data = torch.from_numpy(np.array(raw, copy=True).view(np.uint8).reshape(rows, -1))
    packed = Packed(int(qtype), data.contiguous(), cols)
    if heads is not None:
        order = unpermute_qk(torch.arange(rows).unsqueeze(1), heads).reshape(-1)
        packed = packed.select_rows(order)
    return packed


def packs_gguf(cpu_weights: str, device: torch.device | str, dtype: torch.dtype) -> bool:
    """Keep a GGUF's blocks packed? Only for a CPU fp32 model whose kernels build here."""
    if cpu_weights not in CPU_WEIGHTS:
        raise ValueError(f"cpu_weights {cpu_weights!r} is not one of {list(CPU_WEIGHTS)}")
    if cpu_weights == "fp32" or torch.device(device).type != "cpu" or dtype != torch.float32:
        return False
    from llmservice.kernels import cpu_native

    if not cpu_native.available():
        log.warning(
            "CPU quantized kernels unavailable (%s): dequantizing GGUF weights to fp32",
            cpu_native.error(),
        )
        return False
    return True
