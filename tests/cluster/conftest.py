"""Fixtures for the `cluster` tier: a real control plane shared by the whole session.

Start-up costs ~10-30 s of a shared machine, so one control plane serves every test;
each test isolates itself in its own namespace and its own fake nodes (node names are
unique per test, and the fixtures remove them).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from .binaries import REPO, Binaries, find_binaries
from .control_plane import ControlPlane
from .fake_kubelet import FakeKubelet
from .namespaces import create_namespace, delete_namespace
from .nodes import start_node
from .pod_status import NodeSpec
from .waiting import wait_for

_startup: dict[str, float] = {}
_names = itertools.count(1)


@pytest.fixture(scope="session")
def cluster_binaries() -> Binaries:
    """The built binaries; without them the tier skips, or fails where they are required
    (LLMSERVICE_REQUIRE_CLUSTER=1: `make test`, which builds them first)."""
    binaries, reason = find_binaries()
    if binaries is None:
        if os.environ.get("LLMSERVICE_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason)
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
    """A fresh namespace named after the test."""
    core = client.CoreV1Api(kube_api)
    name = re.sub(r"[^a-z0-9]+", "-", f"t{next(_names)}-{request.node.name.lower()}")
    name = name[:60].strip("-")
    yield create_namespace(core, name)
    delete_namespace(core, name)


@pytest.fixture(scope="session")
def helm(
    cluster_binaries: Binaries, control_plane: ControlPlane
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`helm("install", ...)` against the control plane; returns the completed process."""

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [str(cluster_binaries.helm), "--kubeconfig", str(control_plane.admin_kubeconfig)]
        return subprocess.run(
            [*argv, *args], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "HELM_CACHE_HOME": str(control_plane.workdir / "helm-cache"),
                 "HELM_CONFIG_HOME": str(control_plane.workdir / "helm-config"),
                 "HELM_DATA_HOME": str(control_plane.workdir / "helm-data")},
        )  # fmt: skip

    return run


@pytest.fixture
def add_node(
    kube_api: client.ApiClient, control_plane: ControlPlane, tmp_path: Path
) -> Iterator[Callable[..., FakeKubelet]]:
    """`add_node(gpus=2, run_containers=True)` -> a schedulable FakeKubelet node, stopped
    and deleted at teardown (and the test fails if the fake kubelet hit errors)."""
    started: list[FakeKubelet] = []

    def add(
        *,
        run_containers: bool = False,
        name: str | None = None,
        env: dict[str, str] | None = None,
        **spec: Any,
    ) -> FakeKubelet:
        node = NodeSpec(name=name or f"node-{next(_names)}", **spec)
        kubelet = start_node(kube_api, node, workdir=tmp_path, access=control_plane.access(),
                             run_containers=run_containers, env=env)  # fmt: skip
        started.append(kubelet)
        return kubelet

    yield add
    for kubelet in reversed(started):
        kubelet.stop()
    errors = [e for k in started for e in k.errors]
    assert not errors, f"fake kubelet errors: {errors}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On failure, attach the log of the operator pod the test ran against."""
    outcome = yield
    report = outcome.get_result()
    operator = getattr(item, "funcargs", {}).get("operator")
    if report.failed and callable(getattr(operator, "log", None)):
        report.sections.append(("operator pod log (tail)", operator.log()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _startup:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in _startup.items())
        terminalreporter.write_line(f"control plane start-up (cumulative): {parts}")
