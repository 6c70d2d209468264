"""Start and stop a real Kubernetes control plane on 127.0.0.1 for the cluster tests.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler, compiled from the
k8s.io Go modules (hack/control-plane). Everything a production apiserver enforces is
on: TLS with a session CA, token authentication, RBAC authorization, the default
admission chain (ServiceAccount, NamespaceLifecycle, ...), service-account token
issuance. There is no kubelet: tests add nodes with `fake_kubelet.FakeKubelet`.

Ports are picked free at start so several engineers' test runs on one machine do not
collide; every process is started by us and stopped by us (by pid).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.ports import free_port

from .binaries import Binaries
from .fake_kubelet import ClusterAccess
from .lifetime import die_with_parent
from .pki import Pki, make_pki

ADMIN_TOKEN = "admin-token-for-tests"  # system:masters
NOBODY_TOKEN = "nobody-token-for-tests"  # authenticated, no RBAC bindings
NOBODY_USER = "nobody"

# Audit every request a ServiceAccount makes (a test can then prove who wrote an object
# and that an operator never met a 403), and every write by anyone; skip the rest.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
"""

# The controllers the tests rely on; nothing needing a cloud, volumes or pod eviction.
DEFAULT_CONTROLLERS = (
    "node-lifecycle-controller",  # lifts the not-ready taint admission puts on new nodes
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",  # the "default" SA that pod admission requires
    "namespace-controller",
    "root-ca-certificate-publisher-controller",  # kube-root-ca.crt for token volumes
    "endpointslice-controller",
    "disruption-controller",
    "clusterrole-aggregation-controller",
)


@dataclass
class Component:
    """One child process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class ControlPlaneError(RuntimeError):
    pass


def _terminate(comp: Component) -> None:
    if comp.alive():
        comp.process.terminate()
    try:
        comp.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        comp.process.kill()
        comp.process.wait(timeout=5)


@dataclass
class ControlPlane:
    """A running control plane; `start()` returns one, `stop()` ends it."""

    binaries: Binaries
    workdir: Path
    controllers: Sequence[str] = DEFAULT_CONTROLLERS
    pki: Pki | None = None
    api_port: int = 0
    components: dict[str, Component] = field(default_factory=dict)
    startup_seconds: dict[str, float] = field(default_factory=dict)
    etcd_url: str = ""

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """The apiserver's audit events so far (see AUDIT_POLICY for which)."""
        text = self.audit_log.read_text() if self.audit_log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    # --- lifecycle -----------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> ControlPlane:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.pki = make_pki(self.workdir / "pki")
        self.api_port = free_port()
        (self.workdir / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},admin,uid-admin,"system:masters"\n'
            f"{NOBODY_TOKEN},{NOBODY_USER},uid-nobody\n"
        )
        self.write_kubeconfig(self.admin_kubeconfig, ADMIN_TOKEN, user="admin")
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        try:
            etcd_url = self.etcd_url = self._start_etcd()
            self._wait(lambda: _http_ok(f"{etcd_url}/health"), "etcd", t0, timeout)
            self.startup_seconds["etcd"] = time.monotonic() - t0
            self._start_apiserver(etcd_url)
            self._wait(self._apiserver_ready, "kube-apiserver", t0, timeout)
            self.startup_seconds["kube-apiserver"] = time.monotonic() - t0
            health = {
                "kube-controller-manager": self._start_controller_manager(),
                "kube-scheduler": self._start_scheduler(),
            }
            for name, port in health.items():
                url = f"https://127.0.0.1:{port}/healthz"
                self._wait(lambda u=url: _http_ok(u, verify=False), name, t0, timeout)
            self._wait(self._default_service_account_exists, "serviceaccount", t0, timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds["total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Terminate one by one in reverse start order, killing stragglers by pid.

        Sequential on purpose: an apiserver whose etcd vanished at the same moment
        hangs in its shutdown for the whole timeout.
        """
        for comp in reversed(list(self.components.values())):
            _terminate(comp)
        self.components.clear()

    @contextmanager
    def apiserver_stopped(self, timeout: float = 180.0) -> Iterator[None]:
        """kube-apiserver is down inside the block (SIGTERM, SIGKILL after 15 s: clients get
        connection refused) and back after it, on the same port with the same flags,
        certificates and etcd, ready again; etcd, the controller manager and the
        scheduler keep running, as in an apiserver restart or upgrade."""
        _terminate(self.components["kube-apiserver"])
        try:
            yield
        finally:
            t0 = time.monotonic()
            self._start_apiserver(self.etcd_url)  # replaces the component, keeps its place
            self._wait(self._apiserver_ready, "kube-apiserver after its restart", t0, timeout)

    # --- component start-up ----------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> Component:
        log = self.workdir / "logs" / f"{name}.log"
        with log.open("ab") as fh:  # a restarted component adds to its log
            proc = subprocess.Popen(
                argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, env={**os.environ, "GOMAXPROCS": "2"},
                preexec_fn=die_with_parent,
            )  # fmt: skip
        comp = Component(name=name, process=proc, log=log)
        self.components[name] = comp
        return comp

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        # tmpfs: the 3.4 etcd has no --unsafe-no-fsync, and fsyncs dominate a test run.
        data = Path("/dev/shm") if Path("/dev/shm").is_dir() else self.workdir
        _sweep_stale_etcd_dirs(data)
        data_dir = data / f"llmservice-etcd-{os.getpid()}-{client}"
        self._etcd_data = data_dir
        self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=default",
                f"--data-dir={data_dir}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--log-level=warn",
            ],
        )
        return f"http://127.0.0.1:{client}"

    def _start_apiserver(self, etcd_url: str) -> None:
        assert self.pki is not None
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.control_plane),
                "kube-apiserver",
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={p.serving_cert}",
                f"--tls-private-key-file={p.serving_key}",
                f"--client-ca-file={p.ca_cert}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--anonymous-auth=false",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                # 127.0.0.1 may not be an Endpoints address; nothing here needs the
                # in-cluster "kubernetes" Service endpoints.
                "--endpoint-reconciler-type=none",
                f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--profiling=false",
                "--v=1",
            ],
        )

    def _start_controller_manager(self) -> int:
        assert self.pki is not None
        port = free_port()
        kc = str(self.admin_kubeconfig)
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.control_plane),
                "kube-controller-manager",
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                f"--controllers={','.join(self.controllers)}",
                f"--root-ca-file={self.pki.ca_cert}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        return port

    def _start_scheduler(self) -> int:
        port = free_port()
        kc = str(self.admin_kubeconfig)
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.control_plane),
                "kube-scheduler",
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        return port

    # --- readiness -------------------------------------------------------------------

    def _wait(self, ready: Callable[[], bool], what: str, t0: float, timeout: float) -> None:
        while True:
            for comp in self.components.values():
                if not comp.alive():
                    raise ControlPlaneError(
                        f"{comp.name} exited with {comp.process.returncode} while waiting "
                        f"for {what}; log tail:\n{comp.tail()}"
                    )
            if ready():
                return
            if time.monotonic() - t0 > timeout:
                logs = "\n".join(f"--- {c.name}\n{c.tail(15)}" for c in self.components.values())
                raise ControlPlaneError(f"timed out waiting for {what}\n{logs}")
            time.sleep(0.25)

    def _apiserver_ready(self) -> bool:
        assert self.pki is not None
        return _http_ok(
            f"{self.server}/readyz",
            verify=self.ssl_context(),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )

    def _default_service_account_exists(self) -> bool:
        assert self.pki is not None
        return _http_ok(
            f"{self.server}/api/v1/namespaces/default/serviceaccounts/default",
            verify=self.ssl_context(),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )

    # --- clients ---------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts exactly the session CA, as a client of this apiserver should."""
        assert self.pki is not None
        return ssl.create_default_context(cafile=str(self.pki.ca_cert))

    def access(self) -> ClusterAccess:
        """Server URL + CA, for kubeconfigs the fake kubelet writes for pods."""
        assert self.pki is not None
        return ClusterAccess(server=self.server, ca_file=str(self.pki.ca_cert))

    def write_kubeconfig(self, path: Path, token: str, user: str = "user") -> Path:
        """A kubeconfig for this server with a bearer token (admin, SA token, ...)."""
        assert self.pki is not None
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "llmservice-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "llmservice-test", "user": user}}],
            "current-context": user,
        }
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def cleanup_data(self) -> None:
        data = getattr(self, "_etcd_data", None)
        if data is not None and data.exists():
            subprocess.run(["rm", "-rf", str(data)], check=False)


def _http_ok(
    url: str, verify: bool | ssl.SSLContext = True, headers: dict[str, str] | None = None
) -> bool:
    try:
        r = httpx.get(url, verify=verify, headers=headers, timeout=2.0)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def _sweep_stale_etcd_dirs(parent: Path) -> None:
    """Remove etcd data left by test runs that were killed (their pid is gone)."""
    for d in parent.glob("llmservice-etcd-*-*"):
        pid = d.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["rm", "-rf", str(d)], check=False)
