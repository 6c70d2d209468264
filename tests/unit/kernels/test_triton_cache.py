"""KV write by slot mapping (Triton, interpreter on CPU) against the reference."""

import pytest
import torch
from llmservice.kernels import reference
from llmservice.kernels.triton_cache import reshape_and_cache


def _fused_kv(tokens: int, num_kv_heads: int, head_dim: int, dtype, device, seed: int):
    """key/value as strided column slices of one fused QKV tensor, like the model makes them."""
    gen = torch.Generator().manual_seed(seed)
    q_width = 4 * num_kv_heads * head_dim
    kv_width = num_kv_heads * head_dim
    qkv = torch.randn(tokens, q_width + 2 * kv_width, generator=gen).to(device=device, dtype=dtype)
    _, key, value = qkv.split([q_width, kv_width, kv_width], dim=-1)
    shape = (tokens, num_kv_heads, head_dim)
    return key.view(shape), value.view(shape)


@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_writes_exactly_the_mapped_slots(block_size, dtype, device):
    num_blocks, num_kv_heads, head_dim, tokens = 6, 3, 64, 7
    key, value = _fused_kv(tokens, num_kv_heads, head_dim, dtype, device, seed=block_size)
    assert not key.is_contiguous()
    k_cache = torch.full(
        (num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device
    )
    v_cache = torch.full_like(k_cache, float("nan"))
    gen = torch.Generator().manual_seed(block_size)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens].to(device)
    slots[2] = -1  # padding token: must not be written anywhere
    want_k, want_v = reference.reshape_and_cache(key, value, k_cache, v_cache, slots)

    reshape_and_cache(key, value, k_cache, v_cache, slots)

    # bit-exact copy; untouched slots stay NaN (compare NaN positions and values)
    for got, want in ((k_cache, want_k), (v_cache, want_v)):
        got64 = got.to("cpu", torch.float64)
        assert torch.equal(torch.isnan(got64), torch.isnan(want))
        assert torch.equal(got64.nan_to_num(0.0), want.nan_to_num(0.0))
    written = int((~torch.isnan(k_cache[..., 0, 0])).sum())
    assert written == tokens - 1


def test_head_dim_128_and_eight_kv_heads(device):
    key, value = _fused_kv(5, 8, 128, torch.float32, device, seed=1)
    k_cache = torch.full((4, 16, 8, 128), float("nan"), device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = torch.tensor([63, 0, 17, 18, 40], device=device)
    want_k, want_v = reference.reshape_and_cache(key, value, k_cache, v_cache, slots)
    reshape_and_cache(key, value, k_cache, v_cache, slots)
    # the reference lives on the CPU, in float64
    assert torch.equal(k_cache.to("cpu", torch.float64).nan_to_num(0.0), want_k.nan_to_num(0.0))
    assert torch.equal(v_cache.to("cpu", torch.float64).nan_to_num(0.0), want_v.nan_to_num(0.0))
