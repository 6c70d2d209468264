"""Install and remove the pinned Gateway API Inference Extension CRDs on the real control
plane: InferencePool (inference.networking.k8s.io/v1) and InferenceObjective
(inference.networking.x-k8s.io/v1alpha2), the module's own files at the versions pinned
in hack/fetch-gateway-crds.sh. No gateway or endpoint picker runs here: the API server
stores and validates the objects (schemas and CEL rules), nothing routes to them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.gateway_crds import FILES, crd_dir

from .waiting import wait_for

CRD_NAMES = (
    "inferencepools.inference.networking.k8s.io",
    "inferenceobjectives.inference.networking.x-k8s.io",
)
DISCOVERY = {  # group/version -> plural, as the operator's discovery probe asks
    "inference.networking.k8s.io/v1": "inferencepools",
    "inference.networking.x-k8s.io/v1alpha2": "inferenceobjectives",
}
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def _served(api: client.ApiClient, group_version: str, plural: str) -> bool:
    group, version = group_version.split("/")
    try:
        found = client.CustomObjectsApi(api).get_api_resources(group, version)
    except ApiException:
        return False
    return any(r.name == plural for r in (found.resources if found else None) or [])


def install_gateway_crds(kubectl: Kubectl, api: client.ApiClient) -> None:
    """Apply both CRDs, then wait until discovery serves them (what the operator probes)."""
    files = [str(crd_dir() / name) for name in FILES.values()]
    applied = kubectl("apply", "--server-side", *[a for f in files for a in ("-f", f)])
    assert applied.returncode == 0, applied.stderr
    wait_for(
        lambda: all(_served(api, gv, plural) for gv, plural in DISCOVERY.items()),
        what="the InferencePool and InferenceObjective APIs in discovery",
    )


def remove_gateway_crds(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    for name in CRD_NAMES:
        try:
            ext.delete_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def gone() -> bool:
        return not any(_served(api, gv, plural) for gv, plural in DISCOVERY.items())

    wait_for(gone, what="the Gateway API Inference Extension CRDs to be removed")
