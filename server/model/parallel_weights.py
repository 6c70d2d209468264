"""Weight kinds and weight sources: the seam between what a matrix is and how it is sharded.

Every weight matmul of the model goes through `LinearWeight.matmul(x)`. `DenseWeight` is
a plain tensor (F.linear); another kind (e.g. GGUF blocks kept packed) implements the same
two members and is returned by its source's `linear()`. The parallel layers
(`parallel.py`) decide *which* rows or columns a rank holds (`Shard`) and ask a
`WeightSource` for them, so a weight kind never sees rank arithmetic and the sharding
never sees a weight's encoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shard:
    """Elements [start, start + length) of one dimension of a weight."""

    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


class LinearWeight(Protocol):
    """A [out_features, in_features] matrix (and optional bias) that can multiply activations."""

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in_features] -> x @ W.T (+ bias) [T, out_features]."""
        ...

    @property
    def nbytes(self) -> int: ...


class DenseWeight:
    """A plain tensor: the kind every loader makes today."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight
        self.bias = bias

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @property
    def nbytes(self) -> int:
        tensors = [self.weight] + ([self.bias] if self.bias is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class Part:
    """One HF-named tensor, or a slice of it along `dim` (None: whole), inside a fused weight."""

    name: str
    dim: int = 0
    shard: Shard | None = None


class WeightSource:
    """Where the model takes its weights from, by HF name, one shard at a time.

    Subclasses implement `has` and `_read` (the rows or columns asked for, nothing more
    where the format allows it); `linear` fuses parts along the output dimension into a
    `LinearWeight`. A source whose weights are not plain tensors overrides `linear` (and
    keeps `get` for the norms and the embedding).
    """

    def __init__(self, device: torch.device | str, dtype: torch.dtype):
        self.device = torch.device(device)
        self.dtype = dtype

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def _read(self, name: str, dim: int, shard: Shard | None) -> torch.Tensor:
        raise NotImplementedError

    def get(self, name: str, dim: int = 0, shard: Shard | None = None) -> torch.Tensor:
        """The tensor (or its slice) on the model's device in the model's dtype."""
        return self._read(name, dim, shard).to(device=self.device, dtype=self.dtype)

    def embedding(self, name: str, dim: int = 0, shard: Shard | None = None):
        """The embedding table: a tensor here; a source of packed weights may return an
        object with lookup(ids) / nbytes / as_linear() (server/model/quant_weights.py)."""
        return self.get(name, dim, shard)

    def linear(self, parts: Sequence[Part], bias: Sequence[Part] = ()) -> LinearWeight:
        """Parts concatenated along the output dimension (fused QKV, gate_up)."""
        weight = _cat([self.get(p.name, p.dim, p.shard) for p in parts])
        b = _cat([self.get(p.name, p.dim, p.shard) for p in bias]) if bias else None
        return DenseWeight(weight, b)

    def release(self) -> None:
        """Called once the model is built (close files, drop what is left)."""


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors).contiguous()


class TensorSource(WeightSource):
    """Weights already in memory under HF names (GGUF dequantized, dummy, tests).
    `consume=True` pops each tensor as it is taken, so unfused tensors are freed layer by
    layer (peak memory ~ the weights, not twice)."""

    def __init__(
        self,
        weights: dict[str, torch.Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
        consume: bool = False,
    ):
        super().__init__(device, dtype)
        self.weights = weights if consume else dict(weights)

    def has(self, name: str) -> bool:
        return name in self.weights

    def _read(self, name: str, dim: int, shard: Shard | None) -> torch.Tensor:
        tensor = self.weights.pop(name)
        if shard is None or (shard.start == 0 and shard.length == tensor.shape[dim]):
            return tensor
        # a copy, so the full tensor's storage is not kept alive by the view
        return tensor.narrow(dim, shard.start, shard.length).clone()

    def release(self) -> None:
        self.weights.clear()
