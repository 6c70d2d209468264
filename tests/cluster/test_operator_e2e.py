"""The operator as shipped: installed by helm, run by the fake kubelet from the chart's own
Deployment, with exactly the chart's RBAC (a forgotten permission shows up as a 403 in
its log and a timeout here), reconciling LLMServices on the real control plane."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client

from .binaries import REPO
from .chart_operator import (
    GROUP,
    PLURAL,
    VERSION,
    Helm,
    Operator,
    condition,
    installed_operator,
    llms_api,
)
from .control_plane import ControlPlane
from .fake_kubelet import FakeKubelet
from .waiting import wait_for

pytestmark = pytest.mark.cluster

RELEASE = "llmservice"


@pytest.fixture(scope="module")
def operator(
    llmservice_crd: object,
    helm: Helm,
    kube_api: client.ApiClient,
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    """`helm install` into its own namespace; a CPU node whose fake kubelet runs pods."""
    with installed_operator(
        helm, kube_api, control_plane, tmp_path_factory.mktemp("system-node"),
        release=RELEASE, namespace="llmservice-system", node_name="system-node",
    ) as op:  # fmt: skip
        yield op


def gpu_llmservice(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "builtin:smollm2-135m"},
            "resources": {"gpu": {"count": 1, "memoryGiB": 24}, "cpu": "2", "memory": "4Gi"},
        },
    }


def test_embedded_model_example_serves_a_chat_completion_then_is_collected(
    operator: Operator, kube_api: client.ApiClient, namespace: str
) -> None:
    example = yaml.safe_load((REPO / "examples" / "smollm2-cpu.yaml").read_text())
    llms_api(kube_api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, example)
    name = example["metadata"]["name"]
    ready = wait_for(
        lambda: (c := condition(kube_api, namespace, name, "Ready")).get("status") == "True" and c,
        what=f"LLMService {name} Ready (operator log below on failure)",
        timeout=420,
    )
    assert ready["reason"] == "AllReplicasReady"

    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    llms = llms_api(kube_api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    (dep,) = apps.list_namespaced_deployment(namespace).items
    (rs,) = apps.list_namespaced_replica_set(namespace).items
    (pod,) = core.list_namespaced_pod(namespace).items
    assert dep.metadata.owner_references[0].uid == llms["metadata"]["uid"]
    assert rs.metadata.owner_references[0].uid == dep.metadata.uid
    assert pod.metadata.owner_references[0].uid == rs.metadata.uid
    assert pod.spec.node_name == operator.node.node.name
    # The operator did this as the chart's ServiceAccount, and RBAC never refused it.
    writes = operator.requests(resource="deployments", namespace=namespace)
    assert any(e["verb"] == "patch" and e["responseStatus"]["code"] < 300 for e in writes)
    status = operator.requests(resource="llmservices", subresource="status", namespace=namespace)
    assert status, "the operator never patched llmservices/status"
    assert operator.forbidden() == []

    r = httpx.post(
        f"http://{pod.status.pod_ip}:8000/v1/chat/completions",
        json={
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 12,
            "temperature": 0,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert "Paris" in r.json()["choices"][0]["message"]["content"]

    llms_api(kube_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait_for(
        lambda: (
            not apps.list_namespaced_deployment(namespace).items
            and not apps.list_namespaced_replica_set(namespace).items
            and not core.list_namespaced_pod(namespace).items
            and not core.list_namespaced_service(namespace).items
        ),
        what="the garbage collector to remove Deployment, ReplicaSet, Pod and Service",
        timeout=120,
    )
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{pod.status.pod_ip}:8000/health", timeout=2)


def test_capacity_pending_until_a_gpu_node_is_added(
    operator: Operator,
    kube_api: client.ApiClient,
    namespace: str,
    add_node: Callable[..., FakeKubelet],
) -> None:
    add_node(gpus=1)  # kwok mode: GPU pods are reported Ready, not run
    for name in ("first", "second"):
        llms_api(kube_api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, gpu_llmservice(name)
        )

    def states() -> dict[str, tuple[str, str]]:
        return {
            n: (
                condition(kube_api, namespace, n, "Ready").get("status", ""),
                condition(kube_api, namespace, n, "CapacityPending").get("status", ""),
            )
            for n in ("first", "second")
        }

    wait_for(
        lambda: sorted(states().values()) == [("False", "True"), ("True", "False")],
        what="one LLMService Ready, the other CapacityPending",
        timeout=120,
    )
    waiting = next(n for n, s in states().items() if s == ("False", "True"))
    pending = condition(kube_api, namespace, waiting, "CapacityPending")
    assert "Insufficient nvidia.com/gpu" in pending["message"]

    add_node(gpus=1)  # what a cluster autoscaler would do
    wait_for(
        lambda: all(s == ("True", "False") for s in states().values()),
        what="both LLMServices Ready once the new GPU node is schedulable",
        timeout=120,
    )
    assert operator.forbidden() == []


def test_multi_node_vllm_waits_for_the_lws_crd_then_applies_a_leader_worker_set(
    operator: Operator, kube_api: client.ApiClient, kubectl: Callable[..., Any], namespace: str
) -> None:
    """Without the LWS CRD: Ready=False LeaderWorkerSetMissing with the install command.
    With it (pinned, hack/fetch-lws-crd.sh): the next reconcile applies the group, the API
    server accepts it, and the chart's RBAC covered every request (no 403)."""
    from .lws import install_lws_crd, remove_lws_crd

    example = yaml.safe_load((REPO / "examples/vllm-llama-3-405b-multinode.yaml").read_text())
    name = example["metadata"]["name"]
    llms_api(kube_api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, example)
    wait_for(
        lambda: condition(kube_api, namespace, name, "Ready").get("reason")
        == "LeaderWorkerSetMissing",
        what="Ready=False LeaderWorkerSetMissing",
        timeout=180,
    )
    message = condition(kube_api, namespace, name, "Ready")["message"]
    assert "kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases" in message
    install_lws_crd(kubectl, kube_api)
    try:
        lws = client.CustomObjectsApi(kube_api)
        patch = {"spec": {"replicas": 2}}  # an edit: the reconcile that sees the CRD
        llms_api(kube_api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, patch
        )

        def group() -> dict[str, Any] | None:
            try:
                return lws.get_namespaced_custom_object(
                    "leaderworkerset.x-k8s.io", "v1", namespace, "leaderworkersets", name
                )
            except client.ApiException:
                return None

        wait_for(lambda: (group() or {}).get("spec", {}).get("replicas") == 2,
                 what="the LeaderWorkerSet with 2 groups", timeout=180)  # fmt: skip
        assert group()["spec"]["leaderWorkerTemplate"]["size"] == 2
        wait_for(
            lambda: condition(kube_api, namespace, name, "Ready").get("reason")
            != "LeaderWorkerSetMissing",
            what="LeaderWorkerSetMissing cleared",
            timeout=180,
        )
        # Back within one node (16-GPU nodes): a Deployment again, and the LWS deleted.
        back = {"spec": {"resources": {"gpu": {"perNode": 16}}}}
        llms_api(kube_api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, back
        )
        apps = client.AppsV1Api(kube_api)
        wait_for(
            lambda: group() is None and apps.list_namespaced_deployment(namespace).items,
            what="the Deployment back and the LeaderWorkerSet deleted",
            timeout=180,
        )
        assert not [f for f in operator.forbidden() if "leaderworkersets" in f]
    finally:
        llms_api(kube_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        remove_lws_crd(kube_api)


def test_gateway_pool_member_waits_for_the_crds_then_owns_its_pool_and_objective(
    operator: Operator, kube_api: client.ApiClient, kubectl: Callable[..., Any], namespace: str
) -> None:
    """spec.gateway.inferencePool without the Gateway API Inference Extension CRDs:
    Ready=False InferencePoolMissing with the install command, no rollout. With them
    (pinned, hack/fetch-gateway-crds.sh): the API server accepts the InferencePool and
    InferenceObjective the operator applies, both owned by the LLMService, the pool
    selecting the Deployment's pods; turned off, both are deleted; no 403 on the way."""
    from llmservice.operator.render_gateway import GIE_INSTALL

    from .gateway import install_gateway_crds, remove_gateway_crds

    name = "pool-member"
    body = gpu_llmservice(name)  # no GPU node here: the pods stay Pending, nothing runs
    body["spec"]["gateway"] = {"inferencePool": True, "priority": 5}
    llms_api(kube_api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    wait_for(
        lambda: condition(kube_api, namespace, name, "Ready").get("reason") == "InferencePoolMissing",
        what="Ready=False InferencePoolMissing",
        timeout=60,
    )
    ready = condition(kube_api, namespace, name, "Ready")
    assert ready["status"] == "False" and GIE_INSTALL in ready["message"]
    apps = client.AppsV1Api(kube_api)
    assert not apps.list_namespaced_deployment(namespace).items  # the rollout waits
    install_gateway_crds(kubectl, kube_api)
    try:
        custom = client.CustomObjectsApi(kube_api)
        pool_api = ("inference.networking.k8s.io", "v1", namespace, "inferencepools", name)
        objective_api = ("inference.networking.x-k8s.io", "v1alpha2", namespace, "inferenceobjectives", name)

        def read(api: tuple[str, ...]) -> dict[str, Any] | None:
            try:
                return custom.get_namespaced_custom_object(*api)
            except client.ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        patch = {"spec": {"gateway": {"priority": 7}}}  # an edit: the reconcile that sees the CRDs
        llms_api(kube_api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)
        wait_for(lambda: (read(objective_api) or {}).get("spec", {}).get("priority") == 7,
                 what="the InferenceObjective with priority 7", timeout=60)  # fmt: skip
        pool, objective = read(pool_api), read(objective_api)
        assert pool is not None and objective is not None
        uid = llms_api(kube_api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)[
            "metadata"
        ]["uid"]
        for child in (pool, objective):
            (ref,) = child["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["uid"], ref["controller"]) == ("LLMService", uid, True)
        (deployment,) = apps.list_namespaced_deployment(namespace).items
        assert pool["spec"]["selector"]["matchLabels"] == deployment.spec.selector.match_labels
        assert pool["spec"]["targetPorts"] == [{"number": 8000}]
        assert objective["spec"]["poolRef"] == {
            "group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name,
        }  # fmt: skip
        wait_for(
            lambda: condition(kube_api, namespace, name, "Ready").get("reason") != "InferencePoolMissing",
            what="InferencePoolMissing cleared",
            timeout=60,
        )
        off = {"spec": {"gateway": {"inferencePool": False}}}
        llms_api(kube_api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, off)
        wait_for(lambda: read(pool_api) is None and read(objective_api) is None,
                 what="the pool and its objective deleted", timeout=60)  # fmt: skip
        assert apps.list_namespaced_deployment(namespace).items  # the model itself stays
        assert not [f for f in operator.forbidden() if "inference" in f]
    finally:
        llms_api(kube_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        remove_gateway_crds(kube_api)
