"""The step budget respects the target, the decode-first rule, the token cap, and shares
prefill so short prompts are not stuck behind long ones."""

from __future__ import annotations

import pytest
from llmservice.server.engine.cost_model import Coefficients, StepShape
from llmservice.server.engine.step_budget import (
    DEFAULT_DECODE_MULTIPLE,
    MIN_PROGRESS_TOKENS,
    chunk_cost,
    max_chunk,
    resolve_target_s,
    share_prefill,
)

C = Coefficients(fixed=0.02, prefill_token=5e-4, decode_token=2e-3, attended_pair=1e-7)
DECODES = StepShape.of([(1, 300)] * 32)


def test_target_rules():
    assert resolve_target_s(150.0, C, DECODES, True) == pytest.approx(0.150)
    assert resolve_target_s(0.0, C, DECODES, True) is None  # 0: token budget alone
    assert resolve_target_s(150.0, C, DECODES, False) is None  # no model yet: no time limit
    derived = resolve_target_s(None, C, DECODES, True)
    assert derived == pytest.approx(DEFAULT_DECODE_MULTIPLE * C.predict(DECODES))
    # nothing decodes: nothing to protect
    assert resolve_target_s(None, C, StepShape(), True) is None


@pytest.mark.parametrize("start", [0, 100, 3000])
@pytest.mark.parametrize("seconds", [0.0005, 0.01, 0.2])
def test_max_chunk_is_the_largest_chunk_within_the_time(start, seconds):
    n = max_chunk(C, seconds, start, 10_000)
    assert chunk_cost(C, n, start) <= seconds
    assert n == 10_000 or chunk_cost(C, n + 1, start) > seconds


def test_max_chunk_respects_the_limit_and_no_time():
    assert max_chunk(C, 10.0, 0, 64) == 64
    assert max_chunk(C, 0.0, 0, 64) == 0
    assert max_chunk(C, -1.0, 0, 64) == 0
    free_prefill = Coefficients(0.01, 0.0, 0.0, 0.0)
    assert max_chunk(free_prefill, 0.001, 0, 64) == 64  # the limit


def test_share_respects_time_and_token_cap():
    needs = [(2000, 0), (700, 0), (50, 0), (3000, 500)]
    for seconds in (0.05, 0.2, 1.0):
        for cap in (64, 256, 2048):
            alloc = share_prefill(needs, seconds, cap, C)
            assert sum(alloc) <= cap
            assert (
                sum(chunk_cost(C, g, s) for g, (_, s) in zip(alloc, needs, strict=True))
                <= seconds + 1e-12
            )
            assert all(0 <= g <= n for g, (n, _) in zip(alloc, needs, strict=True))


def test_a_short_prompt_is_not_stuck_behind_a_long_one():
    """One long prompt first in line, a short one behind: the short one completes this step."""
    room = 0.25
    alloc = share_prefill([(5000, 0), (40, 0)], room, 2048, C)
    assert alloc[1] == 40
    assert alloc[0] > 0
    # even behind two long prompts, half the room is open to it
    alloc = share_prefill([(5000, 0), (4000, 0), (40, 0)], room, 2048, C)
    assert alloc[2] == 40


def test_a_lone_long_prompt_gets_the_whole_room():
    room = 0.25
    alloc = share_prefill([(5000, 0)], room, 2048, C)
    assert alloc[0] == max_chunk(C, room, 0, 2048)
    alloc = share_prefill([(5000, 0)], None, 2048, C)
    assert alloc == [2048]  # no time limit: the token cap


def test_short_prompts_keep_policy_order():
    alloc = share_prefill([(300, 0), (300, 0), (300, 0)], chunk_cost(C, 450, 0), 2048, C)
    assert alloc[0] == 300 and 0 < alloc[1] < 300 and alloc[2] == 0


def test_no_time_left_means_no_prefill_unless_nothing_else_runs():
    assert share_prefill([(100, 0)], -0.01, 2048, C) == [0]  # decodes alone over the target
    assert share_prefill([(100, 0)], -0.01, 2048, C, must_progress=True) == [MIN_PROGRESS_TOKENS]
    assert share_prefill([(5, 0)], 0.0, 2048, C, must_progress=True) == [5]


@pytest.mark.parametrize(
    ("max_model_len", "blocks", "cap"),
    [(64, 4, 2048), (1024, 1456, 2048), (256, 16, 7), (4096, 256, 8192)],
)
def test_profile_shapes_fit_the_pool_and_the_cap(max_model_len, blocks, cap):
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine.step_profile import profile_shapes

    config = EngineConfig(max_model_len=max_model_len, max_num_batched_tokens=cap)
    for cuda in (False, True):
        shapes = profile_shapes(config, cuda, blocks)
        assert len(shapes) >= 3  # enough to seed four coefficients with the prior's help
        for shape in shapes:
            assert sum(-(-(start + n) // 16) for n, start in shape) <= blocks
            assert sum(n for n, _ in shape) <= cap
            assert all(start + n <= max_model_len for n, start in shape)


def test_default_mode_floor_keeps_prefill_moving_whatever_the_fit():
    """A fit that prices attended pairs absurdly (seen under load) would allow a few tokens;
    the default mode's floor still gives the waiting prompts DEFAULT_MIN_PREFILL_TOKENS."""
    from llmservice.server.engine.cost_model import Coefficients
    from llmservice.server.engine.step_budget import DEFAULT_MIN_PREFILL_TOKENS

    skewed = Coefficients(0.0, 0.0, 0.0, 0.0115)
    assert sum(share_prefill([(1000, 0)], 0.05, 2048, skewed)) < 10
    floor = DEFAULT_MIN_PREFILL_TOKENS
    assert share_prefill([(1000, 0)], 0.05, 2048, skewed, min_tokens=floor) == [floor]
    # spread in policy order, never past a candidate's need or the token budget
    half = floor // 2
    assert share_prefill([(half, 0), (1000, 0)], 0.05, 2048, skewed, min_tokens=floor) == [half, floor - half]
    assert share_prefill([(1000, 0)], 0.05, half, skewed, min_tokens=floor) == [half]
    assert share_prefill([(floor - 2, 0)], 0.05, 2048, skewed, min_tokens=floor) == [floor - 2]
