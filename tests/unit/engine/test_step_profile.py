"""The start-up step profile: each shape's faster run is kept (a first-use compile or a
neighbour's burst is not the machine's speed), and the whole profile is bounded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from llmservice.server.config import EngineConfig
from llmservice.server.engine import step_profile


class SlowFirstRunner:
    """Each step's first run takes `first_s`, the second `then_s` (a compile, then the speed).

    Time is the runner's own clock, advanced by each run: the durations are the test's,
    not the machine's, so a loaded machine cannot change what is measured."""

    def __init__(self, first_s: float, then_s: float):
        self.model = SimpleNamespace(config=SimpleNamespace(vocab_size=49152))
        self.first_s, self.then_s = first_s, then_s
        self.seen: set[tuple] = set()
        self.runs = 0
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def execute(self, out) -> None:
        if not out.scheduled:
            return  # the final clean-up step
        self.runs += 1
        key = tuple((r.request_id, r.start_position, len(r.token_ids)) for r in out.scheduled)
        self.now += self.then_s if key in self.seen else self.first_s
        self.seen.add(key)


def _shapes(config: EngineConfig) -> list:
    return step_profile.profile_shapes(config, cuda=False, num_blocks=64)


def test_each_shape_keeps_its_faster_run():
    config = EngineConfig(max_model_len=512, block_size=16).resolve_lengths(512)
    shapes = _shapes(config)
    runner = SlowFirstRunner(first_s=0.05, then_s=0.002)
    samples = step_profile._measure(runner, config, shapes, cuda=False, clock=runner.clock)  # type: ignore[arg-type]
    assert len(samples) == len(shapes) and runner.runs == 2 * len(shapes)
    assert all(seconds == pytest.approx(0.002) for _, seconds in samples)  # never the 50 ms first run


def test_the_profile_stops_at_its_budget(monkeypatch):
    monkeypatch.setitem(step_profile.PROFILE_BUDGET_S, "cpu", 0.15)
    config = EngineConfig(max_model_len=512, block_size=16).resolve_lengths(512)
    shapes = _shapes(config)
    runner = SlowFirstRunner(first_s=0.05, then_s=0.05)  # 0.1 s per shape
    samples = step_profile._measure(runner, config, shapes, cuda=False, clock=runner.clock)  # type: ignore[arg-type]
    assert len(shapes) > 2 and len(samples) == 2  # started at 0 and 0.1 s; none after 0.15 s
