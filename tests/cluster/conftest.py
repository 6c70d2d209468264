"""Fixtures for the `cluster` tier: a real control plane shared by the whole session.

Start-up costs ~10-30 s of a shared machine, so one control plane serves every test;
each test isolates itself in its own namespace and its own fake nodes (node names are
unique per test, and the fixtures remove them).
"""

from __future__ import annotations

import itertools
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from .binaries import REPO, Binaries, find_binaries
from .control_plane import ControlPlane
from .fake_kubelet import FakeKubelet
from .pod_status import NodeSpec
from .waiting import exists, wait_for

_startup: dict[str, float] = {}
_names = itertools.count(1)


@pytest.fixture(scope="session")
def cluster_binaries() -> Binaries:
    binaries, reason = find_binaries()
    if binaries is None:
        pytest.skip(reason)
    return binaries


@pytest.fixture(scope="session")
def control_plane(
    cluster_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    cp = ControlPlane(cluster_binaries, tmp_path_factory.mktemp("control-plane"))
    cp.start()
    _startup.update(cp.startup_seconds)
    try:
        yield cp
    finally:
        cp.stop()
        cp.cleanup_data()


@pytest.fixture(scope="session")
def kube_api(control_plane: ControlPlane) -> client.ApiClient:
    """An admin (system:masters) client."""
    return config.new_client_from_config(str(control_plane.admin_kubeconfig))


@pytest.fixture(scope="session")
def kubectl(
    cluster_binaries: Binaries, control_plane: ControlPlane
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`kubectl("apply", "-f", path)` as the admin; returns the completed process."""

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [*cluster_binaries.kubectl(), "--kubeconfig", str(control_plane.admin_kubeconfig)]
        return subprocess.run(
            [*argv, *args], input=input, capture_output=True, text=True, timeout=120
        )

    return run


@pytest.fixture(scope="session")
def llmservice_crd(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], kube_api: client.ApiClient
) -> subprocess.CompletedProcess[str]:
    """`kubectl apply -f crds/` once per session, then wait until the CRD is Established."""
    applied = kubectl("apply", "-f", str(REPO / "crds"))
    assert applied.returncode == 0, applied.stderr
    ext = client.ApiextensionsV1Api(kube_api)

    def established() -> bool:
        crd = ext.read_custom_resource_definition("llmservices.llmservice.dev")
        conds = {c.type: c.status for c in crd.status.conditions or []}
        return conds.get("Established") == "True"

    wait_for(established, what="the LLMService CRD to be Established")
    return applied


@pytest.fixture
def namespace(kube_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace, usable once its "default" ServiceAccount exists."""
    core = client.CoreV1Api(kube_api)
    name = re.sub(r"[^a-z0-9]+", "-", f"t{next(_names)}-{request.node.name.lower()}")
    name = name[:60].strip("-")
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: exists(lambda: core.read_namespaced_service_account("default", name)),
             what=f"default ServiceAccount in {name}")  # fmt: skip
    yield name
    # Pods bound to the test's fake nodes (already gone) would keep the namespace
    # Terminating forever without a kubelet; remove them as a drained node would.
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)


@pytest.fixture
def add_node(
    kube_api: client.ApiClient, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., FakeKubelet]]:
    """`add_node(gpus=2, run_containers=True)` -> a started FakeKubelet, stopped at teardown.

    Waits until the node is schedulable (the node-lifecycle controller lifted the
    `not-ready` taint), as a cluster autoscaler's node would be before pods land on it.
    """
    started: list[FakeKubelet] = []
    core = client.CoreV1Api(kube_api)

    def add(
        *, run_containers: bool = False, name: str | None = None, **spec: object
    ) -> FakeKubelet:
        node_name = name or f"node-{next(_names)}"
        kubelet = FakeKubelet(
            kube_api, NodeSpec(name=node_name, **spec), run_containers=run_containers,
            workdir=tmp_path,
        )  # fmt: skip
        started.append(kubelet.start())
        wait_for(lambda: not _not_ready_taint(core.read_node(node_name)),
                 what=f"node {node_name} schedulable")  # fmt: skip
        return kubelet

    yield add
    for kubelet in reversed(started):
        kubelet.stop()
    errors = [e for k in started for e in k.errors]
    assert not errors, f"fake kubelet errors: {errors}"


def _not_ready_taint(node: client.V1Node) -> bool:
    taints = node.spec.taints or []
    return any(t.key == "node.kubernetes.io/not-ready" for t in taints)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _startup:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in _startup.items())
        terminalreporter.write_line(f"control plane start-up (cumulative): {parts}")
