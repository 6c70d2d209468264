"""The real scheduler against fake GPU nodes: what the operator's CapacityPending relies on."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client

from .fake_kubelet import FakeKubelet
from .waiting import wait_for

pytestmark = pytest.mark.cluster


def gpu_pod(name: str, gpus: int) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "srv",
                    "image": "llmservice:test",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ]
        },
    }


def scheduled_condition(core: client.CoreV1Api, ns: str, name: str) -> client.V1PodCondition | None:
    pod = core.read_namespaced_pod(name, ns)
    return next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)


def test_gpu_pod_waits_for_a_gpu_node_then_runs(
    kube_api: client.ApiClient, namespace: str, add_node: Callable[..., FakeKubelet]
) -> None:
    core = client.CoreV1Api(kube_api)
    add_node(cpu="8", memory="32Gi")  # a CPU-only node: the pod must not land here
    core.create_namespaced_pod(namespace, gpu_pod("llm-0", gpus=1))

    cond = wait_for(
        lambda: (c := scheduled_condition(core, namespace, "llm-0")) and c.status == "False" and c,
        what="the scheduler to report the pod unschedulable",
    )
    assert cond.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond.message
    assert core.read_namespaced_pod("llm-0", namespace).status.phase == "Pending"

    gpu_node = add_node(gpus=2, name=f"gpu-{namespace}")  # the autoscaler's new node
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("llm-0", namespace)).status.phase == "Running" and p,
        what="the pod to run on the new GPU node",
    )
    assert pod.spec.node_name == gpu_node.node.name
    assert pod.status.pod_ip.startswith("127.0.")
    assert pod.status.host_ip == gpu_node.ip
    ready = {c.type: c.status for c in pod.status.conditions}
    assert ready["Ready"] == "True"


def test_gpus_are_counted_across_pods(
    kube_api: client.ApiClient, namespace: str, add_node: Callable[..., FakeKubelet]
) -> None:
    """Two 1-GPU pods on a 1-GPU node: exactly one runs, the other stays Pending."""
    core = client.CoreV1Api(kube_api)
    add_node(gpus=1, name=f"gpu-{namespace}")
    for name in ("a", "b"):
        core.create_namespaced_pod(namespace, gpu_pod(name, gpus=1))

    def phases() -> list[str]:
        return sorted(p.status.phase for p in core.list_namespaced_pod(namespace).items)

    wait_for(lambda: phases() == ["Pending", "Running"], what="one pod running, one pending")
    pending = next(
        p for p in core.list_namespaced_pod(namespace).items if p.status.phase == "Pending"
    )
    cond = wait_for(
        lambda: (
            (c := scheduled_condition(core, namespace, pending.metadata.name))
            and c.status == "False"
            and c
        ),
        what="unschedulable condition",
    )
    assert "Insufficient nvidia.com/gpu" in cond.message
