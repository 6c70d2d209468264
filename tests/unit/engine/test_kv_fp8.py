"""8-bit KV (`--kv-cache-dtype fp8`): e4m3 pools with calibrated per-layer scales, read by
the torch attention path; the memory plan counts 1 byte per element; bad input and devices
without an fp8 attention path are refused with the value named."""

from __future__ import annotations

import pytest
import torch
from llmservice.kernels import kv_quant, torch_ops
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.kernels.swap import copy_blocks
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.startup import check_kv_cache_dtype


def test_quantize_round_trip_is_within_e4m3_precision_and_saturates():
    x = torch.linspace(-3.0, 3.0, 1001)
    scale = kv_quant.scale_for(3.0)
    back = kv_quant.dequantize(kv_quant.quantize(x, scale), scale, torch.float32)
    assert torch.all((back - x).abs() <= 0.0625 * x.abs() + 4 * scale * 2**-9)  # 3 mantissa bits
    big = kv_quant.dequantize(kv_quant.quantize(torch.tensor([1e6, -1e6]), scale), scale, torch.float32)
    assert torch.isfinite(big).all() and big[0] == kv_quant.FP8_MAX * scale


def _pools(dtype, scale=None):
    k, v = torch.zeros(6, 4, 2, 8, dtype=dtype), torch.zeros(6, 4, 2, 8, dtype=dtype)
    if scale:
        kv_quant.set_scale(k, scale)
        kv_quant.set_scale(v, scale)
    return k, v


def test_fp8_pools_give_attention_close_to_fp32():
    torch.manual_seed(0)
    n, hq = 10, 4
    k_new, v_new, q = torch.randn(n, 2, 8), torch.randn(n, 2, 8), torch.randn(n, hq, 8)
    slots = torch.tensor([4, 5, 6, 7, 12, 13, 14, 15, 0, 1])  # blocks 1, 3, 0
    meta = AttentionMetadata(slot_mapping=slots, block_tables=torch.tensor([[1, 3, 0]], dtype=torch.int32),
                             seq_lens=torch.tensor([n], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, n], dtype=torch.int32),
                             query_lens=[n], seq_lens_host=[n], num_decodes=0, block_size=4)  # fmt: skip
    outs = []
    for pools in (_pools(torch.float32), _pools(kv_quant.FP8, kv_quant.scale_for(5.0))):
        torch_ops.reshape_and_cache(k_new, v_new, *pools, slots)
        outs.append(torch_ops.paged_attention(q, *pools, meta, 8**-0.5))
    assert outs[1].dtype == torch.float32
    assert (outs[0] - outs[1]).abs().max() < 0.1
    assert not torch.equal(outs[0], outs[1])  # the fp8 pool really stored 8 bits


def test_fp8_block_copies_move_the_bytes_exactly():
    src = _pools(kv_quant.FP8, 0.01)[0]
    src.view(torch.uint8).copy_(torch.randint(0, 120, src.shape, dtype=torch.uint8))
    dst = torch.zeros(3, 4, 2, 8, dtype=kv_quant.FP8)
    copy_blocks([src], [dst], [5, 2], [0, 2]).wait()
    assert torch.equal(dst[0].view(torch.uint8), src[5].view(torch.uint8))
    assert torch.equal(dst[2].view(torch.uint8), src[2].view(torch.uint8))


def test_bad_kv_cache_dtype_is_named():
    with pytest.raises(ConfigError, match="'int4'"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ConfigError, match="fp8 is not supported on mps"):
        check_kv_cache_dtype("fp8", torch.device("mps"))
    check_kv_cache_dtype("fp8_e4m3", torch.device("cpu"))
    check_kv_cache_dtype("fp8", torch.device("cuda"))  # the Triton kernels read e4m3 pools
    check_kv_cache_dtype("auto", torch.device("mps"))


def test_fp8_engine_plans_four_times_the_tokens_and_mostly_agrees(make_engine):
    full = make_engine(max_model_len=128, kv_cache_memory_gib=0.05)
    fp8 = make_engine(max_model_len=128, kv_cache_memory_gib=0.05, kv_cache_dtype="fp8")
    assert fp8.memory_plan.kv_bytes_per_token * 4 == full.memory_plan.kv_bytes_per_token
    assert fp8.memory_plan.num_blocks >= 4 * full.memory_plan.num_blocks - 1
    assert fp8.runner.kv_caches[0][0].dtype == kv_quant.FP8
    prompts = [[1 + i, 504, 2011, 7, 88, 19, 300 + i] * 6 for i in range(4)]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True) for _ in prompts]
    a = [o.token_ids for o in full.generate(prompts, params)]
    b = [o.token_ids for o in fp8.generate(prompts, params)]
    same = sum(x == y for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))
    assert same >= 0.75 * 48, (a, b)
