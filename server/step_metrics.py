"""The step-time budget's metrics (server/engine/step_budget.py, docs/engine.md).

- `llmservice:step_duration_seconds{kind}`: every engine step's wall time, by kind:
  `decode` (no prompt token), `prefill` (no decode), `mixed`. The advisor's evidence that
  long inter-token gaps are long steps.
- `llmservice:step_time_over_target_ratio{kind}`: measured step time / the step's target,
  for steps that had one: the share above 1.5 is the budget's miss rate. kind `forced`:
  steps whose least (their decodes; with none, the smallest prefill chunk) was already
  predicted over the target, misses the budget cannot avoid (the target is below what
  this machine does for that batch).
- `llmservice:step_budget_target_seconds`: the last step's target (0: no time limit).
- `llmservice:step_cost_coefficient{term}`: the fitted cost model (seconds per step, per
  prefill token, per decode token, per attended query-key pair).
- `llmservice:step_budget_decode_overruns_total`: steps whose decodes alone were
  predicted over the target (they run, prefill waits).
"""

from __future__ import annotations

from typing import Any

from llmservice.server.engine.cost_model import TERMS
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

STEP_BUCKETS = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0,
]  # fmt: skip
RATIO_BUCKETS = [0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0]
STEP_KINDS = ("decode", "prefill", "mixed")
RATIO_KINDS = (*STEP_KINDS, "forced")


class StepMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        m = {"model_name": model_name}
        duration = Histogram(
            "llmservice:step_duration_seconds", "Wall time of one engine step, by kind, in seconds.",
            ["model_name", "kind"], buckets=STEP_BUCKETS, registry=registry,
        )  # fmt: skip
        ratio = Histogram(
            "llmservice:step_time_over_target_ratio",
            "Measured step time over the step-time budget's target, by kind.",
            ["model_name", "kind"], buckets=RATIO_BUCKETS, registry=registry,
        )  # fmt: skip
        self.duration = {k: duration.labels(model_name=model_name, kind=k) for k in STEP_KINDS}
        self.ratio = {k: ratio.labels(model_name=model_name, kind=k) for k in RATIO_KINDS}
        self.target = Gauge(
            "llmservice:step_budget_target_seconds",
            "The last step's time target in seconds (0: no time limit).", ["model_name"], registry=registry,
        ).labels(**m)  # fmt: skip
        coefficient = Gauge(
            "llmservice:step_cost_coefficient",
            "Fitted step cost model: seconds per step (fixed), per prefill token, per decode token, "
            "per attended query-key pair.", ["model_name", "term"], registry=registry,
        )  # fmt: skip
        self.coefficient = {t: coefficient.labels(model_name=model_name, term=t) for t in TERMS}
        self.decode_overruns = Counter(
            "llmservice:step_budget_decode_overruns",
            "Steps whose running decodes alone were predicted over the step-time target.",
            ["model_name"], registry=registry,
        ).labels(**m)  # fmt: skip
        self._overruns = 0

    def on_stats(self, stats: Any) -> None:
        """From an EngineStats (server/engine/messages.py)."""
        if stats.step_cost is not None:
            for term, value in zip(TERMS, stats.step_cost, strict=True):
                self.coefficient[term].set(value)
        self.decode_overruns.inc(max(0, stats.step_decode_overruns - self._overruns))
        self._overruns = max(self._overruns, stats.step_decode_overruns)
        if stats.step_seconds is None or stats.step_kind not in self.duration:
            return
        self.duration[stats.step_kind].observe(stats.step_seconds)
        target = stats.step_target_seconds
        self.target.set(target or 0.0)
        if target:
            kind = "forced" if stats.step_forced else stats.step_kind
            self.ratio[kind].observe(stats.step_seconds / target)
