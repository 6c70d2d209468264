"""Paged decode attention in Triton: split-KV (flash-decoding) with a second reduction pass.

A decode step has one query token per sequence, so a kernel with one program per
(sequence, head) launches only B * H programs: at batch 1-8 that leaves most of a GPU's
SMs idle while a single program walks a 32k-token context. Split-KV fixes this: stage 1
cuts each sequence's context into `num_splits` contiguous ranges and launches
B * Hkv * num_splits programs, each producing a partial output normalised by its own
softmax sum plus that range's log-sum-exp; stage 2 merges the partials per (sequence,
head) by LSE rescaling, which is exact. The split count is chosen per step from the
batch shape (`choose_num_splits`): large batches already fill the GPU and get one split,
in which case stage 1 writes the output itself and stage 2 is not launched.

GQA: one stage-1 program serves all query heads that share a KV head (padded to a tile
of >= 16 rows for tl.dot), so each K/V byte is read once per KV head, not once per query
head. Inputs may be fp16, bf16 or fp32; scores, softmax and accumulators are fp32.

fp8 pools (kv_quant.py) are read as bytes: KV_FP8 decodes each e4m3 K/V value
(triton_fp8.py), multiplies it by its pool's scale and rounds it to q's dtype, the
values the torch path's dequantizing gather gives, before the same dot products.
"""

import functools

import torch
import triton
import triton.language as tl
from llmservice.kernels import kv_quant
from llmservice.kernels.triton_common import dot_config, emulate_bf16, round_bf16
from llmservice.kernels.triton_fp8 import load_kv_tile

LOG2E = 1.4426950408889634
MIN_TOKENS_PER_SPLIT = 256


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    qk_scale,
    k_scale,
    v_scale,
    num_splits,
    stride_q_b,
    stride_q_h,
    stride_kv_blk,
    stride_kv_tok,
    stride_kv_h,
    stride_bt_b,
    stride_mo_b,
    stride_mo_h,
    stride_mo_s,
    stride_ml_b,
    stride_ml_h,
    stride_o_b,
    stride_o_h,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """Stage 1: one KV range of one sequence for all query heads of one KV head.

    With SINGLE_SPLIT the range is the whole context and the final output is written
    directly (large batches need no merge pass).
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    split_len = ((seq_len + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if start >= end:
        return  # empty split: stage 2 never reads it

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h

    q = tl.load(
        q_ptr + seq * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )
    if EMULATE_BF16:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_H], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_H, BLOCK_D], 0.0, dtype=tl.float32)
    table = block_tables_ptr + seq * stride_bt_b
    k_base = k_cache_ptr + kv_head * stride_kv_h + offs_d[None, :]
    v_base = v_cache_ptr + kv_head * stride_kv_h + offs_d[None, :]

    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        page = tl.load(table + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        token = (page * stride_kv_blk + (offs_n % PAGE_SIZE) * stride_kv_tok)[:, None]
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k, v = load_kv_tile(k_base + token, v_base + token, kv_mask, k_scale, v_scale, q_ptr, KV_FP8, EMULATE_BF16)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # log2 domain
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out_mask = mask_h[:, None] & mask_d[None, :]
    if SINGLE_SPLIT:
        result = acc / l_i[:, None]
        if EMULATE_BF16:
            result = round_bf16(result)
        tl.store(
            out_ptr + seq * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :],
            result.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )
    else:
        tl.store(
            mid_o_ptr
            + seq * stride_mo_b
            + heads[:, None] * stride_mo_h
            + split * stride_mo_s
            + offs_d[None, :],
            acc / l_i[:, None],
            mask=out_mask,
        )
        tl.store(
            mid_lse_ptr + seq * stride_ml_b + heads * stride_ml_h + split,
            m_i + tl.log2(l_i),
            mask=mask_h,
        )


@triton.jit
def _decode_reduce_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    seq_lens_ptr,
    num_splits,
    num_heads,
    stride_mo_b,
    stride_mo_h,
    stride_mo_s,
    stride_ml_b,
    stride_ml_h,
    stride_o_b,
    stride_o_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_HR: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    """Stage 2: merge the non-empty splits of BLOCK_HR heads of one sequence by LSE rescaling."""
    seq = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_HR + tl.arange(0, BLOCK_HR)
    seq_len = tl.load(seq_lens_ptr + seq)
    split_len = ((seq_len + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    used = (seq_len + split_len - 1) // tl.maximum(split_len, 1)

    offs_d = tl.arange(0, BLOCK_D)
    mask_h = heads < num_heads
    mask = mask_h[:, None] & (offs_d < HEAD_DIM)[None, :]
    lse_ptrs = mid_lse_ptr + seq * stride_ml_b + heads * stride_ml_h
    part_ptrs = mid_o_ptr + seq * stride_mo_b + heads[:, None] * stride_mo_h + offs_d[None, :]
    m = tl.full([BLOCK_HR], float("-inf"), dtype=tl.float32)
    l_sum = tl.full([BLOCK_HR], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_HR, BLOCK_D], 0.0, dtype=tl.float32)
    for s in range(0, used):
        lse = tl.load(lse_ptrs + s, mask=mask_h, other=0.0)
        part = tl.load(part_ptrs + s * stride_mo_s, mask=mask, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp2(m - m_new)
        beta = tl.exp2(lse - m_new)
        acc = acc * alpha[:, None] + part * beta[:, None]
        l_sum = l_sum * alpha + beta
        m = m_new
    result = tl.where(l_sum[:, None] > 0, acc / l_sum[:, None], 0.0)
    if EMULATE_BF16:
        result = round_bf16(result)
    tl.store(
        out_ptr + seq * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :],
        result.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few splits so the CPU path exercises the merge


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """How many KV ranges per sequence so that stage 1 fills the GPU about twice over.

    Splitting below MIN_TOKENS_PER_SPLIT tokens costs more in the merge than it gains.
    """
    programs = max(batch * num_kv_heads, 1)
    wanted = triton.cdiv(2 * num_sms, programs)
    by_length = triton.cdiv(max(max_seq_len, 1), MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, by_length, 64))


def _block_n(head_dim: int) -> int:
    return 64 if head_dim <= 128 else 32


def decode_workspace(
    batch: int, num_heads: int, head_dim: int, num_splits: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 partial outputs [B, Hq, S, D] and LSEs [B, Hq, S] stage 1 writes."""
    mid_o = torch.empty(
        (batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=device
    )
    mid_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=device)
    return mid_o, mid_lse


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """q [B, Hq, D] -> out [B, Hq, D]; K/V [num_blocks, block_size, Hkv, D]; seq_lens [B] int32.

    `max_seq_len` (a host int) sizes the split count without a device sync; pass
    `num_splits` to fix it (tests, CUDA graphs). `workspace` reuses preallocated
    stage-1 buffers (see `decode_workspace`); with one split there is no stage 2 and no
    workspace. Every sequence must have seq_len >= 1. fp8 pools are read with their own
    scales (`kv_scale`, kv_quant.py).
    """
    batch, num_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride(), "K and V pools share one layout"
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens[:batch].max())
        num_splits = choose_num_splits(batch, num_kv_heads, max_seq_len, _num_sms(q.device))
    single = num_splits == 1
    if workspace is None and not single:
        workspace = decode_workspace(batch, num_heads, head_dim, num_splits, q.device)
    if single:  # stage 1 writes `out` directly; the workspace pointers go unused
        mid_o, mid_lse = out, out
        mid_o_strides, mid_lse_strides = (0, 0, 0), (0, 0)
    else:
        mid_o, mid_lse = workspace
        assert mid_o.shape[2] >= num_splits and mid_lse.shape[2] >= num_splits
        mid_o_strides, mid_lse_strides = mid_o.stride()[:3], mid_lse.stride()[:2]

    group = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    block_n = _block_n(head_dim)
    fp8 = kv_quant.is_quantized(k_cache)
    assert kv_quant.is_quantized(v_cache) == fp8, "K and V pools share one dtype"
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        kv_quant.as_bytes(k_cache),
        kv_quant.as_bytes(v_cache),
        block_tables,
        seq_lens,
        mid_o,
        mid_lse,
        out,
        scale * LOG2E,
        kv_quant.scale_of(k_cache),
        kv_quant.scale_of(v_cache),
        num_splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        *mid_o_strides,
        *mid_lse_strides,
        out.stride(0),
        out.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        PAGE_SIZE=page_size,
        SINGLE_SPLIT=single,
        KV_FP8=fp8,
        num_warps=num_warps,
        num_stages=num_stages,
        **dot_config(_decode_split_kernel, q.dtype),
    )
    if single:
        return out
    block_hr = min(16, triton.next_power_of_2(num_heads))
    _decode_reduce_kernel[(batch, triton.cdiv(num_heads, block_hr))](
        mid_o,
        mid_lse,
        out,
        seq_lens,
        num_splits,
        num_heads,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_HR=block_hr,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        EMULATE_BF16=emulate_bf16(_decode_reduce_kernel, out.dtype),
        num_warps=4,
    )
    return out
