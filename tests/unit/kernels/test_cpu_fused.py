"""The per-layer C ops (kernels/cpu_ops.c) against the fp64 references, and their fallbacks."""

import pytest
import torch
import torch.nn.functional as F
from llmservice.kernels import cpu_fused, cpu_native, reference, torch_ops

pytestmark = pytest.mark.skipif(
    not cpu_native.available("cpu_ops"), reason=f"no C compiler: {cpu_native.error('cpu_ops')}"
)


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("n", [64, 576, 100])
def test_norms(rows, n):
    gen = torch.Generator().manual_seed(rows * n)
    x, residual = torch.randn(2, rows, n, generator=gen) * 3
    weight = 1.0 + 0.5 * torch.randn(n, generator=gen)
    reference.assert_close(
        cpu_fused.rms_norm(x, weight, 1e-5), reference.rms_norm(x, weight, 1e-5), torch.float32
    )
    want_out, want_res = reference.fused_add_rms_norm(x, residual, weight, 1e-5)
    out, res = cpu_fused.fused_add_rms_norm(x, residual, weight, 1e-5)
    assert res is residual  # updated in place
    reference.assert_close(out, want_out, torch.float32)
    reference.assert_close(res, want_res, torch.float32)


@pytest.mark.parametrize(("hq", "hk", "d"), [(9, 3, 64), (4, 4, 128), (8, 1, 32)])
def test_rotary_on_views_of_a_fused_qkv(hq, hk, d):
    gen = torch.Generator().manual_seed(hq)
    t = 7
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=gen)
    q, k, _ = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q, k = q.view(t, hq, d), k.view(t, hk, d)
    assert cpu_fused.rotary_fits(q, k)
    positions = torch.tensor([0, 5, 9, 1, 100, 3, 2])
    cache = reference.rotary_cos_sin_cache(128, d)
    want_q, want_k = (
        reference.rotary_embedding(positions, q, cache),
        reference.rotary_embedding(positions, k, cache),
    )
    v_before = qkv[:, (hq + hk) * d :].clone()
    cpu_fused.rotary_embedding(positions, q, k, cache)
    reference.assert_close(q, want_q, torch.float32)
    reference.assert_close(k, want_k, torch.float32)
    assert torch.equal(qkv[:, (hq + hk) * d :], v_before)  # V untouched
    with pytest.raises(IndexError, match="rotary cache"):
        cpu_fused.rotary_embedding(torch.tensor([128] * t), q, k, cache)


def test_silu_and_mul():
    gu = torch.randn(6, 2 * 96, generator=torch.Generator().manual_seed(3)) * 4
    gu[0, 0], gu[0, 1] = -200.0, 200.0  # exp overflow on either side
    gate, up = gu.double().chunk(2, dim=-1)
    reference.assert_close(cpu_fused.silu_and_mul(gu), F.silu(gate) * up, torch.float32)


def test_other_dtypes_take_the_torch_formulas():
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert not cpu_fused.supports(x)
    gu = torch.randn(3, 128, dtype=torch.bfloat16)
    gate, up = gu.chunk(2, dim=-1)
    assert torch.equal(torch_ops.silu_and_mul(gu), F.silu(gate) * up)


def test_cache_write_takes_qkv_views_and_refuses_a_slot_outside_the_pools():
    gen = torch.Generator().manual_seed(5)
    t, hq, hk, d = 5, 6, 2, 64
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=gen)
    key = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)  # token rows qkv's width apart
    value = qkv[:, (hq + hk) * d :].view(t, hk, d)
    k_cache = torch.full((4, 8, hk, d), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = torch.tensor([31, 0, 9, 8, 17])
    assert cpu_fused.cache_fits(key, value, k_cache, v_cache)
    want_k, want_v = reference.reshape_and_cache(key, value, k_cache, v_cache, slots)
    cpu_fused.cache_write(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache.double().nan_to_num(0.0), want_k.nan_to_num(0.0))
    assert torch.equal(v_cache.double().nan_to_num(0.0), want_v.nan_to_num(0.0))
    before = k_cache.clone(), v_cache.clone()
    with pytest.raises(IndexError, match="slot 32 outside the KV pools"):
        cpu_fused.cache_write(key, value, k_cache, v_cache, torch.tensor([1, 2, 32, 3, 4]))
    assert torch.equal(k_cache.nan_to_num(0.0), before[0].nan_to_num(0.0))  # nothing written
    assert torch.equal(v_cache.nan_to_num(0.0), before[1].nan_to_num(0.0))
