"""What an integration test does to a cluster, in a few words (over the `kubernetes` client)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes
import yaml
from llmservice.operator.kube import Kube
from llmservice.operator.render import LABEL_SERVICE

T = TypeVar("T")
GROUP, VERSION, PLURAL = "llmservice.dev", "v1alpha1", "llmservices"


def wait_until(check: Callable[[], T], timeout: float = 30, interval: float = 0.2) -> T:
    """Poll `check` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except kubernetes.client.ApiException as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s; last value: {last!r}")
        time.sleep(interval)


class Kubectl:
    """The handful of calls the tests make, as plain dicts."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str = "default") -> None:
        self.ns = namespace
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.apps = kubernetes.client.AppsV1Api(api)
        self.ext = kubernetes.client.ApiextensionsV1Api(api)
        self.api = api
        self.kube = Kube(api)

    def install_crd(self, path: str) -> None:
        with open(path) as f:
            self.ext.create_custom_resource_definition(yaml.safe_load(f))

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, manifest
        )

    def llms(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def patch_llms(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, patch
        )

    def scale(self, name: str, replicas: int) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, self.ns, PLURAL, name, {"spec": {"replicas": replicas}}
        )

    def delete_llms(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def get(self, path: str) -> dict[str, Any] | None:
        """A raw GET (dicts, no model classes); None on 404."""
        return self.kube.get(path)

    def deployment(self, name: str) -> dict[str, Any] | None:
        return self.get(f"/apis/apps/v1/namespaces/{self.ns}/deployments/{name}")

    def service(self, name: str) -> dict[str, Any] | None:
        return self.get(f"/api/v1/namespaces/{self.ns}/services/{name}")

    def pdb(self, name: str) -> dict[str, Any] | None:
        return self.get(f"/apis/policy/v1/namespaces/{self.ns}/poddisruptionbudgets/{name}")

    def pods(self, instance: str) -> list[dict[str, Any]]:
        """The model pods of LLMService `instance` (not its router's: they share the
        app.kubernetes.io/instance label, not LABEL_SERVICE)."""
        found = self.get(f"/api/v1/namespaces/{self.ns}/pods?labelSelector={LABEL_SERVICE}%3D{instance}")
        return (found or {}).get("items", [])

    def events(self, name: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of Events about the LLMService `name`, oldest first."""
        items = (self.get(f"/api/v1/namespaces/{self.ns}/events") or {}).get("items", [])
        return [
            (e.get("type", ""), e.get("reason", ""), e.get("message", ""))
            for e in items
            if e.get("involvedObject", {}).get("name") == name
            and e.get("involvedObject", {}).get("kind") == "LLMService"
        ]

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        for c in (self.llms(name).get("status") or {}).get("conditions", []):
            if c["type"] == type_:
                return c
        return {}


def llmservice(name: str, **spec: Any) -> dict[str, Any]:
    """A minimal LLMService manifest; keyword arguments are spec sections."""
    body: dict[str, Any] = {"model": {"source": "builtin:smollm2-135m"}}
    body.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": body,
    }
