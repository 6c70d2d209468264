"""Tensor-parallel ranks keep the embedded GGUF's blocks packed (the packed CPU kernels at
TP > 1): each rank copies only its shard's Q4_1 / Q8_0 blocks, never dequantizes them,
and the sharded packed model computes TP=1's logits.

The real SmolLM2-135M GGUF shipped with the package, SmolLM2's 9 heads / 3 KV heads
split over 3 gloo ranks (one pool per module: spawning costs seconds)."""

from __future__ import annotations

import pytest
import torch
from llmservice.server.model.llama import LlamaModel, score_tokens
from llmservice.server.model.loader import weight_source
from llmservice.server.model.parallel import World
from llmservice.server.model.quant_weights import PackedTable, PackedWeight

from tests.support.tp_ranks import RankPool

MODEL = "builtin:smollm2-135m"
PROMPT = [1, 504, 3458, 282, 4649, 314, 2, 9, 1345, 30, 7001, 12, 5512, 88]


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(3)
    yield ranks
    ranks.close()


def build(world: World, cpu_weights: str = "quantized") -> LlamaModel:
    _, config, _, source = weight_source(MODEL, torch.float32, cpu_weights=cpu_weights)
    return LlamaModel(config, source, torch.device("cpu"), torch.float32, 256, world=world)


def held(world: World) -> dict[str, object]:
    """What kinds of weights a rank holds, and how many bytes."""
    model = build(world)
    layer = model.layers[0]
    linears = {"qkv": layer.qkv, "o_proj": layer.o_proj, "gate_up": layer.gate_up, "down": layer.down}
    return {
        "kinds": {name: type(lin.weight).__name__ for name, lin in linears.items()},
        "embed": type(model.embed.weight).__name__,
        "bytes": model.weight_bytes(),
    }


def logits(world: World) -> torch.Tensor | None:
    return score_tokens(build(world), PROMPT)


def test_ranks_hold_their_share_of_the_packed_blocks(pool):
    whole = held(World())
    assert set(whole["kinds"].values()) == {PackedWeight.__name__}
    assert whole["embed"] == PackedTable.__name__
    rank0 = pool.run(held, 3)
    assert rank0["kinds"] == whole["kinds"] and rank0["embed"] == whole["embed"]
    # a third of every matrix and of the vocabulary; the norms are replicated (~1 %)
    assert 0.30 * whole["bytes"] < rank0["bytes"] < 0.36 * whole["bytes"], (rank0, whole)
    # fp32 weights would be 4 bytes a parameter (counted from the config, not loaded:
    # dequantizing the whole model to weigh it cost seconds)
    _, config, _, _ = weight_source(MODEL, torch.float32)
    assert rank0["bytes"] < 0.1 * 4 * config.num_params


def test_packed_shards_compute_the_unsharded_logits(pool):
    expected = logits(World())
    ours = pool.run(logits, 3)
    rel = ((ours - expected).abs().max() / expected.abs().max()).item()
    assert rel <= 1e-4, f"TP=3 packed: relative logit error {rel:.2e}"
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))
