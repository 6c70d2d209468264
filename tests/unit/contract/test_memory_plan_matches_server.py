"""The operator's status.memoryPlan per GPU (per rank on CPU) agrees with the plan the
server's ranks make, within 5 %, for every example and for CPU tensor parallelism:
weights per rank, KV bytes per token per rank, and on CPU the block count.

The server side is `rank_weight_bytes` / the ranks' KV heads, checked here against a
built model's own `weight_bytes()` at TP 1, 2 and 4 (no process group needed to build)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from llmservice.operator.admission import admit
from llmservice.operator.catalog import Architecture
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.vram import GIB, check_fit, dtype_bytes
from llmservice.server.engine import memory
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.dummy import dummy_weights
from llmservice.server.model.llama import LlamaModel, RankShape, rank_weight_bytes
from llmservice.server.model.parallel import World

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())["spec"]["versions"][0][
    "schema"
]["openAPIV3Schema"]
EXAMPLES = sorted(
    p.stem for p in (ROOT / "examples").glob("*.yaml") if not p.stem.startswith("vllm-")
)


def model_config(arch: Architecture) -> ModelConfig:
    """The server's config of the shape the operator sized; a mixture of experts as the
    family its fields name (shared expert: Qwen2-MoE; q/k norms: Qwen3-MoE; else Mixtral)."""
    moe = {}
    if arch.num_experts > 1:
        family = "qwen2_moe" if arch.shared_expert_intermediate_size else "qwen3_moe" if arch.qk_norm else "mixtral"
        moe = dict(architecture=family, num_experts=arch.num_experts, num_experts_per_tok=arch.num_experts_per_token,
                   moe_intermediate_size=arch.intermediate_size, dense_mlp_layers=list(range(arch.num_dense_layers)),
                   shared_expert_intermediate_size=arch.shared_expert_intermediate_size)  # fmt: skip
    return ModelConfig(**{
        "architecture": "llama", "num_layers": arch.num_layers, "hidden_size": arch.hidden_size,
        "num_heads": arch.num_attention_heads, "num_kv_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim, "intermediate_size": arch.dense_intermediate_size or arch.intermediate_size,
        "vocab_size": arch.vocab_size, "tie_word_embeddings": arch.tie_word_embeddings,
        "attention_bias": arch.attention_bias, "qk_norm": arch.qk_norm, **moe,
    })  # fmt: skip


def spec_of(name: str, **engine) -> LLMServiceSpec:
    obj = yaml.safe_load((ROOT / f"examples/{name}.yaml").read_text())
    obj["spec"].setdefault("engine", {}).update(engine)
    stored, errors = admit(SCHEMA, obj, None)
    assert errors == []
    return LLMServiceSpec.from_dict(stored["spec"])


def server_rank_plan(arch: Architecture, tp: int, nbytes: int) -> tuple[int, int]:
    """(largest weights of any rank, KV bytes per token per rank), as the ranks plan."""
    config = model_config(arch)
    weights = max(rank_weight_bytes(config, World(r, tp), nbytes) for r in range(tp))
    kv_heads = RankShape.of(config, World(0, tp)).kv_heads.length
    return weights, 2 * config.num_layers * kv_heads * config.head_dim * nbytes


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.05 * max(abs(a), abs(b))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_examples_plan_per_gpu_matches_the_ranks(name):
    from llmservice.operator.vram import resolve_architecture

    spec = spec_of(name)
    fit = check_fit(spec)
    arch = resolve_architecture(spec)
    assert fit.plan is not None and arch is not None, name
    tp = spec.engine.tensor_parallel_size
    weights, kv = server_rank_plan(
        arch, tp, dtype_bytes(spec.engine.dtype, spec.gpus_per_replica > 0)
    )
    if spec.gpus_per_replica == 0 and spec.model.source.startswith("builtin:"):
        weights = built_rank_weight_bytes(spec.model.source, tp)  # packed GGUF blocks
    assert close(fit.plan.weights_gib_per_gpu * GIB, weights), (
        name,
        fit.plan.weights_gib_per_gpu,
        weights / GIB,
    )
    assert fit.plan.kv_bytes_per_token_per_gpu == kv, name


def built_rank_weight_bytes(source: str, tp: int) -> int:
    """The largest rank's weights as the server builds them from the real file (the
    builtin GGUF's blocks stay packed on CPU); building needs no process group."""
    from llmservice.server.model.loader import weight_source

    held = []
    for rank in range(tp):
        _, config, _, weights = weight_source(source, torch.float32)
        model = LlamaModel(config, weights, torch.device("cpu"), torch.float32, 64, world=World(rank, tp))
        held.append(model.weight_bytes())
    return max(held)


@pytest.mark.parametrize("tp", [1, 3])
def test_cpu_ranks_plan_the_blocks_the_operator_reports(tp):
    spec = spec_of("smollm2-cpu", tensorParallelSize=tp)
    fit = check_fit(spec)
    from llmservice.operator.vram import resolve_architecture

    arch = resolve_architecture(spec)
    _, kv = server_rank_plan(arch, tp, 4)
    weights = built_rank_weight_bytes(spec.model.source, tp)
    plan = memory.plan_cpu(
        spec.engine.kv_cache_memory_gib, weights, kv, spec.engine.block_size, 2048
    )
    assert close(fit.plan.weights_gib_per_gpu * GIB, plan.weights_bytes), (
        fit.plan.weights_gib_per_gpu * GIB,
        plan.weights_bytes,
    )
    assert close(fit.plan.estimated_kv_blocks, plan.num_blocks), (
        fit.plan.estimated_kv_blocks,
        plan.num_blocks,
    )


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_rank_weight_bytes_is_what_a_built_rank_holds(tp):
    config = ModelConfig(architecture="qwen2", num_layers=2, hidden_size=64, num_heads=8, num_kv_heads=2,
                         head_dim=8, intermediate_size=128, vocab_size=390, attention_bias=True,
                         tie_word_embeddings=True)  # fmt: skip
    weights = dummy_weights(config, torch.float32)
    for rank in range(tp):
        built = LlamaModel(
            config, weights, torch.device("cpu"), torch.float32, 32, world=World(rank, tp)
        )
        assert built.weight_bytes() == rank_weight_bytes(config, World(rank, tp), 4), (tp, rank)
