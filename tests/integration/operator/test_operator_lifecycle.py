"""Operator-wide behaviour: restarts, cluster capabilities, and operator flags.

Each test starts its own cluster and operator (they change what the operator sees at
start-up), so these are the slower tests of the suite.
"""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import Env, start_env
from tests.support.clients import llmservice, wait_until

GPU_8B = {  # weights on a PVC: the server cannot download hf:// sources yet
    "model": {"source": "pvc://weights/Meta-Llama-3-8B-Instruct", "catalogName": "llama-3-8b"},
    "resources": {"gpu": {"count": 1, "memoryGiB": 24}},
}
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "kind": "ServiceMonitor",
            "plural": "servicemonitors",
            "singular": "servicemonitor",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def fresh(tmp_path, request):
    """A cluster + operator of its own; `request.param` holds extra operator flags."""
    args = getattr(request, "param", ())
    yield from start_env(tmp_path, *args)


def labelled(env: Env, kind_path: str, name: str) -> list[dict]:
    found = env.kubectl.get(f"{kind_path}?labelSelector=llmservice.dev/service%3D{name}")
    return (found or {}).get("items", [])


def test_restart_resumes_without_duplicating_children(fresh: Env):
    k = fresh.kubectl
    k.apply(llmservice("survivor", replicas=2, **GPU_8B))
    wait_until(lambda: k.condition("survivor", "Ready").get("status") == "True")
    wait_until(lambda: k.llms("survivor")["status"].get("observedGeneration") == 1)
    deployment_uid = k.deployment("survivor")["metadata"]["uid"]
    service_uid = k.service("survivor")["metadata"]["uid"]
    created_before = [m for _, r, m in k.events("survivor") if r == "Created"]

    fresh.operator.stop()
    k.scale("survivor", 3)  # a change while the operator is away
    fresh.operator.start()

    wait_until(lambda: k.deployment("survivor")["spec"]["replicas"] == 3)
    wait_until(lambda: k.llms("survivor")["status"].get("readyReplicas") == 3)
    wait_until(lambda: k.llms("survivor")["status"].get("observedGeneration") == 2)
    assert k.deployment("survivor")["metadata"]["uid"] == deployment_uid
    assert k.service("survivor")["metadata"]["uid"] == service_uid
    assert len(labelled(fresh, "/apis/apps/v1/namespaces/default/deployments", "survivor")) == 1
    services = labelled(fresh, "/api/v1/namespaces/default/services", "survivor")
    # two replicas: the router is on, <name> fronts it and <name>-pods the model pods
    assert sorted(s["metadata"]["name"] for s in services) == ["survivor", "survivor-pods"]
    assert k.deployment("survivor-router") is not None
    created_after = [m for _, r, m in k.events("survivor") if r == "Created"]
    assert created_after == created_before  # nothing was created twice
    assert len(k.pods("survivor")) == 3


def test_service_monitor_only_when_its_crd_exists(fresh: Env):
    k = fresh.kubectl
    k.apply(llmservice("plain", **GPU_8B))
    wait_until(lambda: k.deployment("plain"))
    monitors = "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors"
    assert k.get(f"{monitors}/plain") is None  # the resource is not even served

    k.ext.create_custom_resource_definition(SERVICE_MONITOR_CRD)
    created = k.apply(llmservice("watched", **GPU_8B))
    monitor = wait_until(lambda: k.get(f"{monitors}/watched"))
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert monitor["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    k.delete_llms("watched")
    wait_until(lambda: k.get(f"{monitors}/watched") is None)


@pytest.mark.parametrize("fresh", [("--max-gpu-memory-utilization", "0.8")], indirect=True)
def test_operator_ceiling_on_gpu_memory_utilization(fresh: Env):
    k = fresh.kubectl
    k.apply(llmservice("capped", **GPU_8B))  # asks for the default 0.90
    deployment = wait_until(lambda: k.deployment("capped"))
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.8"
    plan = wait_until(lambda: k.llms("capped").get("status", {}).get("memoryPlan"))
    assert plan["gpuMemoryUtilization"] == 0.8
    # 32k tokens fit a 24 GiB GPU at 0.90 but not under the operator's 0.80 ceiling.
    k.apply(llmservice("long", engine={"maxModelLen": 32768}, **GPU_8B))
    vram = wait_until(lambda: k.condition("long", "VRAMFit"))
    assert vram["status"] == "False" and "x 0.80" in vram["message"]
    assert k.deployment("long") is None


@pytest.mark.parametrize("fresh", [("--server-image", "registry.example/site:1")], indirect=True)
def test_operator_server_image_is_the_default_of_every_pod(fresh: Env):
    k = fresh.kubectl

    def image(name: str) -> str:
        deployment = wait_until(lambda: k.deployment(name))
        return deployment["spec"]["template"]["spec"]["containers"][0]["image"]

    k.apply(llmservice("plain", **GPU_8B))
    assert "image" not in k.llms("plain")["spec"]["engine"]  # no CRD default in the way
    assert image("plain") == "registry.example/site:1"
    k.apply(llmservice("pinned", engine={"image": "registry.example/pinned:2"}, **GPU_8B))
    assert image("pinned") == "registry.example/pinned:2"
