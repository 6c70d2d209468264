"""status.advice on the real API server: the schema keeps what the operator writes, and
`kubectl get llms` prints the top finding's rule in the Advice column (server-side
Table printing, which the emulator tier cannot show)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from kubernetes import client

from .test_crd import GROUP, PLURAL, VERSION, create, minimal

pytestmark = pytest.mark.cluster

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

FINDING = {
    "rule": "block-size",
    "severity": "warning",
    "summary": "answers average 10 tokens with blockSize 32: 34% of KV slots are tail waste; set engine.blockSize 16",
    "pods": ["adv-abc-1"],
    "evidence": {"meanGenerationTokens": 10.0, "blockSize": 32, "kvFullWhileBatchSmall": False},
    "recommendation": {"engine": {"blockSize": 16}},
    "expectedEffect": {"concurrentRequestsFactor": 1.213, "arithmetic": "..."},
}


def column(kubectl: Kubectl, namespace: str, name: str) -> str:
    out = kubectl("get", "-n", namespace, f"llms/{name}")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[:2]
    start, end = header.index("ADVICE"), header.index("AGE")  # kubectl pads columns to the header
    return row[start:end].strip()


def test_advice_column_and_schema(llmservice_crd: object, kubectl: Kubectl, kube_api: client.ApiClient, namespace: str) -> None:
    api = client.CustomObjectsApi(kube_api)
    obj = create(kube_api, namespace, minimal("adv"))
    assert obj["spec"]["advisor"] == {"enabled": True}  # the default
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "adv", {"status": {"advice": [FINDING]}}
    )
    got = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "adv")
    assert got["status"]["advice"] == [FINDING]  # nothing pruned
    assert column(kubectl, namespace, "adv") == "block-size"
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "adv", {"status": {"advice": []}}
    )
    assert column(kubectl, namespace, "adv") == ""
