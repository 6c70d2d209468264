"""Pod Security Admission `restricted`, enforced by the real API server: the operator pod
as helm installs it and the server pods as the operator renders them are admitted in a
namespace labelled `pod-security.kubernetes.io/enforce=restricted`, and a pod that
breaks the profile is refused there (so the label is really enforced)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
from kubernetes import client
from llmservice.operator.render import Owner, render_deployment
from llmservice.operator.spec import LLMServiceSpec

from .binaries import REPO
from .fake_kubelet import FakeKubelet
from .waiting import wait_for

pytestmark = pytest.mark.cluster

CHART = str(REPO / "charts" / "llmservice-operator")
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}  # fmt: skip
SPECS = {
    "builtin-cpu": {"model": {"source": "builtin:smollm2-135m"}, "resources": {"gpu": {"count": 0}}},
    "hf-gpu-with-key": {
        "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "hfTokenSecretRef": {"name": "hf"}},
        "engine": {"apiKeySecretRef": {"name": "api", "key": "k"}, "maxTokensDefault": 512},
    },
    "pvc-replicated": {"model": {"source": "pvc://weights/llama"}, "replicas": 3},
}


def restrict(core: client.CoreV1Api, namespace: str) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def dry_run_pod(kubectl: Kubectl, namespace: str, pod_spec: dict, name: str) -> subprocess.CompletedProcess[str]:
    """Create the pod with a server-side dry run: every admission plugin runs, nothing is stored."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}
    return kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod))


def test_a_noncompliant_pod_is_refused(kube_api: client.ApiClient, kubectl: Kubectl, namespace: str) -> None:
    plain = {"containers": [{"name": "c", "image": "busybox"}]}
    assert dry_run_pod(kubectl, namespace, plain, "plain").returncode == 0  # admitted before the label
    restrict(client.CoreV1Api(kube_api), namespace)
    refused = dry_run_pod(kubectl, namespace, plain, "plain")
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr, refused.stderr


@pytest.mark.parametrize("case", sorted(SPECS))
def test_server_pods_pass_restricted(kube_api: client.ApiClient, kubectl: Kubectl, namespace: str, case: str) -> None:
    restrict(client.CoreV1Api(kube_api), namespace)
    spec = LLMServiceSpec.from_dict(SPECS[case])
    deployment = render_deployment(Owner("m", namespace, "00000000-0000-0000-0000-000000000001"), spec)
    out = dry_run_pod(kubectl, namespace, deployment["spec"]["template"]["spec"], "server")
    assert out.returncode == 0 and "created (server dry run)" in out.stdout, out.stderr


def test_helm_installed_operator_pod_passes_restricted(
    helm: Callable[..., subprocess.CompletedProcess[str]], kube_api: client.ApiClient,
    namespace: str, add_node: Callable[..., FakeKubelet],
) -> None:
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    restrict(core, namespace)
    add_node()  # kwok mode: the pod is scheduled and reported Ready, not run
    out = helm("install", "psa-op", CHART, "-n", namespace, "--wait", "--timeout", "120s")
    assert out.returncode == 0, out.stderr
    selector = "app.kubernetes.io/instance=psa-op"
    (pod,) = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=selector).items,
                      what="the operator pod")  # fmt: skip
    (rs,) = apps.list_namespaced_replica_set(namespace, label_selector=selector).items
    failed = [e.message for e in core.list_namespaced_event(namespace).items if e.reason == "FailedCreate"]
    assert failed == [] and rs.status.ready_replicas == 1
    assert helm("uninstall", "psa-op", "-n", namespace, "--wait", "--timeout", "60s").returncode == 0
