"""Per-step attention metadata shared by the engine's runner and the kernels.

The runner lays out one flat batch of T new tokens from B sequences, decodes first
(query length 1), then prefill / chunked-prefill chunks. Every kernel reads this one
description, so the torch path and the Triton path see exactly the same inputs.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset of each new token
    block_tables: torch.Tensor  # [B, max_blocks] int32, rows padded with 0
    seq_lens: torch.Tensor  # [B] int32: context length of each sequence after this step
    query_start_loc: torch.Tensor  # [B + 1] int32: offsets of each sequence's new tokens
    query_lens: list[int]  # host copies, so CPU paths never sync on tensors
    seq_lens_host: list[int]
    num_decodes: int  # the first num_decodes sequences have query length 1
    block_size: int
    # what a kernel derives from this step's layout once and every layer reuses (torch_ops:
    # the decode kernel's rows); a new AttentionMetadata per step, so never stale
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host, default=0)

    @classmethod
    def one_sequence(cls, n: int, block_size: int, device: torch.device | str) -> "AttentionMetadata":
        """One sequence of `n` tokens written whole into blocks 0, 1, ...: the layout of a
        scoring pass or a calibration prefill outside the engine's scheduler."""
        nblocks = -(-n // block_size)
        return cls(
            slot_mapping=torch.arange(n, device=device),
            block_tables=torch.arange(nblocks, dtype=torch.int32, device=device)[None],
            seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
            query_lens=[n],
            seq_lens_host=[n],
            num_decodes=1 if n == 1 else 0,
            block_size=block_size,
        )
