"""Make the cluster match one LLMService: checks, render, apply children, report.

The decisions (can the server run it, does it fit, what the children look like, what
the status says) are pure functions in engine_support.py, vram.py, render.py and
status.py; this module only sequences them with API calls and says what happened
through the `emit` callback (Events).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from llmservice.operator import gateway_support, lws_support
from llmservice.operator import render as r
from llmservice.operator.adapter_spec import claims_rollout_message
from llmservice.operator.engine_support import (
    SUPPORTED,
    EngineSupport,
    check_engine,
)
from llmservice.operator.kube import Kube, path_for
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.status import (
    CAPACITY_PENDING,
    DEGRADED,
    READY,
    DeploymentView,
    PodView,
    StatusUpdate,
    compute_status,
    deployment_view,
)
from llmservice.operator.vram import FitResult, check_fit, resolve_architecture

if TYPE_CHECKING:
    from llmservice.operator.hub_shape import FoundShape

Emit = Callable[[str, str, str], None]  # (type Normal|Warning, reason, message)

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceMonitor": "servicemonitors",
    "LeaderWorkerSet": "leaderworkersets",  # a multi-node vLLM replica (render_lws.py)
    "NetworkPolicy": "networkpolicies",
    "ServiceAccount": "serviceaccounts",  # the router's (render_router.py)
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "InferencePool": "inferencepools",  # spec.gateway.inferencePool (render_gateway.py)
    "InferenceObjective": "inferenceobjectives",
}
SERVICE_MONITOR_API = "monitoring.coreos.com/v1"


@dataclass(frozen=True)
class Options:
    """Operator-wide settings (CLI flags / Helm values)."""

    max_gpu_memory_utilization: float = 0.95
    server_image: str = r.DEFAULT_SERVER_IMAGE
    # The Hub the operator reads unknown hf:// models' shapes from (None: never; an
    # offline render). handlers.register() turns it into `shapes`, the cached lookups.
    hf_endpoint: str | None = None
    shapes: ShapeLookup | None = field(default=None, compare=False, repr=False)


class ShapeLookup(Protocol):
    """hub_shape.HubShapes: an hf:// model's shape from the Hub, cached."""

    def lookup(self, namespace: str, model: Any) -> FoundShape | None: ...


@dataclass(frozen=True)
class Outcome:
    fit: FitResult
    applied: bool
    deployment: DeploymentView | None
    support: EngineSupport = SUPPORTED


@dataclass(frozen=True)
class Checks:
    """Both pre-rollout verdicts for one spec; either one blocks the rollout."""

    support: EngineSupport
    fit: FitResult

    @property
    def refuse_rollout(self) -> bool:
        return self.support.refuses_rollout or self.fit.refuses_rollout


def checks(owner: r.Owner, spec: LLMServiceSpec, options: Options) -> Checks:
    ceiling = options.max_gpu_memory_utilization
    support = check_engine(owner, spec, ceiling)
    if support.supported and spec.multi_node:
        support = lws_support.support()  # LeaderWorkerSetMissing once discovery said so
    if support.supported and spec.gateway.inference_pool:
        support = gateway_support.support()  # InferencePoolMissing once discovery said so
    hub = None
    if options.shapes is not None and resolve_architecture(spec) is None:
        hub = options.shapes.lookup(owner.namespace, spec.model)  # cached; bounded wait
    return Checks(support, check_fit(spec, ceiling, hub))


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def owner_of(body: dict[str, Any]) -> r.Owner:
    meta = body["metadata"]
    return r.Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def child_path(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    return path_for(
        manifest["apiVersion"], PLURALS[manifest["kind"]], meta["namespace"], meta["name"]
    )


def apply_child(kube: Kube, manifest: dict[str, Any], emit: Emit) -> dict[str, Any]:
    """Server-side apply one child; emit Created / Updated / Scaled when something changed."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    path = child_path(manifest)
    before = kube.get(path)
    after = kube.apply(path, manifest, r.FIELD_MANAGER)
    if before is None:
        emit("Normal", "Created", f"Created {kind} {name}")
        return after
    old_spec, new_spec = before.get("spec", {}), after.get("spec", {})
    if kind == "Deployment":
        old_n, new_n = old_spec.get("replicas"), new_spec.get("replicas")
        if old_n != new_n:
            emit("Normal", "Scaled", f"Scaled Deployment {name} from {old_n} to {new_n} replicas")
        if old_spec.get("template") != new_spec.get("template"):
            claims = claims_rollout_message(old_spec.get("template"), new_spec.get("template"))
            if claims:
                emit("Normal", "AdapterVolumeAdded", claims)
            emit(
                "Normal",
                "Updated",
                f"Updated Deployment {name}: rolling out generation "
                f"{after.get('metadata', {}).get('generation')}",
            )
    elif old_spec != new_spec:
        emit("Normal", "Updated", f"Updated {kind} {name}")
    return after


def reconcile(body: dict[str, Any], kube: Kube, options: Options, emit: Emit) -> Outcome:
    """Apply what the spec asks for, unless the server cannot run it or it does not fit."""
    owner = owner_of(body)
    spec = LLMServiceSpec.from_dict(body["spec"])
    if spec.multi_node:
        lws_support.probe(kube)
    if spec.gateway.inference_pool:
        gateway_support.probe(kube)
    verdict = checks(owner, spec, options)
    fit, support = verdict.fit, verdict.support
    deployment_path = path_for("apps/v1", "deployments", owner.namespace, owner.name)
    if verdict.refuse_rollout:
        if support.refuses_rollout:
            emit("Warning", support.reason, f"Not rolling out: {support.message}")
        if fit.refuses_rollout:
            emit("Warning", "VRAMRefused", f"Not rolling out: {fit.message}")
        current = kube.get(deployment_path)
        return Outcome(fit, False, deployment_view(current) if current else None, support)
    manifests = r.render(
        owner,
        spec,
        max_gpu_memory_utilization=options.max_gpu_memory_utilization,
        server_image=options.server_image,
        with_service_monitor=kube.has_resource(SERVICE_MONITOR_API, "servicemonitors"),
    )
    applied: dict[str, dict[str, Any]] = {}
    for m in manifests.all():  # the first of a kind is the model's (the router's come last)
        applied.setdefault(m["kind"], apply_child(kube, m, emit))
    if not manifests.router:
        delete_router(owner, kube, emit)
    if not manifests.gateway:
        delete_gateway(owner, kube, emit)
    if manifests.pdb is None:
        pdb_path = path_for("policy/v1", "poddisruptionbudgets", owner.namespace, owner.name)
        if kube.delete(pdb_path) is not None:
            emit("Normal", "Deleted", f"Deleted PodDisruptionBudget {owner.name} (replicas <= 1)")
    if manifests.network_policy is None:
        np_path = path_for("networking.k8s.io/v1", "networkpolicies", owner.namespace, owner.name)
        if kube.delete(np_path) is not None:
            emit("Normal", "Deleted", f"Deleted NetworkPolicy {owner.name} (spec.networkPolicy disabled)")
    if spec.multi_node:  # the replicas are LeaderWorkerSet groups now: no Deployment
        if kube.delete(deployment_path) is not None:
            emit("Normal", "Deleted", f"Deleted Deployment {owner.name} (now a LeaderWorkerSet)")
        return Outcome(fit, True, lws_support.lws_view(applied["LeaderWorkerSet"]), support)
    if spec.engine.kind == "vllm" and lws_support.delete_leftover(kube, owner.namespace, owner.name):
        emit("Normal", "Deleted", f"Deleted LeaderWorkerSet {owner.name} (back within one node)")
    return Outcome(fit, True, deployment_view(applied["Deployment"]), support)


def delete_router(owner: r.Owner, kube: Kube, emit: Emit) -> None:
    """spec.router off (or never on): remove what an earlier router left behind."""
    from llmservice.operator.render_router import router_children

    children = router_children(owner)
    api_version, plural, name = children[-1]  # the ServiceAccount: applied first, deleted last
    if kube.get(path_for(api_version, plural, owner.namespace, name)) is None:
        return  # one read per reconcile when there never was a router
    for api_version, plural, name in children:
        if kube.delete(path_for(api_version, plural, owner.namespace, name)) is not None:
            emit("Normal", "Deleted", f"Deleted {plural.removesuffix('s')} {name} (spec.router disabled)")


def delete_gateway(owner: r.Owner, kube: Kube, emit: Emit) -> None:
    """spec.gateway.inferencePool off (or never on): remove an earlier objective and pool,
    so the gateway stops sending this model's traffic to pods that left the pool."""
    from llmservice.operator.render_gateway import gateway_children

    children = gateway_children(owner)
    api_version, kind, name = children[-1]  # the pool: applied first, deleted last
    if kube.get(path_for(api_version, PLURALS[kind], owner.namespace, name)) is None:
        return  # one read per reconcile when there never was a pool (or no such CRD)
    for api_version, kind, name in children:
        if kube.delete(path_for(api_version, PLURALS[kind], owner.namespace, name)) is not None:
            emit("Normal", "Deleted", f"Deleted {kind} {name} (spec.gateway.inferencePool disabled)")


def fresher(
    applied: DeploymentView | None, watched: DeploymentView | None
) -> DeploymentView | None:
    """The apply response knows the new generation first; the watch knows newer pod counts."""
    if applied is None or watched is None:
        return applied or watched
    return watched if watched.generation >= applied.generation else applied


def needs_repair(body: dict[str, Any], options: Options, deployment: DeploymentView | None) -> bool:
    """Was our Deployment deleted or scaled behind our back since the last reconcile?"""
    if (body.get("status") or {}).get("observedGeneration") != body["metadata"].get("generation"):
        return False  # a reconcile for this generation is still due; it will apply anyway
    spec = LLMServiceSpec.from_dict(body["spec"])
    if checks(owner_of(body), spec, options).refuse_rollout:
        return False
    return deployment is None or deployment.spec_replicas != spec.replicas


def status_for(
    body: dict[str, Any],
    options: Options,
    deployment: DeploymentView | None,
    pods: Iterable[PodView],
    extra: dict[str, Any] | None = None,
    extra_conditions: list[dict[str, str]] | None = None,
) -> StatusUpdate:
    """The status this object should carry given what is observed right now (plus the
    autoscaler's fields, see compute_status)."""
    owner = owner_of(body)
    spec = LLMServiceSpec.from_dict(body["spec"])
    verdict = checks(owner, spec, options)
    return compute_status(
        generation=int(body["metadata"].get("generation", 1)),
        desired_replicas=spec.replicas,
        fit=verdict.fit,
        support=verdict.support,
        deployment=deployment,
        pods=list(pods),
        previous=body.get("status"),
        now=now(),
        selector=r.selector_string(owner.name),
        endpoint=r.endpoint(owner),
        extra=extra,
        extra_conditions=extra_conditions,
    )


# Which condition changes deserve an Event, and of which type.
EVENTFUL = {
    (READY, "True"): "Normal",
    (DEGRADED, "True"): "Warning",
    (DEGRADED, "False"): "Normal",
    (CAPACITY_PENDING, "True"): "Warning",
    (CAPACITY_PENDING, "False"): "Normal",
}


def emit_transitions(update: StatusUpdate, emit: Emit) -> None:
    for t in update.transitions:
        kind = EVENTFUL.get((t.type, t.status))
        if kind is not None and (t.status == "True" or t.previous == "True"):
            reason = t.type if t.status == "True" else f"{t.type}Resolved"
            emit(kind, reason, t.message)
