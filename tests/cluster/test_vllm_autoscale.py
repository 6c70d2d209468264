"""`engine.kind: vllm` under the autoscaler and the advisor, on the real control plane.

The pods are the rendered `vllm serve` Deployment's, in kwok mode (Ready, no process: a
vLLM image cannot run here), and tests/cluster/pod_metrics.py serves vLLM's own metric
names on their IPs, the page a stock vLLM pod would give. So this checks the operator's
side with `kind: vllm`: the pods are scraped, a preemption burst scales 1 -> 3 through
the scale subresource, the Deployment follows, and the advisor's block-size finding
appears in status.advice. (Our server speaking the same names under a real workload is
tests/e2e/test_autoscale.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.support.operator_process import OperatorProcess

from .chart_operator import GROUP, PLURAL, VERSION, condition
from .control_plane import ControlPlane
from .nodes import start_node
from .pod_metrics import ScriptedPodMetrics
from .pod_status import NodeSpec
from .waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]  # passes; e2e for make test's time (docs/control-plane.md)
NAME = "vllm-8b"


def vllm_llmservice() -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LLMService", "metadata": {"name": NAME},
        "spec": {
            "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct",
                      "catalogName": "llama-3-8b"},
            "engine": {"kind": "vllm", "maxModelLen": 8192, "maxNumSeqs": 64,
                       "blockSize": 32},
            "resources": {"gpu": {"count": 1, "memoryGiB": 80}, "cpu": "1", "memory": "2Gi"},
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3,
                            "intervalSeconds": 1},
        },
    }  # fmt: skip


def test_vllm_pods_are_autoscaled_and_advised(
    llmservice_crd: object, kube_api: client.ApiClient, control_plane: ControlPlane,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    node = start_node(
        kube_api, NodeSpec(name="vllm-gpus", gpus=3),
        workdir=tmp_path / "node", access=control_plane.access(),
    )  # fmt: skip

    def llms() -> dict[str, Any]:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)

    def gone() -> bool:
        return not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]

    try:
        with (
            ScriptedPodMetrics(core, namespace) as pods,
            OperatorProcess(control_plane.admin_kubeconfig, tmp_path / "operator.log"),
        ):
            # 15-token answers at block 32: the advisor's rule 1 (block size vs answers)
            pods.set(block_size=32, answer_tokens=15.0)
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, vllm_llmservice()
            )
            wait_for(
                lambda: condition(kube_api, namespace, NAME, "ScalingActive").get("status") == "True",
                what="ScalingActive True (the vllm pod scraped)",
                timeout=90,
            )  # fmt: skip
            (container,) = apps.read_namespaced_deployment(
                NAME, namespace
            ).spec.template.spec.containers
            assert container.command == ["vllm", "serve"]
            advice = wait_for(
                lambda: (llms().get("status") or {}).get("advice"),
                what="status.advice (two windows of the same finding)",
                timeout=60,
            )
            # the scripted page's short requests against maxModelLen 8192 also give
            # rule 3 (max-model-len); rule 1 is the one this page is scripted for
            by_rule = {a["rule"]: a for a in advice}
            assert set(by_rule) <= {"block-size", "max-model-len"}, advice
            assert by_rule["block-size"]["recommendation"] == {"engine": {"blockSize": 16}}

            pods.set(preemptions_per_minute=12.0)  # ceil(12 / 5) = 3 replicas
            wait_for(lambda: llms()["spec"]["replicas"] == 3, what="1 -> 3 replicas", timeout=60)
            status = wait_for(
                lambda: (s := llms().get("status") or {}).get("desiredReplicas") == 3 and s,
                what="status.desiredReplicas 3",
            )
            assert "preemptions" in status["lastScaleReason"], status
            wait_for(
                lambda: apps.read_namespaced_deployment(NAME, namespace).status.ready_replicas == 3,
                what="the vllm Deployment at 3 ready pods",
                timeout=60,
            )
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
            wait_for(gone, what="the LLMService deleted (its finalizer removed)", timeout=60)
    finally:
        node.stop()
    assert node.errors == []
