"""The operator's own Prometheus metrics (`llmservice operator --metrics-port 8081`).

What an SRE asks of an autoscaler: is it deciding (decisions by direction, ticks), can it
see its pods (scrape errors), and is the reconcile path healthy (durations). One
registry of our own, served on its own port, so the numbers never mix with a library's.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)

DECISIONS = Counter(
    "llmservice_operator_autoscaler_decisions_total",
    "Autoscaler decisions, by direction: up, down, none (metrics read, no change), "
    "held (no metrics: the last decision is kept).",
    ["namespace", "name", "direction"],
    registry=REGISTRY,
)
SCRAPES = Counter(
    "llmservice_operator_scrapes_total",
    "Fetches of a pod's /metrics by the autoscaler.",
    ["namespace", "name"],
    registry=REGISTRY,
)
SCRAPE_ERRORS = Counter(
    "llmservice_operator_scrape_errors_total",
    "Fetches of a pod's /metrics that failed (timeout, refused, HTTP error, unparseable).",
    ["namespace", "name"],
    registry=REGISTRY,
)
DESIRED_REPLICAS = Gauge(
    "llmservice_operator_autoscaler_desired_replicas",
    "Replicas the autoscaler last decided on.",
    ["namespace", "name"],
    registry=REGISTRY,
)
TICKS = Counter(
    "llmservice_operator_autoscaler_ticks_total",
    "Autoscaler evaluations of one LLMService (one per intervalSeconds).",
    ["namespace", "name"],
    registry=REGISTRY,
)
TICK_SECONDS = Histogram(
    "llmservice_operator_autoscaler_tick_duration_seconds",
    "Time of one evaluation: scrape every pod, decide, write.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "llmservice_operator_reconcile_duration_seconds",
    "Time of one reconcile of an LLMService (fit check, render, server-side apply).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "llmservice_operator_reconcile_errors_total",
    "Reconciles that failed with an API error (retried by kopf).",
    registry=REGISTRY,
)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics from a daemon thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
