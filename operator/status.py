"""What the LLMService status should say, from what the operator observed. Pure.

Conditions follow the Kubernetes API conventions (type, status, reason, message,
lastTransitionTime, observedGeneration) and each message tells the user what is going on
in words: how many replicas are ready, which pod is crash-looping, or the scheduler's own
"0/3 nodes are available: 3 Insufficient nvidia.com/gpu" copied from a Pending pod, so a
user sees at once that the cluster autoscaler is needed (or already working).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmservice.operator.engine_support import SUPPORTED, EngineSupport
from llmservice.operator.vram import FitResult

READY, PROGRESSING, VRAM_FIT, DEGRADED, CAPACITY_PENDING = (
    "Ready",
    "Progressing",
    "VRAMFit",
    "Degraded",
    "CapacityPending",
)
CONDITION_ORDER = (READY, PROGRESSING, VRAM_FIT, DEGRADED, CAPACITY_PENDING)
FAILING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "OOMKilled",
        "Error",
    }
)


@dataclass(frozen=True)
class PodView:
    name: str
    phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    unschedulable: str | None = None  # the scheduler's message when Unschedulable
    failing: str | None = None  # "CrashLoopBackOff: back-off 5m0s ..." when failing
    restarts: int = 0


@dataclass(frozen=True)
class DeploymentView:
    generation: int = 0
    observed_generation: int = 0
    spec_replicas: int = 0
    replicas: int = 0
    updated_replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0


@dataclass(frozen=True)
class Transition:
    """A condition that changed status: worth an Event."""

    type: str
    status: str
    reason: str
    message: str
    previous: str | None = None  # the status before, None for a new condition


@dataclass(frozen=True)
class StatusUpdate:
    status: dict[str, Any]
    transitions: list[Transition] = field(default_factory=list)


def pod_view(body: dict[str, Any]) -> PodView:
    """Summarise a Pod object into the few facts the conditions use."""
    meta, status = body.get("metadata", {}), body.get("status", {}) or {}
    conditions = {c.get("type"): c for c in status.get("conditions", []) or []}
    scheduled = conditions.get("PodScheduled", {})
    unschedulable = None
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = scheduled.get("message") or "Unschedulable"
    failing = None
    restarts = 0
    for cs in status.get("containerStatuses", []) or []:
        restarts += int(cs.get("restartCount", 0))
        waiting = (cs.get("state") or {}).get("waiting") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        reason = waiting.get("reason")
        if reason in FAILING_REASONS:
            detail = waiting.get("message") or last.get("reason") or ""
            failing = f"{reason}: {detail}".rstrip(": ")
    if status.get("phase") == "Failed":
        failing = failing or f"Failed: {status.get('reason') or status.get('message') or ''}"
    return PodView(
        name=meta.get("name", ""),
        phase=status.get("phase", "Pending"),
        ready=conditions.get("Ready", {}).get("status") == "True",
        terminating=bool(meta.get("deletionTimestamp")),
        unschedulable=unschedulable,
        failing=failing.rstrip(": ") if failing else None,
        restarts=restarts,
    )


def deployment_view(body: dict[str, Any]) -> DeploymentView:
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
    return DeploymentView(
        generation=int(meta.get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        spec_replicas=int(spec.get("replicas", 1)),
        replicas=int(status.get("replicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        available_replicas=int(status.get("availableReplicas", 0)),
    )


def _condition(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def _vram_condition(fit: FitResult) -> dict[str, str]:
    return _condition(VRAM_FIT, fit.status, fit.reason, fit.message)


def _capacity_condition(pods: list[PodView]) -> dict[str, str]:
    pending = [p for p in pods if p.unschedulable and not p.terminating]
    if not pending:
        return _condition(CAPACITY_PENDING, "False", "AllPodsScheduled", "every pod has a node")
    messages = sorted({p.unschedulable or "" for p in pending})
    return _condition(
        CAPACITY_PENDING,
        "True",
        "Unschedulable",
        f"{len(pending)} pod(s) cannot be scheduled: {'; '.join(messages)} "
        "(a cluster autoscaler can add nodes; the pods start when capacity appears)",
    )


def _degraded_condition(pods: list[PodView]) -> dict[str, str]:
    failing = [p for p in pods if p.failing and not p.terminating]
    if not failing:
        return _condition(DEGRADED, "False", "AsExpected", "no pod is failing")
    reason = (failing[0].failing or "Failing").split(":")[0]
    details = "; ".join(f"pod {p.name}: {p.failing}" for p in failing)
    return _condition(DEGRADED, "True", reason, f"{len(failing)} pod(s) failing: {details}")


def _progress(
    desired: int,
    fit: FitResult,
    deployment: DeploymentView | None,
    support: EngineSupport = SUPPORTED,
) -> tuple[dict[str, str], dict[str, str]]:
    """Progressing and Ready together: both read the rollout's numbers."""
    if deployment is None:
        if support.refuses_rollout:
            return (
                _condition(
                    PROGRESSING,
                    "False",
                    "RolloutBlocked",
                    "not rolled out: the server cannot run this spec (see Ready)",
                ),
                _condition(READY, "False", support.reason, support.message),
            )
        if fit.refuses_rollout:
            blocked = "not rolled out: the model does not fit the GPUs (see VRAMFit)"
            return (
                _condition(PROGRESSING, "False", "RolloutBlocked", blocked),
                _condition(READY, "False", "VRAMDoesNotFit", blocked),
            )
        creating = "creating the Deployment"
        return (
            _condition(PROGRESSING, "True", "Creating", creating),
            _condition(READY, "False", "Creating", creating),
        )
    d = deployment
    counts = f"{d.ready_replicas}/{desired} replicas ready, {d.updated_replicas}/{desired} updated"
    rolling = (
        d.observed_generation < d.generation
        or d.spec_replicas != desired
        or d.updated_replicas < desired
        or d.ready_replicas < desired
        or d.replicas > desired
    )
    if support.refuses_rollout:
        progressing = _condition(
            PROGRESSING,
            "False",
            "RolloutBlocked",
            f"the server cannot run the new spec ({support.message}); "
            f"still serving the previous one: {counts}",
        )
    elif fit.refuses_rollout:
        progressing = _condition(
            PROGRESSING,
            "False",
            "RolloutBlocked",
            f"the new spec does not fit the GPUs (see VRAMFit); still serving the previous one: {counts}",
        )
    elif rolling:
        progressing = _condition(PROGRESSING, "True", "RollingOut", counts)
    else:
        progressing = _condition(PROGRESSING, "False", "RolloutComplete", counts)
    if desired == 0:
        ready = _condition(READY, "False", "ScaledToZero", "replicas is 0")
    elif d.ready_replicas >= desired:
        ready = _condition(READY, "True", "AllReplicasReady", counts)
    elif d.ready_replicas > 0:
        ready = _condition(READY, "False", "PartiallyReady", counts)
    else:
        ready = _condition(READY, "False", "NoReplicasReady", counts)
    return progressing, ready


def merge_conditions(
    previous: list[dict[str, Any]], current: list[dict[str, str]], generation: int, now: str
) -> tuple[list[dict[str, Any]], list[Transition]]:
    """Keep lastTransitionTime when a condition's status did not change; list the changes."""
    before = {c.get("type"): c for c in previous or []}
    merged: list[dict[str, Any]] = []
    transitions: list[Transition] = []
    for cond in current:
        old = before.get(cond["type"])
        changed = old is None or old.get("status") != cond["status"]
        merged.append(
            {
                **cond,
                "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
                "observedGeneration": generation,
            }
        )
        if changed:
            transitions.append(
                Transition(
                    cond["type"],
                    cond["status"],
                    cond["reason"],
                    cond["message"],
                    previous=old.get("status") if old else None,
                )
            )
    return merged, transitions


def compute_status(
    *,
    generation: int,
    desired_replicas: int,
    fit: FitResult,
    deployment: DeploymentView | None,
    pods: list[PodView],
    previous: dict[str, Any] | None,
    now: str,
    selector: str,
    endpoint: str,
    extra: dict[str, Any] | None = None,
    extra_conditions: list[dict[str, str]] | None = None,
    support: EngineSupport = SUPPORTED,
) -> StatusUpdate:
    """The status the object should have now, and the condition changes since `previous`.

    `extra` and `extra_conditions` are fields owned by another loop (the autoscaler's
    signals and ScalingActive); they go out in the same write, since a merge patch replaces
    the whole conditions list. A condition of a type computed by nobody here (e.g.
    ScalingActive right after an operator restart) is carried over unchanged.
    """
    previous = previous or {}
    progressing, ready = _progress(desired_replicas, fit, deployment, support)
    current = {
        READY: ready,
        PROGRESSING: progressing,
        VRAM_FIT: _vram_condition(fit),
        DEGRADED: _degraded_condition(pods),
        CAPACITY_PENDING: _capacity_condition(pods),
    }
    computed = [current[t] for t in CONDITION_ORDER] + list(extra_conditions or [])
    conditions, transitions = merge_conditions(
        previous.get("conditions", []), computed, generation, now
    )
    known = {c["type"] for c in computed}
    conditions += [c for c in previous.get("conditions") or [] if c.get("type") not in known]
    status: dict[str, Any] = {
        "replicas": deployment.replicas if deployment else 0,
        "readyReplicas": deployment.ready_replicas if deployment else 0,
        "selector": selector,
        "endpoint": endpoint,
        "conditions": conditions,
        "memoryPlan": fit.plan.as_status() if fit.plan else None,
        **(extra or {}),
    }
    return StatusUpdate(status=status, transitions=transitions)


def changed_fields(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The part of `new` that differs from `old` (a merge patch); {} when nothing changed."""
    old = old or {}
    return {k: v for k, v in new.items() if old.get(k) != v}
