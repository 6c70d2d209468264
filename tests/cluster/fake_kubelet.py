"""A fake kubelet (like kwok) for the real control plane: nodes without a container runtime.

`FakeKubelet(api, NodeSpec(...)).start()` registers a Node with the given capacity
(cpu, memory, `nvidia.com/gpu`), keeps its Lease renewed (so the real node-lifecycle
controller lifts the `not-ready` taint and keeps the node schedulable), and every
`interval` seconds syncs the pods the real scheduler bound to it:
- each pod gets its own IP 127.0.0.x and is reported Running;
- with `run_containers=True` each container's command runs as a local process (see
  `pod_process` for the namespace emulation) and Ready follows its httpGet readiness
  probe, polled every sync rather than every `periodSeconds`; without it, containers
  are Ready at once, as in kwok;
- a pod being deleted (deletionTimestamp set) goes through the kubelet's half of
  graceful deletion, in a thread of its own so other pods keep syncing: it is reported
  not Ready at once (the real EndpointSlice controller drops it), then with
  `run_containers=True` each container's `preStop` `sleep` action runs, then SIGTERM,
  then SIGKILL once the pod's grace period (deletionGracePeriodSeconds, else
  terminationGracePeriodSeconds, else 30 s) is spent since the deletion was seen; then
  the pod is removed (grace 0). The real GC and ReplicaSet controllers wait for it.
  Without processes (kwok mode) there is nothing to wait for: removal is immediate;
- with `routed_pod_ips=True` the API sees each pod at 10.x.y.z instead of its loopback
  127.x.y.z (see `routed_ip`): the API server refuses loopback addresses in
  EndpointSlices, so a Service's endpoints need this. The fake kubelet cannot program
  the host's routes, so a client of such a pod maps the address back (`loopback_ip`), as
  a pod network would route it.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from .lifetime import die_with_parent
from .pod_process import (
    automounts_token,
    probe_url,
    process_plan,
    service_account_kubeconfig,
)
from .pod_status import ContainerState, NodeSpec, node_manifest, pod_status

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
RENEW_EVERY = 5.0


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class IpPool:
    """Loopback addresses for nodes and pods; Linux routes all of 127/8 to `lo`."""

    def __init__(self, prefix: str = "127.0", first: int = 10, last: int = 250) -> None:
        self._free = [f"{prefix}.{a}.{b}" for a in range(0, 3) for b in range(first, last)]
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            return self._free.pop(0)

    def give(self, ip: str) -> None:
        with self._lock:
            self._free.append(ip)


SHARED_POOL = IpPool()


@dataclass(frozen=True)
class ClusterAccess:
    """How pods' processes reach the API server (for their ServiceAccount kubeconfig)."""

    server: str
    ca_file: str


@dataclass
class _Container:
    spec: dict[str, Any]
    started_at: str
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    ready: bool = False
    exit_code: int | None = None
    waiting_reason: str | None = None
    probe: str | None = None
    exited_at: float = 0.0


@dataclass
class _Pod:
    ip: str
    start_time: str
    containers: list[_Container] = field(default_factory=list)
    reported: dict[str, Any] | None = None
    kubeconfig: Path | None = None


class FakeKubelet:
    """One node; runs in a daemon thread until `stop()`."""

    def __init__(
        self,
        api: client.ApiClient,
        node: NodeSpec,
        *,
        run_containers: bool = False,
        workdir: Path | None = None,
        interval: float = 0.3,
        pool: IpPool = SHARED_POOL,
        extra_path: list[str] | None = None,
        env: dict[str, str] | None = None,
        cluster: ClusterAccess | None = None,
        routed_pod_ips: bool = False,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.node = node
        self.run_containers = run_containers
        self.workdir = workdir
        self.interval = interval
        self.pool = pool
        # Pods' commands (e.g. `llmservice serve`) resolve from the test's venv first.
        self.path = ":".join([*(extra_path or []), os.path.dirname(sys.executable),
                              os.environ.get("PATH", "")])  # fmt: skip
        self.env = dict(env or {})  # the "node's" environment, e.g. OMP_NUM_THREADS=1
        self.cluster = cluster
        self.routed_pod_ips = routed_pod_ips
        self.ip = pool.take()
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_renew = 0.0
        self._terminating: dict[tuple[str, str], threading.Thread] = {}

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        body = node_manifest(self.node, self.ip)
        body["status"]["conditions"] = _fresh_conditions(body["status"]["conditions"])
        node = self.core.create_node(body)
        self._node_uid = node.metadata.uid
        self._renew_lease()
        self._thread = threading.Thread(target=self._run, name=f"kubelet-{self.node.name}",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        return self

    def stop(self, delete_node: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for key in list(self.pods):
            self._forget(key)
        if delete_node:
            try:
                self.core.delete_node(self.node.name)
            except ApiException as e:
                if e.status != 404:
                    raise
        self.pool.give(self.ip)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- loop ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as e:  # keep syncing; tests read self.errors
                self.errors.append(repr(e))
            self._stop.wait(self.interval)

    def _sync(self) -> None:
        now = dt.datetime.now().timestamp()
        if now - self._last_renew > RENEW_EVERY:
            self._renew_lease()
        pods = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node.name}"
        ).items
        seen = set()
        for pod in pods:
            key = (pod.metadata.namespace, pod.metadata.name)
            seen.add(key)
            body = self.api.sanitize_for_serialization(pod)
            if pod.metadata.deletion_timestamp is not None:
                self._begin_termination(key, body)
            elif pod.status.phase not in ("Succeeded", "Failed"):
                self._sync_pod(key, body)
        for key in set(self.pods) - seen - set(self._terminating):  # force-deleted
            self._forget(key)
        for key, thread in list(self._terminating.items()):
            if not thread.is_alive():
                del self._terminating[key]

    def _sync_pod(self, key: tuple[str, str], pod: dict[str, Any]) -> None:
        state = self.pods.get(key)
        if state is None:
            state = _Pod(ip=self.pool.take(), start_time=_now())
            state.containers = [
                _Container(spec=c, started_at=state.start_time) for c in pod["spec"]["containers"]
            ]
            self.pods[key] = state
            if self.run_containers and self.cluster is not None and automounts_token(pod):
                state.kubeconfig = self._token_kubeconfig(key, pod)
            for c in state.containers:
                self._start_container(key, pod, state, c)
        for c in state.containers:
            self._observe_container(key, pod, state, c)
        wanted = pod_status(
            self._api_ip(state.ip),
            self.ip,
            state.start_time,
            pod["spec"].get("restartPolicy", "Always"),
            [
                ContainerState(
                    name=c.spec["name"],
                    image=c.spec.get("image", ""),
                    started_at=c.started_at,
                    ready=c.ready,
                    restart_count=c.restarts,
                    exit_code=c.exit_code,
                    waiting_reason=c.waiting_reason,
                )  # fmt: skip
                for c in state.containers
            ],
        )
        if wanted != state.reported:
            self.core.patch_namespaced_pod_status(key[1], key[0], {"status": wanted})
            state.reported = wanted

    # --- containers ------------------------------------------------------------------

    def _start_container(
        self, key: tuple[str, str], pod: dict[str, Any], state: _Pod, c: _Container
    ) -> None:
        c.started_at = _now()
        c.exit_code = None
        if not self.run_containers:
            c.ready = True
            return
        try:
            plan = process_plan(c.spec, pod, state.ip, self.ip)
            c.probe = probe_url(c.spec, state.ip)
        except ValueError as e:
            c.waiting_reason = "FakeKubeletUnsupported"
            self.errors.append(f"{key}: {e}")
            return
        log_dir = self._pod_dir(key)
        env = {"PATH": self.path, "HOME": os.environ.get("HOME", "/root"), **self.env}
        if state.kubeconfig is not None:
            env["KUBECONFIG"] = str(state.kubeconfig)
        with (log_dir / f"{c.spec['name']}.log").open("ab") as log:
            c.process = subprocess.Popen(
                plan.argv,
                env={**env, **plan.env},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=log_dir, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        c.ready = c.probe is None

    def _pod_dir(self, key: tuple[str, str]) -> Path:
        d = (self.workdir or Path("/tmp")) / "pods" / f"{key[0]}_{key[1]}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _token_kubeconfig(self, key: tuple[str, str], pod: dict[str, Any]) -> Path:
        """Request a pod-bound token for the pod's ServiceAccount, as the kubelet does."""
        assert self.cluster is not None
        sa = pod["spec"].get("serviceAccountName") or "default"
        bound = {"kind": "Pod", "apiVersion": "v1", "name": key[1],
                 "uid": pod["metadata"]["uid"]}  # fmt: skip
        token = self.core.create_namespaced_service_account_token(
            sa, key[0], {"spec": {"expirationSeconds": 3600, "boundObjectRef": bound}}
        ).status.token
        path = self._pod_dir(key) / "serviceaccount.kubeconfig"
        doc = service_account_kubeconfig(self.cluster.server, self.cluster.ca_file, token, key[0])
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def _observe_container(
        self, key: tuple[str, str], pod: dict[str, Any], state: _Pod, c: _Container
    ) -> None:
        if c.process is None:
            if c.exit_code is not None and _restarts(pod, c.exit_code):
                # CrashLoopBackOff, compressed: 0.5 s doubling up to 8 s.
                if time.monotonic() - c.exited_at >= min(8.0, 0.5 * 2**c.restarts):
                    c.restarts += 1
                    self._start_container(key, pod, state, c)
            return
        code = c.process.poll()
        if code is None:
            if c.probe is not None:
                c.ready = _probe(c.probe)
            return
        c.ready = False
        c.exit_code = code
        c.exited_at = time.monotonic()
        c.process = None

    def _begin_termination(self, key: tuple[str, str], pod: dict[str, Any]) -> None:
        """Start the pod's graceful termination once; it runs beside the sync loop."""
        if key in self._terminating:
            return
        thread = threading.Thread(target=self._terminate, args=(key, pod),
                                  name=f"terminate-{key[1]}", daemon=True)  # fmt: skip
        self._terminating[key] = thread
        thread.start()

    def _terminate(self, key: tuple[str, str], pod: dict[str, Any]) -> None:
        try:
            self._graceful_stop(key, pod)
            self._finish_deletion(key)
        except Exception as e:  # tests read self.errors
            self.errors.append(f"terminating {key}: {e!r}")

    def _graceful_stop(self, key: tuple[str, str], pod: dict[str, Any]) -> None:
        """Not Ready, preStop, SIGTERM, SIGKILL at the grace deadline, as the kubelet."""
        state = self.pods.get(key)
        if state is None or not self.run_containers:
            return
        deadline = time.monotonic() + termination_grace_seconds(pod)
        for c in state.containers:
            c.ready = False
        self._report_not_ready(key, pod, state)
        hooks = [pre_stop_sleep_seconds(c.spec) for c in state.containers if c.process]
        self._stop.wait(min(max(hooks, default=0), max(0.0, deadline - time.monotonic())))
        live = [c.process for c in state.containers if c.process and c.process.poll() is None]
        for proc in live:
            _signal_group(proc, signal.SIGTERM)
        for proc in live:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=5)

    def _report_not_ready(self, key: tuple[str, str], pod: dict[str, Any], state: _Pod) -> None:
        wanted = pod_status(
            self._api_ip(state.ip), self.ip, state.start_time,
            pod["spec"].get("restartPolicy", "Always"),
            [ContainerState(name=c.spec["name"], image=c.spec.get("image", ""),
                            started_at=c.started_at, ready=False, restart_count=c.restarts,
                            exit_code=c.exit_code, waiting_reason=c.waiting_reason)
             for c in state.containers],
        )  # fmt: skip
        try:
            self.core.patch_namespaced_pod_status(key[1], key[0], {"status": wanted})
        except ApiException as e:
            if e.status != 404:
                raise
        state.reported = wanted

    def _api_ip(self, ip: str) -> str:
        return routed_ip(ip) if self.routed_pod_ips else ip

    def _finish_deletion(self, key: tuple[str, str]) -> None:
        self._forget(key)
        try:
            self.core.delete_namespaced_pod(key[1], key[0], grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise

    def _forget(self, key: tuple[str, str]) -> None:
        state = self.pods.pop(key, None)
        if state is None:
            return
        for c in state.containers:
            _kill(c.process)
            c.process = None
        self.pool.give(state.ip)

    # --- node heartbeat --------------------------------------------------------------

    def _renew_lease(self) -> None:
        self._last_renew = dt.datetime.now().timestamp()
        name = self.node.name
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self._node_uid}
                ],
            },
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": _micro_now(),
            },
        }
        try:
            self.coord.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": body["spec"]})
        except ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease(LEASE_NAMESPACE, body)


def _fresh_conditions(conditions: list[dict[str, str]]) -> list[dict[str, str]]:
    now = _now()
    return [{**c, "lastHeartbeatTime": now, "lastTransitionTime": now} for c in conditions]


def _restarts(pod: dict[str, Any], exit_code: int) -> bool:
    policy = pod["spec"].get("restartPolicy", "Always")
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def _probe(url: str) -> bool:
    try:
        return 200 <= httpx.get(url, timeout=1.0, verify=False).status_code < 400
    except httpx.HTTPError:
        return False


def routed_ip(loopback: str) -> str:
    """The pod IP the API sees for a pod bound to `loopback`: 127.a.b.c -> 10.a.b.c."""
    first, _, rest = loopback.partition(".")
    if first != "127":
        raise ValueError(f"not a loopback address: {loopback!r}")
    return f"10.{rest}"


def loopback_ip(routed: str) -> str:
    """Where traffic to a routed pod IP really goes (the inverse of `routed_ip`)."""
    first, _, rest = routed.partition(".")
    if first != "10":
        raise ValueError(f"not a routed pod address: {routed!r}")
    return f"127.{rest}"


def termination_grace_seconds(pod: dict[str, Any]) -> float:
    """The grace a deletion grants: the delete request's, else the pod spec's, else 30 s."""
    grace = pod["metadata"].get("deletionGracePeriodSeconds")
    if grace is None:
        grace = pod["spec"].get("terminationGracePeriodSeconds")
    return float(30 if grace is None else grace)


def pre_stop_sleep_seconds(container: dict[str, Any]) -> float:
    """A container's `lifecycle.preStop.sleep.seconds` (0 without one).

    Exec and httpGet hooks are not run (the fake kubelet has no image filesystem)."""
    hook = ((container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
    return float(hook.get("seconds", 0))


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a container process group we started (SIGTERM, then SIGKILL)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass
