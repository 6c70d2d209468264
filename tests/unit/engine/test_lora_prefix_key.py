"""The prefix cache keys include the LoRA adapter: a prompt computed under one adapter is
never served from KV computed under another adapter or the base model."""

from __future__ import annotations

from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.request import Request
from llmservice.server.engine.sampling_params import SamplingParams

BLOCK = 8
PROMPT = list(range(100, 141))  # 41 tokens: 5 full blocks


def _computed(bm: BlockManager, rid: str, lora_name: str | None) -> Request:
    """A request whose whole prompt is computed and cached, then freed (blocks stay cached)."""
    req = Request(rid, list(PROMPT), SamplingParams(), max_tokens=4, lora_name=lora_name)
    assert bm.allocate_slots(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    bm.cache_blocks(req)
    bm.free(req)
    return req


def _hit_tokens(bm: BlockManager, lora_name: str | None) -> int:
    probe = Request("probe", list(PROMPT), SamplingParams(), max_tokens=4, lora_name=lora_name)
    return bm.get_computed_blocks(probe)[1]


def test_same_adapter_hits_the_cache():
    bm = BlockManager(64, BLOCK)
    _computed(bm, "a", "sql")
    assert _hit_tokens(bm, "sql") == 5 * BLOCK


def test_other_adapter_and_base_miss():
    bm = BlockManager(64, BLOCK)
    _computed(bm, "a", "sql")
    assert _hit_tokens(bm, "chat") == 0
    assert _hit_tokens(bm, None) == 0


def test_adapter_misses_base_model_kv():
    bm = BlockManager(64, BLOCK)
    _computed(bm, "a", None)
    assert _hit_tokens(bm, None) == 5 * BLOCK
    assert _hit_tokens(bm, "sql") == 0


def test_hash_chains_differ_from_the_first_block():
    bm = BlockManager(64, BLOCK)
    base = _computed(bm, "a", None).block_hashes
    sql = _computed(bm, "b", "sql").block_hashes
    assert len(base) == len(sql) == 5
    assert not set(base) & set(sql)
    bm.check_invariants()
