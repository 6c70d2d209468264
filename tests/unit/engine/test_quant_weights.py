"""GGUF blocks kept packed on CPU (the default) against the fp32 reference path.

The shared `smollm` fixture is the default load, so every engine test of this folder
(HF parity, batch invariance, scheduling equivalence, preemption) runs on packed weights;
this file checks what is specific to them: the weights read back exactly, the memory,
and that packed and `--cpu-weights fp32` engines agree token for token."""

from __future__ import annotations

import pytest
import torch
from llmservice.kernels import cpu_native
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.model.llama import LlamaModel, score_tokens
from llmservice.server.model.loader import load_model
from llmservice.server.model.quant_weights import PackedWeight, PackedWeights, packs_gguf

pytestmark = pytest.mark.skipif(
    not cpu_native.available(), reason=f"no C compiler: {cpu_native.error()}"
)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def reference():
    return load_model("builtin:smollm2-135m", torch.float32, cpu_weights="fp32")


def test_packed_weights_read_back_as_the_reference(smollm, reference):
    assert isinstance(smollm.weights, PackedWeights) and not isinstance(
        reference.weights, PackedWeights
    )
    assert set(smollm.weights) == set(reference.weights)
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.29.self_attn.k_proj.weight", "model.layers.7.mlp.down_proj.weight",
                 "model.norm.weight"):  # fmt: skip
        assert torch.equal(smollm.weights[name], reference.weights[name]), name  # Q/K un-permuted


def test_model_holds_under_40_percent_of_the_fp32_weight_memory(smollm, reference):
    packed = LlamaModel(smollm.config, smollm.weights, CPU, torch.float32, 256)
    dense = LlamaModel(reference.config, reference.weights, CPU, torch.float32, 256)
    assert isinstance(packed.layers[0].gate_up.weight, PackedWeight)
    assert isinstance(packed.lm_head.weight, PackedWeight)  # the tied head shares the Q8_0 table
    assert packed.weight_bytes() < 0.4 * dense.weight_bytes()


@pytest.mark.parametrize("length", [3, 70])  # the direct kernel, then dequantize + GEMM
def test_logits_match_the_fp32_path(smollm, reference, length):
    packed = LlamaModel(smollm.config, smollm.weights, CPU, torch.float32, 256)
    dense = LlamaModel(reference.config, reference.weights, CPU, torch.float32, 256)
    ids = [(i * 7919) % 40000 + 100 for i in range(length)]
    ours, ref = score_tokens(packed, ids), score_tokens(dense, ids)
    assert ((ours - ref).abs().max() / ref.abs().max()).item() <= 1e-5


def test_engines_agree_token_for_token(smollm, reference):
    prompts = [
        [(i * 31 + j * 17) % 30000 + 200 for j in range(n)] for i, n in enumerate([5, 37, 70, 12])
    ]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for name, loaded in (("packed", smollm), ("fp32", reference)):
        cfg = EngineConfig(
            max_model_len=256, num_threads=1, block_size=8, max_num_batched_tokens=32
        )
        engine = LLMEngine.from_config(cfg, loaded=loaded)
        outs[name] = [o.token_ids for o in engine.generate(prompts + prompts[:1], params)]
    assert outs["packed"] == outs["fp32"]


def test_packing_rule():
    assert packs_gguf("quantized", "cpu", torch.float32)
    assert not packs_gguf("fp32", "cpu", torch.float32)
    assert not packs_gguf("quantized", "cpu", torch.bfloat16)
    assert not packs_gguf("quantized", "meta", torch.float32)
    with pytest.raises(ValueError, match="not one of"):
        packs_gguf("int4", "cpu", torch.float32)
    with pytest.raises(ConfigError, match="--cpu-weights"):
        EngineConfig(cpu_weights="int4")
