"""A safetensors shard cut short (an interrupted copy or download) fails with its path."""

from __future__ import annotations

import os

import pytest
import torch
from llmservice.server.model.hf_loader import CorruptShardError
from llmservice.server.model.loader import load_model, weight_source


@pytest.fixture
def sharded_llama(tmp_path):
    """A tiny random Llama saved by transformers in several shards."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) >= 2
    return tmp_path, shards


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_truncated_shard_error_names_the_file(sharded_llama, keep):
    folder, shards = sharded_llama
    victim = shards[-1]
    os.truncate(victim, int(victim.stat().st_size * keep))
    with pytest.raises(CorruptShardError, match=rf"^{victim}: truncated or corrupt safetensors file"):
        load_model(folder)
    with pytest.raises(CorruptShardError, match=str(victim)):  # the tensor-parallel read path too
        weight_source(folder, torch.float32)


def test_intact_shards_load(sharded_llama):
    folder, _ = sharded_llama
    loaded = load_model(folder)
    assert loaded.weights["model.embed_tokens.weight"].shape == (300, 64)
