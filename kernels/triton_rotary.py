"""Rotary position embedding in Triton, applied in place to q and k in one launch.

Rotate-half (NeoX / HF Llama) convention, matching `torch_ops.rotary_embedding`: with
half = D / 2, (x1, x2) = (x[:half], x[half:]) becomes
(x1 * cos - x2 * sin, x2 * cos + x1 * sin). cos_sin_cache [max_positions, D] holds
cat(cos, sin) per position. One program per token loads that token's cos/sin row once
and rotates all its query and key heads, computing in fp32 and rounding once on store.
q and k may be strided views into a fused QKV output; only the last dim must be dense.
"""

import torch
import triton
import triton.language as tl
from llmservice.kernels.triton_common import emulate_bf16, round_bf16


@triton.jit
def _rotary_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    cos_sin_ptr,
    stride_q_t,
    stride_q_h,
    stride_k_t,
    stride_k_h,
    stride_cs,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + row).to(tl.int64)
    offs_half = tl.arange(0, BLOCK_HALF)
    mask_half = offs_half < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_half, mask=mask_half, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_half, mask=mask_half, other=0.0)
    cos = cos.to(tl.float32)[None, :]
    sin = sin.to(tl.float32)[None, :]

    # query heads (written out twice rather than through a helper: see triton_common)
    offs_h = tl.arange(0, BLOCK_HQ)
    mask = (offs_h[:, None] < NUM_Q_HEADS) & mask_half[None, :]
    ptrs = q_ptr + row * stride_q_t + offs_h[:, None] * stride_q_h + offs_half[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if EMULATE_BF16:
        y1 = round_bf16(y1)
        y2 = round_bf16(y2)
    tl.store(ptrs, y1.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, y2.to(q_ptr.dtype.element_ty), mask=mask)

    # key heads
    offs_h = tl.arange(0, BLOCK_HK)
    mask = (offs_h[:, None] < NUM_K_HEADS) & mask_half[None, :]
    ptrs = k_ptr + row * stride_k_t + offs_h[:, None] * stride_k_h + offs_half[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if EMULATE_BF16:
        y1 = round_bf16(y1)
        y2 = round_bf16(y2)
    tl.store(ptrs, y1.to(k_ptr.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, y2.to(k_ptr.dtype.element_ty), mask=mask)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place at positions [T]."""
    num_tokens, num_q_heads, head_dim = q.shape
    assert cos_sin_cache.shape[-1] == head_dim, "rotary over the full head dim only"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        positions,
        q,
        k,
        cos_sin_cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin_cache.stride(0),
        NUM_Q_HEADS=num_q_heads,
        NUM_K_HEADS=k.shape[1],
        HALF=half,
        BLOCK_HQ=triton.next_power_of_2(num_q_heads),
        BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
        EMULATE_BF16=emulate_bf16(_rotary_kernel, q.dtype, k.dtype),
        num_warps=4,
    )
