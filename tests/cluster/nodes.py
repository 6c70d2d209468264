"""Adding fake nodes the way a cluster autoscaler's would appear: registered, then
schedulable once the real node-lifecycle controller lifts the `not-ready` taint."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from .fake_kubelet import ClusterAccess, FakeKubelet
from .pod_status import NodeSpec
from .waiting import wait_for

NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def start_node(
    api: client.ApiClient,
    spec: NodeSpec,
    *,
    workdir: Path,
    access: ClusterAccess,
    run_containers: bool = False,
    env: dict[str, str] | None = None,
    routed_pod_ips: bool = False,
) -> FakeKubelet:
    """Register `spec` with a running FakeKubelet and wait until pods can land on it."""
    kubelet = FakeKubelet(
        api,
        spec,
        run_containers=run_containers,
        workdir=workdir,
        env=env,
        cluster=access,
        routed_pod_ips=routed_pod_ips,
    ).start()
    core = client.CoreV1Api(api)
    wait_for(
        lambda: (
            not any(t.key == NOT_READY_TAINT for t in core.read_node(spec.name).spec.taints or [])
        ),
        what=f"node {spec.name} schedulable",
    )
    return kubelet
