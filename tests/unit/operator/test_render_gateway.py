"""spec.gateway.inferencePool: the InferencePool and InferenceObjective, checked against the
pinned Gateway API Inference Extension CRD schemas, and the InferencePoolMissing verdict."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmservice.operator import gateway_support
from llmservice.operator.admission import apply_defaults, prune, validate
from llmservice.operator.reconcile import Options, checks
from llmservice.operator.render import Owner, selector_labels
from llmservice.operator.render_gateway import (
    GIE_OBJECTIVE_VERSION,
    GIE_VERSION,
    OBJECTIVE_API_VERSION,
    POOL_API_VERSION,
)
from llmservice.operator.spec import LLMServiceSpec

from tests.support.gateway_crds import gateway_schema
from tests.support.golden import ROOT, UID, assert_golden, example, rendered

GOLDEN = Path(__file__).parent / "golden"  # with the other examples (test_rendered_pods_start.py)
EXAMPLE = "llama-3-8b-inference-pool"
VERSIONS = {"InferencePool": POOL_API_VERSION, "InferenceObjective": OBJECTIVE_API_VERSION}


def gateway_docs() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((GOLDEN / f"{EXAMPLE}.yaml").read_text())
    return [d for d in docs if d["kind"] in VERSIONS]


def schema_errors(doc: dict[str, Any]) -> list[Any]:
    """Strict: no field the CRD would prune, and valid as its OpenAPI schema says."""
    schema = gateway_schema(doc["kind"], VERSIONS[doc["kind"]].split("/")[1])
    assert doc["apiVersion"] == VERSIONS[doc["kind"]]
    assert prune(schema, copy.deepcopy(doc), root=True) == doc, "fields the CRD does not know"
    return validate(schema, apply_defaults(schema, copy.deepcopy(doc)), None)


def test_golden_manifests():
    assert_golden(EXAMPLE, GOLDEN)


def test_rendered_pool_and_objective_pass_the_pinned_crd_schemas():
    docs = gateway_docs()
    assert [d["kind"] for d in docs] == ["InferencePool", "InferenceObjective"]
    for doc in docs:
        assert schema_errors(doc) == []


def test_the_schema_check_is_not_vacuous():
    pool, objective = gateway_docs()
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    assert schema_errors(pool) != []
    del objective["spec"]["poolRef"]
    assert schema_errors(objective) != []


def test_pool_selects_exactly_the_server_pods_on_the_server_port():
    obj = example(EXAMPLE)
    manifests = rendered(obj)
    pool, objective = manifests.gateway
    deployment = manifests.deployment
    assert pool["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["selector"]["matchLabels"] == selector_labels(obj["metadata"]["name"])
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
    assert pool["spec"]["targetPorts"] == [{"number": container["ports"][0]["containerPort"]}]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service", "name": "vllm-epp", "port": {"number": 9002}, "failureMode": "FailClose"
    }
    assert objective["spec"] == {
        "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llama-3-8b-pool"},
        "priority": 10,
    }


def test_router_pods_are_not_pool_members():
    obj = example(EXAMPLE)
    obj["spec"]["router"]["enabled"] = True
    manifests = rendered(obj)
    pool = manifests.gateway[0]
    router_pods = [m for m in manifests.router if m["kind"] == "Deployment"]
    assert router_pods
    wanted = pool["spec"]["selector"]["matchLabels"]
    for d in router_pods:
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert not all(labels.get(k) == v for k, v in wanted.items())


def test_default_picker_name_and_no_priority():
    obj = example(EXAMPLE)
    obj["spec"]["gateway"] = {"inferencePool": True}
    pool, objective = rendered(obj).gateway
    assert pool["spec"]["endpointPickerRef"]["name"] == "llama-3-8b-pool-epp"
    assert "priority" not in objective["spec"]


def test_no_gateway_objects_unless_asked():
    obj = example(EXAMPLE)
    del obj["spec"]["gateway"]
    assert rendered(obj).gateway == ()


@pytest.fixture
def probed():
    yield
    gateway_support.record(())


def test_missing_crds_refuse_the_rollout_with_the_install_command(probed):
    class NoGateway:
        def has_resource(self, api_version: str, plural: str) -> bool:
            return api_version != POOL_API_VERSION

    assert gateway_support.probe(NoGateway()) == ("inferencepools.inference.networking.k8s.io/v1",)
    obj = example(EXAMPLE)
    verdict = checks(Owner("llama-3-8b-pool", "default", UID), LLMServiceSpec.from_dict(obj["spec"]), Options())
    assert verdict.refuse_rollout
    assert verdict.support.reason == "InferencePoolMissing"
    assert "kubectl apply --server-side" in verdict.support.message
    assert f"releases/download/{GIE_VERSION}/manifests.yaml" in verdict.support.message
    gateway_support.record(())
    assert not checks(Owner("llama-3-8b-pool", "default", UID), LLMServiceSpec.from_dict(obj["spec"]), Options()).support.refuses_rollout


def test_pins_match_the_fetch_script():
    out = subprocess.run([str(ROOT / "hack/fetch-gateway-crds.sh"), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [GIE_VERSION, GIE_OBJECTIVE_VERSION]


class _Cluster:
    """Just enough of Kube for reconcile(): objects by path, every API discoverable,
    and the order of the deletes."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    def apply(self, path: str, manifest: dict[str, Any], manager: str) -> dict[str, Any]:
        stored = {**manifest, "metadata": {**manifest["metadata"], "generation": 1}}
        self.objects[path] = stored
        return stored

    def delete(self, path: str) -> dict[str, Any] | None:
        self.deleted.append(path)
        return self.objects.pop(path, None)

    def has_resource(self, api_version: str, plural: str) -> bool:
        return True

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects.values())


def test_turning_the_pool_off_deletes_the_objective_then_the_pool(probed):
    from llmservice.operator.reconcile import reconcile

    obj = example(EXAMPLE)
    obj["metadata"].update(namespace="default", uid=UID, generation=1)
    kube, events = _Cluster(), []
    reconcile(obj, kube, Options(), lambda *e: events.append(e))
    assert {"InferencePool", "InferenceObjective"} <= set(kube.kinds())
    pool = f"/apis/{POOL_API_VERSION}/namespaces/default/inferencepools/llama-3-8b-pool"
    objective = f"/apis/{OBJECTIVE_API_VERSION}/namespaces/default/inferenceobjectives/llama-3-8b-pool"
    assert kube.get(pool)["spec"]["selector"] and kube.get(objective)["spec"]["poolRef"]
    assert pool not in kube.deleted and objective not in kube.deleted

    obj["spec"]["gateway"]["inferencePool"] = False
    reconcile(obj, kube, Options(), lambda *e: events.append(e))
    assert "InferencePool" not in kube.kinds() and "InferenceObjective" not in kube.kinds()
    assert [p for p in kube.deleted if "inference" in p] == [objective, pool]
    assert ("Normal", "Deleted", "Deleted InferencePool llama-3-8b-pool (spec.gateway.inferencePool disabled)") in events
    assert "Deployment" in kube.kinds()  # the model's own children stay

    kube.deleted.clear()
    reconcile(obj, kube, Options(), lambda *e: events.append(e))
    assert not [p for p in kube.deleted if "inference" in p]  # nothing left: one read, no deletes
