"""Which rows and columns a rank takes (pure), and GGUF shards read without the rest."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from llmservice.server.model.gguf_source import GGUFSource, slice_raw
from llmservice.server.model.loaded import UnsupportedModelError
from llmservice.server.model.parallel import (
    TensorParallelError,
    World,
    even_shard,
    kv_head_shard,
    vocab_shard,
)
from llmservice.server.model.parallel_weights import Shard
from llmservice.server.model.registry import resolve_model_path


def test_heads_split_evenly_and_kv_heads_replicate_past_their_count():
    assert [even_shard(9, World(r, 3), "heads") for r in range(3)] == [
        Shard(0, 3),
        Shard(3, 3),
        Shard(6, 3),
    ]
    # 2 KV heads over 4 ranks: ranks 0-1 hold head 0, ranks 2-3 head 1 (their query heads' group)
    assert [kv_head_shard(2, World(r, 4)) for r in range(4)] == [
        Shard(0, 1),
        Shard(0, 1),
        Shard(1, 1),
        Shard(1, 1),
    ]
    assert [kv_head_shard(4, World(r, 2)) for r in range(2)] == [Shard(0, 2), Shard(2, 2)]
    with pytest.raises(
        TensorParallelError, match=r"num_attention_heads \(9\) is not divisible by .* 2"
    ):
        even_shard(9, World(0, 2), "num_attention_heads")
    with pytest.raises(TensorParallelError, match="neither a divisor nor a multiple"):
        kv_head_shard(3, World(0, 4))


def test_vocab_ranges_cover_the_vocabulary_once():
    shards = [vocab_shard(49155, World(r, 4)) for r in range(4)]
    assert shards[0] == Shard(0, 12289) and shards[-1].end == 49155
    assert sum(s.length for s in shards) == 49155
    assert all(a.end == b.start for a, b in zip(shards, shards[1:], strict=False))


def test_column_shards_of_quantized_rows_take_whole_blocks():
    q4_1 = GGMLQuantizationType.Q4_1  # 32 elements in 20 bytes
    raw = np.arange(4 * 60, dtype=np.uint8).reshape(4, 60)  # 4 rows of 96 elements
    assert slice_raw(raw, q4_1, 1, Shard(32, 32), "w").tolist() == raw[:, 20:40].tolist()
    assert slice_raw(raw, q4_1, 0, Shard(1, 2), "w").tolist() == raw[1:3].tolist()
    with pytest.raises(UnsupportedModelError, match="do not fall on Q4_1 blocks of 32"):
        slice_raw(raw, q4_1, 1, Shard(16, 32), "w")


def test_gguf_shards_are_the_full_tensors_sliced(smollm):
    path = resolve_model_path("builtin:smollm2-135m")
    source = GGUFSource(path, smollm.config, "cpu", torch.float32)
    cases = [
        ("model.layers.3.self_attn.q_proj.weight", 0, Shard(192, 192)),  # un-permuted per head
        ("model.layers.3.self_attn.k_proj.weight", 0, Shard(128, 64)),
        ("model.layers.3.self_attn.o_proj.weight", 1, Shard(384, 192)),
        ("model.layers.3.mlp.down_proj.weight", 1, Shard(512, 512)),
        ("model.embed_tokens.weight", 0, Shard(32768, 16384)),  # Q8_0
    ]
    for name, dim, shard in cases:
        expected = smollm.weights[name].narrow(dim, shard.start, shard.length)
        assert torch.equal(source.get(name, dim, shard), expected), name
