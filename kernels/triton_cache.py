"""KV write in Triton: scatter each new token's K and V rows into its slot in the pools.

Token t goes to pool[slot // block_size, slot % block_size]. In the pool layout
[num_blocks, block_size, Hkv, D] one token's [Hkv, D] rows are contiguous, and so are
they in `key`/`value` when those are column slices of a fused QKV projection (rows of
Hkv * D contiguous values, any row stride), so each token is one flat run of Hkv * D
values: a program copies BLOCK_T such runs, no per-head indexing. A negative slot means
"padding, do not write" (the runner may pad batches for CUDA graphs).

fp8 pools (kv_quant.py) arrive as uint8 views with their two scales; with KV_FP8 each
value is stored as e4m3(x / scale), saturated to +-448 (triton_fp8.py), the same bytes
as kv_quant.quantize: the division is IEEE (div_rn), as torch's on the CPU.
"""

import torch
import triton
import triton.language as tl
from llmservice.kernels import kv_quant
from llmservice.kernels.triton_fp8 import f32_to_e4m3


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
    k_scale,
    v_scale,
    ROW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_ROW: tl.constexpr,
    KV_FP8: tl.constexpr,
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
    if KV_FP8:
        k = f32_to_e4m3(tl.div_rn(k.to(tl.float32), k_scale))
        v = f32_to_e4m3(tl.div_rn(v.to(tl.float32), v_scale))
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [T, Hkv, D] -> k_cache/v_cache [num_blocks, block_size, Hkv, D] at slot_mapping [T].

    fp8 pools are quantized with their own scales (`kv_scale`, kv_quant.py).
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    fp8 = kv_quant.is_quantized(k_cache)
    assert kv_quant.is_quantized(v_cache) == fp8, "K and V pools share one dtype"
    assert fp8 or (key.dtype == k_cache.dtype and value.dtype == v_cache.dtype)
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
        kv_quant.as_bytes(k_cache),
        kv_quant.as_bytes(v_cache),
        slot_mapping,
        num_tokens,
        key.stride(0),
        value.stride(0),
        k_cache.stride(1),
        kv_quant.scale_of(k_cache),
        kv_quant.scale_of(v_cache),
        ROW=row,
        BLOCK_T=block_t,
        BLOCK_ROW=block_row,
        KV_FP8=fp8,
        num_warps=4,
    )
