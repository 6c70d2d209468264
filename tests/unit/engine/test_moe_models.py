"""Mixture-of-experts models (Mixtral, Qwen3-MoE, Qwen2-MoE) against transformers on
the very same random weights (fp32), loaded the way `serve` loads them: logits of a
whole prompt (torch and Triton kernels), then greedy tokens of 16 prompts run together by the engine (continuous
batching, prefix caching, 7-token prefill chunks) and at tensor-parallel size 2.

Every prompt of a family is compared; at least 15 of the 16 must match transformers
token for token (a near-tie in a router's top k may flip one in a hundred). The TP=2
engine must match our TP=1 engine exactly on all 16."""

from __future__ import annotations

import math
import random

import pytest
import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.tp_executor import build_tp_engine
from llmservice.server.model.hf_info import read_hf_config
from llmservice.server.model.llama import LlamaModel, rank_weight_bytes, score_tokens
from llmservice.server.model.loader import weight_source
from llmservice.server.model.parallel import World

from tests.support.moe_models import MOE_SPECS, moe_models

ARCHS = list(MOE_SPECS)
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("transformers")
    return moe_models(tmp_path_factory.mktemp("moe-models"))


def workload(vocab: int, seed: int = 3, n: int = 16) -> list[list[int]]:
    """16 prompts over 4 shared prefixes (none, 1, 2 and 1.5 blocks): prefix-cache hits."""
    rng = random.Random(seed)
    prefixes = [[], [rng.randrange(4, vocab) for _ in range(16)], [rng.randrange(4, vocab) for _ in range(32)],
                [rng.randrange(4, vocab) for _ in range(23)]]  # fmt: skip
    return [prefixes[i % 4] + [rng.randrange(4, vocab) for _ in range(rng.randint(3, 20))] for i in range(n)]


def greedy(n: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module", params=ARCHS)
def family(request, folders):
    """(name, folder, transformers model, prompts, transformers' greedy tokens)."""
    import transformers

    folder = folders[request.param]
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompts = workload(ref.config.vocab_size)
    expected = []
    with torch.no_grad():
        for ids in prompts:
            inputs = torch.tensor([ids])
            out = ref.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=NEW_TOKENS,
                               do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
            expected.append(out[0, len(ids):].tolist())
    return request.param, folder, ref, prompts, expected


def engine(folder, **overrides) -> LLMEngine:
    config = dict(model=str(folder), max_model_len=256, kv_cache_memory_gib=0.01, num_threads=1, device="cpu")
    return LLMEngine.from_config(EngineConfig(**{**config, **overrides}))


def matches(outs, expected) -> int:
    return sum(o.token_ids == e for o, e in zip(outs, expected, strict=True))


def test_logits_match_transformers(family):
    name, folder, ref, prompts, _ = family
    eng = engine(folder)
    for ids in prompts[:4]:
        ours = score_tokens(eng.model, ids)
        with torch.no_grad():
            expected = ref(torch.tensor([ids])).logits[0].float()
        rel = ((ours - expected).abs().max() / expected.abs().max()).item()
        assert rel <= 1e-4, f"{name}: relative logit error {rel:.2e}"


def test_triton_path_logits_match_transformers(family, monkeypatch):
    """Every kernel of the model Triton's (the fused-MoE kernel included), run by the
    interpreter on CPU tensors: what a CUDA run computes, against transformers."""
    name, folder, ref, prompts, _ = family
    _, config, _, source = weight_source(folder, torch.float32)
    model = LlamaModel(config, source, torch.device("cpu"), torch.float32, 256)
    monkeypatch.setenv("LLMSERVICE_KERNELS", "triton")
    ours = score_tokens(model, prompts[1])
    with torch.no_grad():
        expected = ref(torch.tensor([prompts[1]])).logits[0].float()
    rel = ((ours - expected).abs().max() / expected.abs().max()).item()
    assert rel <= 1e-4, f"{name} (Triton): relative logit error {rel:.2e}"


@pytest.mark.parametrize(
    "case",
    [
        dict(enable_prefix_caching=True, max_num_seqs=4),  # 4 at a time: later ones hit the cache
        dict(enable_prefix_caching=True, max_num_batched_tokens=7, max_num_seqs=4),  # chunks
    ],
    ids=["batched_4_prefix_cache", "chunked_prefill_7"],
)
def test_greedy_tokens_match_transformers_under_continuous_batching(family, case):
    name, folder, _, prompts, expected = family
    eng = engine(folder, **case)
    outs = eng.generate(prompts, [greedy() for _ in prompts])
    assert matches(outs, expected) >= 15, (name, [o.token_ids for o in outs], expected)
    assert eng.scheduler.stats.prefix_hits > 0
    assert eng.block_manager.usage == 0.0


def test_tensor_parallel_2_equals_tp1_and_transformers(family):
    name, folder, _, prompts, expected = family
    base = dict(model=str(folder), max_model_len=256, num_threads=1, num_gpu_blocks_override=48,
                max_num_batched_tokens=16, enable_prefix_caching=True)  # fmt: skip
    tp1 = LLMEngine.from_config(EngineConfig(**base))
    single = [o.token_ids for o in tp1.generate(prompts, [greedy() for _ in prompts])]
    eng = build_tp_engine(LLMEngine, EngineConfig(tensor_parallel_size=2, **base))
    try:
        outs = eng.generate(prompts, [greedy() for _ in prompts])
    finally:
        eng.runner.close()
    assert [o.token_ids for o in outs] == single, name
    assert matches(outs, expected) >= 15, name


@pytest.mark.parametrize("name", ARCHS)
def test_config_turns_on_what_each_family_has(folders, name):
    config = read_hf_config(folders[name])
    spec = MOE_SPECS[name]
    assert config.num_experts == spec.get("num_local_experts", spec.get("num_experts"))
    assert config.num_experts_per_tok == 2
    assert config.norm_topk_prob == (name != "qwen2_moe")
    assert config.dense_mlp_layers == ([1] if name == "qwen3_moe" else [])
    assert config.shared_expert_intermediate_size == (96 if name == "qwen2_moe" else 0)
    assert config.qk_norm == (name == "qwen3_moe") and config.attention_bias == (name == "qwen2_moe")


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("tp", [1, 2])
def test_every_expert_is_resident_and_counted(folders, name, tp):
    """The weights a rank holds (all experts, its half of each expert's columns) are what
    the plan computes from the shape; at TP=1 they are every tensor of the checkpoint."""
    from safetensors import safe_open

    for rank in range(tp):
        _, config, _, source = weight_source(folders[name], torch.float32)
        model = LlamaModel(config, source, torch.device("cpu"), torch.float32, 64, world=World(rank, tp))
        assert model.weight_bytes() == rank_weight_bytes(config, World(rank, tp), 4)
        moe = next(layer.moe for layer in model.layers if layer.moe is not None)
        assert moe.w13.shape == (config.num_experts, 2 * config.moe_intermediate_size // tp, config.hidden_size)
    if tp == 1:
        with safe_open(str(folders[name] / "model.safetensors"), "pt") as f:
            total = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        assert model.weight_bytes() == 4 * total and config.num_params == total


@pytest.mark.parametrize("name", ARCHS)
def test_dummy_weights_have_the_checkpoints_names_and_shapes(folders, name):
    """--load-format dummy (GPU benchmarks at a real MoE's shape) makes every tensor the
    checkpoint has, experts and shared expert included, and the model builds from them."""
    from llmservice.server.model.dummy import dummy_weights
    from safetensors import safe_open

    config = read_hf_config(folders[name])
    dummy = dummy_weights(config, torch.float32)
    with safe_open(str(folders[name] / "model.safetensors"), "pt") as f:
        expected = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert {k: tuple(v.shape) for k, v in dummy.items()} == expected
    model = LlamaModel(config, dummy, torch.device("cpu"), torch.float32, 64)
    assert torch.isfinite(score_tokens(model, [5, 6, 7])).all()


def test_a_lora_adapter_on_an_experts_mlp_is_refused_by_name(folders):
    """An MoE layer has no dense gate/up/down for a LoRA delta: the adapter is refused
    naming the layer, never served with its MLP part silently left out; its attention
    projections and a dense layer's MLP fit."""
    from llmservice.server.lora.adapter import LoRAAdapter, LoRAAdapterError
    from llmservice.server.lora.fit import check_fits

    config = read_hf_config(folders["qwen3_moe"])  # layer 0 experts, layer 1 a dense MLP
    h, i = config.hidden_size, config.intermediate_size

    def adapter(layer: int, module: str, fan_in: int, fan_out: int) -> LoRAAdapter:
        return LoRAAdapter("a", 4, 1.0, None, {(layer, module): (torch.zeros(4, fan_in), torch.zeros(fan_out, 4))})

    check_fits(adapter(0, "o_proj", config.num_heads * config.head_dim, h), config, "m")
    check_fits(adapter(1, "gate_proj", h, i), config, "m")
    with pytest.raises(LoRAAdapterError, match="layer 0 is a mixture-of-experts layer, which has no dense gate_proj"):
        check_fits(adapter(0, "gate_proj", h, i), config, "m")
