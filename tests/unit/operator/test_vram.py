"""The VRAM fit check: a table of known configurations, and what the refusal suggests."""

from __future__ import annotations

import dataclasses

import pytest
from llmservice.operator.catalog import CATALOG, lookup
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.vram import (
    Shape,
    check_fit,
    plan_memory,
    resolve_architecture,
    sequence_fits,
)

LLAMA_8B = "hf://meta-llama/Meta-Llama-3-8B-Instruct"
LLAMA_70B = "hf://meta-llama/Meta-Llama-3-70B-Instruct"


def spec(source: str, *, gib: float = 80, tp: int = 1, length: int = 8192, **extra: object):
    resources = {"gpu": {"memoryGiB": gib}, **extra.pop("resources", {})}  # type: ignore[dict-item]
    engine = {"tensorParallelSize": tp, "maxModelLen": length, "maxNumBatchedTokens": 8192}
    engine.update(extra.pop("engine", {}))  # type: ignore[arg-type]
    return LLMServiceSpec.from_dict(
        {"model": {"source": source, **extra}, "engine": engine, "resources": resources}
    )


@pytest.mark.parametrize(
    ("name", "published_billions"),
    [
        ("smollm2-135m", 0.1345),
        ("llama-3-8b", 8.03),
        ("llama-3-70b", 70.55),
        ("mistral-7b", 7.25),
        ("mixtral-8x7b", 46.70),
        ("qwen2.5-7b", 7.62),
        ("qwen2.5-72b", 72.71),
    ],
)
def test_catalog_shapes_give_the_published_parameter_counts(name, published_billions):
    params = CATALOG[name].architecture.parameters / 1e9
    assert params == pytest.approx(published_billions, rel=0.005)


def test_sources_resolve_to_catalog_entries():
    assert lookup("builtin:smollm2-135m").name == "smollm2-135m"
    assert lookup("hf://Qwen/Qwen2.5-72B-Instruct").name == "qwen2.5-72b"
    assert lookup("hf://meta-llama/meta-llama-3-8b-instruct").name == "llama-3-8b"
    assert lookup("hf://someone/unknown") is None
    assert lookup("pvc://claim/path") is None


# Llama-3-8B in bf16: 15.0 GiB of weights, 128 KiB of KV per token on one GPU.
@pytest.mark.parametrize(
    ("gib", "length", "fits"),
    [
        (24, 4096, True),
        (24, 8192, True),
        (24, 32768, True),
        (24, 65536, False),
        (24, 131072, False),
        (40, 65536, True),
        (40, 131072, True),
        (80, 131072, True),
        (16, 4096, False),  # 16 GiB x 0.9 < 15 GiB of weights + activations
    ],
)
def test_llama_3_8b_fit_table(gib, length, fits):
    result = check_fit(spec(LLAMA_8B, gib=gib, length=length))
    assert result.status == ("True" if fits else "False")
    if fits:
        assert result.plan is not None
        assert result.plan.estimated_max_concurrent_sequences >= 1
        assert result.plan.weights_gib_per_gpu == pytest.approx(14.96, abs=0.05)
        assert result.plan.kv_bytes_per_token_per_gpu == 2 * 32 * 8 * 128 * 2


@pytest.mark.parametrize(("tp", "fits"), [(1, False), (2, True), (4, True), (8, True)])
def test_llama_3_70b_on_80gib_needs_tensor_parallelism(tp, fits):
    result = check_fit(spec(LLAMA_70B, gib=80, tp=tp))
    assert result.status == ("True" if fits else "False")


def test_tp4_shards_weights_and_kv_heads():
    plan = check_fit(spec(LLAMA_70B, gib=80, tp=4)).plan
    assert plan.weights_gib_per_gpu == pytest.approx(70.55e9 * 2 / 4 / 2**30, rel=0.01)
    assert plan.kv_bytes_per_token_per_gpu == 2 * 80 * (8 // 4) * 128 * 2
    assert plan.estimated_max_concurrent_sequences > 30


def test_refusal_names_the_longest_length_and_fewest_gpus_that_fit():
    result = check_fit(spec(LLAMA_8B, gib=24, length=65536))
    assert result.refuses_rollout and result.reason == "InsufficientVRAM"
    longest = result.largest_max_model_len
    assert f"largest maxModelLen that fits: {longest}" in result.message
    assert "smallest GPU count that fits: 2" in result.message
    # The suggestion is exact: the suggested length fits, one block more does not.
    assert check_fit(spec(LLAMA_8B, gib=24, length=longest)).status == "True"
    assert check_fit(spec(LLAMA_8B, gib=24, length=longest + 16)).status == "False"
    assert check_fit(spec(LLAMA_8B, gib=24, length=65536, tp=2)).status == "True"


def test_70b_on_one_24gib_gpu_says_weights_alone_do_not_fit():
    result = check_fit(spec(LLAMA_70B, gib=24, length=4096))
    assert result.refuses_rollout
    assert result.largest_max_model_len == 0
    assert "weights alone do not fit" in result.message
    assert "smallest GPU count that fits: 8" in result.message


def test_no_tensor_parallel_size_fits():
    result = check_fit(spec("hf://Qwen/Qwen2.5-72B-Instruct", gib=8, length=4096))
    assert result.refuses_rollout
    assert result.smallest_tensor_parallel_size is None
    assert "no tensor-parallel size up to 8 fits on 8 GiB GPUs" in result.message


def test_operator_ceiling_lowers_the_budget():
    tight = spec(LLAMA_8B, gib=24, length=32768, resources={"gpuMemoryUtilization": 0.95})
    assert check_fit(tight, max_utilization=0.95).status == "True"
    capped = check_fit(tight, max_utilization=0.8)
    assert capped.status == "False"
    assert capped.plan.gpu_memory_utilization == 0.8


def test_user_architecture_overrides_the_catalog():
    arch = {
        "numLayers": 32,
        "hiddenSize": 4096,
        "numAttentionHeads": 32,
        "numKeyValueHeads": 32,  # no GQA: 4x the KV of Llama-3-8B
        "intermediateSize": 11008,
        "vocabSize": 32000,
    }
    s = spec("pvc://weights/llama-2-7b", gib=24, length=32768, architecture=arch)
    result = check_fit(s)
    assert result.plan.kv_bytes_per_token_per_gpu == 2 * 32 * 32 * 128 * 2
    assert result.refuses_rollout


def test_unknown_model_is_unknown_not_refused():
    result = check_fit(spec("hf://someone/secret-model"))
    assert result.status == "Unknown" and not result.refuses_rollout
    assert "catalogName" in result.message


def test_catalog_name_gives_a_pvc_model_its_shape():
    s = spec("pvc://weights/x", catalogName="mixtral-8x7b", gib=80, tp=2)
    assert resolve_architecture(s) == CATALOG["mixtral-8x7b"].architecture
    assert check_fit(s).status == "True"
    assert check_fit(spec("pvc://weights/x", catalogName="mixtral-8x7b", gib=80)).status == "False"


def test_cpu_pod_plans_from_the_kv_cache_flag():
    s = LLMServiceSpec.from_dict(
        {
            "model": {"source": "builtin:smollm2-135m"},
            "engine": {"maxModelLen": 2048, "kvCacheMemoryGiB": 0.5},
            "resources": {"gpu": {"count": 0}},
        }
    )
    result = check_fit(s)
    assert result.status == "True" and result.reason == "CPUOnly"
    kv_per_token = 2 * 30 * 3 * 64 * 4  # fp32 on CPU
    assert result.plan.kv_bytes_per_token == kv_per_token
    assert result.plan.estimated_kv_blocks == int(0.5 * 2**30 // (kv_per_token * 16))
    too_small = dataclasses.replace(
        s, engine=dataclasses.replace(s.engine, kv_cache_memory_gib=0.01)
    )
    assert check_fit(too_small).refuses_rollout


def test_block_rounding_in_sequence_fits():
    shape = Shape(CATALOG["llama-3-8b"].architecture, 2, 1, 24, 0.9, 4096, 8192, 128, 16)
    plan = plan_memory(shape)
    assert sequence_fits(plan, plan.estimated_kv_blocks * 16)
    assert not sequence_fits(plan, plan.estimated_kv_blocks * 16 + 1)
