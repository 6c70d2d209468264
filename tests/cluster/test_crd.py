"""crds/llmservice.yaml on the real API server: structural schema, defaults, CEL rules.

The fast tier checks the same rules with an emulator (tests/unit/operator/test_crd.py);
here the apiextensions-apiserver itself decides, so a rule the emulator gets wrong, or
a schema the real server would refuse as non-structural, fails here.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from .binaries import REPO

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "llmservice.dev", "v1alpha1", "llmservices"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def minimal(name: str = "smol", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": {"model": {"source": "builtin:smollm2-135m"}, **spec},
    }


def create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def rejection(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        create(api, namespace, body)
    assert err.value.status == 422, err.value.body
    return str(json.loads(err.value.body)["message"])  # includes every cause


def test_kubectl_apply_crds_is_accepted_as_structural(
    llmservice_crd: subprocess.CompletedProcess[str], kube_api: client.ApiClient
) -> None:
    assert "customresourcedefinition.apiextensions.k8s.io/llmservices.llmservice.dev" in (
        llmservice_crd.stdout
    )
    crd = client.ApiextensionsV1Api(kube_api).read_custom_resource_definition(
        "llmservices.llmservice.dev"
    )
    conditions = {c.type: c for c in crd.status.conditions}
    assert conditions["Established"].status == "True"
    assert conditions["NamesAccepted"].status == "True"
    assert "NonStructuralSchema" not in conditions
    assert crd.status.accepted_names.short_names == ["llms"]


def test_defaults_are_applied_by_the_api_server(
    llmservice_crd: object, kube_api: client.ApiClient, namespace: str
) -> None:
    spec = create(kube_api, namespace, minimal())["spec"]
    assert spec["replicas"] == 1
    assert spec["resources"]["gpuMemoryUtilization"] == 0.9
    assert spec["resources"]["gpu"]["resourceName"] == "nvidia.com/gpu"
    assert spec["engine"]["blockSize"] == 16
    assert spec["engine"]["enableChunkedPrefill"] is True
    assert spec["autoscaling"]["minReplicas"] == 1
    assert spec["autoscaling"]["maxReplicas"] == 4
    assert spec["autoscaling"]["enabled"] is False


@pytest.mark.parametrize("value", [1.0, 0.99, 0.3])
def test_gpu_memory_utilization_outside_bounds_is_rejected_with_our_message(
    llmservice_crd: object, kube_api: client.ApiClient, namespace: str, value: float
) -> None:
    body = rejection(kube_api, namespace, minimal(resources={"gpuMemoryUtilization": value}))
    assert "gpuMemoryUtilization must lie in [0.5, 0.95]" in body
    assert "spec.resources.gpuMemoryUtilization" in body


def test_min_replicas_above_max_is_rejected_with_our_cel_message(
    llmservice_crd: object, kube_api: client.ApiClient, namespace: str
) -> None:
    body = rejection(kube_api, namespace, minimal(autoscaling={"minReplicas": 5, "maxReplicas": 2}))
    assert "autoscaling.minReplicas must be <= autoscaling.maxReplicas" in body
    assert "spec.autoscaling" in body


def test_cross_field_rules_see_defaulted_values(
    llmservice_crd: object, kube_api: client.ApiClient, namespace: str
) -> None:
    """CEL runs after defaulting: chunked prefill off + the default 8192-token budget is
    fine at maxModelLen 4096 but refused at 16384."""
    ok = minimal("fits", engine={"enableChunkedPrefill": False, "maxModelLen": 4096})
    assert create(kube_api, namespace, ok)["spec"]["engine"]["maxNumBatchedTokens"] == 8192
    bad = minimal("too-long", engine={"enableChunkedPrefill": False, "maxModelLen": 16384})
    body = rejection(kube_api, namespace, bad)
    assert "engine.maxNumBatchedTokens must be >= engine.maxModelLen" in body


def test_adapters_and_scale_to_zero_rules_on_the_real_api_server(
    llmservice_crd: object, kube_api: client.ApiClient, namespace: str
) -> None:
    """spec.adapters and autoscaling.scaleToZero as the apiextensions-apiserver sees them:
    valid ones stored, each bad value refused with a message naming it."""
    adapters = [{"name": "sql", "source": "hf://acme/sql-lora"}, {"name": "chat", "source": "pvc://loras/chat"}]
    stored = create(kube_api, namespace, minimal("lora", adapters=adapters, engine={"maxLoras": 2}))
    assert [a["name"] for a in stored["spec"]["adapters"]] == ["sql", "chat"]
    assert stored["spec"]["autoscaling"]["scaleToZero"] == "delete"  # the default
    twice = rejection(kube_api, namespace, minimal("twice", adapters=adapters + [adapters[0]]))
    assert "Duplicate value" in twice and "sql" in twice  # the list map's own key check
    bad_name = rejection(kube_api, namespace, minimal("bad-name", adapters=[{"name": "SQL", "source": "/x"}]))
    assert "adapter name SQL must be a DNS-1123 label" in bad_name
    bad_source = rejection(kube_api, namespace, minimal("bad-source", adapters=[{"name": "a", "source": "s3://x"}]))
    assert "adapter source s3://x must be" in bad_source
    slots = rejection(kube_api, namespace, minimal("slots", engine={"maxLoras": 4, "maxCpuLoras": 2}))
    assert "engine.maxCpuLoras must be >= engine.maxLoras" in slots
    sleepy = {"enabled": True, "minReplicas": 0, "scaleToZero": "sleep"}
    assert create(kube_api, namespace, minimal("sleepy", autoscaling=sleepy))["spec"]["autoscaling"]["scaleToZero"] == "sleep"
    vllm = minimal("sleepy-vllm", autoscaling=sleepy, engine={"kind": "vllm"})
    vllm["spec"]["model"]["source"] = "hf://acme/model"
    assert "scaleToZero sleep needs engine.kind llmservice" in rejection(kube_api, namespace, vllm)
    unknown = rejection(kube_api, namespace, minimal("hibernate", autoscaling={"scaleToZero": "hibernate"}))
    assert "hibernate" in unknown and "delete" in unknown


def test_kubectl_shows_the_cel_message_to_the_user(
    llmservice_crd: object, kubectl: Kubectl, namespace: str
) -> None:
    bad = minimal("bad", autoscaling={"minReplicas": 3, "maxReplicas": 1})
    out = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(bad))
    assert out.returncode != 0
    assert "autoscaling.minReplicas must be <= autoscaling.maxReplicas" in out.stderr


def test_scale_subresource_drives_spec_replicas(
    llmservice_crd: object, kubectl: Kubectl, kube_api: client.ApiClient, namespace: str
) -> None:
    create(kube_api, namespace, minimal("scaled"))
    out = kubectl("scale", "-n", namespace, "llms/scaled", "--replicas=3")
    assert out.returncode == 0, out.stderr
    obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "scaled"
    )
    assert obj["spec"]["replicas"] == 3


def test_status_is_a_subresource(
    llmservice_crd: object, kube_api: client.ApiClient, namespace: str
) -> None:
    """A spec update cannot write status (only the operator's status patches can)."""
    api = client.CustomObjectsApi(kube_api)
    obj = create(kube_api, namespace, minimal("st"))
    changed = copy.deepcopy(obj)
    changed["status"] = {"readyReplicas": 7}
    assert "status" not in api.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "st", changed
    )
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "st", {"status": {"readyReplicas": 1}}
    )
    got = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "st")
    assert got["status"]["readyReplicas"] == 1


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_pass_server_side_dry_run(
    llmservice_crd: object, kubectl: Kubectl, namespace: str, path: Any
) -> None:
    out = kubectl("apply", "--dry-run=server", "--server-side", "-n", namespace, "-f", str(path))
    assert out.returncode == 0, out.stderr
    assert "serverside-applied (server dry run)" in out.stdout
