"""Is the LeaderWorkerSet API there for a multi-node vLLM replica, and how is it doing?

A replica past one node (spec.multi_node) is a LeaderWorkerSet, a CRD the cluster may
lack. The reconciler asks discovery before it renders one and records the answer here;
the pure `checks()` (reconcile.py) reads it, so every status written for the object says
Ready=False, reason LeaderWorkerSetMissing, with the install command, until the CRD is
installed (the next reconcile of the object, e.g. any edit or an operator restart, sees
it). Nothing is recorded before the first probe: offline rendering (template.py) assumes
the API is there.
"""

from __future__ import annotations

import threading
from typing import Any

from llmservice.operator.engine_support import SUPPORTED, EngineSupport
from llmservice.operator.kube import path_for
from llmservice.operator.render_lws import LWS_API_VERSION, LWS_INSTALL, LWS_PLURAL
from llmservice.operator.status import DeploymentView

LWS_MISSING = "LeaderWorkerSetMissing"

_lock = threading.Lock()
_installed: bool | None = None  # None: never probed in this process


def record(installed: bool) -> None:
    global _installed
    with _lock:
        _installed = installed


def probe(kube: Any) -> bool:
    """Discovery through the operator's Kube client; the answer is recorded."""
    installed = bool(kube.has_resource(LWS_API_VERSION, LWS_PLURAL))
    record(installed)
    return installed


def support() -> EngineSupport:
    """The verdict for a multi-node spec: SUPPORTED unless discovery said the API is absent."""
    with _lock:
        missing = _installed is False
    if not missing:
        return SUPPORTED
    return EngineSupport(
        False,
        "engine.tensorParallelSize x engine.pipelineParallelSize is more than "
        "resources.gpu.perNode, so each replica is a LeaderWorkerSet, and the "
        f"{LWS_API_VERSION} API is not installed in this cluster; install it with: "
        f"{LWS_INSTALL}",
        reason=LWS_MISSING,
    )


def delete_leftover(kube: Any, namespace: str, name: str) -> bool:
    """A vllm object back within one node: its replicas are a Deployment again, so the
    LeaderWorkerSet of its multi-node days goes (the garbage collector takes its pods).
    True if there was one. No request where discovery said the API is absent."""
    with _lock:
        missing = _installed is False
    if missing:
        return False
    return kube.delete(path_for(LWS_API_VERSION, LWS_PLURAL, namespace, name)) is not None


def lws_view(body: dict[str, Any]) -> DeploymentView:
    """A LeaderWorkerSet's numbers as the status code reads a Deployment's (counted in
    groups). LWS has no status.observedGeneration: the object's generation stands in."""
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
    generation = int(meta.get("generation", 0))
    return DeploymentView(
        generation=generation,
        observed_generation=generation,
        spec_replicas=int(spec.get("replicas", 1)),
        replicas=int(status.get("replicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        available_replicas=int(status.get("readyReplicas", 0)),
    )
