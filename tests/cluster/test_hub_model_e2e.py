"""An `hf://` model on the real control plane: the operator (installed by helm, run by the
fake kubelet, `hfEndpoint` set) sizes it from the Hub, and the server pod downloads it
from the same Hub (`HF_ENDPOINT` through spec.engine.env), becomes Ready and answers a
chat completion. The Hub is the Hub-compatible endpoint on 127.0.0.1
(tests/support/hub_endpoint.py) serving a tiny random Llama-3.1-style model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from tests.support.hub_endpoint import HubEndpoint, hub_models, serve_all  # noqa: F401

from .chart_operator import GROUP, PLURAL, VERSION, Helm, Operator, condition, installed_operator
from .control_plane import ControlPlane
from .waiting import wait_for

pytestmark = pytest.mark.cluster
RELEASE = "llmservice-hub"


@pytest.fixture(scope="module")
def hub(hub_models: dict[str, Path]) -> Iterator[HubEndpoint]:  # noqa: F811
    with HubEndpoint() as endpoint:
        serve_all(endpoint, hub_models)
        yield endpoint


@pytest.fixture(scope="module")
def operator(
    llmservice_crd: object,
    helm: Helm,
    kube_api: client.ApiClient,
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
    hub: HubEndpoint,
) -> Iterator[Operator]:
    """The chart, pointed at the test Hub; its node runs the operator and the server pods."""
    with installed_operator(
        helm, kube_api, control_plane, tmp_path_factory.mktemp("hub-node"),
        release=RELEASE, namespace="llmservice-hub-system", node_name="hub-node",
        values={"hfEndpoint": hub.base_url},
    ) as op:  # fmt: skip
        yield op


def hub_llmservice(name: str, endpoint: str, cache: Path) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "hf://tiny/llama3", "servedName": "tiny"},
            "engine": {
                "maxModelLen": 256, "maxNumBatchedTokens": 256, "maxNumSeqs": 4,
                "dtype": "float32", "kvCacheMemoryGiB": 0.05,
                "env": [{"name": "HF_ENDPOINT", "value": endpoint},
                        # The fake kubelet runs pods as host processes and mounts no
                        # volumes: the download cache goes to this test's directory
                        # instead of the pod's emptyDir at /models-cache.
                        {"name": "HF_HOME", "value": str(cache)}],
                "extraArgs": ["--download-dir", str(cache)],
            },
            "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "2Gi"},
        },
    }  # fmt: skip


def test_an_hf_model_is_sized_downloaded_and_served(
    operator: Operator,
    kube_api: client.ApiClient,
    namespace: str,
    hub: HubEndpoint,
    tmp_path: Path,
) -> None:
    api = client.CustomObjectsApi(kube_api)
    api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, hub_llmservice("tiny", hub.base_url, tmp_path / "hf")
    )
    ready = wait_for(
        lambda: (c := condition(kube_api, namespace, "tiny", "Ready")).get("status") == "True" and c,
        what="LLMService tiny Ready (the server downloaded hf://tiny/llama3 from the test Hub)",
        timeout=300,
    )
    assert ready["reason"] == "AllReplicasReady"
    llms = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tiny")
    sha = hub.repos["tiny/llama3"].sha
    assert llms["status"]["memoryPlan"]["shapeSource"] == f"hub:tiny/llama3@{sha}"
    fit = condition(kube_api, namespace, "tiny", "VRAMFit")
    assert (fit["status"], fit["reason"]) == ("True", "CPUOnly")
    assert (tmp_path / "hf").is_dir() and any((tmp_path / "hf").rglob("*.safetensors"))
    assert operator.forbidden() == []

    (pod,) = client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items
    r = httpx.post(
        f"http://{pod.status.pod_ip}:8000/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "Hello"}],
              "max_tokens": 8, "temperature": 0},  # fmt: skip
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny" and body["usage"]["completion_tokens"] > 0
    assert isinstance(body["choices"][0]["message"]["content"], str)
