"""The fake kubelet's pure rules (no cluster needed; these run in the fast tier)."""

from __future__ import annotations

import pytest

from .fake_kubelet import (
    loopback_ip,
    pre_stop_sleep_seconds,
    routed_ip,
    termination_grace_seconds,
)
from .pod_process import bind_to_pod_ip, container_env, expand, probe_url, process_plan
from .pod_status import ContainerState, NodeSpec, node_manifest, pod_phase, pod_status

POD = {
    "metadata": {"name": "web-0", "namespace": "ns1", "uid": "u-1"},
    "spec": {"nodeName": "gpu-1", "serviceAccountName": "default"},
}


def test_expand_follows_kubernetes_rules() -> None:
    env = {"PORT": "8000", "MODEL": "smol"}
    assert expand("--port=$(PORT)", env) == "--port=8000"
    assert expand("$(MISSING) stays", env) == "$(MISSING) stays"
    assert expand("$$(PORT) escapes", env) == "$(PORT) escapes"


def test_env_expands_against_earlier_entries_and_downward_api() -> None:
    container = {
        "name": "c",
        "env": [
            {"name": "A", "value": "x"},
            {"name": "B", "value": "$(A)-y"},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
    }
    env = container_env(container, POD, "127.0.0.20", "127.0.0.10")
    assert env == {"A": "x", "B": "x-y", "IP": "127.0.0.20", "NS": "ns1"}


def test_unsupported_env_source_is_an_error_not_a_silent_gap() -> None:
    container = {"name": "c", "env": [{"name": "S", "valueFrom": {"secretKeyRef": {}}}]}
    with pytest.raises(ValueError, match="cannot resolve env 'S'"):
        container_env(container, POD, "127.0.0.20", "127.0.0.10")


def test_all_interfaces_bind_becomes_pod_ip() -> None:
    args = ["serve", "--host", "0.0.0.0", "--bind=::", "--name=0.0.0.0x", "[::]"]
    assert bind_to_pod_ip(args, "127.0.0.21") == [
        "serve",
        "--host",
        "127.0.0.21",
        "--bind=127.0.0.21",
        "--name=0.0.0.0x",
        "127.0.0.21",
    ]


def test_process_plan_needs_a_command_and_expands_args() -> None:
    container = {
        "name": "srv",
        "command": ["llmservice", "serve"],
        "args": ["--port", "$(PORT)", "--host", "0.0.0.0"],
        "env": [{"name": "PORT", "value": "8000"}],
    }
    plan = process_plan(container, POD, "127.0.0.22", "127.0.0.10")
    assert plan.argv == ["llmservice", "serve", "--port", "8000", "--host", "127.0.0.22"]
    assert plan.env["POD_IP"] == "127.0.0.22"
    with pytest.raises(ValueError, match="no command"):
        process_plan({"name": "x", "args": ["a"]}, POD, "127.0.0.22", "127.0.0.10")


def test_probe_url_resolves_named_ports() -> None:
    container = {
        "name": "srv",
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
    }
    assert probe_url(container, "127.0.0.23") == "http://127.0.0.23:8000/health"
    assert probe_url({"name": "c"}, "127.0.0.23") is None
    with pytest.raises(ValueError, match="httpGet"):
        probe_url({"name": "c", "readinessProbe": {"exec": {"command": ["true"]}}}, "1")


def test_node_advertises_gpus_only_when_it_has_them() -> None:
    gpu = node_manifest(NodeSpec(name="g", gpus=2), "127.0.0.11")["status"]
    cpu = node_manifest(NodeSpec(name="c"), "127.0.0.12")["status"]
    assert gpu["capacity"]["nvidia.com/gpu"] == "2"
    assert gpu["allocatable"] == gpu["capacity"]
    assert "nvidia.com/gpu" not in cpu["capacity"]
    assert {"type": "InternalIP", "address": "127.0.0.12"} in cpu["addresses"]


def _c(ready: bool, exit_code: int | None = None) -> ContainerState:
    return ContainerState(name="c", image="i", started_at="t", ready=ready, exit_code=exit_code)


def test_pod_ready_only_when_every_container_is() -> None:
    status = pod_status("127.0.0.30", "127.0.0.10", "t", "Always", [_c(True), _c(False)])
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Ready"] == "False" and conditions["ContainersReady"] == "False"
    status = pod_status("127.0.0.30", "127.0.0.10", "t", "Always", [_c(True)])
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert status["podIP"] == "127.0.0.30" and status["phase"] == "Running"


def test_phase_reflects_restart_policy() -> None:
    assert pod_phase("Always", [_c(False, 1)]) == "Running"  # will be restarted
    assert pod_phase("Never", [_c(False, 0)]) == "Succeeded"
    assert pod_phase("Never", [_c(False, 0), _c(False, 2)]) == "Failed"
    assert pod_phase("OnFailure", [_c(False, 2)]) == "Running"
    assert pod_phase("Never", [_c(True), _c(False, 0)]) == "Running"


def test_deletion_grace_comes_from_the_request_then_the_spec_then_30_s() -> None:
    spec_only = {"metadata": {}, "spec": {"terminationGracePeriodSeconds": 35}}
    assert termination_grace_seconds(spec_only) == 35
    asked = {"metadata": {"deletionGracePeriodSeconds": 3}, "spec": spec_only["spec"]}
    assert termination_grace_seconds(asked) == 3
    assert termination_grace_seconds({"metadata": {}, "spec": {}}) == 30
    assert termination_grace_seconds({"metadata": {"deletionGracePeriodSeconds": 0},
                                      "spec": spec_only["spec"]}) == 0  # fmt: skip


def test_pre_stop_sleep_is_read_from_the_container_lifecycle() -> None:
    assert pre_stop_sleep_seconds({"lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}) == 5
    assert pre_stop_sleep_seconds({"lifecycle": {"preStop": {"exec": {"command": ["x"]}}}}) == 0
    assert pre_stop_sleep_seconds({"name": "c"}) == 0


def test_routed_pod_ips_map_loopback_both_ways() -> None:
    assert routed_ip("127.0.1.42") == "10.0.1.42"
    assert loopback_ip(routed_ip("127.0.1.42")) == "127.0.1.42"
    with pytest.raises(ValueError, match="not a loopback"):
        routed_ip("10.0.0.1")
    with pytest.raises(ValueError, match="not a routed"):
        loopback_ip("127.0.0.1")
