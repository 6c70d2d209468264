"""Fixed-address input buffers for pure-decode steps, padded to a captured batch size.

A CUDA graph replays kernels on the addresses it captured, so a decode step's inputs
(token ids, positions, slot mapping, sequence lengths, block tables) are copied in place
into these buffers before each replay. The same buffers and the same padding run on CPU
(no capture there), so the CPU tests check everything but the capture itself.

Padding rows write their K/V into the pad slot (the first slot of the pad block, one
block past the pool the block manager hands out) and attend to that slot alone (sequence
length 1): they read only what padding rows wrote, which is finite, and no request's KV.
`kernels/triton_cache.py` also skips slot -1, but torch's `index_copy_` (the CPU path)
has no such rule, so one pad block serves both devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from llmservice.kernels.metadata import AttentionMetadata


@dataclass
class PaddedDecode:
    """A pure-decode step's host values, padded to `size` rows."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    seq_lens: list[int]
    tables: list[list[int]]  # each `width` long

    @property
    def size(self) -> int:
        return len(self.input_ids)


def pad_decode(
    input_ids: Sequence[int],
    positions: Sequence[int],
    slots: Sequence[int],
    seq_lens: Sequence[int],
    tables: Sequence[Sequence[int]],
    size: int,
    pad_block: int,
    block_size: int,
) -> PaddedDecode:
    """Pad a decode batch of n rows to `size`: padding rows compute token 0 at position 0
    into the pad slot with a context of 1 (their own write); every table row is padded
    to the widest one with the pad block (entries past a row's length are never read)."""
    n = len(input_ids)
    if not n <= size:
        raise ValueError(f"{n} decode rows do not fit a padded batch of {size}")
    extra = size - n
    width = max((len(t) for t in tables), default=1) or 1
    pad_row = [pad_block] * width
    return PaddedDecode(
        input_ids=[*input_ids, *[0] * extra],
        positions=[*positions, *[0] * extra],
        slots=[*slots, *[pad_block * block_size] * extra],
        seq_lens=[*seq_lens, *[1] * extra],
        tables=[list(t) + [pad_block] * (width - len(t)) for t in tables] + [pad_row] * extra,
    )


def host_tensor(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor to copy to `device` without waiting: on CUDA in pinned
    memory (from torch's caching host allocator, which keeps the block until the
    non-blocking copy that reads it has run), so the copy never syncs the stream."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory() if device.type == "cuda" else t


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list on `device`, copied asynchronously on CUDA (see host_tensor)."""
    t = host_tensor(values, dtype, device)
    return t.to(device, non_blocking=True) if device.type == "cuda" else t


class StaticDecodeInputs:
    """The buffers, sized for the largest padded batch and the longest block table."""

    def __init__(self, max_batch: int, max_blocks_per_seq: int, block_size: int, pad_block: int,
                 device: torch.device):  # fmt: skip
        self.max_batch = max_batch
        self.block_size = block_size
        self.pad_block = pad_block
        self.device = device
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((max_batch, max(max_blocks_per_seq, 1)), dtype=torch.int32, device=device)
        # a pure-decode batch: row i's one token is token i
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.reset_padding()

    @property
    def nbytes(self) -> int:
        bufs = (self.input_ids, self.positions, self.slot_mapping, self.seq_lens, self.block_tables, self.query_start_loc)
        return sum(t.numel() * t.element_size() for t in bufs)

    def reset_padding(self) -> None:
        """Every row a padding row (before capture: warm-up and capture write the pad slot only)."""
        self.input_ids.zero_()
        self.positions.zero_()
        self.slot_mapping.fill_(self.pad_block * self.block_size)
        self.seq_lens.fill_(1)
        self.block_tables.fill_(self.pad_block)

    def fill(self, batch: PaddedDecode) -> None:
        """Copy a padded step into the buffers in place (the addresses never change). On
        CUDA from pinned host tensors with non_blocking: the copies queue behind the
        previous step on the stream (after its graph read the buffers), and the host
        does not wait for them."""
        n = batch.size
        if n > self.max_batch:
            raise ValueError(f"a padded batch of {n} exceeds the static buffers' {self.max_batch} rows")
        width = len(batch.tables[0])
        if width > self.block_tables.shape[1]:
            raise ValueError(f"a block table of {width} blocks exceeds the static buffers' {self.block_tables.shape[1]}")
        cuda = self.device.type == "cuda"

        def put(dst: torch.Tensor, values: list, dtype: torch.dtype) -> None:
            dst.copy_(host_tensor(values, dtype, self.device), non_blocking=cuda)

        put(self.input_ids[:n], batch.input_ids, torch.int64)
        put(self.positions[:n], batch.positions, torch.int64)
        put(self.slot_mapping[:n], batch.slots, torch.int64)
        put(self.seq_lens[:n], batch.seq_lens, torch.int32)
        put(self.block_tables[:n, :width], batch.tables, torch.int32)

    def metadata(self, size: int, seq_lens_host: list[int]) -> AttentionMetadata:
        """Views of the first `size` rows. `seq_lens_host` sizes launches only on CUDA
        (decode attention's split count); the CPU decode path also masks with it, so the
        eager path passes the step's exact lengths and a graph a fixed bound."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            seq_lens=self.seq_lens[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            query_lens=[1] * size,
            seq_lens_host=seq_lens_host,
            num_decodes=size,
            block_size=self.block_size,
        )

    def graph_metadata(self, size: int, seq_len_bound: int) -> AttentionMetadata:
        """The metadata a graph is captured with: host lengths at a fixed upper bound
        (max_model_len), so the split count baked into the graph fits every replay."""
        return self.metadata(size, [seq_len_bound] * size)
