"""KV write in Triton: scatter each new token's K and V rows into its slot in the pools.

One program per token copies that token's [Hkv, D] K and V tiles into
pool[slot // block_size, slot % block_size]. Strides are passed explicitly, so `key` and
`value` may be column slices of a fused QKV projection without a copy. A negative slot
means "padding, do not write" (the runner pads batches for CUDA graphs).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_key_t,
    stride_key_h,
    stride_value_t,
    stride_value_h,
    stride_k_blk,
    stride_k_tok,
    stride_k_h,
    stride_v_blk,
    stride_v_tok,
    stride_v_h,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE_SIZE
    in_page = slot % PAGE_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    row = token.to(tl.int64)
    k = tl.load(
        key_ptr + row * stride_key_t + offs_h[:, None] * stride_key_h + offs_d[None, :],
        mask=mask,
    )
    v = tl.load(
        value_ptr + row * stride_value_t + offs_h[:, None] * stride_value_h + offs_d[None, :],
        mask=mask,
    )
    k_dst = k_cache_ptr + page * stride_k_blk + in_page * stride_k_tok
    v_dst = v_cache_ptr + page * stride_v_blk + in_page * stride_v_tok
    tl.store(k_dst + offs_h[:, None] * stride_k_h + offs_d[None, :], k, mask=mask)
    tl.store(v_dst + offs_h[:, None] * stride_v_h + offs_d[None, :], v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [T, Hkv, D] -> k_cache/v_cache [num_blocks, block_size, Hkv, D] at slot_mapping [T]."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert key.dtype == k_cache.dtype and value.dtype == v_cache.dtype
    assert key.stride(-1) == 1 and value.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE_SIZE=k_cache.shape[1],
        num_warps=4,
    )
