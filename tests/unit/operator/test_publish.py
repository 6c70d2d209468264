"""The status publisher: only changed fields are written, bursts are coalesced, and a
concurrent request is never lost (it is published by the thread already at work)."""

from __future__ import annotations

import threading
from typing import Any

from llmservice.operator.publish import StatusPublisher
from llmservice.operator.reconcile import Options
from llmservice.operator.status import DeploymentView, PodView


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append((path, patch))
        return {}


BODY = {
    "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": 2},
    "spec": {"model": {"source": "builtin:smollm2-135m"}, "replicas": 1},
}


def make() -> tuple[StatusPublisher, FakeKube, list[tuple[str, str, str]]]:
    kube = FakeKube()
    events: list[tuple[str, str, str]] = []
    return StatusPublisher(lambda: kube, Options()), kube, events  # type: ignore[arg-type,return-value]


def test_writes_only_what_changed_and_announces_transitions_once():
    publisher, kube, events = make()
    emit = lambda *e: events.append(e)  # noqa: E731
    ready = DeploymentView(1, 1, 1, 1, 1, 1, 1)
    publisher.publish(("ns", "m"), lambda: (BODY, ready, [PodView("p", "Running", True)]), emit, 2)
    ((path, first),) = kube.patches
    assert path == "/apis/llmservice.dev/v1alpha1/namespaces/ns/llmservices/m/status"
    assert first["status"]["observedGeneration"] == 2 and first["status"]["readyReplicas"] == 1
    assert [r for _, r, _ in events] == ["Ready"]
    publisher.publish(("ns", "m"), lambda: (BODY, ready, [PodView("p", "Running", True)]), emit)
    assert len(kube.patches) == 1  # nothing changed: no write, no event
    publisher.publish(("ns", "m"), lambda: (BODY, DeploymentView(1, 1, 1, 1, 0, 0, 0), []), emit)
    assert set(kube.patches[-1][1]["status"]) == {"readyReplicas", "conditions"}


def test_a_request_during_a_publish_is_coalesced_not_lost():
    publisher, kube, events = make()
    emit = lambda *e: events.append(e)  # noqa: E731
    entered, release = threading.Event(), threading.Event()
    views = iter([DeploymentView(1, 1, 1, 1, 0, 0, 0), DeploymentView(1, 1, 1, 1, 1, 1, 1)])
    calls = []

    def slow_observe():
        calls.append("slow")
        entered.set()
        release.wait(5)
        return BODY, next(views), []

    def fresh_observe():
        calls.append("fresh")
        return BODY, next(views), []

    worker = threading.Thread(target=publisher.publish, args=(("ns", "m"), slow_observe, emit, 2))
    worker.start()
    assert entered.wait(5)
    publisher.publish(("ns", "m"), fresh_observe, emit)  # returns at once: a publish is running
    assert calls == ["slow"]
    release.set()
    worker.join(5)
    assert calls == ["slow", "fresh"]  # the running thread published the newer request too
    assert kube.patches[-1][1]["status"]["readyReplicas"] == 1
    assert kube.patches[0][1]["status"]["observedGeneration"] == 2


def test_a_child_event_before_the_reconcile_keeps_the_observed_generation_on_conditions():
    """Generation 3 was applied, its reconcile has not published yet; a pod event's publish
    (no generation) stamps conditions with the last observed generation, 2, not 3."""
    publisher, kube, events = make()
    emit = lambda *e: events.append(e)  # noqa: E731
    ready = DeploymentView(1, 1, 1, 1, 1, 1, 1)
    publisher.publish(("ns", "m"), lambda: (BODY, ready, [PodView("p", "Running", True)]), emit, 2)
    newer = {**BODY, "metadata": {**BODY["metadata"], "generation": 3}}
    publisher.publish(("ns", "m"), lambda: (newer, DeploymentView(1, 1, 1, 1, 0, 0, 0), []), emit)
    status = kube.patches[-1][1]["status"]
    assert "observedGeneration" not in status
    assert {c["observedGeneration"] for c in status["conditions"]} == {2}
    publisher.publish(("ns", "m"), lambda: (newer, ready, [PodView("p", "Running", True)]), emit, 3)
    status = kube.patches[-1][1]["status"]
    assert status["observedGeneration"] == 3
    assert {c["observedGeneration"] for c in status["conditions"]} == {3}
