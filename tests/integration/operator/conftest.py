"""Fixtures: an emulated cluster with our CRD, and the real operator process against it.

One cluster + operator per test module keeps the suite fast (an operator start is ~2 s);
tests use their own LLMService names so they do not see each other.
"""

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.clients import Kubectl  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.kubelet import Node  # noqa: E402
from tests.support.operator_process import OperatorProcess  # noqa: E402

CRD = str(ROOT / "crds" / "llmservice.yaml")


@dataclass
class Env:
    cluster: Cluster
    kubectl: Kubectl
    operator: OperatorProcess
    workdir: Path


def start_env(workdir: Path, *operator_args: str, **cluster_args) -> Iterator[Env]:
    with Cluster(workdir, **cluster_args) as cluster:
        kubectl = Kubectl(cluster.api)
        kubectl.install_crd(CRD)
        operator = OperatorProcess(cluster.kubeconfig, workdir / "operator.log", *operator_args)
        with operator:
            yield Env(cluster, kubectl, operator, workdir)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from start_env(
        tmp_path_factory.mktemp("cluster"),
        nodes=[
            Node("gpu-node-1", gpus=64),
            Node("cpu-node-1", gpus=0),
            Node("small-pool-1", gpus=1, labels={"pool": "small"}),
        ],
        failing_images={"registry.invalid/missing:1": "ImagePullBackOff"},
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On failure, show the operator's log next to the assertion."""
    outcome = yield
    report = outcome.get_result()
    env = getattr(item, "funcargs", {}).get("env")
    if report.failed and isinstance(env, Env):
        report.sections.append(("operator log (tail)", env.operator.logs()[-15000:]))
