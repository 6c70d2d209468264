"""The advisor inside the operator: per LLMService, each pod's previous scrape, the
findings of the latest window aggregated over pods, and the hysteresis. No I/O: the
autoscaling loop hands in the pages it scraped and posts what this returns.

Aggregation: a rule found on several pods is one finding, with the evidence of the
first pod (by name) and the list of pods; warnings sort first, so `status.advice[0]` is
what the printer column shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from llmservice.operator.advisor import engine_settings, rules
from llmservice.operator.advisor.hysteresis import Hysteresis, step
from llmservice.operator.advisor.snapshot import Scrape, Snapshot


def enabled(spec: dict[str, Any] | None) -> bool:
    """`spec.advisor.enabled`, default true."""
    advisor = (spec or {}).get("advisor") or {}
    return advisor.get("enabled", True) is not False


@dataclass(frozen=True)
class PodPage:
    """One pod's scrape in this window."""

    uid: str
    name: str
    scrape: Scrape
    oom_restarts: int = 0


@dataclass(frozen=True)
class Advice:
    findings: list[dict[str, Any]]  # status.advice, hysteresis applied
    appeared: list[dict[str, Any]]  # findings to announce with an Event


def aggregate(per_pod: dict[str, list[rules.Finding]]) -> dict[str, dict[str, Any]]:
    """rule -> finding dict with `pods`; pods in name order."""
    out: dict[str, dict[str, Any]] = {}
    for pod in sorted(per_pod):
        for finding in per_pod[pod]:
            entry = out.setdefault(finding.rule, {**finding.to_dict(), "pods": []})
            entry["pods"].append(pod)
    return out


@dataclass
class ServiceAdvisor:
    hysteresis: Hysteresis = field(default_factory=Hysteresis)
    last: dict[str, tuple[Scrape, float]] = field(default_factory=dict)  # pod uid -> (page, time)

    def window(self, spec: dict[str, Any] | None, pages: Iterable[PodPage], now: float) -> Advice:
        """One window: the rules on each pod with a previous page, then the hysteresis."""
        spec_settings = engine_settings.from_spec(spec)
        per_pod: dict[str, list[rules.Finding]] = {}
        seen: set[str] = set()
        for page in pages:
            seen.add(page.uid)
            previous = self.last.get(page.uid)
            self.last[page.uid] = (page.scrape, now)
            if previous is None or now <= previous[1]:
                continue
            snap = Snapshot(previous[0], page.scrape, now - previous[1], page.oom_restarts)
            settings = engine_settings.from_metrics(page.scrape).overlaid(spec_settings)
            per_pod[page.name] = rules.evaluate(snap, settings)
        for uid in [u for u in self.last if u not in seen]:
            del self.last[uid]  # gone, or its scrape failed: start over with its next page
        found = aggregate(per_pod)
        result = step(self.hysteresis, set(found))
        self.hysteresis = result.state
        shown = sorted(
            (found[r] for r in result.shown),
            key=lambda f: (rules.SEVERITY_ORDER.get(f["severity"], 9), f["rule"]),
        )
        return Advice(shown, [f for f in shown if f["rule"] in result.appeared])
