"""The router's own Prometheus metrics (one registry per router, so tests can run many)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

HOLD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "llmservice_router_requests", "Requests answered, by pod and HTTP status code "
            "(pod is empty when the router answered itself: held too long, queue full).",
            ["pod", "code"], registry=r,
        )  # fmt: skip
        self.held = Gauge(
            "llmservice_router_held_requests", "Requests waiting for a Ready pod now.", registry=r
        )
        self.hold_seconds = Histogram(
            "llmservice_router_hold_seconds", "How long requests waited for a Ready pod.",
            buckets=HOLD_BUCKETS, registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            "llmservice_router_routing_decisions", "Routing decisions by reason "
            "(prefix, least-loaded, no-prefix, round-robin, retry, lora-affinity, lora-slot).",
            ["reason"], registry=r,
        )  # fmt: skip
        self.wakes = Counter(
            "llmservice_router_scale_from_zero",
            "Times this router set replicas 0 -> 1.",
            registry=r,
        )
        self.pod_wake_ups = Counter(
            "llmservice_router_pod_wake_ups", "Sleeping pods this router woke (POST /wake_up) "
            "for a request, by pod.", ["pod"], registry=r,
        )  # fmt: skip
        self.upstream_errors = Counter(
            "llmservice_router_upstream_errors",
            "Connection errors to pods, by pod.",
            ["pod"],
            registry=r,
        )
        self.pods = Gauge("llmservice_router_pods", "Routable pods (Ready endpoints).", registry=r)
