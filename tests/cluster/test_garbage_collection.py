"""The real garbage collector and workload controllers, with pods run by the fake kubelet."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client

from .fake_kubelet import FakeKubelet
from .waiting import wait_for

pytestmark = pytest.mark.cluster


def deployment(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "srv", "image": "llmservice:test"}]},
            },
        },
    }


def test_deployment_rolls_out_and_is_garbage_collected(
    kube_api: client.ApiClient, namespace: str, add_node: Callable[..., FakeKubelet]
) -> None:
    apps = client.AppsV1Api(kube_api)
    core = client.CoreV1Api(kube_api)
    add_node()
    apps.create_namespaced_deployment(namespace, deployment("web", replicas=2))

    dep = wait_for(
        lambda: (
            (d := apps.read_namespaced_deployment("web", namespace)).status.ready_replicas == 2
            and d
        ),
        what="2 ready replicas (deployment -> replicaset -> pods -> fake kubelet)",
    )
    assert dep.status.available_replicas == 2
    (rs,) = apps.list_namespaced_replica_set(namespace).items
    assert rs.metadata.owner_references[0].uid == dep.metadata.uid
    pods = core.list_namespaced_pod(namespace).items
    assert len(pods) == 2
    assert {p.metadata.owner_references[0].uid for p in pods} == {rs.metadata.uid}
    assert len({p.status.pod_ip for p in pods}) == 2  # one IP per pod

    apps.delete_namespaced_deployment("web", namespace)  # background propagation
    wait_for(
        lambda: (
            not apps.list_namespaced_replica_set(namespace).items
            and not core.list_namespaced_pod(namespace).items
        ),
        what="the garbage collector to delete the replicaset and its pods",
    )


def test_foreground_deletion_waits_for_children(
    kube_api: client.ApiClient, namespace: str, add_node: Callable[..., FakeKubelet]
) -> None:
    """With Foreground propagation the owner lingers (foregroundDeletion finalizer)
    until the kubelet has finished deleting every pod."""
    apps = client.AppsV1Api(kube_api)
    add_node()
    apps.create_namespaced_deployment(namespace, deployment("fg", replicas=1))
    wait_for(
        lambda: apps.read_namespaced_deployment("fg", namespace).status.ready_replicas == 1,
        what="1 ready replica",
    )
    apps.delete_namespaced_deployment("fg", namespace, propagation_policy="Foreground")
    dep = apps.read_namespaced_deployment("fg", namespace)
    assert dep.metadata.deletion_timestamp is not None
    assert "foregroundDeletion" in dep.metadata.finalizers
    wait_for(
        lambda: not apps.list_namespaced_deployment(namespace).items,
        what="the deployment to go once its children are gone",
    )
    assert not client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items
