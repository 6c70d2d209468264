"""The fake kubelet running pods' real commands as local processes on 127.0.0.x."""

from __future__ import annotations

import sys
from collections.abc import Callable

import httpx
import pytest
from kubernetes import client

from .fake_kubelet import FakeKubelet
from .waiting import wait_for

pytestmark = pytest.mark.cluster

# Readiness is delayed by 3 s so the test sees the pod Running but not yet Ready.
SERVER = """
import http.server, sys, time
time.sleep(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.path + " from " + self.server.server_address[0]).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


def web_deployment(replicas: int) -> dict:
    labels = {"app": "web"}
    container = {
        "name": "srv",
        "image": "python:local",
        "command": [sys.executable, "-c", SERVER],
        "args": ["0.0.0.0", "$(PORT)"],
        "env": [{"name": "PORT", "value": "8080"}],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
    }
    return {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def test_pods_run_their_command_and_become_ready_by_probe(
    kube_api: client.ApiClient, namespace: str, add_node: Callable[..., FakeKubelet]
) -> None:
    core = client.CoreV1Api(kube_api)
    apps = client.AppsV1Api(kube_api)
    kubelet = add_node(run_containers=True)
    apps.create_namespaced_deployment(namespace, web_deployment(replicas=2))

    def pods() -> list[client.V1Pod]:
        return core.list_namespaced_pod(namespace).items

    def ready(p: client.V1Pod) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])

    running = wait_for(
        lambda: len(ps := [p for p in pods() if p.status.phase == "Running"]) == 2 and ps,
        what="2 running pods",
    )
    assert not all(ready(p) for p in running)  # the probe has not passed yet
    wait_for(lambda: len([p for p in pods() if ready(p)]) == 2, what="2 pods ready by probe")

    # Both replicas listen on port 8080, each on its own pod IP.
    ips = sorted(p.status.pod_ip for p in pods())
    assert len(set(ips)) == 2
    for ip in ips:
        r = httpx.get(f"http://{ip}:8080/hello", timeout=5)
        assert r.text == f"/hello from {ip}"

    # Deleting a pod stops its process; the ReplicaSet replaces it with a new one.
    victim = ips[0]
    doomed = next(p for p in pods() if p.status.pod_ip == victim)
    core.delete_namespaced_pod(doomed.metadata.name, namespace)
    wait_for(
        lambda: doomed.metadata.name not in {p.metadata.name for p in pods()},
        what="the deleted pod to be finalised by the fake kubelet",
    )
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{victim}:8080/hello", timeout=2)
    wait_for(lambda: len([p for p in pods() if ready(p)]) == 2, what="the replacement ready")
    assert not kubelet.errors
