"""Tensor parallelism on CPU on the real control plane: an LLMService with
`tensorParallelSize: 3` and no GPU (the CRD admits it since the bundled engine shards over
CPU ranks) is admitted, sized per rank, rolled out through the chart-installed operator,
run by the fake kubelet (3 gloo ranks in the pod's process tree), becomes Ready and answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from .chart_operator import GROUP, PLURAL, VERSION, Helm, Operator, condition, installed_operator
from .control_plane import ControlPlane
from .waiting import wait_for

pytestmark = pytest.mark.cluster
RELEASE = "llmservice-tp"


@pytest.fixture(scope="module")
def operator(
    llmservice_crd: object,
    helm: Helm,
    kube_api: client.ApiClient,
    control_plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    with installed_operator(
        helm, kube_api, control_plane, tmp_path_factory.mktemp("tp-node"),
        release=RELEASE, namespace="llmservice-tp-system", node_name="tp-node", values={},
    ) as op:  # fmt: skip
        yield op


def tp3_llmservice(name: str) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "builtin:smollm2-135m", "servedName": "smol"},
            "engine": {"tensorParallelSize": 3, "maxModelLen": 256, "maxNumBatchedTokens": 256,
                       "maxNumSeqs": 4, "kvCacheMemoryGiB": 0.05, "startupTimeoutSeconds": 600},
            "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "4Gi"},
        },
    }  # fmt: skip


def test_a_cpu_llmservice_with_three_ranks_is_ready_and_answers(
    operator: Operator, kube_api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    api = client.CustomObjectsApi(kube_api)
    api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, tp3_llmservice("smol-tp3")
    )
    ready = wait_for(
        lambda: (
            (c := condition(kube_api, namespace, "smol-tp3", "Ready")).get("status") == "True" and c
        ),
        what="LLMService smol-tp3 Ready (3 CPU ranks loaded their shards)",
        timeout=600,
    )
    assert ready["reason"] == "AllReplicasReady"
    plan = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "smol-tp3")[
        "status"
    ]["memoryPlan"]
    assert (
        plan["kvBytesPerTokenPerGPU"] * 3 == plan["kvBytesPerToken"]
    )  # 1 of the 3 KV heads per rank
    (pod,) = client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29500"
    r = httpx.post(
        f"http://{pod.status.pod_ip}:8000/v1/chat/completions",
        json={
            "model": "smol",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
            "temperature": 0,
        },  # fmt: skip
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0
    assert operator.forbidden() == []
