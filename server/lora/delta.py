"""The LoRA delta for a batch whose rows use different adapters: computed per row group
(each adapter's rows gathered, x @ A^T @ B^T scaled), never by merging weights."""

from __future__ import annotations

import torch


def lora_delta(
    x: torch.Tensor,
    row_slots: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    scalings: torch.Tensor,
) -> torch.Tensor:
    """x [rows, in]; row_slots [rows] (slot per row, -1: the base model, no delta);
    a_stack [slots, rank, in], b_stack [slots, out, rank] (zero-padded to the max rank);
    scalings [slots]. Returns the delta [rows, out]."""
    out = x.new_zeros(x.shape[0], b_stack.shape[1])
    for slot in torch.unique(row_slots).tolist():
        if slot < 0:
            continue
        rows = (row_slots == slot).nonzero(as_tuple=True)[0]
        xs = x.index_select(0, rows)
        out.index_copy_(0, rows, (xs @ a_stack[slot].T @ b_stack[slot].T) * scalings[slot])
    return out
