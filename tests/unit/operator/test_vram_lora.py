"""The VRAM check counts the LoRA device slot pool exactly as the server allocates it
(server/lora/weights.py), and refuses a spec whose adapter slots leave no room for one
max-length sequence, with the numbers."""

from __future__ import annotations

import pytest
import torch
from llmservice.operator.catalog import CATALOG, Architecture
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.vram import GIB, check_fit, lora_pool_bytes
from llmservice.server.lora.weights import LoRAWeights
from llmservice.server.model.config import ModelConfig


def model_config(arch: Architecture) -> ModelConfig:
    return ModelConfig(
        architecture="llama", num_layers=arch.num_layers, hidden_size=arch.hidden_size,
        num_heads=arch.num_attention_heads, num_kv_heads=arch.num_key_value_heads, head_dim=arch.head_dim,
        intermediate_size=arch.intermediate_size, vocab_size=arch.vocab_size,
    )  # fmt: skip


@pytest.mark.parametrize("model", ["llama-3-8b", "qwen2.5-7b", "smollm2-135m"])
@pytest.mark.parametrize(("slots", "rank", "dtype"), [(1, 16, torch.bfloat16), (4, 64, torch.float32)])
def test_the_operators_pool_is_the_servers_allocation(model, slots, rank, dtype):
    arch = CATALOG[model].architecture
    # meta tensors: the server's exact shapes and dtypes, no memory
    pool = LoRAWeights(model_config(arch), slots, rank, torch.device("meta"), dtype)
    assert lora_pool_bytes(arch, slots, rank, dtype.itemsize) == pool.nbytes


def spec(adapters: bool = True, **engine) -> LLMServiceSpec:
    return LLMServiceSpec.from_dict({
        "model": {"source": "hf://meta-llama/Meta-Llama-3-8B-Instruct", "catalogName": "llama-3-8b"},
        "adapters": [{"name": "sql", "source": "hf://org/sql"}] if adapters else [],
        "engine": {"maxModelLen": 32768, "maxNumBatchedTokens": 8192, "dtype": "bfloat16", **engine},
        "resources": {"gpu": {"count": 1, "memoryGiB": 24}, "gpuMemoryUtilization": 0.9},
    })  # fmt: skip


def test_the_slot_pool_takes_kv_cache_and_a_spec_past_the_budget_is_refused():
    small = check_fit(spec(maxLoras=1, maxLoraRank=16))
    assert small.status == "True" and small.plan is not None
    assert small.plan.lora_slots_gib_per_gpu == pytest.approx(81920 * 16 * 32 * 2 / GIB)
    assert small.plan.as_status()["loraSlotsGiBPerGPU"] == round(small.plan.lora_slots_gib_per_gpu, 3)
    without = check_fit(spec(adapters=False, maxLoras=1, maxLoraRank=16))
    assert without.plan.kv_cache_gib_per_gpu - small.plan.kv_cache_gib_per_gpu == pytest.approx(
        small.plan.lora_slots_gib_per_gpu
    )
    big = check_fit(spec(maxLoras=4, maxLoraRank=64))  # 1.25 GiB of slots: 32k tokens no longer fit
    assert (big.status, big.reason) == ("False", "InsufficientVRAM")
    assert "LoRA slots 1.25 GiB (engine.maxLoras 4 x engine.maxLoraRank 64, 7 projections x 32 layers)" in big.message
    assert big.largest_max_model_len is not None and big.largest_max_model_len < 32768

