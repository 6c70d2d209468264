"""The step budget's metrics as the server exports them (server/step_metrics.py)."""

from __future__ import annotations

from llmservice.server.engine.messages import EngineStats
from llmservice.server.metrics import CacheInfo, ServerMetrics
from llmservice.server.step_metrics import TERMS

from tests.support.server_process import parse_metrics


def test_coefficients_target_ratio_and_overruns_are_exported():
    m = ServerMetrics("m", 2048, CacheInfo(16, 100, 0, 0.9))
    cost = (0.02, 2.5e-4, 1.2e-3, 3e-8)
    m.on_stats(EngineStats(step_seconds=0.12, step_kind="mixed", step_target_seconds=0.1, step_cost=cost,
                           step_decode_overruns=2))  # fmt: skip
    m.on_stats(EngineStats(step_seconds=0.3, step_kind="decode", step_target_seconds=0.1, step_cost=cost,
                           step_decode_overruns=5))  # fmt: skip
    m.on_stats(
        EngineStats(step_seconds=0.3, step_kind="decode", step_target_seconds=0.1, step_forced=True)
    )
    m.on_stats(EngineStats(step_cost=cost, step_decode_overruns=5))  # an admission report: no step
    got = parse_metrics(m.render().decode())
    for term, value in zip(TERMS, cost, strict=True):
        assert got[f'llmservice:step_cost_coefficient{{model_name="m",term="{term}"}}'] == value
    assert got['llmservice:step_budget_decode_overruns_total{model_name="m"}'] == 5
    assert got['llmservice:step_budget_target_seconds{model_name="m"}'] == 0.1
    ratio = "llmservice:step_time_over_target_ratio"
    assert got[f'{ratio}_bucket{{kind="mixed",le="1.25",model_name="m"}}'] == 1  # 1.2x: within 1.25
    assert got[f'{ratio}_bucket{{kind="decode",le="2.0",model_name="m"}}'] == 0  # 3x
    assert got[f'{ratio}_count{{kind="forced",model_name="m"}}'] == 1  # counted apart from decode
    assert got[f'{ratio}_count{{kind="decode",model_name="m"}}'] == 1
    assert got['llmservice:step_duration_seconds_count{kind="decode",model_name="m"}'] == 2
    assert got["llmservice:step_duration_seconds_count"] == 3
