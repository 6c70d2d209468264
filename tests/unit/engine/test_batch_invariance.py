"""Greedy outputs do not depend on batching, block size, or recompute preemption."""

from __future__ import annotations

import random

import pytest
from llmservice.server.engine.sampling_params import SamplingParams


def mixed_workload(vocab: int, n: int = 16, seed: int = 7):
    rng = random.Random(seed)
    prompts, params = [], []
    for i in range(n):
        length = [5, 300][i % 2] if i < 2 else rng.randint(5, 160)
        prompts.append([rng.randrange(100, vocab) for _ in range(length)])
        out = [1, 64][i % 2] if i < 2 else rng.randint(1, 48)
        params.append(SamplingParams(temperature=0, max_tokens=out, ignore_eos=True))
    return prompts, params


@pytest.fixture(scope="module")
def workload(engine):
    return mixed_workload(engine.model_config.vocab_size)


@pytest.fixture(scope="module")
def one_by_one(make_engine, workload):
    eng = make_engine(enable_prefix_caching=False)
    prompts, params = workload
    return [eng.generate([p], [sp])[0].token_ids for p, sp in zip(prompts, params, strict=True)]


@pytest.mark.parametrize(
    "block_size",
    [8, *(pytest.param(b, marks=pytest.mark.e2e) for b in (16, 32, 64)), 128],  # ends: default tier
)
def test_batched_equals_one_by_one(make_engine, workload, one_by_one, block_size):
    eng = make_engine(block_size=block_size, max_num_batched_tokens=512)
    prompts, params = workload
    outs = eng.generate(prompts, params)
    assert [o.token_ids for o in outs] == one_by_one
    assert [len(o.token_ids) for o in outs] == [sp.max_tokens for sp in params]
    eng.block_manager.check_invariants()
    assert eng.block_manager.usage == 0.0


def test_recompute_preemption_keeps_outputs(make_engine, workload, one_by_one):
    # 40 blocks x 16 tokens = 640 tokens of KV for ~1500 tokens of demand: preemption must happen
    eng = make_engine(num_gpu_blocks_override=40, max_model_len=512, max_num_batched_tokens=256)
    prompts, params = workload
    outs = eng.generate(prompts, params)
    assert eng.scheduler.stats.num_preemptions > 0
    assert sum(o.num_preemptions for o in outs) == eng.scheduler.stats.num_preemptions
    assert [o.token_ids for o in outs] == one_by_one
    eng.block_manager.check_invariants()
    assert eng.block_manager.num_free_blocks == 40
