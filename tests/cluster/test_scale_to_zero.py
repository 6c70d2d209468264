"""Scale to zero and back through the router, on the real control plane.

The real operator (a local process) and the fake kubelet, which runs the server pod as
a real `llmservice serve` and the router pod as a real `llmservice router` (with its
ServiceAccount's token, so its Role is what it can do). An LLMService with
`minReplicas: 0` and `scaleToZeroAfterSeconds: 10` answers a request, goes to 0
replicas when idle (status ScaledToZero), then a burst of requests at zero is held by
the router, wakes it (replicas 0 -> 1 through the scale subresource) and every one is
answered. Measured: request arrival -> spec.replicas patched, and -> first token.
A second object whose pods can never schedule (pending, as while a node is added)
holds its request until holdTimeoutSeconds, then answers 504 saying it is starting.
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
from .waiting import wait_for

# ~90 s (two server starts, an idle window): `make test-cluster` / `make e2e` run it.
pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

GROUP, VERSION, PLURAL = "llmservice.dev", "v1alpha1", "llmservices"
NODE_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "LLMSERVICE_POD_ADDRESS_MAP": "10.=127.",  # the router's and the operator's (pod_address.py)
}
BURST = 6


def llmservice(name: str, **extra: Any) -> dict[str, Any]:
    spec = {
        "model": {"source": "builtin:smollm2-135m", "servedName": "smollm2"},
        "engine": {"maxModelLen": 256, "maxNumBatchedTokens": 256, "dtype": "float32",
                   "kvCacheMemoryGiB": 0.1},
        "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "2Gi"},
        "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1, "intervalSeconds": 1,
                        "scaleToZeroAfterSeconds": 10},
        "router": {"replicas": 1, "holdTimeoutSeconds": 120},
    }  # fmt: skip
    for key, value in extra.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": spec,
    }


def replicas(custom: client.CustomObjectsApi, namespace: str, name: str) -> int:
    return int(
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)["spec"][
            "replicas"
        ]
    )


def status(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    return (
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status")
        or {}
    )


def condition(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def stream_first_token(url: str, started: float) -> tuple[int, float | None, str]:
    """(status, seconds from `started` to the first SSE data line, body)."""
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4,
            "temperature": 0, "stream": True}  # fmt: skip
    first = None
    text = []
    with (
        httpx.Client(timeout=200) as http,
        http.stream("POST", url + "/v1/completions", json=body) as r,
    ):
        for line in r.iter_lines():
            if first is None and line.startswith("data:"):
                first = time.monotonic() - started
            text.append(line)
        return r.status_code, first, "\n".join(text)


def test_idle_to_zero_then_a_burst_wakes_it_and_nothing_is_lost(
    llmservice_crd: object, kube_api: client.ApiClient, control_plane: ControlPlane,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    node = start_node(kube_api, NodeSpec(name="zero-node", cpu="8", memory="32Gi"),
                      workdir=tmp_path, access=control_plane.access(), run_containers=True,
                      env=NODE_ENV, routed_pod_ips=True)  # fmt: skip
    custom = client.CustomObjectsApi(kube_api)
    figures: dict[str, Any] = {}
    try:
        with OperatorProcess(control_plane.admin_kubeconfig, tmp_path / "operator.log", env=NODE_ENV):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, llmservice("zero")
            )
            router = EndpointFollower(client.DiscoveryV1Api(kube_api), namespace, "zero")
            (url,) = wait_for(router.read, what="the router pod behind Service zero", timeout=120)
            pods = EndpointFollower(client.DiscoveryV1Api(kube_api), namespace, "zero-pods")
            wait_for(pods.read, what="a Ready model pod", timeout=180)
            code, _, text = stream_first_token(url, time.monotonic())
            assert code == 200, text

            wait_for(lambda: replicas(custom, namespace, "zero") == 0, what="scale to zero when idle",
                     timeout=90)  # fmt: skip
            wait_for(lambda: condition(status(custom, namespace, "zero"), "ScaledToZero").get("status") == "True",
                     what="ScaledToZero True", timeout=30)  # fmt: skip
            assert status(custom, namespace, "zero").get("lastRequestTime")
            wait_for(lambda: not pods.read(), what="no model endpoint left", timeout=60)

            patched: list[float] = []
            started = time.monotonic()

            def watch_replicas() -> None:
                while time.monotonic() - started < 60 and not patched:
                    if replicas(custom, namespace, "zero") > 0:
                        patched.append(time.monotonic() - started)
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch_replicas, daemon=True)
            watcher.start()
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
            watcher.join(5)
            assert [r[0] for r in results] == [200] * BURST, [r[2][:300] for r in results]
            assert patched and patched[0] < 1.0, f"replicas patched after {patched} s"
            firsts = sorted(r[1] for r in results if r[1] is not None)
            figures = {"arrival_to_replicas_patched_s": round(patched[0], 3),
                       "arrival_to_first_token_s": round(firsts[0], 2),
                       "arrival_to_last_first_token_s": round(firsts[-1], 2), "burst": BURST}  # fmt: skip
            metrics = httpx.get(url + "/metrics", timeout=5).text
            assert "llmservice_router_scale_from_zero_total 1.0" in metrics
    finally:
        node.stop()
    print("\nscale from zero:", json.dumps(figures))
    assert node.errors == [], node.errors


def test_held_past_the_timeout_gets_504_while_pods_are_pending(
    llmservice_crd: object, kube_api: client.ApiClient, control_plane: ControlPlane,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    node = start_node(kube_api, NodeSpec(name="pending-node", cpu="8", memory="32Gi"),
                      workdir=tmp_path, access=control_plane.access(), run_containers=True,
                      env=NODE_ENV, routed_pod_ips=True)  # fmt: skip
    custom = client.CustomObjectsApi(kube_api)
    try:
        with OperatorProcess(control_plane.admin_kubeconfig, tmp_path / "operator.log", env=NODE_ENV):
            obj = llmservice("never", replicas=0, router={"holdTimeoutSeconds": 3},
                             scheduling={"nodeSelector": {"no-such-node": "true"}})  # fmt: skip
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, obj)
            router = EndpointFollower(client.DiscoveryV1Api(kube_api), namespace, "never")
            (url,) = wait_for(router.read, what="the router pod behind Service never", timeout=120)
            t0 = time.monotonic()
            r = httpx.post(
                url + "/v1/completions", json={"model": "smollm2", "prompt": "hi"}, timeout=60
            )
            waited = time.monotonic() - t0
            assert r.status_code == 504, r.text
            assert "never is starting" in r.json()["error"]["message"]
            assert 3 <= waited < 10, waited
            assert replicas(custom, namespace, "never") == 1  # woken; its pod is Pending
    finally:
        node.stop()
    assert node.errors == [], node.errors
