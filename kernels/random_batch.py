"""Random paged-attention batches for tests and the GPU benchmark.

Builds what the engine's runner would hand the kernels for a step: a KV pool filled with
random (never zero) values, each sequence's blocks drawn from a shuffled free list (so
block tables are non-contiguous and out of order, as after real allocation churn), and
the matching `AttentionMetadata` with decodes first, then prefill chunks.
"""

from dataclasses import dataclass

import torch
from llmservice.kernels.metadata import AttentionMetadata


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float


def make_paged_batch(
    seqs: list[tuple[int, int]],
    *,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
) -> PagedBatch:
    """seqs: (query_len, seq_len) per sequence; decodes (query_len 1) must come first.

    The cache holds K/V for all seq_len tokens of every sequence (the new tokens' K/V
    included, as after reshape_and_cache), plus `spare_blocks` unused random blocks.
    """
    assert all(0 < q <= s for q, s in seqs), "each sequence needs 0 < query_len <= seq_len"
    num_decodes = sum(1 for q, _ in seqs if q == 1)
    assert all(q == 1 for q, _ in seqs[:num_decodes]), "decodes must come first"
    gen = torch.Generator().manual_seed(seed)
    data_gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for _, s in seqs]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    free = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq)
    table = torch.zeros((len(seqs), width), dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        table[i, :n] = torch.tensor(free[:n], dtype=torch.int32)
        free = free[n:]

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = _randn(shape, data_gen, dtype, device)
    v_cache = _randn(shape, data_gen, dtype, device)
    total = sum(q for q, _ in seqs)
    q = _randn((total, num_kv_heads * group, head_dim), data_gen, dtype, device)

    query_lens = [q_len for q_len, _ in seqs]
    seq_lens = [s for _, s in seqs]
    starts = [0]
    slots: list[int] = []
    for i, (q_len, s) in enumerate(seqs):
        starts.append(starts[-1] + q_len)
        for pos in range(s - q_len, s):
            slots.append(int(table[i, pos // block_size]) * block_size + pos % block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=table.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        query_lens=query_lens,
        seq_lens_host=seq_lens,
        num_decodes=num_decodes,
        block_size=block_size,
    )
    return PagedBatch(q=q, k_cache=k_cache, v_cache=v_cache, meta=meta, scale=head_dim**-0.5)


def _randn(shape, gen: torch.Generator, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
