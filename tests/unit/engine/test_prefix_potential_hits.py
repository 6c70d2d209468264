"""`llmservice:prefix_cache_potential_hits_total`: prompt tokens a prefix cache would
have served, counted by the engine with caching off (the advisor's rule 3) and on."""

from __future__ import annotations

import pytest
from llmservice.server.engine.prefix_sketch import PrefixSketch
from llmservice.server.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)


def test_sketch_counts_the_leading_run_of_seen_blocks():
    sketch = PrefixSketch(capacity=100)
    assert sketch.observe([1, 2, 3], max_hit_blocks=3) == 0
    assert sketch.observe([1, 2, 9], max_hit_blocks=3) == 2
    assert sketch.observe([1, 2, 3], max_hit_blocks=2) == 2  # a cache always computes one token
    assert sketch.observe([7, 2, 3], max_hit_blocks=3) == 0  # a chain: no parent, no hit


def test_sketch_is_bounded_and_forgets_the_least_recent():
    sketch = PrefixSketch(capacity=4)
    sketch.observe([1, 2, 3, 4], 4)
    sketch.observe([1], 1)  # touch 1: 2 is now the oldest
    sketch.observe([5], 1)
    assert len(sketch) == 4
    assert sketch.observe([2], 1) == 0 and sketch.observe([1], 1) == 1
    with pytest.raises(ValueError, match="capacity"):
        PrefixSketch(0)


@pytest.mark.parametrize("caching", [False, True])
def test_engine_counts_potential_hits_of_a_shared_system_prompt(make_engine, caching):
    eng = make_engine(block_size=16, enable_prefix_caching=caching, max_num_seqs=1)
    system = [300 + (i % 50) for i in range(160)]  # 10 full blocks shared
    prompts = [system + [1000 + k] * 20 for k in range(4)]
    eng.generate(prompts, PARAMS)
    stats = eng.scheduler.stats
    # the first prompt hits nothing; each later one hits the 10 shared blocks (160 tokens)
    assert stats.prefix_potential_hits == 3 * 160
    if caching:
        assert stats.prefix_hits == 3 * 160  # the sketch agrees with the real cache here
    else:
        assert stats.prefix_hits == 0 and stats.prefix_queries == 0


def test_unrelated_prompts_have_no_potential_hits(make_engine):
    eng = make_engine(block_size=16, enable_prefix_caching=False)
    eng.generate([[100 + k] * 64 for k in range(4)], PARAMS)
    assert eng.scheduler.stats.prefix_potential_hits == 0
