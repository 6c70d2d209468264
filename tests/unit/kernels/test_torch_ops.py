"""The CPU torch path (torch_ops) against the same fp64 references as the Triton kernels."""

import pytest
import torch
from llmservice.kernels import reference, torch_ops
from llmservice.kernels.random_batch import make_paged_batch

MIXED = [(1, 1), (1, 129), (1, 1000), (7, 7), (20, 129), (5, 300)]


@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_paged_attention_mixed_batch(block_size, group, reference_attention):
    batch = make_paged_batch(
        MIXED, num_kv_heads=2, group=group, head_dim=64, block_size=block_size, seed=group
    )
    meta = batch.meta
    got = torch_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, batch.scale)
    want = reference_attention(batch)
    reference.assert_close(got, want, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_attention_half_precision(dtype, reference_attention):
    batch = make_paged_batch(
        [(1, 40), (9, 9), (4, 70)],
        num_kv_heads=1,
        group=3,
        head_dim=128,
        block_size=16,
        dtype=dtype,
    )
    meta = batch.meta
    got = torch_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, batch.scale)
    want = reference_attention(batch)
    reference.assert_close(got, want, dtype)


def test_reshape_and_cache():
    gen = torch.Generator().manual_seed(0)
    key, value = torch.randn(2, 5, 3, 64, generator=gen)
    k_cache = torch.full((4, 8, 3, 64), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = torch.tensor([31, 0, 9, 8, 17])
    want_k, want_v = reference.reshape_and_cache(key, value, k_cache, v_cache, slots)
    torch_ops.reshape_and_cache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache.double().nan_to_num(0.0), want_k.nan_to_num(0.0))
    assert torch.equal(v_cache.double().nan_to_num(0.0), want_v.nan_to_num(0.0))


def test_norms_and_rotary():
    gen = torch.Generator().manual_seed(1)
    x, residual = torch.randn(2, 6, 576, generator=gen)
    weight = 1.0 + 0.5 * torch.randn(576, generator=gen)
    reference.assert_close(
        torch_ops.rms_norm(x, weight, 1e-5), reference.rms_norm(x, weight, 1e-5), torch.float32
    )
    want_out, want_res = reference.fused_add_rms_norm(x, residual, weight, 1e-5)
    out, res = torch_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    reference.assert_close(out, want_out, torch.float32)
    reference.assert_close(res, want_res, torch.float32)

    q, k = torch.randn(6, 9, 64, generator=gen), torch.randn(6, 3, 64, generator=gen)
    cache = reference.rotary_cos_sin_cache(512, 64)
    positions = torch.tensor([0, 1, 5, 100, 511, 7])
    want_q = reference.rotary_embedding(positions, q, cache)
    want_k = reference.rotary_embedding(positions, k, cache)
    torch_ops.rotary_embedding(positions, q, k, cache)
    reference.assert_close(q, want_q, torch.float32)
    reference.assert_close(k, want_k, torch.float32)


@pytest.mark.parametrize("block_size", [16, 64])
def test_large_decode_batch_is_grouped_by_length_correctly(block_size, reference_attention):
    # more decodes than one length group (torch_ops.DECODE_GROUP), lengths spread wide
    lengths = [(1, 1 + (i * 37) % 400) for i in range(3 * torch_ops.DECODE_GROUP + 5)]
    batch = make_paged_batch(lengths, num_kv_heads=3, group=3, head_dim=64, block_size=block_size, seed=5)
    meta = batch.meta
    got = torch_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, batch.scale)
    want = reference_attention(batch)
    reference.assert_close(got, want, torch.float32)
