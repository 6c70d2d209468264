"""Two scrapes of one pod's `/metrics`, as the rules read them: rates and histogram deltas.

A single scrape cannot say "preemptions are rising" or "answers are short *now*": the
counters and histograms are cumulative since the process started. So the advisor reads
two scrapes `seconds` apart and works on their difference (Prometheus' `increase()` rule:
a counter that went down means the process restarted, and its new value is the increase).

Parsing uses prometheus-client's own parser, as scrape.py does, so our server's page and
a stock vLLM page go through the same code. Values are summed over label sets (one engine
per pod); `*_info` gauges keep their labels (vLLM's `vllm:cache_config_info`). Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (le -> count, +Inf included), count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def minus(self, before: Histogram | None) -> Histogram:
        """The observations made since `before` (all of them if the process restarted)."""
        if before is None or self.count < before.count:
            return self
        old = dict(before.buckets)
        return Histogram(
            tuple((le, max(0.0, c - old.get(le, 0.0))) for le, c in self.buckets),
            self.count - before.count,
            self.total - before.total,
        )

    def fraction_above(self, threshold: float) -> float | None:
        """Share of observations above the smallest bucket bound >= threshold (exact when
        the threshold is a bucket bound, as the rules choose)."""
        if self.count <= 0:
            return None
        for le, c in self.buckets:
            if le >= threshold:
                return max(0.0, 1.0 - c / self.count)
        return 0.0

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear inside the bucket that holds rank q."""
        if self.count <= 0:
            return None
        rank, lower, below = q * self.count, 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return lower
                width = c - below
                return lower + (le - lower) * ((rank - below) / width if width else 1.0)
            lower, below = le, c
        return lower

    def upper_bound(self, q: float) -> float | None:
        """The bound of the bucket that holds rank q: a quantile that never underestimates."""
        if self.count <= 0:
            return None
        rank, lower = q * self.count, 0.0
        for le, c in self.buckets:
            if c >= rank:
                return lower if math.isinf(le) else le
            lower = le
        return lower


@dataclass(frozen=True)
class Scrape:
    """One `/metrics` page: plain values by sample name, histograms by family name."""

    values: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    info: dict[str, dict[str, str]] = field(default_factory=dict)

    def value(self, *names: str) -> float | None:
        """The first of `names` the page has (a renamed metric and its older name)."""
        for name in names:
            if name in self.values:
                return self.values[name]
        return None


def parse(text: str) -> Scrape:
    """Prometheus text -> Scrape. Raises ValueError on text that is not that format."""
    values: dict[str, float] = {}
    info: dict[str, dict[str, str]] = {}
    raw: dict[str, dict[str, dict[float, float] | float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "histogram":
            parts = raw.setdefault(family.name, {"buckets": {}, "count": 0.0, "sum": 0.0})
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    buckets = parts["buckets"]
                    assert isinstance(buckets, dict)
                    buckets[le] = buckets.get(le, 0.0) + float(s.value)
                elif s.name.endswith("_count"):
                    parts["count"] = float(parts["count"]) + float(s.value)  # type: ignore[arg-type]
                elif s.name.endswith("_sum"):
                    parts["sum"] = float(parts["sum"]) + float(s.value)  # type: ignore[arg-type]
            continue
        for s in family.samples:
            if s.name.endswith("_info") or family.type == "info":
                info.setdefault(s.name, dict(s.labels))
                continue
            values[s.name] = values.get(s.name, 0.0) + float(s.value)
    histograms = {
        name: Histogram(
            tuple(sorted(p["buckets"].items())),  # type: ignore[union-attr]
            float(p["count"]),  # type: ignore[arg-type]
            float(p["sum"]),  # type: ignore[arg-type]
        )
        for name, p in raw.items()
    }
    return Scrape(values, histograms, info)


@dataclass(frozen=True)
class Snapshot:
    """Two scrapes of one pod `seconds` apart, plus what only the cluster knows."""

    before: Scrape
    after: Scrape
    seconds: float
    oom_restarts: int = 0  # restarts of the pod's containers with reason OOMKilled

    def increase(self, name: str) -> float | None:
        now, then = self.after.value(name), self.before.value(name)
        if now is None:
            return None
        if then is None or now < then:
            return now
        return now - then

    def per_minute(self, name: str) -> float | None:
        inc = self.increase(name)
        if inc is None or self.seconds <= 0:
            return None
        return inc * 60.0 / self.seconds

    def histogram(self, name: str) -> Histogram | None:
        now = self.after.histograms.get(name)
        return None if now is None else now.minus(self.before.histograms.get(name))

    def gauge_range(self, *names: str) -> tuple[float, float] | None:
        """(min, max) of a gauge over the two scrapes; the later one alone if it is new."""
        now, then = self.after.value(*names), self.before.value(*names)
        if now is None:
            return None
        if then is None:
            return now, now
        return min(now, then), max(now, then)
