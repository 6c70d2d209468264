"""KV write in Triton: scatter each new token's K and V rows into its slot in the pools.

Token t goes to pool[slot // block_size, slot % block_size]. In the pool layout
[num_blocks, block_size, Hkv, D] one token's [Hkv, D] rows are contiguous, and so are
they in `key`/`value` when those are column slices of a fused QKV projection (rows of
Hkv * D contiguous values, any row stride), so each token is one flat run of Hkv * D
values: a program copies BLOCK_T such runs, no per-head indexing. A negative slot means
"padding, do not write" (the runner may pad batches for CUDA graphs).
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
    num_tokens,
    stride_key_t,
    stride_value_t,
    stride_cache_tok,
    ROW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_ROW: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slots = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    offs = tl.arange(0, BLOCK_ROW)[None, :]
    mask = (slots >= 0)[:, None] & (offs < ROW)
    rows = tokens.to(tl.int64)[:, None]
    # a dense pool is a flat array of token rows: slot * stride(1) addresses token `slot`
    dst = slots[:, None] * stride_cache_tok + offs
    k = tl.load(key_ptr + rows * stride_key_t + offs, mask=mask)
    v = tl.load(value_ptr + rows * stride_value_t + offs, mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


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
    row = num_kv_heads * head_dim
    assert key.dtype == k_cache.dtype and value.dtype == v_cache.dtype
    for t in (key, value):
        assert t.stride(2) == 1 and t.stride(1) == head_dim, (
            "each token's K/V must be one dense row"
        )
    for c in (k_cache, v_cache):
        assert c.is_contiguous(), "the KV pool must be dense"
    assert k_cache.shape == v_cache.shape
    block_row = triton.next_power_of_2(row)
    block_t = max(1, min(64, 4096 // block_row))
    _reshape_and_cache_kernel[(triton.cdiv(num_tokens, block_t),)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        num_tokens,
        key.stride(0),
        value.stride(0),
        k_cache.stride(1),
        ROW=row,
        BLOCK_T=block_t,
        BLOCK_ROW=block_row,
        num_warps=4,
    )
