"""The LoRA delta in Triton: shrink (x @ A^T) and expand (+= scaling * s @ B^T into the
output's columns), punica-style, for rows of many adapters in one launch each.

Layout (server/lora/weights.py): a projection group (fused q/k/v, o, fused gate/up,
down) keeps its modules' stacks side by side, `a [slots, n_modules * R, in]` and
`b [slots, sum(widths), R]`, zero-padded to R = --max-lora-rank. So the shrink of all the
group's modules is one gather-GEMM `x [rows, in] -> s [rows, n_modules * R]`, and the
expand reads module m's R columns of `s` against its B rows, writing into the same
columns m has in the fused output (the module's column offset in `b` and in `out` is the
same). A module an adapter does not target has zero A/B and adds zero.

Rows come as `LoRATiles` (lora_rows.py): tiles of rows sharing a slot, gathered by row
index (a segmented gather, SGMV-style; decode rows are tiles of each adapter's decode
rows, so one kernel pair serves prefill and decode, sorted or not). Rows of slot -1 are
in no tile and stay untouched, like every column outside `out`.

Shrink splits `in` across programs when there are few tiles (decode with one adapter
would otherwise run a handful of programs over a 4096-wide K); the splits' fp32 partial
sums go to a [splits, rows, n_modules * R] workspace that the expand sums, so the result
does not depend on scheduling (no atomics). Everything accumulates in fp32; the output
is rounded once, when the scaled delta is added.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from llmservice.kernels.lora_rows import LoRATiles
from llmservice.kernels.triton_common import dot_config, emulate_bf16, round_bf16

MAX_MODULES = 3  # the widest fused group (q/k/v)
EXPAND_BLOCK_N = 64
TARGET_PROGRAMS = 256  # shrink programs to aim for before splitting K further


@triton.jit
def _lora_shrink_kernel(
    x_ptr,
    a_ptr,
    s_ptr,
    row_ids_ptr,
    tile_slot_ptr,
    tile_start_ptr,
    tile_rows_ptr,
    stride_xm,
    stride_as,
    stride_ar,
    stride_sp,
    stride_sm,
    num_in,
    num_out,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    slot = tl.load(tile_slot_ptr + tile).to(tl.int64)
    start = tl.load(tile_start_ptr + tile)
    num_rows = tl.load(tile_rows_ptr + tile)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < num_rows
    rows = tl.load(row_ids_ptr + start + offs_m, mask=m_mask, other=0).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    n_mask = offs_n < num_out
    offs_k = tl.arange(0, BLOCK_K)
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, num_in)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < k_end
        xt = tl.load(
            x_ptr + rows[:, None] * stride_xm + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0
        )
        at = tl.load(
            a_ptr + slot * stride_as + offs_n[None, :] * stride_ar + k[:, None],
            mask=n_mask[None, :] & k_mask[:, None],
            other=0.0,
        )
        if EMULATE_BF16:
            xt = xt.to(tl.float32)
            at = at.to(tl.float32)
        acc = tl.dot(xt, at, acc, input_precision=PRECISION)
    s_ptrs = s_ptr + split * stride_sp + rows[:, None] * stride_sm + offs_n[None, :]
    tl.store(s_ptrs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _lora_expand_kernel(
    s_ptr,
    b_ptr,
    out_ptr,
    scaling_ptr,
    row_ids_ptr,
    tile_slot_ptr,
    tile_start_ptr,
    tile_rows_ptr,
    stride_sp,
    stride_sm,
    stride_bs,
    stride_bn,
    stride_om,
    num_splits,
    rank,
    width0,
    width1,
    width2,
    blocks0,
    blocks1,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    tile = tl.program_id(0)
    block = tl.program_id(1)  # column blocks of all modules, module by module
    module = (block >= blocks0).to(tl.int32) + (block >= blocks0 + blocks1).to(tl.int32)
    first_block = tl.where(module == 0, 0, tl.where(module == 1, blocks0, blocks0 + blocks1))
    col_start = tl.where(module == 0, 0, tl.where(module == 1, width0, width0 + width1))
    width = tl.where(module == 0, width0, tl.where(module == 1, width1, width2))
    slot = tl.load(tile_slot_ptr + tile).to(tl.int64)
    start = tl.load(tile_start_ptr + tile)
    num_rows = tl.load(tile_rows_ptr + tile)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < num_rows
    rows = tl.load(row_ids_ptr + start + offs_m, mask=m_mask, other=0).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < rank
    cols = (block - first_block) * BLOCK_N + tl.arange(0, BLOCK_N)
    c_mask = cols < width
    s_ptrs = s_ptr + rows[:, None] * stride_sm + (module * rank + offs_r)[None, :]
    s_mask = m_mask[:, None] & r_mask[None, :]
    s = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for split in range(0, num_splits):
        s += tl.load(s_ptrs + split * stride_sp, mask=s_mask, other=0.0)
    bt = tl.load(
        b_ptr + slot * stride_bs + (col_start + cols)[None, :] * stride_bn + offs_r[:, None],
        mask=r_mask[:, None] & c_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    delta = tl.dot(s, bt, input_precision=PRECISION) * tl.load(scaling_ptr + slot).to(tl.float32)
    o_ptrs = out_ptr + rows[:, None] * stride_om + (col_start + cols)[None, :]
    o_mask = m_mask[:, None] & c_mask[None, :]
    total = tl.load(o_ptrs, mask=o_mask, other=0.0).to(tl.float32) + delta
    if EMULATE_BF16:
        total = round_bf16(total)
    tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=o_mask)


def _shrink_blocks(num_out: int, dtype: torch.dtype) -> tuple[int, int]:
    block_n = max(16, triton.next_power_of_2(num_out))
    block_k = 32 if dtype == torch.float32 or block_n >= 256 else 64
    return block_n, block_k


def choose_num_splits(num_tiles: int, num_in: int, block_k: int) -> int:
    """K splits so a step with few tiles still runs about TARGET_PROGRAMS programs,
    each over at least four K blocks."""
    by_programs = max(1, TARGET_PROGRAMS // num_tiles)
    by_length = max(1, num_in // (4 * block_k))
    return min(by_programs, by_length)


def lora_shrink(
    x: torch.Tensor, a: torch.Tensor, tiles: LoRATiles, *, num_splits: int | None = None
) -> torch.Tensor:
    """x [rows, in], a [slots, N, in] -> fp32 partial sums [splits, rows, N] of x @ A[slot]^T
    for the tiles' rows (the other rows of the workspace are left unwritten)."""
    rows, num_in = x.shape
    num_out = a.shape[1]
    assert a.shape[2] == num_in and x.stride(1) == 1 and a.stride(2) == 1
    block_n, block_k = _shrink_blocks(num_out, x.dtype)
    splits = num_splits or choose_num_splits(tiles.num_tiles, num_in, block_k)
    k_per_split = triton.cdiv(triton.cdiv(num_in, block_k), splits) * block_k
    s = torch.empty(splits, rows, num_out, dtype=torch.float32, device=x.device)
    _lora_shrink_kernel[(tiles.num_tiles, splits)](
        x, a, s, tiles.row_ids, tiles.tile_slot, tiles.tile_start, tiles.tile_rows,
        x.stride(0), a.stride(0), a.stride(1), s.stride(0), s.stride(1),
        num_in, num_out, k_per_split,
        BLOCK_M=tiles.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        **dot_config(_lora_shrink_kernel, x.dtype),
        num_warps=4 if block_n * tiles.block_m <= 4096 else 8,
    )  # fmt: skip
    return s


def lora_expand(
    s: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    scalings: torch.Tensor,
    tiles: LoRATiles,
    widths: tuple[int, ...],
) -> None:
    """out[row, module m's columns] += scalings[slot] * s[:, row, m's R columns] @ B_m[slot]^T,
    summing the shrink's splits; b [slots, sum(widths), R], out [rows, sum(widths)]."""
    assert 1 <= len(widths) <= MAX_MODULES and b.shape[1] == sum(widths) == out.shape[1]
    assert out.stride(1) == 1 and b.stride(2) == 1 and s.stride(2) == 1
    rank = b.shape[2]
    assert s.shape[2] == rank * len(widths)
    w = list(widths) + [0] * (MAX_MODULES - len(widths))
    blocks = [triton.cdiv(width, EXPAND_BLOCK_N) for width in w]
    emulate = emulate_bf16(_lora_expand_kernel, b.dtype, out.dtype)
    _lora_expand_kernel[(tiles.num_tiles, sum(blocks))](
        s, b, out, scalings, tiles.row_ids, tiles.tile_slot, tiles.tile_start, tiles.tile_rows,
        s.stride(0), s.stride(1), b.stride(0), b.stride(1), out.stride(0),
        s.shape[0], rank, w[0], w[1], w[2], blocks[0], blocks[1],
        BLOCK_M=tiles.block_m, BLOCK_N=EXPAND_BLOCK_N, BLOCK_R=max(16, triton.next_power_of_2(rank)),
        PRECISION="ieee" if b.dtype == torch.float32 else "tf32", EMULATE_BF16=emulate,
        num_warps=4,
    )  # fmt: skip


def add_lora(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scalings: torch.Tensor,
    tiles: LoRATiles | None,
    widths: tuple[int, ...],
    out: torch.Tensor,
    *,
    num_splits: int | None = None,
) -> torch.Tensor:
    """out += the LoRA delta of every tiled row (one shrink and one expand launch);
    `out` may be a column slice of a wider tensor. Returns out."""
    if tiles is not None and tiles.num_tiles:
        lora_expand(lora_shrink(x, a, tiles, num_splits=num_splits), b, out, scalings, tiles, widths)
    return out
