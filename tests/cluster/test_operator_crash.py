"""The operator killed with SIGKILL in the middle of a reconcile, then restarted, on the
real control plane: it converges with exactly one of each child and a complete status
(children are applied by name with server-side apply, so a retried reconcile cannot
duplicate them; kopf resumes the handler that never finished)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.support.operator_process import OperatorProcess

from .control_plane import ControlPlane
from .fake_kubelet import FakeKubelet
from .waiting import wait_for

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "llmservice.dev", "v1alpha1", "llmservices"


def llmservice(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LLMService", "metadata": {"name": name},
        "spec": {"model": {"source": "builtin:smollm2-135m"}, "replicas": 2,
                 "router": {"enabled": False},  # one of each child kind (the router adds more)
                 "resources": {"gpu": {"count": 1, "memoryGiB": 24}, "cpu": "1", "memory": "2Gi"}},
    }  # fmt: skip


def test_sigkill_mid_reconcile_then_restart_converges_without_duplicates(
    llmservice_crd: object, kube_api: client.ApiClient, control_plane: ControlPlane,
    namespace: str, add_node: Callable[..., FakeKubelet], tmp_path: Path,
) -> None:
    add_node(gpus=2)  # kwok mode: pods are reported Ready, not run
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    policy, custom = client.PolicyV1Api(kube_api), client.CustomObjectsApi(kube_api)
    log = tmp_path / "operator.log"
    first = OperatorProcess(control_plane.admin_kubeconfig, log)
    first.start()
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, llmservice("crash"))
    # Kill it the moment its first child exists: the rest of the reconcile and the
    # status patch have not happened yet (or are in flight).
    wait_for(lambda: apps.list_namespaced_deployment(namespace).items, what="the first child", every=0.01)
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait(10)
    before = {
        "services": len(core.list_namespaced_service(namespace).items),
        "pdbs": len(policy.list_namespaced_pod_disruption_budget(namespace).items),
        "status": custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "crash").get("status"),
    }
    first.process = None
    first._log.close()

    with OperatorProcess(control_plane.admin_kubeconfig, log):
        def converged() -> dict[str, Any] | None:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "crash")
            ready = [c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
            observed = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
            return obj if ready and ready[0]["status"] == "True" and observed else None

        obj = wait_for(converged, what="Ready and observedGeneration after the restart", timeout=120)
        time.sleep(2)  # a duplicate, if any, would show up now
        uid = obj["metadata"]["uid"]
        children = {
            "Deployment": apps.list_namespaced_deployment(namespace).items,
            "Service": core.list_namespaced_service(namespace).items,
            "PodDisruptionBudget": policy.list_namespaced_pod_disruption_budget(namespace).items,
        }
        for kind, items in children.items():
            assert len(items) == 1, (kind, [i.metadata.name for i in items], before)
            (ref,) = items[0].metadata.owner_references
            assert ref.uid == uid and ref.controller, kind
        status = obj["status"]
        assert status["replicas"] == 2 and status["readyReplicas"] == 2, status
        assert len(apps.list_namespaced_replica_set(namespace).items) == 1
        # Delete while this operator still runs: it removes its finalizer, so no object is
        # left for the next test's operator to chase into a terminating namespace.
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "crash")

        def gone() -> bool:
            try:
                custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "crash")
            except client.ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, what="the LLMService deleted (its finalizer removed)", timeout=60)
