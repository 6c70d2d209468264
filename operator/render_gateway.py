"""The LLMService's pods as members of a Gateway API Inference Extension pool. Pure.

With `spec.gateway.inferencePool: true` the operator renders
- an InferencePool (inference.networking.k8s.io/v1) named after the LLMService that
  selects exactly the server pods (the Deployment's pod selector; for a LeaderWorkerSet
  only the leaders, which serve HTTP) on the server's port, with the endpoint picker
  (`endpointPickerRef`) the cluster's inference gateway runs for it, and
- an InferenceObjective (inference.networking.x-k8s.io/v1alpha2) with the same name,
  pointing at the pool, carrying `spec.gateway.priority`. The v1alpha2 objective has no
  model field: requests name it in the `x-gateway-inference-objective` header, and the
  model itself is the request body's `model` (spec.model.servedName).

The versions are the pinned sigs.k8s.io/gateway-api-inference-extension module's
(hack/fetch-gateway-crds.sh): InferencePool from GIE_VERSION; InferenceObjective from
GIE_OBJECTIVE_VERSION, the last release of that module that ships it (later releases
moved it to llm-d/llm-d-router).
"""

from __future__ import annotations

from typing import Any

from llmservice.operator import render as r
from llmservice.operator.gateway_spec import GatewaySpec

POOL_API_VERSION = "inference.networking.k8s.io/v1"
POOL_KIND = "InferencePool"
POOL_PLURAL = "inferencepools"
OBJECTIVE_API_VERSION = "inference.networking.x-k8s.io/v1alpha2"
OBJECTIVE_KIND = "InferenceObjective"
OBJECTIVE_PLURAL = "inferenceobjectives"
GIE_VERSION = "v1.6.0"  # hack/fetch-gateway-crds.sh pins the same CRDs for the tests
GIE_OBJECTIVE_VERSION = "v1.5.0"
_GIE = "https://github.com/kubernetes-sigs/gateway-api-inference-extension"
GIE_INSTALL = (
    f"kubectl apply --server-side -f {_GIE}/releases/download/{GIE_VERSION}/manifests.yaml "
    f"-f {_GIE}/raw/{GIE_OBJECTIVE_VERSION}/config/crd/bases/"
    "inference.networking.x-k8s.io_inferenceobjectives.yaml"
)


def pool_selector(owner: r.Owner, multi_node: bool) -> dict[str, str]:
    """The server pods and nothing else: the router's pods carry another app name."""
    selector = dict(r.selector_labels(owner.name))
    if multi_node:
        from llmservice.operator.render_lws import WORKER_INDEX

        selector[WORKER_INDEX] = "0"  # workers serve no HTTP
    return selector


def _metadata(owner: r.Owner) -> dict[str, Any]:
    meta = r._metadata(owner)
    meta["labels"] = {**meta["labels"], "app.kubernetes.io/component": "inference-pool"}
    return meta


def render_inference_pool(owner: r.Owner, gateway: GatewaySpec, multi_node: bool) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": POOL_KIND,
        "metadata": _metadata(owner),
        "spec": {
            "selector": {"matchLabels": pool_selector(owner, multi_node)},
            "targetPorts": [{"number": r.PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": gateway.picker_name or f"{owner.name}-epp",
                "port": {"number": gateway.picker_port},
                "failureMode": gateway.failure_mode,
            },
        },
    }


def render_inference_objective(owner: r.Owner, gateway: GatewaySpec) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "poolRef": {"group": POOL_API_VERSION.split("/")[0], "kind": POOL_KIND, "name": owner.name}
    }
    if gateway.priority is not None:
        spec["priority"] = gateway.priority
    return {
        "apiVersion": OBJECTIVE_API_VERSION,
        "kind": OBJECTIVE_KIND,
        "metadata": _metadata(owner),
        "spec": spec,
    }


def gateway_children(owner: r.Owner) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of each gateway child, the objective (which names the pool) first."""
    return [(OBJECTIVE_API_VERSION, OBJECTIVE_KIND, owner.name), (POOL_API_VERSION, POOL_KIND, owner.name)]


def render_gateway(owner: r.Owner, gateway: GatewaySpec, multi_node: bool) -> tuple[dict[str, Any], ...]:
    """The pool and its objective, or nothing when the object is not a pool member."""
    if not gateway.inference_pool:
        return ()
    return (render_inference_pool(owner, gateway, multi_node), render_inference_objective(owner, gateway))
