"""The chart's operator Deployment, run for real: its command starts the operator.

The rendered container's command, args and env (POD_ID from the pod name, HOME) are
executed as a local process against the API emulator (tests/support), the way the
kubelet would run them, with a kubeconfig carrying a token of its own that stands for the
chart's ServiceAccount. The process must pass the rendered probes, serve an LLMService,
and every API request it made must be allowed by the rendered (Cluster)Roles bound to
that ServiceAccount: the RBAC is shown sufficient by the operator's own traffic.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.clients import Kubectl, wait_until
from tests.support.cluster import Cluster
from tests.support.gateway_crds import gateway_crd
from tests.support.kubelet import Node
from tests.support.lws_crd import lws_crd
from tests.support.operator_process import free_port
from tests.unit.chart.helm import CHART, NAMESPACE, ROOT, Helm, one, operator_container
from tests.unit.chart.scenarios import Access, allows

POD_NAME = "llms-llmservice-operator-5c9d7b8f6d-x2x7q"


@pytest.fixture(autouse=True)
def namespace_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the emulator route /api/v1/namespaces[/NAME], which kmock 0.8 cannot parse.

    kmock reads `namespaces/X` as a namespace scope and fails on the bare collection; kopf
    lists and watches namespaces when it serves named namespaces (the chart's namespaced
    install). Here those two paths mean the cluster-scoped `namespaces` resource, as in
    kube-apiserver; every other path goes to kmock's own parser.
    """
    from kmock._internal import parsing

    original = parsing.parse_path

    def parse_path(path: str) -> parsing.ParsedPath:
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
            name = parts[3] if len(parts) == 4 else None
            return parsing.ParsedPath("", "v1", "namespaces", None, name, None)
        return original(path)

    monkeypatch.setattr(parsing, "parse_path", parse_path)


APPLY = "application/apply-patch"


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as the kubelet resolves it (only the fieldRef the chart uses)."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, item
            env[item["name"]] = POD_NAME
    return env


def executable(name: str) -> str:
    """The image's PATH has the project's console scripts; here they live in the venv."""
    found = shutil.which(
        name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    assert found, f"{name} is not installed (pip install -e .)"
    return found


def probe_url(container: dict[str, Any], probe: str) -> str:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    get = container[probe]["httpGet"]
    port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
    return f"http://127.0.0.1:{port}{get['path']}"


def probe_url_of_port(container: dict[str, Any], name: str, path: str = "/metrics") -> str:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    return f"http://127.0.0.1:{ports[name]}{path}"


def wait_live(process: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the operator exited: {log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered 200: {log.read_text()[-4000:]}")


def write_kubeconfig(path: Path, url: str, token: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": url}}],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [
                    {"name": "emulator", "context": {"cluster": "emulator", "user": "operator"}}
                ],
                "current-context": "emulator",
            }
        )
    )
    return path


class RenderedOperator:
    """`with RenderedOperator(...) as op:` an emulated cluster with the chart's operator in it.

    `op.stop()` ends the operator and returns the requests the emulator recorded.
    """

    def __init__(self, helm: Helm, workdir: Path, values: dict[str, Any], namespace: str) -> None:
        self.docs = helm.template({**values, "healthPort": free_port()})
        self.container = operator_container(self.docs)
        self.sa = one(self.docs, "ServiceAccount")["metadata"]["name"]
        self.token = f"serviceaccount-{NAMESPACE}-{self.sa}"
        self.workdir = workdir
        self.namespace = namespace
        self.log = workdir / "operator.log"
        self.cluster = Cluster(workdir, nodes=[Node("cpu-node-1", gpus=0)])
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RenderedOperator:
        cluster = self.cluster.__enter__()
        try:
            self.kubectl = Kubectl(cluster.api, namespace=self.namespace)
            self._install()
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _install(self) -> None:
        """What `helm install` does: the crds/ folder first, then the rendered objects we need."""
        for ns in {self.namespace, NAMESPACE}:
            self.kubectl.core.create_namespace({"metadata": {"name": ns}})
        for path in sorted((CHART / "crds").glob("*.yaml")):
            for crd in yaml.safe_load_all(path.read_text()):
                self.kubectl.ext.create_custom_resource_definition(crd)
        custom = self.kubectl.custom
        for peering in [d for d in self.docs if d["apiVersion"] == "kopf.dev/v1"]:
            plural = peering["kind"].lower() + "s"
            ns = peering["metadata"].get("namespace")
            if ns:
                custom.create_namespaced_custom_object("kopf.dev", "v1", ns, plural, peering)
            else:
                custom.create_cluster_custom_object("kopf.dev", "v1", plural, peering)

    def _start(self) -> None:
        c = self.container
        kubeconfig = write_kubeconfig(
            self.workdir / "operator-kubeconfig", self.cluster.url, self.token
        )
        env = {**os.environ, **container_env(c), "KUBECONFIG": str(kubeconfig)}
        argv = [executable(c["command"][0]), *c["command"][1:], *c["args"]]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        wait_live(self.process, probe_url(c, "startupProbe"), self.log)
        for probe in ("livenessProbe", "readinessProbe"):
            with urllib.request.urlopen(probe_url(c, probe), timeout=2) as response:
                assert response.status == 200, probe

    def stop(self) -> list[Any]:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        return self.cluster.call(lambda: list(self.cluster.emulator))

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __exit__(self, *exc: object) -> None:
        if exc and exc[0] is not None:
            print(f"operator log (tail):\n{self.logs()[-6000:]}")  # shown with the failure
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        self.cluster.__exit__(None, None, None)


def accesses(request: Any) -> list[Access]:
    """What the API server's authorizer would check for one recorded request."""
    res = request.resource
    group = res.group or ""
    resource = res.plural + (f"/{request.subresource}" if request.subresource else "")
    ns = request.namespace
    method = str(request.method.value if hasattr(request.method, "value") else request.method)
    method = method.upper()
    if method == "GET":
        if request.name:
            verbs = ["get"]
        else:
            verbs = ["watch"] if request.params.get("watch") in ("true", "1") else ["list"]
    elif method == "POST":
        verbs = ["create"]
    elif method == "PATCH":
        # Server-side apply creates missing objects: authorized as patch and create.
        content_type = request.headers.get("Content-Type", "")
        verbs = ["patch", "create"] if content_type.startswith(APPLY) else ["patch"]
    elif method == "PUT":
        verbs = ["update"]
    elif method == "DELETE":
        verbs = ["delete"] if request.name else ["deletecollection"]
    else:
        raise AssertionError(f"unexpected method {method} {request.url}")
    return [Access(v, group, resource, ns) for v in verbs]


def check_rbac(op: RenderedOperator, requests: list[Any]) -> set[tuple[str, str, str]]:
    """Every request made with the operator's token is allowed by the rendered RBAC."""
    mine = [r for r in requests if r.headers.get("Authorization") == f"Bearer {op.token}"]
    assert mine, "no request carried the operator's token"
    denied, used = [], set()
    for request in mine:
        if request.resource is None or request.resource.plural is None:
            # discovery (/api, /apis/GROUP/VERSION, /version): open to every user
            assert str(request.method).upper().endswith("GET"), request.url
            continue
        for access in accesses(request):
            used.add((access.verb, access.group, access.resource))
            if not allows(op.docs, op.sa, NAMESPACE, access):
                denied.append(f"{access} <- {request.method} {request.url}")
    assert denied == [], "the rendered RBAC would forbid:\n" + "\n".join(sorted(set(denied)))
    return used


SMOLLM2 = yaml.safe_load((ROOT / "examples" / "smollm2-cpu.yaml").read_text())
MULTINODE = yaml.safe_load((ROOT / "examples" / "vllm-llama-3-405b-multinode.yaml").read_text())
MULTINODE["spec"]["autoscaling"] = {"enabled": False}  # the autoscaler's rights stay RESERVED


def serve_example(kubectl: Kubectl) -> None:
    kubectl.apply(SMOLLM2)
    wait_until(lambda: kubectl.deployment("smollm2"), timeout=60)
    wait_until(lambda: kubectl.condition("smollm2", "Ready").get("status") == "True", timeout=60)


SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "ServiceMonitor", "plural": "servicemonitors"},
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
# Granted for code paths this scenario does not reach: the autoscaler reads
# pods and writes replicas through the scale subresource.
RESERVED = {
    ("get", "", "pods"),
    ("get", "", "secrets"),  # the Hub shape lookup's token (tests/integration/operator/test_hub_shape.py)
    ("get", "llmservice.dev", "llmservices/scale"),
    ("patch", "llmservice.dev", "llmservices/scale"),
    # granted to the router's Role, so held (RBAC's escalation check), never used itself
    ("list", "discovery.k8s.io", "endpointslices"),
    ("watch", "discovery.k8s.io", "endpointslices"),
}


def granted(op: RenderedOperator) -> set[tuple[str, str, str]]:
    rights = set()
    for kind in ("ClusterRole", "Role"):
        for role in [d for d in op.docs if d["kind"] == kind]:
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        rights |= {(verb, group, resource) for verb in rule["verbs"]}
    return rights


# Real server pods start, scale and stop in here: ~2 min idle, and a loaded 2-core machine
# once ran it past the default 600 s limit, in teardown. The waits are each bounded.
@pytest.mark.timeout(1800)
def test_cluster_wide_install_runs_with_exactly_its_rbac(helm: Helm, tmp_path: Path):
    values = {"metrics.enabled": True, "metrics.port": free_port()}
    with RenderedOperator(helm, tmp_path, values, "default") as op:
        k = op.kubectl
        k.ext.create_custom_resource_definition(SERVICE_MONITOR_CRD)  # Prometheus Operator
        k.ext.create_custom_resource_definition(lws_crd())  # LeaderWorkerSet, pinned in hack/
        for kind in ("InferencePool", "InferenceObjective"):  # pinned in hack/fetch-gateway-crds.sh
            k.ext.create_custom_resource_definition(gateway_crd(kind))
        serve_example(k)
        # A vllm replica past one node is a LeaderWorkerSet group, scaled by its replicas.
        k.apply(MULTINODE)
        lws = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{k.ns}/leaderworkersets/vllm-llama-3-405b"
        wait_until(lambda: k.get(lws), timeout=60)
        k.scale("vllm-llama-3-405b", 2)
        wait_until(lambda: k.get(lws)["spec"]["replicas"] == 2, timeout=60)
        # Back within one node (16-GPU nodes): a Deployment again, and the LWS goes.
        k.patch_llms("vllm-llama-3-405b", {"spec": {"resources": {"gpu": {"perNode": 16}}}})
        wait_until(lambda: k.get(lws) is None and k.deployment("vllm-llama-3-405b"), timeout=60)
        k.scale("smollm2", 2)  # a change the operator must follow (patches its Deployment)
        wait_until(lambda: k.deployment("smollm2")["spec"]["replicas"] == 2, timeout=60)
        wait_until(lambda: k.pdb("smollm2"), timeout=60)
        k.scale("smollm2", 1)  # back to one replica: the PDB goes
        wait_until(lambda: k.pdb("smollm2") is None, timeout=60)
        policy = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/smollm2"
        k.patch_llms("smollm2", {"spec": {"networkPolicy": {"enabled": True}}})
        wait_until(lambda: k.get(policy), timeout=60)
        k.patch_llms("smollm2", {"spec": {"networkPolicy": {"enabled": False}}})  # it goes again
        wait_until(lambda: k.get(policy) is None, timeout=60)
        # A gateway pool member (docs/gateway.md): its pool and objective applied, then deleted.
        pool = "/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools/smollm2"
        objective = "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/default/inferenceobjectives/smollm2"
        k.patch_llms("smollm2", {"spec": {"gateway": {"inferencePool": True}}})
        wait_until(lambda: k.get(pool) and k.get(objective), timeout=60)
        k.patch_llms("smollm2", {"spec": {"gateway": {"inferencePool": False}}})
        wait_until(lambda: k.get(pool) is None and k.get(objective) is None, timeout=60)
        uid = k.deployment("smollm2")["metadata"]["uid"]
        k.apps.delete_namespaced_deployment("smollm2", "default")  # drift: the operator repairs
        wait_until(
            lambda: (
                (k.deployment("smollm2") or {}).get("metadata", {}).get("uid") not in (None, uid)
            ),
            timeout=60,
        )
        # The metrics Service's target port serves the operator's own metrics.
        metrics = urllib.request.urlopen(probe_url_of_port(op.container, "metrics"), timeout=5)
        assert "llmservice_operator_reconcile_duration_seconds_count" in metrics.read().decode()
        used = check_rbac(op, op.stop())
    assert ("create", "monitoring.coreos.com", "servicemonitors") in used
    # Least privilege: every right the chart grants is one the operator used here.
    assert granted(op) - used == RESERVED


def test_namespaced_install_with_peering_runs_within_its_rbac(helm: Helm, tmp_path: Path):
    values = {"watchNamespaces": ["team-a"], "leaderElection.enabled": True}
    with RenderedOperator(helm, tmp_path, values, "team-a") as op:
        serve_example(op.kubectl)
        peering = one(op.docs, "KopfPeering")["metadata"]["name"]

        def registered() -> bool:
            obj = op.kubectl.custom.get_namespaced_custom_object(
                "kopf.dev", "v1", "team-a", "kopfpeerings", peering
            )
            return POD_NAME in (obj.get("status") or {})

        wait_until(registered, timeout=60)  # kopf announced itself under the pod's name
        requests = op.stop()
        used = check_rbac(op, requests)
    assert ("patch", "kopf.dev", "kopfpeerings") in used
    # Peering and the cluster-scoped lists kopf keeps: all granted rights were used.
    framework = {r for r in granted(op) if r[1] in ("kopf.dev", "apiextensions.k8s.io")}
    framework |= {r for r in granted(op) if r[2] == "namespaces"}
    assert len(framework) == 7 and framework <= used, sorted(framework - used)
    mine = [r for r in requests if r.headers.get("Authorization") == f"Bearer {op.token}"]
    assert {r.namespace for r in mine} <= {None, "team-a"}  # it never looked elsewhere
