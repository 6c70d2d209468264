"""Scheduler invariants on the real engine: token budget, max_num_seqs, max_model_len."""

from __future__ import annotations

import random

import pytest
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine.engine import PromptTooLongError
from llmservice.server.engine.sampling_params import SamplingParams


def record_schedules(engine):
    seen = []
    original = engine.scheduler.schedule

    def wrapped():
        out = original()
        seen.append(([(s.request_id, s.num_tokens) for s in out.scheduled], len(engine.scheduler.running)))
        return out

    engine.scheduler.schedule = wrapped
    return seen


def test_budget_and_max_num_seqs_hold_every_step(make_engine):
    eng = make_engine(max_num_batched_tokens=48, max_num_seqs=3)
    seen = record_schedules(eng)
    rng = random.Random(1)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(3, 90))] for _ in range(7)]
    outs = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert all(len(o.token_ids) == 5 for o in outs)
    assert len(seen) > 7
    for scheduled, running in seen:
        assert sum(n for _, n in scheduled) <= 48
        assert running <= 3 and len(scheduled) <= 3
    # chunked prefill really split the 90-token prompts and mixed them with decodes
    assert any(n == 1 for s, _ in seen for _, n in s) and any(1 < n for s, _ in seen for _, n in s)


def test_without_chunked_prefill_prompts_are_scheduled_whole(make_engine):
    eng = make_engine(max_num_batched_tokens=1024, enable_chunked_prefill=False, enable_prefix_caching=False)
    seen = record_schedules(eng)
    prompts = [[200 + i] * length for i, length in enumerate([300, 500, 400])]
    eng.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    prefill_sizes = sorted(n for s, _ in seen for _, n in s if n > 1)
    assert prefill_sizes == [300, 400, 500]
    assert all(sum(n for _, n in s) <= 1024 for s, _ in seen)


def test_prompt_plus_max_tokens_over_max_model_len_is_rejected(engine):
    with pytest.raises(PromptTooLongError) as err:
        engine.add_request([5] * 1000, SamplingParams(max_tokens=100))
    assert "1000" in str(err.value) and "100" in str(err.value) and "1024" in str(err.value)
    assert not engine.has_unfinished_requests()
    with pytest.raises(PromptTooLongError):
        engine.add_request([5] * 1024, SamplingParams(max_tokens=None))


def test_bad_engine_arguments_name_the_value():
    with pytest.raises(ConfigError, match="--block-size 24"):
        EngineConfig(block_size=24)
    with pytest.raises(ConfigError, match="--preemption-mode 'sometimes'"):
        EngineConfig(preemption_mode="sometimes")
    cfg = EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=2048)
    with pytest.raises(ConfigError, match="--max-num-batched-tokens 512 is smaller than --max-model-len 2048"):
        cfg.resolve_lengths(8192)
