"""The autoscaler in the real operator process, against the emulator, with fake pods that
serve scripted vLLM /metrics on their pod IPs (tests/support/metrics_pods.py).

Timing is counted in the operator's own evaluations (`llmservice_operator_autoscaler_
ticks_total` on its /metrics), not in wall-clock seconds, so a busy machine slows the
test down but cannot make it pass or fail by accident.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.operator.conftest import CRD, Env
from tests.support.clients import Kubectl, llmservice, wait_until
from tests.support.cluster import Cluster
from tests.support.kubelet import Node
from tests.support.metrics_pods import MetricsPods, ServedMetrics, unique_ip_prefix
from tests.support.operator_process import OperatorProcess, free_port

CPU_POD = {"engine": {"kvCacheMemoryGiB": 0.5}, "resources": {"gpu": {"count": 0}}}


@dataclass
class Scaling(Env):
    pods: MetricsPods
    metrics_url: str
    liveness_url: str

    def metric(self, metric: str, /, **labels: str) -> float:
        """Sum of a sample of the operator's own /metrics matching the labels."""
        text = httpx.get(self.metrics_url, timeout=5, trust_env=False).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(metric + "{") and not line.startswith(metric + " "):
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def ticks(self, name: str) -> int:
        return int(self.metric("llmservice_operator_autoscaler_ticks_total", name=name))

    def wait_ticks(self, name: str, n: int, timeout: float = 30) -> None:
        start = self.ticks(name)
        wait_until(lambda: self.ticks(name) >= start + n, timeout=timeout, interval=0.1)


@pytest.fixture
def cleanup(scaling: Scaling) -> Iterator[list[str]]:
    """LLMServices to delete after the test, so their evaluations stop taking CPU."""
    names: list[str] = []
    yield names
    for name in names:
        scaling.kubectl.delete_llms(name)


@pytest.fixture(scope="module")
def scaling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaling]:
    workdir = tmp_path_factory.mktemp("autoscaling")
    with Cluster(
        workdir, nodes=[Node("cpu-node-1", gpus=0)], ip_prefix=unique_ip_prefix()
    ) as cluster:
        kubectl = Kubectl(cluster.api)
        kubectl.install_crd(CRD)
        port = free_port()
        operator = OperatorProcess(
            cluster.kubeconfig, workdir / "operator.log", "--metrics-port", str(port),
            "--metrics-address", "127.0.0.1",
        )  # fmt: skip
        with ServedMetrics(cluster) as pods, operator:
            metrics = f"http://127.0.0.1:{port}/metrics"
            yield Scaling(cluster, kubectl, operator, workdir, pods, metrics, operator.liveness)


def autoscaled(name: str, replicas: int = 1, **policy) -> dict:
    spec = {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "intervalSeconds": 1, **policy}
    return llmservice(name, replicas=replicas, autoscaling=spec, **CPU_POD)


def scale_events(k: Kubectl, name: str) -> list[str]:
    return [m for _, r, m in k.events(name) if r == "Autoscaled"]


def active(k: Kubectl, name: str) -> dict:
    return k.condition(name, "ScalingActive")


def test_preemption_burst_on_one_pod_scales_1_to_3_within_two_intervals(
    scaling: Scaling, cleanup: list[str]
):
    k, pods = scaling.kubectl, scaling.pods
    cleanup.append("burst")
    k.apply(autoscaled("burst", scaleDownStabilizationSeconds=3))
    # Two scrapes of the pod: the preemption counter has a baseline, the rate is 0.
    wait_until(
        lambda: "preemptions" in ((k.llms("burst").get("status") or {}).get("signals") or {}).get("perSignal", {}),
        timeout=30,
    )  # fmt: skip
    assert active(k, "burst")["status"] == "True"
    (pod,) = k.pods("burst")

    name = pod["metadata"]["name"]
    pods.set_pod(name, preemptions_per_minute=12.0)  # the burst starts at the next scrape
    wait_until(lambda: k.llms("burst")["spec"]["replicas"] == 3, timeout=30, interval=0.05)
    # The scrape where the burst began still saw no preemptions; the next one saw 12/min.
    assert pods.scrapes[name] - pods.rate_changed_at[name] <= 1

    status = wait_until(lambda: (s := k.llms("burst")["status"]).get("desiredReplicas") == 3 and s)
    assert re.fullmatch(
        r"preemptions 1[0-4]\.\d/min/replica > 5 → 3 replicas", status["lastScaleReason"]
    ), status
    assert status["desiredReplicas"] == 3 and status["lastScaleTime"]
    assert status["signals"]["perSignal"]["preemptions"]["desiredReplicas"] == 3
    assert status["signals"]["preemptionsPerMinute"] == pytest.approx(12.0, abs=2.5)
    (event,) = scale_events(k, "burst")
    assert event.startswith("Scaled from 1 to 3 replicas: preemptions")
    # The reconciler follows spec.replicas: three pods, all Ready
    wait_until(lambda: k.llms("burst")["status"].get("readyReplicas") == 3, timeout=30)

    # The burst ends: every answer is 1 from now on. Down after the window, at most half a step.
    pods.set_pod(pod["metadata"]["name"], preemptions_per_minute=0.0)
    wait_until(lambda: k.llms("burst")["spec"]["replicas"] == 1, timeout=60, interval=0.1)
    messages = {m.split(":")[0]: m for m in scale_events(k, "burst")}  # Events are unordered
    assert sorted(messages) == [
        "Scaled from 1 to 3 replicas",
        "Scaled from 2 to 1 replicas",
        "Scaled from 3 to 2 replicas",
    ], messages
    assert messages["Scaled from 3 to 2 replicas"].endswith("at most half per step: 2")
    assert (
        scaling.metric(
            "llmservice_operator_autoscaler_decisions_total", name="burst", direction="up"
        )
        == 1
    )
    assert (
        scaling.metric(
            "llmservice_operator_autoscaler_decisions_total", name="burst", direction="down"
        )
        == 2
    )


def test_oscillating_load_does_not_flap(scaling: Scaling, cleanup: list[str]):
    k, pods = scaling.kubectl, scaling.pods
    cleanup.append("wobble")
    # KV usage alternates 1.0 / 0.1 on every scrape; the pods speak vLLM's old KV name.
    pods.set_service("wobble", kv_cache_usage=1.0, alternate_kv=0.1, old_kv_name=True)
    k.apply(autoscaled("wobble", maxReplicas=2, scaleDownStabilizationSeconds=60))
    wait_until(lambda: active(k, "wobble").get("status") == "True", timeout=30)
    scaling.wait_ticks("wobble", 8, timeout=60)
    status = k.llms("wobble")["status"]
    assert k.llms("wobble")["spec"]["replicas"] == 2
    assert len(scale_events(k, "wobble")) == 1  # up once; the low answers never win the window
    assert (
        scaling.metric(
            "llmservice_operator_autoscaler_decisions_total", name="wobble", direction="down"
        )
        == 0
    )
    assert status["lastScaleReason"] == "KV cache usage 1.00 > 0.8 → 2 replicas"


def test_one_pods_metrics_down_does_not_stop_scaling(scaling: Scaling, cleanup: list[str]):
    k, pods = scaling.kubectl, scaling.pods
    cleanup.append("partial")
    pods.set_service("partial", waiting=1.0)
    k.apply(autoscaled("partial", replicas=2, minReplicas=2, maxReplicas=4))
    wait_until(
        lambda: len([p for p in k.pods("partial") if p["status"].get("podIP")]) == 2, timeout=30
    )
    hung, alive = sorted(p["metadata"]["name"] for p in k.pods("partial"))
    pods.set_pod(hung, mode="hang")  # answers after 30 s: only the scrape timeout is spent
    pods.set_pod(alive, waiting=12.0)  # ceil(2 pods x 12 / 5) = 5 -> maxReplicas 4
    wait_until(lambda: k.llms("partial")["spec"]["replicas"] == 4, timeout=30, interval=0.1)
    # Status follows the decision by one write; the skipped pod is named in ScalingActive.
    cond = wait_until(lambda: (c := active(k, "partial"))["message"].count(" of 4 Ready") and c)
    assert cond["status"] == "True"
    assert f"skipped {hung}: timed out" in cond["message"]
    assert scaling.metric("llmservice_operator_scrape_errors_total", name="partial") >= 1
    assert "limited to maxReplicas 4" in k.llms("partial")["status"]["lastScaleReason"]

    # Every pod down: the decision is held and ScalingActive says why.
    pods.set_service("partial", mode="error")
    for name in (hung, alive):
        pods.set_pod(name, mode="error")
    wait_until(lambda: active(k, "partial").get("status") == "False", timeout=30)
    cond = active(k, "partial")
    assert cond["reason"] == "NoMetrics" and "HTTP 500" in cond["message"]
    scaling.wait_ticks("partial", 3)
    assert k.llms("partial")["spec"]["replicas"] == 4
    assert "ScalingInactive" in [r for _, r, _ in k.events("partial")]
    assert (
        scaling.metric(
            "llmservice_operator_autoscaler_decisions_total", name="partial", direction="held"
        )
        >= 3
    )


def test_disabled_autoscaling_never_touches_replicas(scaling: Scaling, cleanup: list[str]):
    k, pods = scaling.kubectl, scaling.pods
    cleanup.append("manual")
    pods.set_service("manual", preemptions_per_minute=600.0, kv_cache_usage=1.0, waiting=50.0)
    k.apply(llmservice("manual", **CPU_POD))  # autoscaling.enabled defaults to false
    wait_until(lambda: k.condition("manual", "Ready").get("status") == "True", timeout=30)
    k.scale("manual", 2)
    time.sleep(4)  # four intervals' worth: there are no ticks to count for a disabled service
    assert k.llms("manual")["spec"]["replicas"] == 2
    assert scaling.metric("llmservice_operator_autoscaler_ticks_total", name="manual") == 0
    assert active(k, "manual") == {}

    # Switched on: it scales; switched off again: the user's replicas stick.
    k.patch_llms(
        "manual",
        {"spec": {"autoscaling": {"enabled": True, "intervalSeconds": 1, "maxReplicas": 3}}},
    )
    wait_until(lambda: k.llms("manual")["spec"]["replicas"] == 3, timeout=30)
    k.patch_llms("manual", {"spec": {"autoscaling": {"enabled": False}}})
    wait_until(lambda: active(k, "manual").get("reason") == "AutoscalingDisabled", timeout=30)
    assert "signals" not in k.llms("manual")["status"]
    k.scale("manual", 1)
    time.sleep(3)
    assert k.llms("manual")["spec"]["replicas"] == 1


def test_operator_serves_metrics_and_liveness(scaling: Scaling):
    health = httpx.get(scaling.liveness_url, timeout=15, trust_env=False)
    assert health.status_code == 200
    assert "autoscaler" in health.json()
    assert scaling.metric("llmservice_operator_reconcile_duration_seconds_count") >= 1
    assert scaling.metric("process_resident_memory_bytes") > 0
