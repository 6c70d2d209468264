"""Tensor-parallel layers (Megatron style, as vLLM's `parallel_layers`): the model uses
these objects, never F.linear with rank arithmetic.

- `ColumnParallelLinear`: each rank holds a slice of the output rows; its output stays
  split (attention heads, MLP intermediate). Several HF tensors fuse into one GEMM (QKV,
  gate_up), each rank fusing its own slice of each.
- `RowParallelLinear`: each rank holds the matching slice of the input columns; the
  partial products are summed over ranks (one all-reduce).
- `VocabParallelEmbedding` / `ParallelLMHead`: the vocabulary split in contiguous ranges;
  the embedding all-reduces (a token's row lives on one rank, the others give zeros), the
  head gathers the logits to rank 0, the only rank that samples.

`World()` (size 1) is the default: every collective is then the identity and each layer
is exactly the F.linear / F.embedding it replaces, so TP=1 computes what it did before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from llmservice.server.model.parallel_weights import (
    DenseWeight,
    LinearWeight,
    Part,
    Shard,
    WeightSource,
)


@dataclass(frozen=True)
class World:
    """This process's place in its tensor-parallel group. `group` None with size > 1
    means torch.distributed's default group (initialised by the worker)."""

    rank: int = 0
    size: int = 1
    group: object | None = None

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: every rank's x (same shape) side by side on the last dim; others: None."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.is_first else None
        dist.gather(x, parts, dst=0, group=self.group)
        return torch.cat(parts, dim=-1) if parts is not None else None


class TensorParallelError(ValueError):
    """The model's shape cannot be split over this many ranks."""


def even_shard(total: int, world: World, what: str) -> Shard:
    """Rank r's 1/N of `total` (heads, intermediate columns): N must divide it."""
    if total % world.size:
        raise TensorParallelError(
            f"{what} ({total}) is not divisible by the tensor-parallel size {world.size}"
        )
    n = total // world.size
    return Shard(world.rank * n, n)


def kv_head_shard(num_kv_heads: int, world: World) -> Shard:
    """KV heads of rank r, in heads. With more ranks than KV heads each rank holds one
    head, replicated over size / num_kv_heads consecutive ranks (as vLLM does), which
    matches the query heads of that rank under grouped-query attention."""
    if world.size <= num_kv_heads:
        return even_shard(num_kv_heads, world, "num_key_value_heads")
    if world.size % num_kv_heads:
        raise TensorParallelError(
            f"the tensor-parallel size {world.size} is neither a divisor nor a multiple of "
            f"num_key_value_heads ({num_kv_heads})"
        )
    return Shard(world.rank // (world.size // num_kv_heads), 1)


def vocab_shard(vocab_size: int, world: World) -> Shard:
    """Contiguous ranges of ceil(vocab / N) rows; the last may be shorter."""
    per = -(-vocab_size // world.size)
    start = min(world.rank * per, vocab_size)
    return Shard(start, min(per, vocab_size - start))


def scaled(shard: Shard, unit: int) -> Shard:
    """A shard of heads as a shard of rows (`unit` = head_dim)."""
    return Shard(shard.start * unit, shard.length * unit)


class ColumnParallelLinear:
    """y[:, this rank's rows] = x @ W[rows].T: the output stays split over ranks."""

    def __init__(
        self,
        source: WeightSource,
        names: Sequence[str],
        shards: Sequence[Shard],
        bias: bool = False,
    ):
        self.weight: LinearWeight = source.linear(
            [Part(f"{n}.weight", 0, s) for n, s in zip(names, shards, strict=True)],
            [Part(f"{n}.bias", 0, s) for n, s in zip(names, shards, strict=True)] if bias else (),
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight.matmul(x)


class RowParallelLinear:
    """y = sum over ranks of x[:, rank's columns] @ W[:, columns].T (one all-reduce)."""

    def __init__(self, source: WeightSource, name: str, shard: Shard, world: World):
        self.world = world
        self.weight: LinearWeight = source.linear([Part(f"{name}.weight", 1, shard)])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.world.all_reduce(self.weight.matmul(x))


class VocabParallelEmbedding:
    """Rows [start, end) of the embedding; a token outside them looks up zeros here, and
    the all-reduce adds the rank that holds it."""

    def __init__(self, source: WeightSource, name: str, vocab_size: int, world: World):
        self.world = world
        self.vocab_size = vocab_size
        self.shard = vocab_shard(vocab_size, world)
        # a dense tensor, or a table kept packed on CPU (quant_weights.PackedTable: lookup/nbytes)
        self.weight = source.embedding(name, 0, self.shard if world.size > 1 else None)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return F.embedding(ids, w) if isinstance(w, torch.Tensor) else w.lookup(ids)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.world.size == 1:
            return self._lookup(ids)
        inside = (ids >= self.shard.start) & (ids < self.shard.end)
        local = torch.where(inside, ids - self.shard.start, 0)
        out = self._lookup(local)
        out.mul_(inside.unsqueeze(-1).to(out.dtype))
        return self.world.all_reduce(out)

    @property
    def nbytes(self) -> int:
        w = self.weight
        return w.numel() * w.element_size() if isinstance(w, torch.Tensor) else w.nbytes


class ParallelLMHead:
    """Logits of this rank's vocabulary range, gathered to rank 0 (padded to equal widths
    for the gather, trimmed after); other ranks get None."""

    def __init__(self, weight: LinearWeight, vocab_size: int, world: World):
        self.weight = weight
        self.world = world
        self.vocab_size = vocab_size
        self.shard = vocab_shard(vocab_size, world)
        self.width = -(-vocab_size // world.size)

    @classmethod
    def load(cls, source: WeightSource, name: str, vocab_size: int, world: World) -> ParallelLMHead:
        shard = vocab_shard(vocab_size, world)
        return cls(
            source.linear([Part(name, 0, shard if world.size > 1 else None)]), vocab_size, world
        )

    @classmethod
    def tied(cls, embedding: VocabParallelEmbedding) -> ParallelLMHead:
        """Shares the embedding's rows (tie_word_embeddings): no second copy."""
        w = embedding.weight
        linear = DenseWeight(w) if isinstance(w, torch.Tensor) else w.as_linear()
        return cls(linear, embedding.vocab_size, embedding.world)

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        logits = self.weight.matmul(x)
        if self.world.size == 1:
            return logits
        if logits.shape[-1] < self.width:
            logits = F.pad(logits, (0, self.width - logits.shape[-1]))
        full = self.world.gather_last_dim(logits)
        return full[..., : self.vocab_size] if full is not None else None
