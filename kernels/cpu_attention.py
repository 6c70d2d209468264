"""Paged decode attention on CPU without gathering the context (kernels/cpu_attention.c).

The torch path copies every decoding sequence's K/V blocks into a contiguous tensor each
step (13 % of a batch-100 decode step on the embedded model); this kernel reads the rows
in place through the block table, any block size, any GQA ratio. fp32 pools only (the
CPU engine's dtype); `supports` says when it applies, else callers use the torch path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from llmservice.kernels import cpu_native
from llmservice.kernels.metadata import AttentionMetadata


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (
        q.is_cpu
        and q.dtype == torch.float32
        and k_cache.dtype == torch.float32
        and k_cache.is_contiguous()
        and cpu_native.available("cpu_attention")
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, Hq, D] (one token per sequence) -> out [B, Hq, D]; seq_lens [B] are the
    context lengths including this token (already written to the pools)."""
    return decode(q, k_cache, v_cache, DecodeRows.of(block_tables, seq_lens, q.shape[0]), scale)


@dataclass(frozen=True)
class DecodeRows:
    """The sequences' block tables and lengths as the kernel reads them (int32, rows
    contiguous). A step prepares them once for all its layers: at batch 1 the conversions
    and slicing cost as much as the kernel's own call."""

    tables: torch.Tensor
    lens: torch.Tensor

    @classmethod
    def of(cls, block_tables: torch.Tensor, seq_lens: torch.Tensor, bsz: int) -> DecodeRows:
        tables = block_tables[:bsz]
        if tables.dtype != torch.int32 or tables.stride(-1) != 1:
            tables = tables.to(torch.int32).contiguous()
        return cls(tables, seq_lens[:bsz].to(torch.int32).contiguous())

    @classmethod
    def of_step(cls, meta: AttentionMetadata) -> DecodeRows:
        """The rows of a decode-only step, built once and kept in `meta.derived` for every
        layer (and for the one-call decoder)."""
        rows = meta.derived.get("decode_only_rows")
        if rows is None:
            rows = meta.derived["decode_only_rows"] = cls.of(meta.block_tables, meta.seq_lens, meta.num_decodes)
        return rows


def decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: DecodeRows, scale: float
) -> torch.Tensor:
    """paged_decode_attention over prepared rows (one layer's call)."""
    bsz, hq, d = q.shape
    _, block_size, hkv, dk = k_cache.shape
    if dk != d or hq % hkv or v_cache.shape != k_cache.shape or not v_cache.is_contiguous():
        raise ValueError(f"q {tuple(q.shape)} does not fit pools {tuple(k_cache.shape)}")
    if rows.lens.shape[0] != bsz:
        raise ValueError(f"{rows.lens.shape[0]} sequence lengths for {bsz} queries")
    q = q.contiguous()
    out = torch.empty_like(q)
    rc = cpu_native.library("cpu_attention").qa_decode(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), rows.tables.data_ptr(),
        rows.tables.stride(0), rows.lens.data_ptr(), bsz, hq, hkv, d, block_size, scale,
        out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError("decode attention: no memory for the scores buffer")
    return out
