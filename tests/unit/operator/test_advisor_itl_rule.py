"""Advisor rule 7: ITL p99 > 4x its median with long steps as evidence -> engine.maxStepMs.
Read from a real server metrics page (ServerMetrics renders it, the advisor parses it)."""

from __future__ import annotations

from llmservice.operator.advisor import rules
from llmservice.operator.advisor.engine_settings import EngineSettings
from llmservice.operator.advisor.snapshot import Snapshot, parse
from llmservice.server.engine.messages import EngineStats
from llmservice.server.metrics import CacheInfo, ServerMetrics


def page(
    gaps: list[tuple[float, int]], steps: list[tuple[float, str, int]], target: float | None = None
) -> str:
    m = ServerMetrics("m", 2048, CacheInfo(16, 1000, 0, 0.9))
    for gap, n in gaps:
        for _ in range(n):
            m.on_tokens(1, gap)
    for seconds, kind, n in steps:
        for _ in range(n):
            m.on_stats(
                EngineStats(
                    step_tokens=10, step_seconds=seconds, step_kind=kind, step_target_seconds=target
                )
            )
    return m.render().decode()


def snap(gaps, steps, target=None) -> Snapshot:
    return Snapshot(parse(page([], [])), parse(page(gaps, steps, target)), 60.0)


# the CPU run: median gap ~350 ms, p99 ~2 s, steps as long as the gaps
SPIKY_GAPS = [(0.35, 900), (0.45, 60), (2.0, 40)]
SPIKY_STEPS = [(0.3, "decode", 500), (1.8, "mixed", 40)]


def test_spiky_itl_with_long_steps_recommends_max_step_ms():
    finding = rules.itl_step_rule(snap(SPIKY_GAPS, SPIKY_STEPS), EngineSettings())
    assert finding is not None and finding.rule == "itl-long-steps"
    target = finding.recommendation["engine"]["maxStepMs"]
    p50 = finding.evidence["itlP50Seconds"]
    # twice the median, rounded up to 10 ms
    assert 2 * p50 * 1000 - 1 <= target <= 2 * p50 * 1000 + 10
    assert finding.evidence["itlP99OverMedian"] > rules.ITL_P99_OVER_MEDIAN
    assert finding in rules.evaluate(snap(SPIKY_GAPS, SPIKY_STEPS), EngineSettings())


def test_silent_just_under_four_times_the_median():
    gaps = [(0.35, 900), (0.45, 60), (1.0, 40)]  # p99 inside the 0.75-1.0 bucket: < 4 x 0.35
    assert rules.itl_step_rule(snap(gaps, SPIKY_STEPS), EngineSettings()) is None


def test_silent_when_the_steps_are_short():
    """Spiky gaps whose steps are all short are not this mistake (network, preemption, loop)."""
    short_steps = [(0.3, "decode", 540)]
    assert rules.itl_step_rule(snap(SPIKY_GAPS, short_steps), EngineSettings()) is None


def test_silent_without_step_metrics_or_enough_gaps():
    assert rules.itl_step_rule(snap(SPIKY_GAPS, []), EngineSettings()) is None  # stock vLLM
    few = [(0.35, 50), (2.0, 5)]
    assert rules.itl_step_rule(snap(few, SPIKY_STEPS), EngineSettings()) is None


def test_silent_when_the_target_is_already_that_tight():
    assert rules.itl_step_rule(snap(SPIKY_GAPS, SPIKY_STEPS, target=0.5), EngineSettings()) is None
    loose = rules.itl_step_rule(snap(SPIKY_GAPS, SPIKY_STEPS, target=5.0), EngineSettings())
    assert loose is not None and loose.evidence["stepTargetSeconds"] == 5.0
