"""The operator as shipped, for the cluster tier: `helm install` of the chart into its own
namespace, on a CPU node whose fake kubelet runs the chart's Deployment as a process, so
the operator runs with exactly the chart's RBAC (a forgotten permission shows up as a 403
in the audit log and in `Operator.forbidden()`)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client

from .binaries import REPO
from .control_plane import ControlPlane
from .fake_kubelet import FakeKubelet
from .namespaces import create_namespace, delete_namespace
from .nodes import start_node
from .pod_status import NodeSpec

GROUP, VERSION, PLURAL = "llmservice.dev", "v1alpha1", "llmservices"
CHART = str(REPO / "charts" / "llmservice-operator")
Helm = Callable[..., subprocess.CompletedProcess[str]]
# The machine is small and shared: one thread per served model.
NODE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class Operator:
    def __init__(self, namespace: str, node: FakeKubelet, control_plane: ControlPlane) -> None:
        self.namespace = namespace
        self.node = node
        self.control_plane = control_plane
        self.user = ""  # system:serviceaccount:NS:NAME, once installed

    def requests(self, **match: str) -> list[dict[str, Any]]:
        """Audit events of the operator's own requests whose objectRef matches `match`."""
        return [
            e
            for e in self.control_plane.audit_events()
            if e["user"]["username"] == self.user
            and all(e.get("objectRef", {}).get(k) == v for k, v in match.items())
        ]

    def forbidden(self) -> list[str]:
        """Every request of the operator the chart's RBAC refused."""
        return [
            f"{e['verb']} {e['requestURI']}"
            for e in self.requests()
            if e.get("responseStatus", {}).get("code") == 403
        ]

    def log(self) -> str:
        logs = sorted((self.node.workdir or Path("/tmp")).glob(f"pods/{self.namespace}_*/*.log"))
        return "\n".join(p.read_text(errors="replace")[-6000:] for p in logs)


@contextmanager
def installed_operator(
    helm: Helm,
    kube_api: client.ApiClient,
    control_plane: ControlPlane,
    workdir: Path,
    *,
    release: str,
    namespace: str,
    node_name: str,
    values: dict[str, str] | None = None,
) -> Iterator[Operator]:
    """The chart installed (`--set` each of `values`) and its operator running; uninstalled,
    its node stopped and its namespace deleted on exit."""
    core = client.CoreV1Api(kube_api)
    ns = create_namespace(core, namespace)
    node = start_node(
        kube_api, NodeSpec(name=node_name, cpu="16", memory="64Gi"),
        workdir=workdir, access=control_plane.access(), run_containers=True, env=NODE_ENV,
    )  # fmt: skip
    op = Operator(ns, node, control_plane)
    sets = [arg for k, v in (values or {}).items() for arg in ("--set", f"{k}={v}")]
    try:
        out = helm("install", release, CHART, "-n", ns, *sets, "--wait", "--timeout", "180s")
        assert out.returncode == 0, f"{out.stderr}\noperator log:\n{op.log()}"
        (pod,) = core.list_namespaced_pod(
            ns, label_selector=f"app.kubernetes.io/instance={release}"
        ).items
        op.user = f"system:serviceaccount:{ns}:{pod.spec.service_account_name}"
        yield op
    finally:
        helm("uninstall", release, "-n", ns, "--wait", "--timeout", "60s")
        node.stop()
        delete_namespace(core, ns)


def llms_api(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def condition(api: client.ApiClient, ns: str, name: str, type_: str) -> dict[str, Any]:
    """The LLMService's condition of that type ({} while it has none)."""
    obj = llms_api(api).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    found = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_]
    return found[0] if found else {}
