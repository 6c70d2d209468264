"""The API emulator itself, over HTTP with the `kubernetes` client: the semantics kopf and
the operator rely on, so a green operator test means the same on a real API server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import kubernetes
import pytest
import urllib3

from tests.integration.operator.conftest import CRD
from tests.support.clients import Kubectl, llmservice, wait_until
from tests.support.cluster import Cluster

LLMS = "/apis/llmservice.dev/v1alpha1/namespaces/default/llmservices"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("emulator")) as c:
        Kubectl(c.api).install_crd(CRD)
        yield c


@pytest.fixture
def k(cluster) -> Kubectl:
    return Kubectl(cluster.api)


def raw(cluster: Cluster, method: str, path: str, body=None, content_type="application/json"):
    http = urllib3.PoolManager()
    response = http.request(
        method,
        cluster.url + path,
        body=None if body is None else json.dumps(body),
        headers={"Content-Type": content_type},
    )
    return response.status, json.loads(response.data or b"null")


def test_discovery_serves_the_crd_with_subresources(k):
    found = k.get("/apis/llmservice.dev/v1alpha1")
    names = {r["name"]: r for r in found["resources"]}
    assert {"llmservices", "llmservices/status", "llmservices/scale"} <= names.keys()
    assert names["llmservices"]["kind"] == "LLMService"
    assert names["llmservices"]["shortNames"] == ["llms"]
    assert names["llmservices"]["namespaced"] is True


def test_generation_bumps_on_spec_changes_only(k):
    created = k.apply(llmservice("gen"))
    assert created["metadata"]["generation"] == 1
    assert created["metadata"]["uid"] and created["metadata"]["creationTimestamp"]
    labelled = k.patch_llms("gen", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    assert int(labelled["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    respec = k.patch_llms("gen", {"spec": {"replicas": 2}})
    assert respec["metadata"]["generation"] == 2
    noop = k.patch_llms("gen", {"spec": {"replicas": 2}})
    assert noop["metadata"]["resourceVersion"] == respec["metadata"]["resourceVersion"]


def test_status_subresource_is_separate_from_the_main_resource(k):
    k.apply(llmservice("sub"))
    k.custom.patch_namespaced_custom_object_status(
        "llmservice.dev", "v1alpha1", "default", "llmservices", "sub",
        {"status": {"readyReplicas": 7}, "spec": {"replicas": 9}},
    )  # fmt: skip
    obj = k.llms("sub")
    assert obj["status"]["readyReplicas"] == 7 and obj["spec"]["replicas"] == 1
    assert obj["metadata"]["generation"] == 1
    k.patch_llms("sub", {"status": {"readyReplicas": 0}, "spec": {"replicas": 2}})
    obj = k.llms("sub")
    assert obj["status"]["readyReplicas"] == 7 and obj["spec"]["replicas"] == 2


def test_scale_subresource_reads_and_writes_spec_replicas(k):
    k.apply(llmservice("sc"))
    k.custom.patch_namespaced_custom_object_status(
        "llmservice.dev", "v1alpha1", "default", "llmservices", "sc",
        {"status": {"replicas": 1, "selector": "app=x"}},
    )  # fmt: skip
    scale = k.scale("sc", 4)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 4
    assert scale["status"] == {"replicas": 1, "selector": "app=x"}
    assert k.llms("sc")["spec"]["replicas"] == 4
    with pytest.raises(kubernetes.client.ApiException) as caught:
        k.scale("sc", -1)  # the CRD's minimum applies through the scale subresource too
    assert caught.value.status == 422


def test_validation_errors_name_the_field_and_rule(cluster):
    status, body = raw(
        cluster, "POST", LLMS, llmservice("bad", resources={"gpuMemoryUtilization": 1.0})
    )
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"].startswith('LLMService.llmservice.dev "bad" is invalid: [')
    fields = {c["field"] for c in body["details"]["causes"]}
    assert fields == {"spec.resources.gpuMemoryUtilization"}
    status, _ = raw(cluster, "POST", LLMS + "?dryRun=All", llmservice("dry"))
    assert status == 201
    assert raw(cluster, "GET", LLMS + "/dry")[0] == 404


def test_patch_flavours(cluster, k):
    k.apply(llmservice("pf", engine={"extraArgs": ["--a"]}))
    path = f"{LLMS}/pf"
    status, obj = raw(
        cluster,
        "PATCH",
        path,
        [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}],
        "application/json-patch+json",
    )
    assert status == 422  # a failed `test` op (kopf relies on this)
    rv = k.llms("pf")["metadata"]["resourceVersion"]
    status, obj = raw(cluster, "PATCH", path, [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
    ], "application/json-patch+json")  # fmt: skip
    assert status == 200 and obj["metadata"]["finalizers"] == ["x/y"]
    status, obj = raw(
        cluster,
        "PATCH",
        path,
        {"spec": {"engine": {"extraArgs": ["--b"]}}},
        "application/merge-patch+json",
    )
    assert obj["spec"]["engine"]["extraArgs"] == ["--b"]  # lists are replaced
    status, obj = raw(
        cluster,
        "PATCH",
        path + "?fieldManager=t",
        {
            "apiVersion": "llmservice.dev/v1alpha1",
            "kind": "LLMService",
            "metadata": {"name": "pf"},
            "spec": {"replicas": 3, "model": {"source": "builtin:smollm2-135m"}},
        },
        "application/apply-patch+yaml",
    )
    assert status == 200 and obj["spec"]["replicas"] == 3
    status, _ = raw(cluster, "PATCH", path, {"spec": {}}, "application/apply-patch+yaml")
    assert status == 400  # apply needs a field manager


def test_strategic_merge_merges_containers_by_name(cluster, k):
    k.apps.create_namespaced_deployment("default", {
        "metadata": {"name": "smp"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "one", "image": "i1"}, {"name": "two", "image": "i2"}]},
        }},
    })  # fmt: skip
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "two", "image": "i3"}]}}}}
    status, obj = raw(
        cluster,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/smp",
        patch,
        "application/strategic-merge-patch+json",
    )
    images = [(c["name"], c["image"]) for c in obj["spec"]["template"]["spec"]["containers"]]
    assert images == [("one", "i1"), ("two", "i3")]


def test_finalizers_hold_deletion_until_removed(k):
    k.apply(llmservice("fin"))
    k.patch_llms("fin", {"metadata": {"finalizers": ["example.com/hold"]}})
    k.delete_llms("fin")
    held = k.llms("fin")
    assert held["metadata"]["deletionTimestamp"]
    k.patch_llms("fin", {"metadata": {"finalizers": None}})
    wait_until(lambda: k.get(f"{LLMS}/fin") is None)


def test_owner_reference_cascade(k):
    owner = k.apply(llmservice("own"))
    ref = {
        "apiVersion": "llmservice.dev/v1alpha1",
        "kind": "LLMService",
        "name": "own",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    k.core.create_namespaced_service(
        "default",
        {
            "metadata": {"name": "own-svc", "ownerReferences": [ref]},
            "spec": {"ports": [{"port": 80}]},
        },
    )
    k.core.create_namespaced_config_map("default", {"metadata": {"name": "unrelated"}})
    k.delete_llms("own")
    assert k.service("own-svc") is None
    assert k.get("/api/v1/namespaces/default/configmaps/unrelated") is not None


def test_list_and_watch_with_selectors_resource_versions_and_bookmarks(cluster, k):
    cluster.emulator.bookmark_interval = 0.2
    k.apply(llmservice("w1"))
    listing = k.custom.list_namespaced_custom_object(
        "llmservice.dev", "v1alpha1", "default", "llmservices", label_selector="team=blue"
    )
    assert listing["items"] == []
    since = listing["metadata"]["resourceVersion"]
    events: list[tuple[str, str]] = []

    def watch() -> None:
        stream = kubernetes.watch.Watch().stream(
            k.custom.list_namespaced_custom_object, "llmservice.dev", "v1alpha1", "default", "llmservices",
            label_selector="team=blue", resource_version=since, allow_watch_bookmarks=True, timeout_seconds=3,
        )  # fmt: skip
        for event in stream:
            events.append((event["type"], event["object"]["metadata"].get("name", "")))

    thread = threading.Thread(target=watch)
    thread.start()
    k.patch_llms("w1", {"metadata": {"labels": {"team": "blue"}}})  # enters the selection
    k.patch_llms("w1", {"spec": {"replicas": 2}})
    k.patch_llms("w1", {"metadata": {"labels": {"team": "red"}}})  # leaves it
    k.apply(llmservice("w2"))  # never selected
    thread.join(timeout=10)
    changes = [e for e in events if e[0] != "BOOKMARK"]
    assert changes == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]
    assert ("BOOKMARK", "") in events


def test_watch_from_an_expired_resource_version_gets_410(cluster, k):
    store = cluster.emulator.store
    res = next(r for r in store.kinds if r.plural == "llmservices")
    cluster.call(lambda: store.compacted.__setitem__(res, store.rv))
    status, _ = raw(cluster, "GET", f"{LLMS}?watch=true&resourceVersion=1&timeoutSeconds=1")
    assert status == 200  # errors in watches travel inside the stream
    http = urllib3.PoolManager()
    body = http.request(
        "GET", f"{cluster.url}{LLMS}?watch=true&resourceVersion=1&timeoutSeconds=1"
    ).data
    first = json.loads(body.splitlines()[1] if body.startswith(b"\n") else body.splitlines()[0])
    assert first["type"] == "ERROR" and first["object"]["code"] == 410
