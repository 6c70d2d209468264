"""Greedy outputs of a 24-request mixed workload are identical whatever the scheduling
knobs: prefix caching, chunk budget, chunked prefill off, preemption mode, block size."""

from __future__ import annotations

import random

import pytest
from llmservice.server.engine.sampling_params import SamplingParams


def workload(seed: int = 11):
    rng = random.Random(seed)
    prefixes = {
        "none": [],
        "one_block": [rng.randrange(200, 40000) for _ in range(16)],
        "many_blocks": [rng.randrange(200, 40000) for _ in range(70)],  # 4 blocks of 16 + 6: ends mid-block
        "mid_block": [rng.randrange(200, 40000) for _ in range(23)],
    }
    names = list(prefixes)
    prompts, params = [], []
    for i in range(24):
        suffix = [rng.randrange(200, 40000) for _ in range(rng.randint(1, 30))]
        prompts.append(prefixes[names[i % 4]] + suffix)
        params.append(SamplingParams(temperature=0, max_tokens=rng.randint(2, 14), ignore_eos=True))
    return prompts, params


@pytest.fixture(scope="module")
def mixed():
    return workload()


@pytest.fixture(scope="module")
def reference(make_engine, mixed):
    """Everything off: no prefix cache, whole prompts, no preemption."""
    eng = make_engine(enable_prefix_caching=False, enable_chunked_prefill=False, max_num_batched_tokens=4096)
    outs = eng.generate(*mixed)
    assert eng.scheduler.stats.num_preemptions == 0
    return [o.token_ids for o in outs]


CASES = {
    "prefix_on": dict(enable_prefix_caching=True, max_num_seqs=4),  # later requests find earlier prefixes
    "chunk_7": dict(max_num_batched_tokens=7),
    "chunk_64": dict(max_num_batched_tokens=64),
    "chunk_512": dict(max_num_batched_tokens=512),
    "recompute": dict(num_gpu_blocks_override=24, max_model_len=256, preemption_mode="recompute"),
    "swap": dict(num_gpu_blocks_override=24, max_model_len=256, preemption_mode="swap", swap_space=0.05),
    "auto": dict(num_gpu_blocks_override=24, max_model_len=256, preemption_mode="auto", swap_space=0.05),
    "swap_tiny_pool_falls_back": dict(
        num_gpu_blocks_override=24, max_model_len=256, preemption_mode="swap", swap_space=0.0012
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_identical(make_engine, mixed, reference, case):
    eng = make_engine(**CASES[case])
    outs = eng.generate(*mixed)
    assert [o.token_ids for o in outs] == reference
    stats = eng.scheduler.stats
    if case == "prefix_on":
        assert stats.prefix_hits > 0
    if "num_gpu_blocks_override" in CASES[case]:
        assert stats.num_preemptions > 0
        # the victims' computed tokens, counted under the mode that handled each
        assert stats.preempted_tokens_recompute + stats.preempted_tokens_swap > 0
    if case in ("swap", "auto"):
        assert stats.num_swap_outs > 0 and stats.num_swap_ins == stats.num_swap_outs
        assert stats.preempted_tokens_swap >= stats.num_swap_outs
    if CASES[case].get("preemption_mode", "recompute") == "recompute":
        assert stats.preempted_tokens_swap == 0
    if case == "swap_tiny_pool_falls_back":
        assert stats.num_preemptions > stats.num_swap_outs  # some victims did not fit: recompute
        assert stats.preempted_tokens_recompute > 0
    eng.block_manager.check_invariants()
    assert eng.block_manager.usage == 0.0
    assert eng.swap_space.num_free == eng.swap_space.num_blocks


@pytest.mark.parametrize("block_size", [8, 32, 64, 128])
def test_outputs_identical_across_block_sizes_with_swap(make_engine, mixed, reference, block_size):
    blocks = 256 // block_size  # same KV memory for every block size: 256 tokens
    eng = make_engine(
        block_size=block_size, num_gpu_blocks_override=blocks, max_model_len=128, preemption_mode="swap",
        swap_space=0.1, max_num_batched_tokens=128,
    )
    outs = eng.generate(*mixed)
    assert [o.token_ids for o in outs] == reference
    if block_size <= 32:  # with 64/128-token blocks whole prompts fit their blocks: no growth, no preemption
        assert eng.scheduler.stats.num_swap_outs > 0
    assert eng.block_manager.usage == 0.0 and eng.swap_space.usage == 0.0
