"""The API server stopped while the operator autoscales, on the real control plane: the
operator process survives, its autoscaling loop keeps evaluating (each failed write is a
log line, retried next interval) and holds its decision (no scale while blind, no
flapping after), and once the API server is back it resumes: kopf's watches see a spec
change, the autoscaler acts on new metrics, and no child was lost or duplicated.

The pods are kwok-mode (Ready, no process); tests/cluster/pod_metrics.py serves scripted
vLLM /metrics on their IPs. The default tier stops the API server for 8 s; `make e2e`
runs a 30 s outage.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from tests.support.operator_process import OperatorProcess
from tests.support.ports import free_port

from .chart_operator import GROUP, PLURAL, VERSION, condition
from .control_plane import ControlPlane
from .nodes import start_node
from .pod_metrics import ScriptedPodMetrics
from .pod_status import NodeSpec
from .waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]  # passes; e2e for make test's time (docs/control-plane.md)
NAME = "outage"


def autoscaled(max_num_seqs: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LLMService", "metadata": {"name": NAME},
        "spec": {
            "model": {"source": "builtin:smollm2-135m"},
            "engine": {"maxNumSeqs": max_num_seqs},
            "resources": {"gpu": {"count": 1, "memoryGiB": 24}, "cpu": "1", "memory": "2Gi"},
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2,
                            "intervalSeconds": 1},
        },
    }  # fmt: skip


def ticks(metrics_url: str) -> float:
    """The operator's own count of autoscaler evaluations of this LLMService."""
    text = httpx.get(metrics_url, timeout=5, trust_env=False).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmservice_operator_autoscaler_ticks_total{")
        and f'name="{NAME}"' in line
    )


def scale_events(core: client.CoreV1Api, namespace: str) -> list[str]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={NAME}")
    return [e.message for e in events.items if e.reason == "Autoscaled"]


@pytest.mark.parametrize(
    "down_seconds", [8, pytest.param(30, marks=pytest.mark.e2e)], ids=lambda s: f"{s}s"
)
def test_operator_rides_out_an_api_server_outage(
    llmservice_crd: object, kube_api: client.ApiClient, control_plane: ControlPlane,
    namespace: str, tmp_path: Path, down_seconds: int,
) -> None:  # fmt: skip
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    custom, policy = client.CustomObjectsApi(kube_api), client.PolicyV1Api(kube_api)
    node = start_node(
        kube_api, NodeSpec(name=f"outage-{down_seconds}", gpus=2),
        workdir=tmp_path / "node", access=control_plane.access(),
    )  # fmt: skip
    port = free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    operator = OperatorProcess(
        control_plane.admin_kubeconfig, tmp_path / "operator.log",
        "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
    )  # fmt: skip

    def replicas() -> int:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
        return int(obj["spec"]["replicas"])

    def uid(read: Any) -> str:
        return read(NAME, namespace).metadata.uid

    def scaling_active() -> bool:
        return condition(kube_api, namespace, NAME, "ScalingActive").get("status") == "True"

    def gone() -> bool:
        return not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]

    try:
        with ScriptedPodMetrics(core, namespace) as pods, operator:
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, autoscaled(max_num_seqs=64)
            )
            wait_for(
                scaling_active,
                what="ScalingActive True (the pod scraped)",
                timeout=90,
            )
            children = {
                "deployment": uid(apps.read_namespaced_deployment),
                "service": uid(core.read_namespaced_service),
            }
            pid = operator.process.pid if operator.process else None
            before, scrapes = ticks(metrics_url), pods.scrapes
            assert node.errors == []

            down_at = time.monotonic()
            with control_plane.apiserver_stopped():
                time.sleep(down_seconds)
                # Blind to the API, the loop still runs: it scrapes and evaluates every
                # interval, and liveness holds (a restart would lose nothing but time).
                assert operator.process is not None and operator.process.poll() is None
                assert ticks(metrics_url) >= before + down_seconds / 2
                assert pods.scrapes > scrapes
                assert httpx.get(operator.liveness, timeout=5).status_code == 200
            back_at = time.monotonic()

            # Held: no scale while blind or on the way back (the load is steady and low).
            time.sleep(3)
            # The fake kubelet saw the outage as a kubelet does (failed syncs, retried);
            # from here on, with the API server back, it must not fail again.
            outage_errors = len(node.errors)
            assert replicas() == 1 and scale_events(core, namespace) == []

            # Resumed, 1: kopf's watches see a spec change and the Deployment follows it.
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, NAME, {"spec": {"engine": {"maxNumSeqs": 32}}}
            )

            def rolled() -> bool:
                dep = apps.read_namespaced_deployment(NAME, namespace)
                args = dep.spec.template.spec.containers[0].args
                return args[args.index("--max-num-seqs") + 1] == "32"

            wait_for(rolled, what="the Deployment to follow maxNumSeqs 32", timeout=60)

            # Resumed, 2: the autoscaler acts on new metrics, once (1 -> 2), not back and forth.
            pods.set(preemptions_per_minute=30.0)
            wait_for(
                lambda: replicas() == 2,
                what="a scale to 2 replicas on 30 preemptions/min",
                timeout=60,
            )
            time.sleep(3)
            (event,) = scale_events(core, namespace)
            assert event.startswith("Scaled from 1 to 2 replicas: preemptions"), event

            # Nothing lost or duplicated; the same operator process throughout.
            assert uid(apps.read_namespaced_deployment) == children["deployment"]
            assert uid(core.read_namespaced_service) == children["service"]
            model = f"llmservice.dev/service={NAME}"  # not the router's Deployment
            assert len(apps.list_namespaced_deployment(namespace, label_selector=model).items) == 1
            # two replicas now: the reconciler added the PodDisruptionBudget, once
            wait_for(
                lambda: len(policy.list_namespaced_pod_disruption_budget(namespace).items) == 1,
                what="one PodDisruptionBudget for two replicas",
            )
            assert operator.process is not None and operator.process.pid == pid
            logs = operator.logs()
            assert "failed; retrying next interval" in logs, logs[-3000:]
            wait_for(  # the second pod, started by the scale, comes up after it
                lambda: condition(kube_api, namespace, NAME, "Ready").get("status") == "True",
                what="Ready True with both replicas",
                timeout=60,
            )

            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
            wait_for(
                gone,
                what="the LLMService deleted (its finalizer removed by this operator)",
                timeout=60,
            )
    finally:
        node.stop()
    assert node.errors[outage_errors:] == []
    assert back_at - down_at >= down_seconds
