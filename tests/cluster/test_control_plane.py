"""The control plane itself: the real apiserver's version, authentication and RBAC."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .binaries import Binaries
from .control_plane import NOBODY_TOKEN, NOBODY_USER, ControlPlane

pytestmark = pytest.mark.cluster


def message(err: ApiException) -> str:
    """The apiserver's Status message (the body is JSON, its quotes escaped)."""
    return str(json.loads(err.body)["message"])


def test_serves_the_pinned_release(kube_api: client.ApiClient) -> None:
    info = client.VersionApi(kube_api).get_code()
    assert info.git_version == "v1.37.2"
    assert (info.major, info.minor) == ("1", "37")


def test_unbound_user_is_forbidden_by_rbac(control_plane: ControlPlane, tmp_path: Path) -> None:
    kc = control_plane.write_kubeconfig(tmp_path / "nobody", NOBODY_TOKEN, user=NOBODY_USER)
    core = client.CoreV1Api(config.new_client_from_config(str(kc)))
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default")
    assert err.value.status == 403
    assert f'User "{NOBODY_USER}" cannot list resource "pods"' in message(err.value)


def test_bad_token_is_unauthenticated(control_plane: ControlPlane, tmp_path: Path) -> None:
    kc = control_plane.write_kubeconfig(tmp_path / "bad", "not-a-token")
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(config.new_client_from_config(str(kc))).list_namespace()
    assert err.value.status == 401


def test_service_account_token_gets_exactly_its_role(
    kube_api: client.ApiClient, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """TokenRequest issues a signed token; RBAC grants what the Role says and no more."""
    core = client.CoreV1Api(kube_api)
    rbac = client.RbacAuthorizationV1Api(kube_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "cm-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "cm-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )  # fmt: skip
    token = core.create_namespaced_service_account_token(
        "reader", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    sa = client.CoreV1Api(
        config.new_client_from_config(str(control_plane.write_kubeconfig(tmp_path / "sa", token)))
    )
    assert sa.list_namespaced_config_map(namespace).items is not None
    with pytest.raises(ApiException) as err:
        sa.list_namespaced_secret(namespace)
    assert err.value.status == 403
    assert f'User "system:serviceaccount:{namespace}:reader" cannot list' in message(err.value)


def test_kubectl_from_the_same_binary_talks_to_the_server(
    cluster_binaries: Binaries, control_plane: ControlPlane
) -> None:
    out = subprocess.run(
        [*cluster_binaries.kubectl(), "--kubeconfig", str(control_plane.admin_kubeconfig),
         "auth", "can-i", "create", "deployments", "--all-namespaces"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "yes"
