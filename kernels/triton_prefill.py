"""Paged prefill / extend attention in Triton: all prefill chunks of a step in one launch.

Each sequence contributes a chunk of q_len new tokens whose K/V were already written to
the paged cache (reshape_and_cache runs first), on top of ctx = seq_len - q_len earlier
tokens: a prefix-cache hit, or the previous chunks of a chunked prefill. New token i
sits at position ctx + i and sees positions 0..ctx + i. Reading everything, prefix and
new tokens alike, through the block table keeps one code path for fresh prefills,
prefix hits and chunked prefill.

Grid: (query tiles of BLOCK_M tokens, sequences, query heads). Programs past their
sequence's chunk exit at once; that costs little next to the real tiles, and avoids a
host-built tile->sequence map (and its per-step upload). Within a program the KV loop
runs in two phases: tiles entirely below the tile's first query position need no mask,
then the few diagonal tiles are masked causally; tiles above the diagonal are skipped.
Softmax is online (flash-attention) in fp32 and in the log2 domain.
"""

import torch
import triton
import triton.language as tl

from llmservice.kernels.triton_common import dot, dot_config, round_to
from llmservice.kernels.triton_decode import LOG2E


@triton.jit
def _attend_tiles(
    acc,
    m_i,
    l_i,
    q,
    k_cache_ptr,
    v_cache_ptr,
    table,
    kv_head,
    lo,
    hi,
    seq_len,
    pos_q,
    qk_scale,
    stride_k_blk,
    stride_k_tok,
    stride_k_h,
    stride_v_blk,
    stride_v_tok,
    stride_v_h,
    offs_d,
    mask_d,
    CAUSAL_MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """Online-softmax update of (acc, m_i, l_i) with KV positions [lo, hi)."""
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < seq_len
        page = tl.load(table + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        in_page = offs_n % PAGE_SIZE
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(
            k_cache_ptr
            + page[:, None] * stride_k_blk
            + in_page[:, None] * stride_k_tok
            + kv_head * stride_k_h
            + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = dot(q, tl.trans(k), PRECISION, EMULATE_BF16) * qk_scale
        if CAUSAL_MASK:
            visible = (offs_n[None, :] <= pos_q[:, None]) & mask_n[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_cache_ptr
            + page[:, None] * stride_v_blk
            + in_page[:, None] * stride_v_tok
            + kv_head * stride_v_h
            + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, EMULATE_BF16)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _prefill_kernel(
    q_ptr,
    out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    first_seq,
    qk_scale,
    stride_q_t,
    stride_q_h,
    stride_o_t,
    stride_o_h,
    stride_k_blk,
    stride_k_tok,
    stride_k_h,
    stride_v_blk,
    stride_v_tok,
    stride_v_h,
    stride_bt_b,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = first_seq + tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx = seq_len - q_len
    kv_head = head // GROUP

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < q_len
    mask_d = offs_d < HEAD_DIM
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_q_t + head * stride_q_h + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )
    pos_q = ctx + offs_m

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    table = block_tables_ptr + seq * stride_bt_b

    # Every query row of this tile sees at least positions 0..ctx + tile * BLOCK_M.
    first_pos = ctx + tile * BLOCK_M
    unmasked_end = ((first_pos + 1) // BLOCK_N) * BLOCK_N
    causal_end = tl.minimum(seq_len, first_pos + BLOCK_M)
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, table, kv_head, 0, unmasked_end,
        seq_len, pos_q, qk_scale, stride_k_blk, stride_k_tok, stride_k_h,
        stride_v_blk, stride_v_tok, stride_v_h, offs_d, mask_d,
        False, BLOCK_N, PAGE_SIZE, PRECISION, EMULATE_BF16,
    )  # fmt: skip
    acc, m_i, l_i = _attend_tiles(
        acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, table, kv_head, unmasked_end, causal_end,
        seq_len, pos_q, qk_scale, stride_k_blk, stride_k_tok, stride_k_h,
        stride_v_blk, stride_v_tok, stride_v_h, offs_d, mask_d,
        True, BLOCK_N, PAGE_SIZE, PRECISION, EMULATE_BF16,
    )  # fmt: skip

    result = acc / l_i[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_o_t + head * stride_o_h + offs_d[None, :],
        round_to(result, out_ptr.dtype.element_ty, EMULATE_BF16),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def _tiles(head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): 64x64 keeps q, K, V and the accumulator in registers up to D=128."""
    return (64, 64) if head_dim <= 128 else (32, 32)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int,
    first_seq: int = 0,
    num_seqs: int | None = None,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Causal attention for sequences first_seq.. of a flat batch q [T, Hq, D].

    query_start_loc [B + 1] gives each sequence's rows in q; only the rows of sequences
    first_seq..first_seq + num_seqs - 1 are written to `out` (decodes placed before
    them are left alone). `max_query_len` (host int) sizes the grid without a sync.
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    if out is None:
        out = torch.empty_like(q)
    if num_seqs is None:
        num_seqs = query_start_loc.shape[0] - 1 - first_seq
    if num_seqs <= 0 or max_query_len <= 0:
        return out
    default_m, default_n = _tiles(head_dim)
    block_m = block_m or default_m
    block_n = block_n or default_n
    grid = (triton.cdiv(max_query_len, block_m), num_seqs, num_heads)
    _prefill_kernel[grid](
        q,
        out,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        first_seq,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE_SIZE=page_size,
        num_warps=num_warps,
        num_stages=num_stages,
        **dot_config(_prefill_kernel, q.dtype),
    )
    return out
