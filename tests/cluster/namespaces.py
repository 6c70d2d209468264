"""Namespaces for tests: usable only once the ServiceAccount controller made `default`."""

from __future__ import annotations

from kubernetes import client

from .waiting import exists, wait_for


def create_namespace(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: exists(lambda: core.read_namespaced_service_account("default", name)),
        what=f"default ServiceAccount in {name}",
    )
    return name


def delete_namespace(core: client.CoreV1Api, name: str) -> None:
    # Pods bound to the test's fake nodes (already gone) would keep the namespace
    # Terminating forever without a kubelet; remove them as a drained node would.
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)
