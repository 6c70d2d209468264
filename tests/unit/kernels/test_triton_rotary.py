"""Rotary embedding in place on q and k (Triton, interpreter on CPU) against fp64."""

import pytest
import torch
from llmservice.kernels import reference
from llmservice.kernels.triton_rotary import rotary_embedding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (8, 1, 128), (4, 4, 64)]
)
def test_rotates_strided_q_and_k_in_place(dtype, num_heads, num_kv_heads, head_dim, device):
    tokens = 11
    gen = torch.Generator().manual_seed(num_heads * head_dim)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(tokens, width, generator=gen).to(device=device, dtype=dtype)
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    q = q.view(tokens, num_heads, head_dim)
    k = k.view(tokens, num_kv_heads, head_dim)
    v_before = v.clone()
    cache = reference.rotary_cos_sin_cache(8192, head_dim, base=100000.0).to(device)
    positions = torch.randint(0, 8192, (tokens,), generator=gen).to(device)
    positions[0] = 0  # identity rotation
    want_q = reference.rotary_embedding(positions, q, cache)
    want_k = reference.rotary_embedding(positions, k, cache)

    rotary_embedding(positions, q, k, cache)

    reference.assert_close(q, want_q, dtype)
    reference.assert_close(k, want_k, dtype)
    assert torch.equal(v, v_before), "v shares the buffer and must be left alone"
