"""spec.router -> the router's children: Deployment, RBAC, and the two Services. Pure.

One router Deployment per LLMService, not per namespace: its pods route one model's
pods (one hash ring, one hold queue, one scale target), its Role can then name that one
LLMService's scale subresource, it rolls out and is garbage-collected with its
LLMService (ownerReference), and one model's burst or bug never stalls another's.
The cost is a small pod or two per LLMService (250m CPU, 256 MiB by default).

With the router on, the LLMService's Service (`<name>`, what clients already use)
selects the router pods, and a headless `<name>-pods` Service selects the model pods
so that their EndpointSlices exist for the router to watch. The router pods carry
none of the labels the operator's indexes and the model Service select on, so status,
the autoscaler and the PDB never mistake them for model pods.

With `spec.gateway.inferencePool` on as well, the router pods also serve the endpoint
picker's ext-proc gRPC (`--ext-proc`, container port `ext-proc`, 9002), so a Service
named by `spec.gateway.endpointPicker` can point the gateway at them (docs/router.md).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from llmservice.operator.render import (
    DEFAULT_SERVER_IMAGE,
    FIELD_MANAGER,
    PORT,
    PRE_STOP_SLEEP_S,
    Owner,
    _metadata,
    _probe,
    selector_labels,
)
from llmservice.operator.router_spec import RouterSpec
from llmservice.operator.spec import LLMServiceSpec

LABEL_ROUTER = "llmservice.dev/router"  # value: the LLMService name, on the router pods
CONTAINER = "router"
EXT_PROC_PORT = 9002  # `llmservice router --ext-proc`'s default port (router/ext_proc.py)


def router_name(owner: Owner) -> str:
    return f"{owner.name}-router"


def pods_service_name(owner: Owner) -> str:
    return f"{owner.name}-pods"


def router_selector(owner: Owner) -> dict[str, str]:
    return {"app.kubernetes.io/name": "llmservice-router", "app.kubernetes.io/instance": owner.name}


def router_labels(owner: Owner) -> dict[str, str]:
    return {
        **router_selector(owner),
        "app.kubernetes.io/component": "router",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        LABEL_ROUTER: owner.name,
    }


def _meta(owner: Owner, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta = copy.deepcopy(_metadata(owner))
    meta["name"] = name
    if labels is not None:
        meta["labels"] = labels
    return meta


def router_args(owner: Owner, spec: LLMServiceSpec, router: RouterSpec) -> list[str]:
    args = [
        "router",
        "--host", "0.0.0.0",
        "--port", str(PORT),
        "--namespace", owner.namespace,
        "--service", owner.name,
        "--endpoint-slices-of", pods_service_name(owner),
        "--policy", router.policy,
        "--load-factor", f"{router.load_factor:g}",
        "--prefix-tokens", str(router.prefix_tokens),
        "--max-held-requests", str(router.max_held_requests),
        "--hold-timeout-seconds", str(router.hold_timeout_seconds),
        "--drain-seconds", f"{drain_seconds(spec):g}",
    ]  # fmt: skip
    if router.scale_from_zero:
        args.append("--scale-from-zero")
    if spec.gateway.inference_pool:
        args += ["--ext-proc", "--ext-proc-port", str(EXT_PROC_PORT)]
    return args


def drain_seconds(spec: LLMServiceSpec) -> float:
    """As long as a pod's own drain: a stream the router carries ends when the pod's does."""
    return math.ceil(spec.engine.shutdown_grace_seconds) + 5


def router_image(spec: LLMServiceSpec, router: RouterSpec, server_image: str) -> str:
    """The server image holds the `llmservice` command (the router imports no torch); a
    vllm object's own image does not, so it gets the operator's server image."""
    own = spec.engine.image if spec.engine.kind == "llmservice" else None
    return router.image or own or server_image


def render_router_deployment(
    owner: Owner, spec: LLMServiceSpec, router: RouterSpec, server_image: str = DEFAULT_SERVER_IMAGE
) -> dict[str, Any]:
    ports = [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]
    if spec.gateway.inference_pool:
        ports.append({"name": "ext-proc", "containerPort": EXT_PROC_PORT, "protocol": "TCP"})
    container = {
        "name": CONTAINER,
        "image": router_image(spec, router, server_image),
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": ["llmservice"],
        "args": router_args(owner, spec, router),
        "env": [{"name": "HOME", "value": "/tmp"}],
        "ports": ports,
        "resources": {
            "requests": {"cpu": router.cpu, "memory": router.memory},
            "limits": {"memory": router.memory},
        },
        "livenessProbe": _probe("/healthz", 10, 3, 3),
        "readinessProbe": _probe("/readyz", 2, 1, 2),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_S}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod = {
        "serviceAccountName": router_name(owner),
        "automountServiceAccountToken": True,  # it watches EndpointSlices
        "terminationGracePeriodSeconds": PRE_STOP_SLEEP_S + math.ceil(drain_seconds(spec)) + 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
        "containers": [container],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, router_name(owner), router_labels(owner)),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": router_selector(owner)},
            "revisionHistoryLimit": 3,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": router_labels(owner),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod,
            },
        },
    }


def render_router_rbac(owner: Owner, router: RouterSpec) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding: watch EndpointSlices in the namespace, and (only
    with scale from zero) get and patch this one LLMService's scale subresource."""
    name, labels = router_name(owner), router_labels(owner)
    rules: list[dict[str, Any]] = [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["list", "watch"],
        }
    ]
    if router.scale_from_zero:
        rules.append({
            "apiGroups": ["llmservice.dev"], "resources": ["llmservices/scale"],
            "resourceNames": [owner.name], "verbs": ["get", "patch"],
        })  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(owner, name, labels)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(owner, name, labels),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(owner, name, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        },
    ]


def render_pods_service(owner: Owner) -> dict[str, Any]:
    """Headless: no virtual IP, only the EndpointSlices of the Ready model pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, pods_service_name(owner)),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(owner.name),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_router_service(owner: Owner, service: dict[str, Any]) -> dict[str, Any]:
    """The LLMService's own Service, now in front of the router pods."""
    routed = copy.deepcopy(service)
    routed["spec"]["selector"] = router_selector(owner)
    return routed


def render_router(
    owner: Owner,
    spec: LLMServiceSpec,
    router: RouterSpec,
    service: dict[str, Any],
    server_image: str = DEFAULT_SERVER_IMAGE,
) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """(the LLMService's Service, the router's other children)."""
    children = (
        *render_router_rbac(owner, router),
        render_router_deployment(owner, spec, router, server_image),
        render_pods_service(owner),
    )  # fmt: skip
    return render_router_service(owner, service), children


# Kinds and names of every child the router adds: deleted when the router is turned off.
def router_children(owner: Owner) -> list[tuple[str, str, str]]:
    """(apiVersion, plural, name) of each router child."""
    name = router_name(owner)
    return [
        ("apps/v1", "deployments", name),
        ("v1", "services", pods_service_name(owner)),
        ("rbac.authorization.k8s.io/v1", "rolebindings", name),
        ("rbac.authorization.k8s.io/v1", "roles", name),
        ("v1", "serviceaccounts", name),
    ]
