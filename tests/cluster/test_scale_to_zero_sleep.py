"""Scale to zero by sleeping (`scaleToZero: sleep`), on the real control plane.

The real operator (a local process) and the fake kubelet, which runs the server pod as a
real `llmservice serve` and the router pod as a real `llmservice router`. An LLMService
with `minReplicas: 0`, `scaleToZero: sleep` and `scaleToZeroAfterSeconds: 10` answers a
request; once idle its pod is put to sleep (POST /sleep: status ScaledToZero True,
reason Asleep; the pod stays, spec.replicas stays 1); a burst of requests through the
router finds it asleep, the router wakes it with one POST /wake_up, and every request is
answered. Measured: request arrival -> first token, against the cold start of the same
pod (its first Ready).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from tests.support.operator_process import OperatorProcess

from .control_plane import ControlPlane
from .nodes import start_node
from .pod_status import NodeSpec
from .test_rollout_drops_nothing import EndpointFollower
from .test_scale_to_zero import (
    BURST,
    GROUP,
    NODE_ENV,
    PLURAL,
    VERSION,
    condition,
    llmservice,
    replicas,
    status,
    stream_first_token,
)
from .waiting import wait_for

# ~60 s (one server start, an idle window): `make test-cluster` / `make e2e` run it.
pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


def test_idle_pods_sleep_then_a_burst_wakes_one_and_nothing_is_lost(
    llmservice_crd: object, kube_api: client.ApiClient, control_plane: ControlPlane,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    node = start_node(kube_api, NodeSpec(name="sleep-node", cpu="8", memory="32Gi"),
                      workdir=tmp_path, access=control_plane.access(), run_containers=True,
                      env=NODE_ENV, routed_pod_ips=True)  # fmt: skip
    custom = client.CustomObjectsApi(kube_api)
    figures: dict[str, Any] = {}
    try:
        with OperatorProcess(control_plane.admin_kubeconfig, tmp_path / "operator.log", env=NODE_ENV):
            created = time.monotonic()
            obj = llmservice("sleepy", autoscaling={"scaleToZero": "sleep"})
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, obj)
            router = EndpointFollower(client.DiscoveryV1Api(kube_api), namespace, "sleepy")
            (url,) = wait_for(router.read, what="the router pod behind Service sleepy", timeout=120)
            pods = EndpointFollower(client.DiscoveryV1Api(kube_api), namespace, "sleepy-pods")
            (pod_url,) = wait_for(pods.read, what="a Ready model pod", timeout=180)
            cold_ready_s = time.monotonic() - created
            code, _, text = stream_first_token(url, time.monotonic())
            assert code == 200, text

            def asleep() -> bool:
                c = condition(status(custom, namespace, "sleepy"), "ScaledToZero")
                return c.get("status") == "True" and c.get("reason") == "Asleep"

            wait_for(asleep, what="ScaledToZero True, reason Asleep", timeout=90)
            assert httpx.get(pod_url + "/is_sleeping", timeout=5).json()["is_sleeping"] is True
            assert replicas(custom, namespace, "sleepy") == 1  # the pod stays
            assert pods.read() == [pod_url]  # and stays Ready: the router can reach it

            started = time.monotonic()
            results: list[tuple[int, float | None, str]] = []
            lock = threading.Lock()

            def one() -> None:
                outcome = stream_first_token(url, started)
                with lock:
                    results.append(outcome)

            threads = [threading.Thread(target=one) for _ in range(BURST)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(200)
            assert [r[0] for r in results] == [200] * BURST, [r[2][:300] for r in results]
            assert httpx.get(pod_url + "/is_sleeping", timeout=5).json()["is_sleeping"] is False
            metrics = httpx.get(url + "/metrics", timeout=5).text
            woke = [line for line in metrics.splitlines()
                    if line.startswith("llmservice_router_pod_wake_ups_total")]  # fmt: skip
            assert len(woke) == 1 and woke[0].endswith(" 1.0"), woke
            assert "llmservice_router_scale_from_zero_total 0.0" in metrics
            firsts = sorted(r[1] for r in results if r[1] is not None)
            figures = {"cold_create_to_ready_s": round(cold_ready_s, 2),
                       "asleep_arrival_to_first_token_s": round(firsts[0], 2),
                       "asleep_arrival_to_last_first_token_s": round(firsts[-1], 2), "burst": BURST}  # fmt: skip
    finally:
        node.stop()
    print("\nwake from sleep:", json.dumps(figures))
    assert node.errors == [], node.errors
