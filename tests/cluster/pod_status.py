"""Pure functions of the fake kubelet: what a Node and a Pod's status should say.

Kept apart from the API and process I/O in `fake_kubelet.py` so the rules (when a pod is
Ready, what a node advertises) read in one place and are unit-testable without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FAKE_KUBELET_VERSION = "v1.37.2-fake"


@dataclass(frozen=True)
class NodeSpec:
    """A node as a cloud provider would hand it over: size, GPUs, labels, taints."""

    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    gpus: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    max_pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()


def node_manifest(spec: NodeSpec, ip: str) -> dict[str, Any]:
    """The Node object a kubelet registers (nodes may set status on create)."""
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.max_pods)}
    if spec.gpus:
        capacity[spec.gpu_resource] = str(spec.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "llmservice.dev/fake-kubelet": "true",
                **spec.labels,
            },
        },
        "spec": {"taints": [dict(t) for t in spec.taints]},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": node_conditions(now="1970-01-01T00:00:00Z"),
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": spec.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": spec.name,
                "systemUUID": spec.name,
                "bootID": spec.name,
                "kernelVersion": "fake",
                "osImage": "fake-kubelet",
                "containerRuntimeVersion": "fake://1",
                "kubeletVersion": FAKE_KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def node_conditions(now: str) -> list[dict[str, str]]:
    """A healthy node: Ready, no pressure."""
    healthy = {
        "Ready": ("True", "KubeletReady", "fake kubelet is posting ready status"),
        "MemoryPressure": ("False", "KubeletHasSufficientMemory", "fake"),
        "DiskPressure": ("False", "KubeletHasNoDiskPressure", "fake"),
        "PIDPressure": ("False", "KubeletHasSufficientPID", "fake"),
    }
    return [
        {
            "type": t,
            "status": s,
            "reason": r,
            "message": m,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t, (s, r, m) in healthy.items()
    ]


@dataclass(frozen=True)
class ContainerState:
    """What the runtime knows about one container of a pod."""

    name: str
    image: str
    started_at: str
    ready: bool
    restart_count: int = 0
    exit_code: int | None = None  # set while terminated (between restarts, or for good)
    waiting_reason: str | None = None  # set when the container cannot run


def pod_status(
    pod_ip: str,
    host_ip: str,
    start_time: str,
    restart_policy: str,
    containers: list[ContainerState],
) -> dict[str, Any]:
    """The status a kubelet reports for a pod whose containers are in these states.

    Ready follows Kubernetes' rule: every container ready. Phase is Running while any
    container runs or will restart; Succeeded/Failed only once all ended for good.
    """
    phase = pod_phase(restart_policy, containers)
    all_ready = bool(containers) and all(c.ready for c in containers)
    ready = "True" if all_ready else "False"
    statuses = []
    for c in containers:
        if c.waiting_reason is not None:
            state: dict[str, Any] = {"waiting": {"reason": c.waiting_reason}}
        elif c.exit_code is not None:
            state = {"terminated": {"exitCode": c.exit_code, "startedAt": c.started_at,
                                    "finishedAt": c.started_at}}  # fmt: skip
        else:
            state = {"running": {"startedAt": c.started_at}}
        statuses.append(
            {
                "name": c.name,
                "image": c.image,
                "imageID": f"fake://{c.image}",
                "containerID": f"fake://{c.name}",
                "ready": c.ready,
                "started": "running" in state,
                "restartCount": c.restart_count,
                "state": state,
            }
        )
    conditions = [
        {"type": "PodReadyToStartContainers", "status": "True"},
        {"type": "Initialized", "status": "True"},
        {"type": "ContainersReady", "status": ready},
        {"type": "Ready", "status": ready},
        {"type": "PodScheduled", "status": "True"},
    ]
    return {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "conditions": conditions,
        "containerStatuses": statuses,
    }


def pod_phase(restart_policy: str, containers: list[ContainerState]) -> str:
    """Running until every container has exited and none will be restarted."""
    codes = [c.exit_code for c in containers]
    if not containers or any(code is None for code in codes):
        return "Running"
    if restart_policy == "Always":
        return "Running"
    if all(code == 0 for code in codes):
        return "Succeeded"
    return "Failed" if restart_policy == "Never" else "Running"
