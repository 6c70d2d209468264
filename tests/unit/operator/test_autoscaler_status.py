"""What the autoscaler writes: status.signals, ScalingActive next to the publisher's own
conditions (one merge patch), and its Events."""

from __future__ import annotations

from typing import Any

from llmservice.operator.autoscale_loop import (
    SCALING_ACTIVE,
    condition,
    event_manifest,
    scrape_timeout,
    signals_status,
)
from llmservice.operator.autoscaler import (
    AutoscalingPolicy,
    History,
    Observation,
    PodMetrics,
    decide,
)
from llmservice.operator.publish import StatusPublisher
from llmservice.operator.reconcile import Options
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.status import DeploymentView, PodView, changed_fields, compute_status
from llmservice.operator.vram import check_fit

BODY = {
    "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": 2},
    "spec": {"model": {"source": "builtin:smollm2-135m"}, "replicas": 1},
}
FIT = check_fit(LLMServiceSpec.from_dict(BODY["spec"]))


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch["status"])
        return {}


def status(previous=None, **extra):
    return compute_status(
        generation=2,
        desired_replicas=1,
        fit=FIT,
        deployment=DeploymentView(2, 2, 1, 1, 1, 1, 1),
        pods=[PodView("p", "Running", True)],
        previous=previous,
        now="t1",
        selector="a=b",
        endpoint="e",
        **extra,
    )


def test_scaling_active_joins_the_conditions_with_a_transition_time():
    update = status(
        extra={"desiredReplicas": 3},
        extra_conditions=[condition("True", "MetricsAvailable", "1 of 1 Ready pods scraped")],
    )
    types = [c["type"] for c in update.status["conditions"]]
    assert types[-1] == SCALING_ACTIVE and types.count(SCALING_ACTIVE) == 1
    active = update.status["conditions"][-1]
    assert active["lastTransitionTime"] == "t1" and active["observedGeneration"] == 2
    assert update.status["desiredReplicas"] == 3


def test_a_condition_nobody_computes_is_carried_over():
    """After an operator restart ScalingActive stays until the loop speaks again."""
    first = status(extra_conditions=[condition("False", "NoMetrics", "x")])
    again = compute_status(
        generation=2, desired_replicas=1, fit=FIT, deployment=DeploymentView(2, 2, 1, 1, 1, 1, 1),
        pods=[PodView("p", "Running", True)], previous=first.status, now="t2", selector="a=b",
        endpoint="e",
    )  # fmt: skip
    assert again.status["conditions"] == first.status["conditions"]
    assert changed_fields(first.status, again.status) == {}


def test_publisher_writes_the_autoscaler_fields_in_its_own_patch():
    kube = FakeKube()
    publisher = StatusPublisher(lambda: kube, Options())  # type: ignore[arg-type,return-value]
    key = ("ns", "m")
    observe = lambda: (BODY, DeploymentView(2, 2, 1, 1, 1, 1, 1), [PodView("p", "Running", True)])  # noqa: E731
    publisher.publish(key, observe, lambda *e: None, 2)
    publisher.set_extra(
        key, {"signals": {"kvCacheUsagePercent": 93}, "desiredReplicas": 3},
        [condition("True", "MetricsAvailable", "ok")],
    )  # fmt: skip
    publisher.publish(key, observe, lambda *e: None)
    patch = kube.patches[-1]
    assert patch["signals"] == {"kvCacheUsagePercent": 93} and patch["desiredReplicas"] == 3
    assert [c["type"] for c in patch["conditions"]][-1] == SCALING_ACTIVE
    assert "Ready" in [c["type"] for c in patch["conditions"]]  # the list is whole
    # Disabling: None removes the fields (merge patch), the condition says why
    publisher.set_extra(
        key, {"signals": None, "desiredReplicas": None},
        [condition("False", "AutoscalingDisabled", "off")],
    )  # fmt: skip
    publisher.publish(key, observe, lambda *e: None)
    patch = kube.patches[-1]
    assert patch["signals"] is None and patch["desiredReplicas"] is None
    assert patch["conditions"][-1]["reason"] == "AutoscalingDisabled"
    publisher.publish(key, observe, lambda *e: None)
    assert len(kube.patches) == 3  # nothing changed since: no write


def test_signals_status_feeds_the_printer_columns():
    policy = AutoscalingPolicy(enabled=True, max_replicas=3)
    scraped = [PodMetrics(0.934, 2.0, 12.04), PodMetrics(0.5, 1.0, None)]
    obs = Observation(2, ready_pods=3, pending_pods=1, scraped=tuple(scraped))
    d = decide(policy, obs, History(), 0.0)
    s = signals_status(d, obs, scraped)
    assert s["kvCacheUsagePercent"] == 72 and isinstance(s["kvCacheUsagePercent"], int)
    assert s["kvCacheUsage"] == 0.717
    assert s["preemptionsPerMinute"] == 12.0  # all pods together
    assert s["waitingRequests"] == 3.0
    assert s["pods"] == {"ready": 3, "scraped": 2, "starting": 1}
    assert s["perSignal"]["preemptions"] == {"current": 12.04, "target": 5.0, "desiredReplicas": 8}
    assert s["recommendation"] == 3


def test_held_signals_have_no_values():
    obs = Observation(2, ready_pods=0, pending_pods=2)
    d = decide(AutoscalingPolicy(enabled=True), obs, History(), 0.0)
    s = signals_status(d, obs, [])
    assert s == {"pods": {"ready": 0, "scraped": 0, "starting": 2}, "perSignal": {}}


def test_event_names_the_llmservice():
    e = event_manifest(BODY, "Normal", "Autoscaled", "Scaled from 1 to 3 replicas: x")
    assert e["involvedObject"] == {
        "apiVersion": "llmservice.dev/v1alpha1",
        "kind": "LLMService",
        "name": "m",
        "namespace": "ns",
        "uid": "u1",
    }
    assert (e["type"], e["reason"], e["metadata"]["namespace"]) == ("Normal", "Autoscaled", "ns")


def test_scrape_timeout_is_short_and_inside_the_interval():
    assert scrape_timeout(AutoscalingPolicy(interval_seconds=15)) == 2.0
    assert scrape_timeout(AutoscalingPolicy(interval_seconds=1)) == 1.0
    assert scrape_timeout(AutoscalingPolicy(interval_seconds=3)) == 1.5
