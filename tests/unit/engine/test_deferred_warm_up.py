"""An engine built with its start-up measurements deferred serves at once, and the
measurements, run later piece by piece, never touch a cached prefix's KV."""

from __future__ import annotations

import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine import step_profile
from llmservice.server.engine.core import EngineCore
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.messages import CostsMeasured
from llmservice.server.engine.sampling_params import SamplingParams

PROMPT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def deferred_engine(smollm, **overrides) -> LLMEngine:
    # a time budget, so the step profile is among the measurements
    config = EngineConfig(max_model_len=1024, num_threads=1, max_step_ms=50, **overrides)
    return LLMEngine.from_config(config, loaded=smollm, defer_warm_up=True)


def cached_kv(engine: LLMEngine) -> dict[int, list[torch.Tensor]]:
    blocks = sorted(engine.block_manager.cached.values())
    return {b: [pool[b].clone() for pair in engine.runner.kv_caches for pool in pair] for b in blocks}


def test_measurements_run_after_serving_and_leave_cached_prefixes_intact(smollm, monkeypatch):
    monkeypatch.setattr(step_profile, "_MEASURED", {})  # measure here, not from an earlier engine
    engine = deferred_engine(smollm, swap_space=0.01, preemption_mode="auto")
    assert not engine.cost_model.seeded and not engine.preemption_costs.measured
    first = engine.generate([PROMPT], GREEDY)[0].token_ids
    before = cached_kv(engine)
    assert before, "the prompt's full blocks are in the prefix cache"

    core = EngineCore(engine)
    answers = []
    while core.warming_up:
        answers.append(core.warm_up_piece())
    assert len(answers) > 2 and answers[:-1] == [None] * (len(answers) - 1)  # a shape per piece
    done = answers[-1]
    assert isinstance(done, CostsMeasured) and done.recompute_s_per_token > 0 and done.swap_s_per_token > 0
    assert engine.cost_model.seeded and engine.preemption_costs.measured and engine.preemption_costs.swap_measured
    assert core.warm_up_piece() is None

    after = cached_kv(engine)
    assert after.keys() == before.keys()
    assert all(torch.equal(a, b) for blk in before for a, b in zip(before[blk], after[blk], strict=True))
    hits = engine.scheduler.stats.prefix_hits
    assert engine.generate([PROMPT], GREEDY)[0].token_ids == first
    assert engine.scheduler.stats.prefix_hits > hits
    engine.block_manager.check_invariants()


def test_a_shape_without_enough_blank_blocks_is_left_out(smollm, monkeypatch):
    monkeypatch.setattr(step_profile, "_MEASURED", {})
    engine = deferred_engine(smollm)
    full = len(engine.warm_up.shapes)
    # every free block but three holds a cached prefix: the profile's larger shapes find no room
    blank = engine.block_manager.blank_free_blocks()
    for i, block_id in enumerate(blank[3:]):
        engine.block_manager.blocks[block_id].block_hash = -(i + 1)
    engine.warm_up.run()
    assert 0 < len(engine.warm_up.samples) < full
    assert not engine.warm_up.complete and step_profile._MEASURED == {}  # not reused by a later engine
