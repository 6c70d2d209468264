"""The advisor in the real operator process against the API emulator: fake pods serve
scripted vLLM /metrics (tests/support/metrics_pods.py) with seed 000's first mistake
(10-token answers at block 32). `status.advice`, the `Advice` Event and the printer
column appear, and clear after the fix; `spec.advisor.enabled: false` removes them.

The emulator has no server-side Table printing, so the column is checked by evaluating
the CRD's own `additionalPrinterColumns` jsonPath on the object (as the API server does).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.integration.operator.conftest import CRD
from tests.support.clients import Kubectl, llmservice, wait_until
from tests.support.cluster import Cluster
from tests.support.kubelet import Node
from tests.support.metrics_pods import MetricsPods, ServedMetrics, unique_ip_prefix
from tests.support.operator_process import OperatorProcess


@pytest.fixture(scope="module")
def advised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kubectl, MetricsPods]]:
    workdir = tmp_path_factory.mktemp("advice")
    with Cluster(workdir, nodes=[Node("cpu-node-1", gpus=0)], ip_prefix=unique_ip_prefix()) as cluster:
        kubectl = Kubectl(cluster.api)
        kubectl.install_crd(CRD)
        with ServedMetrics(cluster) as pods, OperatorProcess(cluster.kubeconfig, workdir / "operator.log"):
            yield kubectl, pods


def advice_column(obj: dict[str, Any]) -> str:
    """The `Advice` printer column: the CRD's jsonPath (.status.advice[0].rule) on obj."""
    with open(CRD) as f:
        crd = yaml.safe_load(f)
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    path = next(c["jsonPath"] for c in columns if c["name"] == "Advice")
    value: Any = obj
    for part in re.findall(r"\.(\w+)(?:\[(\d+)\])?", path):
        key, index = part
        value = (value or {}).get(key) if isinstance(value, dict) else None
        if index and value is not None:
            value = value[int(index)] if isinstance(value, list) and len(value) > int(index) else None
    return "" if value is None else str(value)


def service(name: str, autoscaling: bool, block_size: int) -> dict:
    return llmservice(
        name,
        # maxNumSeqs 4: the 512-block pool holds 4 full-length requests, so rule 4 is quiet
        engine={"kvCacheMemoryGiB": 0.5, "blockSize": block_size, "maxNumSeqs": 4},
        resources={"gpu": {"count": 0}},
        autoscaling={"enabled": autoscaling, "intervalSeconds": 1, "maxReplicas": 1},
    )


def advice(k: Kubectl, name: str) -> list[dict] | None:
    return (k.llms(name).get("status") or {}).get("advice")


@pytest.mark.parametrize("autoscaling", [True, False], ids=["autoscaler-pass", "advice-only"])
def test_advice_appears_with_event_and_column_then_clears_after_the_fix(advised, autoscaling):
    k, pods = advised
    name = "adv-on" if autoscaling else "adv-off"
    pods.set_service(name, block_size=32, answer_tokens=10)
    k.apply(service(name, autoscaling, block_size=32))

    wait_until(lambda: [f["rule"] for f in advice(k, name) or []] == ["block-size"], timeout=60)
    finding = advice(k, name)[0]
    assert finding["severity"] == "warning" and finding["pods"] == [p["metadata"]["name"] for p in k.pods(name)]
    assert finding["evidence"]["meanGenerationTokens"] == 10 and finding["evidence"]["blockSize"] == 32
    assert finding["recommendation"] == {"engine": {"blockSize": 16}}
    assert "arithmetic" in finding["expectedEffect"]
    assert advice_column(k.llms(name)) == "block-size"
    wait_until(lambda: any(r == "Advice" for _, r, _ in k.events(name)), timeout=10)
    events = [(t, m) for t, r, m in k.events(name) if r == "Advice"]
    assert events == [("Warning", f"block-size: {finding['summary']}")]

    # The fix: the recommended patch (the pods restart with block 16).
    pods.set_service(name, block_size=16)
    k.patch_llms(name, {"spec": finding["recommendation"]})
    wait_until(lambda: advice(k, name) == [], timeout=60)
    assert advice_column(k.llms(name)) == ""

    # The mistake again, then the advisor switched off: no advice at all.
    pods.set_service(name, block_size=32)
    k.patch_llms(name, {"spec": {"engine": {"blockSize": 32}}})
    wait_until(lambda: bool(advice(k, name)), timeout=60)
    assert len([r for _, r, _ in k.events(name) if r == "Advice"]) == 2
    k.patch_llms(name, {"spec": {"advisor": {"enabled": False}}})
    wait_until(lambda: advice(k, name) is None, timeout=30)
    assert advice_column(k.llms(name)) == ""
    k.delete_llms(name)
