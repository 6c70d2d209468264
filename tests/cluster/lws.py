"""Install and remove the pinned LeaderWorkerSet CRD on the real control plane.

The CRD is the sigs.k8s.io/lws module's own file at the version pinned in
hack/fetch-lws-crd.sh. No LWS controller runs here: the API server stores and validates
LeaderWorkerSets, no pods are created for them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from .binaries import REPO
from .waiting import wait_for

LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def lws_crd_path() -> Path:
    out = subprocess.run(
        [str(REPO / "hack/fetch-lws-crd.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def install_lws_crd(kubectl: Kubectl, api: client.ApiClient) -> None:
    # --server-side: the CRD is too large for the last-applied annotation.
    applied = kubectl("apply", "--server-side", "-f", str(lws_crd_path()))
    assert applied.returncode == 0, applied.stderr
    ext = client.ApiextensionsV1Api(api)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(LWS_CRD_NAME)
        return {c.type: c.status for c in crd.status.conditions or []}.get("Established") == "True"

    wait_for(established, what="the LeaderWorkerSet CRD to be Established")


def remove_lws_crd(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.delete_custom_resource_definition(LWS_CRD_NAME)
    except ApiException as exc:
        if exc.status != 404:
            raise

    def gone() -> bool:
        try:
            ext.read_custom_resource_definition(LWS_CRD_NAME)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, what="the LeaderWorkerSet CRD to be removed")
