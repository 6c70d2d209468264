"""The step-cost profile's prefills price a recompute preemption (no second timing)."""

from __future__ import annotations

import pytest
from llmservice.server.engine.cost_model import StepShape
from llmservice.server.engine.startup import profiled_prefills
from llmservice.server.engine.swap_space import fit_costs


def shape(*requests: tuple[int, int]) -> StepShape:
    return StepShape.of(requests)


def test_the_smallest_and_largest_prefill_only_steps_are_taken():
    samples = [
        (shape((64, 0)), 0.040),
        (shape((16, 0)), 0.012),
        (shape(*[(1, 64)] * 8), 0.020),  # decodes
        (shape(*[(1, 64)] * 8, (32, 0)), 0.050),  # mixed: not a pure prefill
    ]
    assert profiled_prefills(samples) == ((16, 0.012), (64, 0.040))
    costs = fit_costs(profiled_prefills(samples), None, 1024)
    assert costs.recompute_s_per_token == (0.040 - 0.012) / 48
    assert costs.prefill_tokens_per_s == 64 / 0.040


def test_fewer_than_two_prefill_sizes_give_none():
    assert profiled_prefills([]) is None
    assert profiled_prefills([(shape((64, 0)), 0.04), (shape((1, 64)), 0.01)]) is None


def test_an_engine_with_a_step_profile_does_not_time_prefills_again(make_engine, monkeypatch):
    from llmservice.server.engine import startup

    def no_second_timing(*args, **kwargs):
        raise AssertionError("prefills timed again although the step profile ran")

    monkeypatch.setattr(startup, "timed_prefills", no_second_timing)
    engine = make_engine(max_step_ms=50)  # a time budget: the step profile runs
    costs = engine.preemption_costs
    assert costs.measured and costs.recompute_s_per_token > 0 and costs.prefill_tokens_per_s > 0
    with pytest.raises(AssertionError, match="timed again"):
        make_engine()  # max_step_ms=0: no profile, so the prefills are timed
