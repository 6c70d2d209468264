"""--load-format dummy: random weights of the model's shape, from its config and tokenizer alone."""

from __future__ import annotations

import json

import pytest
import torch
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.model.llama import LlamaModel, score_tokens
from llmservice.server.model.loaded import UnsupportedModelError
from llmservice.server.model.loader import load_model
from llmservice.server.tokenizer import build_tokenizer


def test_dummy_gguf_has_the_real_names_shapes_and_tokenizer(smollm):
    dummy = load_model("builtin:smollm2-135m", load_format="dummy")
    assert dummy.config == smollm.config
    assert {k: v.shape for k, v in dummy.weights.items()} == {k: v.shape for k, v in smollm.weights.items()}
    assert dummy.tokenizer.tokens == smollm.tokenizer.tokens
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(dummy.weights[q], smollm.weights[q])
    assert 0.015 < dummy.weights[q].std().item() < 0.025  # N(0, 0.02): finite activations in bf16
    assert torch.equal(dummy.weights["model.layers.3.input_layernorm.weight"], torch.ones(576))
    again = load_model("builtin:smollm2-135m", load_format="dummy")
    assert torch.equal(again.weights[q], dummy.weights[q])  # seeded: runs are comparable


@pytest.fixture
def config_only_dir(tmp_path, smollm):
    """An HF directory with config.json + tokenizer.json and no weights (what GPU runs carry)."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": smollm.config.vocab_size, "max_position_embeddings": 512, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "eos_token_id": 2, "bos_token_id": 1,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "tokenizer.json").write_text(build_tokenizer(smollm.tokenizer).to_str())
    return tmp_path


def test_config_only_directory_loads_dummy_but_not_auto(config_only_dir):
    with pytest.raises(UnsupportedModelError, match=r"no \*\.safetensors"):
        load_model(config_only_dir)
    loaded = load_model(config_only_dir, load_format="dummy")
    assert loaded.weights["lm_head.weight"].shape == (49152, 64)  # untied: its own head
    assert loaded.weights["model.layers.1.mlp.down_proj.weight"].shape == (64, 128)


def test_engine_serves_a_dummy_model(config_only_dir):
    eng = LLMEngine.from_config(EngineConfig(model=str(config_only_dir), load_format="dummy", max_model_len=256,
                                 kv_cache_memory_gib=0.01, num_threads=1))  # fmt: skip
    out = eng.generate(["Hello there"], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))[0]
    assert len(out.token_ids) == 9 and all(0 <= t < 49152 for t in out.token_ids)
    assert eng.tokenizer.encode("Hello there") == out.prompt_token_ids
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_dummy_weights_are_hf_named_so_transformers_computes_the_same_logits(config_only_dir):
    """bench/offline_throughput.py builds HF's baseline from these weights on the GPU."""
    transformers = pytest.importorskip("transformers")
    loaded = load_model(config_only_dir, load_format="dummy")
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(config_only_dir))
    missing, unexpected = hf.load_state_dict(loaded.weights, strict=False)
    assert not missing and not unexpected
    ids = list(range(300, 331))
    ours = score_tokens(LlamaModel(loaded.config, loaded.weights, torch.device("cpu"), torch.float32, 512), ids)
    with torch.no_grad():
        ref = hf.eval()(torch.tensor([ids])).logits[0]
    assert ((ours - ref).norm() / ref.norm()).item() < 1e-4


def test_unknown_load_format_is_refused():
    with pytest.raises(ConfigError, match="--load-format 'pt' is not one of"):
        EngineConfig(load_format="pt")
    with pytest.raises(UnsupportedModelError, match="load format 'pt'"):
        load_model("builtin:smollm2-135m", load_format="pt")
