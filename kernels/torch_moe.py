"""The CPU path of a mixture-of-experts MLP: one grouped GEMM pair per expert.

The (token, k) pairs are sorted by expert, so each expert's rows are one contiguous
slice: an expert that k tokens chose runs one [k, H] x [H, 2I] GEMM, one SiLU-and-mul
and one [k, I] x [I, H] GEMM, whatever the batch. That is E calls at most per layer
(fewer when few experts are hit), instead of T * K small ones per token, and each
weight matrix is read once per step. The contributions are weighted, then summed into
their tokens with one `index_add_`, in expert order, as transformers adds them.

When every expert is hit and the busiest has at most twice the mean rows, or at most
16 (decode batches, where a GEMM costs its weight read), the groups are padded to one [E, n, H] block and the two
GEMMs are one `bmm` each: 2 calls instead of 2E. Small GEMMs each pay a thread-pool
fork and join, which on a busy 2-core machine costs more than the GEMM itself.
"""

from __future__ import annotations

import torch
from llmservice.kernels import torch_ops

# Up to this many rows an expert's GEMM costs its weight read, so padding every expert to
# the busiest one's rows adds next to nothing (decode batches)
PADDED_ROWS_FREE = 16


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """(pair order sorted by expert, stable; rows per expert): pair p is token p // K's
    k-th choice."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return order, counts


def grouped_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """out[t] = sum_k w[t,k] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t,k].

    x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_* [T, K]."""
    num_tokens, k = topk_ids.shape
    order, counts = sort_by_expert(topk_ids, w13.shape[0])
    token_of = order // k
    rows = x.index_select(0, token_of)
    if min(counts) > 0 and (max(counts) <= PADDED_ROWS_FREE or len(counts) * max(counts) <= 2 * len(order)):
        out_rows = _padded_bmm(rows, w13, w2, topk_ids.reshape(-1).index_select(0, order), counts)
    else:
        out_rows = _per_expert(rows, w13, w2, counts)
    weights = topk_weights.reshape(-1).index_select(0, order)
    out_rows.mul_(weights.unsqueeze(1).to(out_rows.dtype))
    out = torch.zeros_like(x)
    return out.index_add_(0, token_of, out_rows)


def _per_expert(rows: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """One GEMM pair per expert that has rows (rows sorted by expert)."""
    out_rows = torch.empty_like(rows)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        seg = slice(start, start + n)
        act = torch_ops.silu_and_mul(torch.mm(rows[seg], w13[expert].t()))
        torch.mm(act, w2[expert].t(), out=out_rows[seg])
        start += n
    return out_rows


def _padded_bmm(
    rows: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, expert_of: torch.Tensor, counts: list[int]
) -> torch.Tensor:
    """Every expert's rows in one zero-padded [E, max rows, H] block: two bmm calls."""
    sizes = torch.tensor(counts, device=rows.device)
    slot = torch.arange(len(rows), device=rows.device) - (torch.cumsum(sizes, 0) - sizes)[expert_of]
    padded = rows.new_zeros(len(counts), max(counts), rows.shape[1])
    padded[expert_of, slot] = rows
    act = torch_ops.silu_and_mul(torch.bmm(padded, w13.transpose(1, 2)))
    return torch.bmm(act, w2.transpose(1, 2))[expert_of, slot]
