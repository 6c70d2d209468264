"""kernels.ops picks Triton or torch per call: CUDA tensors -> Triton, CPU -> torch, and
LLMSERVICE_KERNELS=triton|torch overrides. Both paths must agree on a model-like step."""

import pytest
import torch
from llmservice.kernels import kv_quant, ops, reference, torch_ops, triton_decode, triton_prefill
from llmservice.kernels.random_batch import make_paged_batch


def test_backend_choice(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv("LLMSERVICE_KERNELS", raising=False)
    assert ops.backend_for(cpu) == "torch"
    monkeypatch.setenv("LLMSERVICE_KERNELS", "triton")
    assert ops.backend_for(cpu) == "triton"
    monkeypatch.setenv("LLMSERVICE_KERNELS", " Torch ")
    assert ops.backend_for(cpu) == "torch"
    monkeypatch.setenv("LLMSERVICE_KERNELS", "bogus")
    assert ops.backend_for(cpu) == "torch"


def _step(path: str, monkeypatch, dtype=torch.float32, kv_fp8=False):
    """One attention layer of a mixed step through ops: rotary, KV write, attention
    (with kv_fp8, into e4m3 pools with their own K and V scales, as the engine makes them)."""
    monkeypatch.setenv("LLMSERVICE_KERNELS", path)
    batch = make_paged_batch(
        [(1, 50), (1, 9), (12, 12), (6, 40)],
        num_kv_heads=2,
        group=3,
        head_dim=64,
        block_size=16,
        dtype=dtype,
        seed=5,
    )
    if kv_fp8:
        for pool, scale in ((batch.k_cache, 0.02), (batch.v_cache, 0.03)):
            pool.data = kv_quant.quantize(pool, scale)
            kv_quant.set_scale(pool, scale)
    meta = batch.meta
    gen = torch.Generator().manual_seed(9)
    tokens = batch.q.shape[0]
    k_new = torch.randn(tokens, 2, 64, generator=gen).to(dtype)
    v_new = torch.randn(tokens, 2, 64, generator=gen).to(dtype)
    positions = torch.tensor(
        [
            p
            for q, s in zip(meta.query_lens, meta.seq_lens_host, strict=True)
            for p in range(s - q, s)
        ]
    )
    cache = reference.rotary_cos_sin_cache(64, 64)
    q = batch.q.clone()
    ops.rotary_embedding(positions, q, k_new, cache)
    ops.reshape_and_cache(k_new, v_new, batch.k_cache, batch.v_cache, meta.slot_mapping)
    return ops.paged_attention(q, batch.k_cache, batch.v_cache, meta, batch.scale), (q, batch, meta)


def test_forced_triton_matches_torch_and_reference(monkeypatch, reference_attention):
    calls = []
    for module, name in (
        (triton_decode, "paged_decode_attention"),
        (triton_prefill, "paged_prefill_attention"),
    ):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k)
        )

    via_torch, _ = _step("torch", monkeypatch)
    assert calls == []
    via_triton, (q, batch, _) = _step("triton", monkeypatch)
    assert calls == ["paged_decode_attention", "paged_prefill_attention"]

    want = reference_attention(batch, q)
    reference.assert_close(via_triton, want, torch.float32)
    reference.assert_close(via_torch, want, torch.float32)


def test_fp8_pools_dispatch_to_the_triton_kernels_with_their_scales(monkeypatch):
    """What the engine does on CUDA with --kv-cache-dtype fp8: ops sends the e4m3 pools
    to the Triton kernels, which write and read them as the torch (CPU) path does."""
    calls = []
    real = triton_decode.paged_decode_attention
    monkeypatch.setattr(triton_decode, "paged_decode_attention",
                        lambda *a, **k: calls.append(kv_quant.scale_of(a[1])) or real(*a, **k))  # fmt: skip
    via_torch, (_, torch_batch, _) = _step("torch", monkeypatch, kv_fp8=True)
    via_triton, (_, triton_batch, _) = _step("triton", monkeypatch, kv_fp8=True)
    assert calls == [0.02]
    for name in ("k_cache", "v_cache"):
        a, b = getattr(torch_batch, name), getattr(triton_batch, name)
        assert a.dtype == b.dtype == kv_quant.FP8
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    reference.assert_close(via_triton, via_torch, torch.float32)
    assert not torch.equal(via_triton, _step("triton", monkeypatch)[0])  # 8-bit KV really read


def test_forced_triton_norms_match_torch(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    x, residual = torch.randn(2, 5, 576, generator=gen)
    weight = torch.randn(576, generator=gen)
    results = {}
    for path in ("torch", "triton"):
        monkeypatch.setenv("LLMSERVICE_KERNELS", path)
        res = residual.clone()
        normed = ops.rms_norm(x, weight, 1e-5)
        fused, res_out = ops.fused_add_rms_norm(x, res, weight, 1e-5)
        assert res_out is res
        results[path] = (normed, fused, res)
    for a, b in zip(results["torch"], results["triton"], strict=True):
        reference.assert_close(b, a, torch.float32)


def test_compiled_kernels_refuse_cpu_tensors(monkeypatch):
    """If the Triton modules were imported in compiled mode (a GPU machine without
    TRITON_INTERPRET), CPU tensors must fail loudly instead of crashing in the driver."""
    kernels = ops._load_triton()
    monkeypatch.setattr(kernels, "interpreted", False)
    monkeypatch.setenv("LLMSERVICE_KERNELS", "triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        ops.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-5)
    monkeypatch.setenv("LLMSERVICE_KERNELS", "torch")
    assert torch.equal(
        ops.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-5),
        torch_ops.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-5),
    )
