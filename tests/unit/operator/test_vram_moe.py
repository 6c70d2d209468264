"""The VRAM plan of mixture-of-experts models: every expert is resident, so the weights
count all of them (not the active ones), exactly as transformers builds the three
families (Mixtral, Qwen3-MoE, Qwen2-MoE with a shared expert); the activation reserve
uses the expert's width; the Qwen3-30B-A3B example fits one 80 GiB GPU, not a 24 GiB one,
and Qwen3-235B-A22B, which would fit one GPU if only its active experts counted, is refused."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from llmservice.operator.admission import admit
from llmservice.operator.catalog import CATALOG, Architecture, lookup
from llmservice.operator.model_shape import architecture_from_config
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.vram import (
    GIB,
    Shape,
    activation_reserve_bytes,
    check_fit,
    plan_memory,
)

from tests.support.golden import crd_schema, example
from tests.support.moe_models import QWEN3_30B_A3B

GOLDEN = Path(__file__).parent / "golden"

# Published config.json values (the numbers that matter for sizing).
QWEN3_235B_A22B = {
    **QWEN3_30B_A3B, "hidden_size": 4096, "intermediate_size": 12288,
    "moe_intermediate_size": 1536, "num_attention_heads": 64, "num_hidden_layers": 94,
}  # fmt: skip
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_attention_heads": 16, "num_hidden_layers": 24,
    "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
    "tie_word_embeddings": False,
}  # fmt: skip
QWEN2_57B_A14B = {
    **QWEN15_MOE_A27B, "hidden_size": 3584, "intermediate_size": 18944,
    "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "num_experts": 64, "num_experts_per_tok": 8,
}  # fmt: skip
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
    "num_experts_per_tok": 2, "tie_word_embeddings": False,
}  # fmt: skip


def active(arch: Architecture) -> Architecture:
    """The same model with only the experts one token uses: what must NOT be sized."""
    return dataclasses.replace(arch, num_experts=arch.num_experts_per_token)


# ------------------------------------------------------------------ parameter counts


@pytest.mark.parametrize(
    ("config", "total_billions", "active_billions"),
    [
        (QWEN3_30B_A3B, 30.5, 3.3),
        (QWEN3_235B_A22B, 235.0, 22.0),
        (MIXTRAL_8X7B, 46.7, 12.9),
        (QWEN15_MOE_A27B, 14.3, 2.7),
        (QWEN2_57B_A14B, 57.4, 14.0),
    ],
)
def test_config_shapes_give_the_published_total_and_active_counts(
    config, total_billions, active_billions
):
    arch = architecture_from_config(config)
    assert arch.parameters / 1e9 == pytest.approx(total_billions, rel=0.005)
    # The active count is the model's name (A3B, A22B, A2.7B, A14B): published to 1-2 digits.
    assert active(arch).parameters / 1e9 == pytest.approx(active_billions, rel=0.06)


@pytest.mark.parametrize(
    ("name", "config", "exact"),
    [
        ("qwen3-30b-a3b", QWEN3_30B_A3B, 30_532_122_624),
        ("qwen3-235b-a22b", QWEN3_235B_A22B, 235_093_634_560),
        ("mixtral-8x7b", MIXTRAL_8X7B, 46_702_792_704),
    ],
)
def test_catalog_entries_are_their_configs_shapes(name, config, exact):
    from_config = architecture_from_config(config)
    catalog = CATALOG[name].architecture
    assert from_config.derived_parameter_count() == catalog.parameters == exact
    assert (catalog.num_experts, catalog.num_experts_per_token) == (
        from_config.num_experts,
        from_config.num_experts_per_token,
    )
    assert catalog.intermediate_size == from_config.intermediate_size  # the expert's width


def test_the_moe_hub_ids_resolve_to_the_catalog():
    assert lookup("hf://Qwen/Qwen3-30B-A3B").name == "qwen3-30b-a3b"
    assert lookup("hf://Qwen/Qwen3-30B-A3B-Instruct-2507").name == "qwen3-30b-a3b"
    assert lookup("hf://Qwen/Qwen3-235B-A22B").name == "qwen3-235b-a22b"
    assert lookup("hf://qwen/qwen3-235b-a22b-instruct-2507").name == "qwen3-235b-a22b"


def test_dense_layers_and_sparse_steps_follow_transformers_rule():
    base = {**QWEN3_30B_A3B, "num_hidden_layers": 6}
    assert architecture_from_config(base).num_dense_layers == 0
    only = architecture_from_config({**base, "mlp_only_layers": [0, 5, 99]})
    assert (only.num_dense_layers, only.num_moe_layers) == (2, 4)
    assert only.dense_mlp_size == 6144 and only.intermediate_size == 768
    step = architecture_from_config({**base, "decoder_sparse_step": 3})  # layers 2 and 5 sparse
    assert (step.num_dense_layers, step.num_moe_layers) == (4, 2)
    mixtral = architecture_from_config(MIXTRAL_8X7B)
    assert (mixtral.num_dense_layers, mixtral.intermediate_size) == (0, 14336)


# transformers' own models: the derived count is exact, tensor for tensor.
TINY = {"vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 48, "num_experts_per_tok": 2}  # fmt: skip


def tiny_models():
    transformers = pytest.importorskip("transformers")
    return {
        "qwen3-moe mlp_only_layers": lambda: transformers.Qwen3MoeForCausalLM(
            transformers.Qwen3MoeConfig(**TINY, head_dim=16, num_experts=5,
                                        moe_intermediate_size=24, mlp_only_layers=[1],
                                        decoder_sparse_step=1, tie_word_embeddings=False)
        ),
        "qwen3-moe sparse step, tied": lambda: transformers.Qwen3MoeForCausalLM(
            transformers.Qwen3MoeConfig(**TINY, head_dim=16, num_experts=6,
                                        moe_intermediate_size=20, decoder_sparse_step=2,
                                        tie_word_embeddings=True)
        ),
        "qwen2-moe shared expert": lambda: transformers.Qwen2MoeForCausalLM(
            transformers.Qwen2MoeConfig(**TINY, num_experts=6, moe_intermediate_size=20,
                                        shared_expert_intermediate_size=40, mlp_only_layers=[0],
                                        tie_word_embeddings=False)
        ),
        "mixtral": lambda: transformers.MixtralForCausalLM(
            transformers.MixtralConfig(**TINY, num_local_experts=4, tie_word_embeddings=False)
        ),
    }  # fmt: skip


@pytest.mark.parametrize(
    "family",
    [
        "qwen3-moe mlp_only_layers",
        "qwen3-moe sparse step, tied",
        "qwen2-moe shared expert",
        "mixtral",
    ],
)
def test_the_derived_count_is_the_saved_models_tensor_sizes(family, tmp_path):
    from safetensors import safe_open

    model = tiny_models()[family]()
    model.save_pretrained(tmp_path)  # config.json + model.safetensors, as on the Hub
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:  # the headers' shapes
        saved = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    unique = {p.data_ptr(): p.numel() for p in model.state_dict().values()}
    config = json.loads((tmp_path / "config.json").read_text())
    arch = architecture_from_config(config)
    assert arch.derived_parameter_count() == saved == sum(unique.values())
    assert arch.num_experts > 1 and arch.num_moe_layers >= 2


# ------------------------------------------------------------------ the fit decision


def spec(source: str, gib: float = 80, tp: int = 1, length: int = 32768) -> LLMServiceSpec:
    return LLMServiceSpec.from_dict({
        "model": {"source": source},
        "engine": {"maxModelLen": length, "maxNumBatchedTokens": 8192, "maxNumSeqs": 64,
                   "dtype": "bfloat16", "tensorParallelSize": tp},
        "resources": {"gpu": {"count": tp, "memoryGiB": gib}, "gpuMemoryUtilization": 0.9},
    })  # fmt: skip


def shape_of(arch: Architecture, gib: float = 80, tp: int = 1) -> Shape:
    return Shape(arch, 2, tp, gib, 0.9, 32768, 8192, 64, 16)


def test_235b_would_fit_one_gpu_by_its_active_experts_but_is_refused():
    arch = CATALOG["qwen3-235b-a22b"].architecture
    assert plan_memory(shape_of(active(arch))).estimated_kv_blocks * 16 >= 32768  # 22 B: fits
    result = check_fit(spec("hf://Qwen/Qwen3-235B-A22B-Instruct-2507"))
    assert (result.status, result.reason) == ("False", "InsufficientVRAM")
    assert result.plan.weights_gib_per_gpu == pytest.approx(235_093_634_560 * 2 / GIB)
    assert (
        "weights 437.9 GiB (235.1 B parameters: all 128 experts of each MoE layer" in result.message
    )
    assert "the weights alone do not fit" in result.message
    assert result.smallest_tensor_parallel_size == 8
    assert "smallest GPU count that fits: 8" in result.message
    assert check_fit(spec("hf://Qwen/Qwen3-235B-A22B", tp=4)).status == "False"
    assert check_fit(spec("hf://Qwen/Qwen3-235B-A22B", tp=8)).status == "True"


def test_the_30b_example_fits_80_gib_with_the_figures_in_its_comment():
    result = check_fit(LLMServiceSpec.from_dict(example("qwen3-moe")["spec"]))
    assert (result.status, result.reason) == ("True", "Fits")
    plan = result.plan
    assert plan.shape_source == "catalog:qwen3-30b-a3b"
    assert round(plan.weights_gib_per_gpu, 1) == 56.9
    assert round(plan.activation_reserve_gib_per_gpu, 1) == 1.9
    assert round(plan.kv_cache_gib_per_gpu, 1) == 13.2
    assert plan.kv_bytes_per_token_per_gpu == 2 * 48 * 4 * 128 * 2 == 96 * 1024
    assert plan.estimated_kv_blocks * 16 // 1000 == 144  # ~144k tokens
    assert plan.estimated_max_concurrent_sequences == 4
    assert "all 128 experts of each MoE layer resident, 8 active per token" in result.message


def test_the_30b_does_not_fit_24_gib_and_needs_four():
    result = check_fit(spec("hf://Qwen/Qwen3-30B-A3B-Instruct-2507", gib=24))
    assert result.refuses_rollout and "weights 56.9 GiB" in result.message
    assert result.largest_max_model_len == 0
    assert result.smallest_tensor_parallel_size == 4
    arch = CATALOG["qwen3-30b-a3b"].architecture
    assert plan_memory(shape_of(active(arch), gib=24)).estimated_kv_blocks * 16 >= 32768


def test_the_activation_reserve_uses_the_experts_width_and_each_tokens_k_copies():
    arch = CATALOG["qwen3-30b-a3b"].architecture
    h, k, e, i = 2048, 8, 128, 768
    qkv = (32 + 2 * 4) * 128
    per_token = 2 * (2 * i * k + 2 * k * h + 4 * h + qkv) + 4 * e
    expected = 8192 * per_token + 64 * 151936 * 4 + GIB
    assert activation_reserve_bytes(shape_of(arch)) == pytest.approx(expected)
    # config.json's intermediate_size sizes dense layers only, and this model has none
    wider = dataclasses.replace(arch, dense_intermediate_size=100_000)
    assert activation_reserve_bytes(shape_of(wider)) == activation_reserve_bytes(shape_of(arch))


def test_a_shared_expert_and_dense_layers_widen_the_reserve():
    arch = architecture_from_config(QWEN15_MOE_A27B)
    without = dataclasses.replace(arch, shared_expert_intermediate_size=0)
    extra = activation_reserve_bytes(shape_of(arch)) - activation_reserve_bytes(shape_of(without))
    assert extra == pytest.approx(8192 * 2 * 2 * 5632)
    wide_dense = dataclasses.replace(arch, num_dense_layers=1, dense_intermediate_size=100_000)
    assert activation_reserve_bytes(shape_of(wide_dense)) == pytest.approx(
        activation_reserve_bytes(shape_of(without))
        - 8192 * 2 * (2 * 1408 * 4 + 2 * 4 * 2048)
        + 8192 * 2 * 2 * 100_000
    )


def test_dense_models_plan_as_before():
    for name in ("llama-3-8b", "qwen2.5-7b", "smollm2-135m"):
        arch = CATALOG[name].architecture
        assert arch.num_moe_layers == 0 and arch.dense_mlp_size == arch.intermediate_size
        qkv = (arch.num_attention_heads + 2 * arch.num_key_value_heads) * arch.head_dim
        per_token = 2 * (2 * arch.intermediate_size + 4 * arch.hidden_size + qkv)
        expected = 8192 * per_token + 64 * arch.vocab_size * 4 + GIB
        assert activation_reserve_bytes(shape_of(arch)) == pytest.approx(expected)


# ------------------------------------------------------------------ the API


def admitted_spec(model: dict) -> tuple[dict, list[str]]:
    obj = {"apiVersion": "llmservice.dev/v1alpha1", "kind": "LLMService",
           "metadata": {"name": "moe"}, "spec": {"model": model}}  # fmt: skip
    stored, errors = admit(crd_schema(), obj, None)
    return stored, [str(e) for e in errors]


def test_spec_architecture_describes_a_qwen2_moe_like_its_config():
    model = {
        "source": "pvc://weights/qwen1.5-moe",
        "architecture": {
            "numLayers": 24, "hiddenSize": 2048, "numAttentionHeads": 16, "numKeyValueHeads": 16,
            "intermediateSize": 1408, "vocabSize": 151936, "numExperts": 60,
            "numExpertsPerToken": 4, "attentionBias": True, "denseIntermediateSize": 5632,
            "sharedExpertIntermediateSize": 5632, "numDenseLayers": 0,
        },
    }  # fmt: skip
    stored, errors = admitted_spec(model)
    assert errors == []
    given = LLMServiceSpec.from_dict(stored["spec"]).model.architecture
    assert given == architecture_from_config(QWEN15_MOE_A27B)
    model["architecture"]["numDenseLayers"] = 25
    assert any("numDenseLayers must be <= numLayers" in e for e in admitted_spec(model)[1])


def test_the_moe_catalog_names_are_admitted():
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        stored, errors = admitted_spec({"source": "pvc://weights/x", "catalogName": name})
        assert errors == []
        assert check_fit(LLMServiceSpec.from_dict(stored["spec"])).plan.shape_source == (
            f"catalog:{name}"
        )

