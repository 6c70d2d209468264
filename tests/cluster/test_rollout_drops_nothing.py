"""A rollout under steady traffic drops nothing, on the real control plane.

The real operator (a local process) serves a CPU LLMService; the fake kubelet runs each
server pod as a real `llmservice serve` process and does the kubelet's half of graceful
deletion (not Ready, preStop sleep, SIGTERM, SIGKILL at the grace deadline). A client
balances over the ready endpoints of the LLMService Service's EndpointSlices, as
kube-proxy or a client-side balancer does, re-reading them every 0.2 s, while
`spec.engine.maxNumSeqs` changes (a new pod template, so a rolling update:
maxSurge 1, maxUnavailable 0).

Accounting: every request is sent once and ends as succeeded (200), rejected (503 from
a draining server, which a client may retry elsewhere) or failed (anything else). A
connection error to an endpoint that the client's latest EndpointSlice read no longer
lists is a stale route, not the server's fault: it is re-sent once to a current
endpoint, as kube-proxy does after its rules catch up, and counted under `retried`
(the preStop sleep exists so this stays 0). A connection error to an endpoint still
listed ready is a failure.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from tests.support.operator_process import OperatorProcess

from .control_plane import ControlPlane
from .fake_kubelet import loopback_ip
from .nodes import start_node
from .pod_status import NodeSpec
from .waiting import wait_for

# ~65 s (a server start, a graceful stop under traffic): too long for `make test`;
# `make test-cluster` (-m cluster) runs it.
pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

GROUP, VERSION, PLURAL = "llmservice.dev", "v1alpha1", "llmservices"
NAME = "rollout"
NODE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CLIENTS = 2


def cpu_llmservice(max_num_seqs: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LLMService", "metadata": {"name": NAME},
        "spec": {
            "model": {"source": "builtin:smollm2-135m", "servedName": "smollm2"},
            "engine": {"maxModelLen": 256, "maxNumBatchedTokens": 256,
                       "maxNumSeqs": max_num_seqs, "dtype": "float32", "kvCacheMemoryGiB": 0.1},
            "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "2Gi"},
        },
    }  # fmt: skip


class EndpointFollower:
    """The ready endpoints of a Service, from its EndpointSlices, refreshed every 0.2 s."""

    def __init__(self, discovery: client.DiscoveryV1Api, namespace: str, service: str) -> None:
        self.discovery, self.namespace, self.service = discovery, namespace, service
        self.ready: list[str] = []
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> list[str]:
        slices = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}"
        ).items
        urls = []
        for s in slices:
            port = next((p.port for p in s.ports or [] if p.name == "http"), None)
            if port is None:  # a slice with no endpoints has no ports either
                continue
            for ep in s.endpoints or []:
                if ep.conditions and ep.conditions.ready:
                    urls += [f"http://{loopback_ip(a)}:{port}" for a in ep.addresses]
        return sorted(urls)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.ready = self.read()
            self.seen.update(self.ready)

    def start(self) -> EndpointFollower:
        self.ready = self.read()
        self.seen.update(self.ready)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def drive(follower: EndpointFollower, stop: threading.Event, tally: Counter[str],
          failures: list[str], lock: threading.Lock, offset: int) -> None:  # fmt: skip
    """One client: short completions back to back, round-robin over ready endpoints."""
    turn = itertools.count(offset)
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0}  # fmt: skip
    with httpx.Client(timeout=60) as http:
        while not stop.is_set():
            outcome = send(http, follower, body, turn)
            with lock:
                tally["sent"] += 1
                tally[outcome[0]] += 1
                tally["retried"] += outcome[1]
                if outcome[0] == "failed":
                    failures.append(outcome[2])


def send(http: httpx.Client, follower: EndpointFollower, body: dict[str, Any],
         turn: itertools.count[int]) -> tuple[str, int, str]:  # fmt: skip
    """(outcome, retries, detail) for one request; see the module docstring."""
    for attempt in range(2):
        ready = follower.ready
        if not ready:
            return "failed", attempt, "no ready endpoint"
        url = ready[next(turn) % len(ready)]
        try:
            r = http.post(f"{url}/v1/completions", json=body)
        except httpx.ConnectError as e:
            if attempt == 0 and url not in follower.read():
                continue  # a stale route to a removed endpoint: re-send once
            return "failed", attempt, f"{url}: {e!r}"
        except httpx.HTTPError as e:
            return "failed", attempt, f"{url}: {e!r}"
        if r.status_code == 200 and r.json()["choices"][0]["text"] is not None:
            return "succeeded", attempt, ""
        if r.status_code == 503:
            return "rejected", attempt, ""
        return "failed", attempt, f"{url}: {r.status_code} {r.text[:200]}"
    return "failed", 1, "retry also hit a removed endpoint"


def test_rollout_under_traffic_drops_nothing(
    llmservice_crd: object, kube_api: client.ApiClient, control_plane: ControlPlane,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    node = start_node(kube_api, NodeSpec(name="rollout-node", cpu="8", memory="32Gi"),
                      workdir=tmp_path, access=control_plane.access(), run_containers=True,
                      env=NODE_ENV, routed_pod_ips=True)  # fmt: skip
    try:
        tally, failures, seen, rollout_s, during = roll_out_under_traffic(
            kube_api, control_plane, namespace, tmp_path
        )
    finally:
        node.stop()
    assert node.errors == [], node.errors
    assert len(seen) >= 2, f"the client never saw both pods: {seen}"
    print(f"\nrollout {rollout_s:.1f} s; {dict(tally)}; sent by rollout end: {during}")
    assert failures == [], failures
    assert tally["failed"] == 0
    assert tally["succeeded"] + tally["rejected"] == tally["sent"], tally
    assert tally["sent"] > during > 4


def roll_out_under_traffic(
    kube_api: client.ApiClient, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> tuple[Counter[str], list[str], set[str], float, int]:
    """Serve, drive traffic, patch maxNumSeqs, wait for the rollout; the client's tally."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    with OperatorProcess(control_plane.admin_kubeconfig, tmp_path / "operator.log"):
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cpu_llmservice(4))
        follower = EndpointFollower(client.DiscoveryV1Api(kube_api), namespace, NAME)
        wait_for(follower.read, what="a ready endpoint of the LLMService Service", timeout=180)
        (old,) = core.list_namespaced_pod(namespace).items

        follower.start()
        stop, lock = threading.Event(), threading.Lock()
        tally: Counter[str] = Counter()
        failures: list[str] = []
        clients = [
            threading.Thread(target=drive, args=(follower, stop, tally, failures, lock, i))
            for i in range(CLIENTS)
        ]
        for t in clients:
            t.start()
        try:
            wait_for(lambda: tally["succeeded"] >= 4, what="traffic flowing", timeout=60)
            started = time.monotonic()
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, NAME, {"spec": {"engine": {"maxNumSeqs": 8}}}
            )

            def rolled_out() -> bool:
                (dep,) = apps.list_namespaced_deployment(namespace).items
                pods = core.list_namespaced_pod(namespace).items
                st = dep.status
                return (
                    st.observed_generation == dep.metadata.generation
                    and st.updated_replicas == 1 and st.ready_replicas == 1
                    and (st.replicas or 0) == 1
                    and [p.metadata.name for p in pods if p.metadata.uid == old.metadata.uid] == []
                )  # fmt: skip

            wait_for(rolled_out, what="the new pod Ready and the old one gone", timeout=180)
            rollout_s = time.monotonic() - started
            during = tally["sent"]
            time.sleep(1.0)  # traffic on the new pod alone
        finally:
            stop.set()
            for t in clients:
                t.join(90)
            follower.stop()

        (new,) = core.list_namespaced_pod(namespace).items
        assert new.metadata.uid != old.metadata.uid
        args = new.spec.containers[0].args
        assert args[args.index("--max-num-seqs") + 1] == "8", args
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    return tally, failures, follower.seen, rollout_s, during
