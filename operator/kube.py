"""A small dict-in, dict-out Kubernetes client on top of the `kubernetes` package.

The typed API classes turn every object into generated models; the operator renders
plain dicts and applies several kinds (including ServiceMonitor, which has no typed API),
so one generic path per verb is simpler. Authentication, TLS and kubeconfig/in-cluster
loading stay with the `kubernetes` package.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import kubernetes

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


def load_config() -> None:
    """In a pod: the service account; elsewhere: $KUBECONFIG or ~/.kube/config."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


def path_for(api_version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    """The REST path of a collection or an object (`apps/v1`, `deployments`, ...)."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    return f"{base}/{quote(name)}" if name else base


class Kube:
    def __init__(self, client: kubernetes.client.ApiClient | None = None) -> None:
        self.client = client or kubernetes.client.ApiClient()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any] | None:
        """One API call; None on 404 for reads and deletes, ApiError otherwise."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        method_, url, headers_, body_, post = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.client.call_api(method_, url, header_params=headers_, body=body_)
            response.read()
        except kubernetes.client.ApiException as exc:
            if exc.status == 404 and method in ("GET", "DELETE"):
                return None
            raise ApiError(exc.status or 0, str(exc.body or exc.reason)) from exc
        if response.status == 404 and method in ("GET", "DELETE"):
            return None
        if response.status >= 400:
            raise ApiError(response.status, response.data.decode(errors="replace"))
        return json.loads(response.data) if response.data else {}

    def get(self, path: str) -> dict[str, Any] | None:
        return self.request("GET", path)

    def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        return (self.request("GET", path, query=query) or {}).get("items", [])

    def apply(self, path: str, manifest: dict[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply: creates or updates, and owns the fields it sends."""
        result = self.request(
            "PATCH",
            path,
            body=manifest,
            query={"fieldManager": field_manager, "force": "true"},
            content_type=APPLY,
        )
        assert result is not None
        return result

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        return self.request("PATCH", path, body=patch, content_type=MERGE)

    def delete(self, path: str) -> dict[str, Any] | None:
        return self.request("DELETE", path, body={"propagationPolicy": "Background"})

    def has_resource(self, api_version: str, plural: str) -> bool:
        """Discovery: does the cluster serve this resource (e.g. a CRD is installed)?"""
        try:
            found = self.get(f"/apis/{api_version}")
        except ApiError:
            return False
        return any(r.get("name") == plural for r in (found or {}).get("resources", []))
