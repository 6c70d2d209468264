"""charts/llmservice-operator with the real helm against the real control plane."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from kubernetes import client

from .binaries import REPO
from .fake_kubelet import FakeKubelet
from .waiting import wait_for

pytestmark = pytest.mark.cluster

CHART = str(REPO / "charts" / "llmservice-operator")
Helm = Callable[..., subprocess.CompletedProcess[str]]


def test_helm_lint_strict_is_clean(helm: Helm) -> None:
    out = helm("lint", "--strict", CHART)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


def test_install_admits_a_valid_operator_pod_and_uninstall_cleans_up(
    helm: Helm, kube_api: client.ApiClient, namespace: str, add_node: Callable[..., FakeKubelet]
) -> None:
    """The API server admits every rendered object (pod security fields included), the
    pod runs as the chart's ServiceAccount, and `helm uninstall` leaves nothing behind
    but the CRDs (which helm never deletes)."""
    add_node()  # kwok mode: the pod is scheduled and reported Ready, not run
    release = "lint-op"
    out = helm("install", release, CHART, "-n", namespace, "--wait", "--timeout", "120s")
    assert out.returncode == 0, out.stderr
    assert "STATUS: deployed" in out.stdout

    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    rbac = client.RbacAuthorizationV1Api(kube_api)
    selector = f"app.kubernetes.io/instance={release}"
    (dep,) = apps.list_namespaced_deployment(namespace, label_selector=selector).items
    assert dep.status.ready_replicas == 1
    (pod,) = core.list_namespaced_pod(namespace, label_selector=selector).items
    sa = pod.spec.service_account_name
    assert core.read_namespaced_service_account(sa, namespace)
    assert pod.spec.security_context.run_as_non_root is True
    (container,) = pod.spec.containers
    assert container.command[:2] == ["llmservice", "operator"]
    assert container.security_context.read_only_root_filesystem is True
    (binding,) = rbac.list_cluster_role_binding(label_selector=selector).items
    assert binding.subjects[0].name == sa and binding.subjects[0].namespace == namespace
    assert rbac.read_cluster_role(binding.role_ref.name)

    out = helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
    assert out.returncode == 0, out.stderr
    wait_for(
        lambda: (
            not apps.list_namespaced_deployment(namespace, label_selector=selector).items
            and not core.list_namespaced_pod(namespace, label_selector=selector).items
            and not core.list_namespaced_service_account(namespace, label_selector=selector).items
            and not rbac.list_cluster_role(label_selector=selector).items
            and not rbac.list_cluster_role_binding(label_selector=selector).items
        ),
        what="helm uninstall to remove every object of the release",
    )
    crds = client.ApiextensionsV1Api(kube_api).list_custom_resource_definition().items
    assert "llmservices.llmservice.dev" in {c.metadata.name for c in crds}
