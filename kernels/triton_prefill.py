"""Paged prefill / extend attention in Triton: all prefill chunks of a step in one launch.

Each sequence contributes a chunk of q_len new tokens whose K/V were already written to
the paged cache (reshape_and_cache runs first), on top of ctx = seq_len - q_len earlier
tokens: a prefix-cache hit, or the previous chunks of a chunked prefill. New token i
sits at position ctx + i and sees positions 0..ctx + i. Reading everything, prefix and
new tokens alike, through the block table keeps one code path for fresh prefills,
prefix hits and chunked prefill.

Grid: (query tiles, sequences, KV heads). A tile's BLOCK_M rows are BLOCK_M // GROUP
query tokens times the GROUP query heads that share the program's KV head, so each K/V
tile is loaded once for the whole group (GQA packing). Programs past their sequence's
chunk exit at once; that costs little next to the real tiles, and avoids a
host-built tile->sequence map (and its per-step upload). Each program walks KV tiles
from position 0 up to the causal limit of its last query row (tiles above the diagonal
are skipped) with one causal mask on every tile: a separate unmasked loop for the tiles
below the diagonal would save a compare-and-select per score on a GPU, but doubles the
code and, under the interpreter, the per-op cost. Softmax is online (flash-attention),
in fp32 and in the log2 domain.

fp8 pools (kv_quant.py) are read as bytes: KV_FP8 decodes each e4m3 K/V value
(triton_fp8.py), multiplies it by its pool's scale and rounds it to q's dtype, the
values the torch path's dequantizing gather gives, before the same dot products.
"""

import torch
import triton
import triton.language as tl
from llmservice.kernels import kv_quant
from llmservice.kernels.triton_common import dot_config, round_bf16
from llmservice.kernels.triton_decode import LOG2E
from llmservice.kernels.triton_fp8 import load_kv_tile


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
    k_scale,
    v_scale,
    stride_q_t,
    stride_q_h,
    stride_o_t,
    stride_o_h,
    stride_kv_blk,
    stride_kv_tok,
    stride_kv_h,
    stride_bt_b,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = first_seq + tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx = seq_len - q_len

    # Row r of the tile is query token tile * BLOCK_Q + r // GROUP, head r % GROUP of
    # this KV head's group: all heads sharing a KV head share one pass over K/V.
    offs_r = tl.arange(0, BLOCK_M)
    offs_q = tile * BLOCK_Q + offs_r // GROUP
    heads = kv_head * GROUP + offs_r % GROUP
    mask_r = (offs_r < BLOCK_Q * GROUP) & (offs_q < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    io_mask = mask_r[:, None] & mask_d[None, :]
    rows = (q_start + offs_q).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :],
        mask=io_mask,
        other=0.0,
    )
    if EMULATE_BF16:
        q = q.to(tl.float32)
    pos_q = (ctx + offs_q)[:, None]

    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    table = block_tables_ptr + seq * stride_bt_b
    k_base = k_cache_ptr + kv_head * stride_kv_h + offs_d[None, :]
    v_base = v_cache_ptr + kv_head * stride_kv_h + offs_d[None, :]

    # Causal tile skipping: the tile's last query token sees up to position ctx + its index.
    kv_end = tl.minimum(seq_len, ctx + (tile + 1) * BLOCK_Q)
    for n0 in range(0, kv_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_end
        page = tl.load(table + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        token = (page * stride_kv_blk + (offs_n % PAGE_SIZE) * stride_kv_tok)[:, None]
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k, v = load_kv_tile(k_base + token, v_base + token, kv_mask, k_scale, v_scale, q_ptr, KV_FP8, EMULATE_BF16)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # log2 domain
        # one mask covers causality and the ragged end (offs_n >= kv_end > pos_q never both)
        s = tl.where(offs_n[None, :] <= pos_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    result = acc / l_i[:, None]
    if EMULATE_BF16:
        result = round_bf16(result)
    tl.store(
        out_ptr + rows[:, None] * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :],
        result.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


def _tiles(head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): 64x64 keeps q, K, V and the accumulator in registers up to D=128.

    BLOCK_M counts rows (query tokens x heads of one GQA group), not tokens.
    """
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
    fp8 pools are read with their own scales (`kv_scale`, kv_quant.py).
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride(), "K and V pools share one layout"
    if out is None:
        out = torch.empty_like(q)
    if num_seqs is None:
        num_seqs = query_start_loc.shape[0] - 1 - first_seq
    if num_seqs <= 0 or max_query_len <= 0:
        return out
    group = num_heads // num_kv_heads
    default_m, default_n = _tiles(head_dim)
    block_m = max(block_m or default_m, triton.next_power_of_2(group))
    block_n = block_n or default_n
    block_q = block_m // group
    grid = (triton.cdiv(max_query_len, block_q), num_seqs, num_kv_heads)
    fp8 = kv_quant.is_quantized(k_cache)
    assert kv_quant.is_quantized(v_cache) == fp8, "K and V pools share one dtype"
    _prefill_kernel[grid](
        q,
        out,
        kv_quant.as_bytes(k_cache),
        kv_quant.as_bytes(v_cache),
        block_tables,
        seq_lens,
        query_start_loc,
        first_seq,
        scale * LOG2E,
        kv_quant.scale_of(k_cache),
        kv_quant.scale_of(v_cache),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE_SIZE=page_size,
        KV_FP8=fp8,
        num_warps=num_warps,
        num_stages=num_stages,
        **dot_config(_prefill_kernel, q.dtype),
    )
    return out
