"""Are the Gateway API Inference Extension APIs there for `spec.gateway.inferencePool`?

As for a LeaderWorkerSet (lws_support.py): the reconciler asks discovery before it
renders an InferencePool and records the answer; the pure `checks()` (reconcile.py)
reads it, so the object says Ready=False, reason InferencePoolMissing, with the install
command (and a Warning Event), until the CRDs are installed. A pool member that is not
in its pool would take no gateway traffic while looking healthy, so the rollout waits.
Nothing is recorded before the first probe: offline rendering assumes the APIs are there.
"""

from __future__ import annotations

import threading
from typing import Any

from llmservice.operator.engine_support import SUPPORTED, EngineSupport
from llmservice.operator.render_gateway import (
    GIE_INSTALL,
    OBJECTIVE_API_VERSION,
    OBJECTIVE_PLURAL,
    POOL_API_VERSION,
    POOL_PLURAL,
)

POOL_MISSING = "InferencePoolMissing"

_lock = threading.Lock()
_missing: tuple[str, ...] | None = None  # None: never probed in this process


def record(missing: tuple[str, ...]) -> None:
    global _missing
    with _lock:
        _missing = missing


def probe(kube: Any) -> tuple[str, ...]:
    """Discovery through the operator's Kube client; the missing APIs are recorded."""
    wanted = ((POOL_API_VERSION, POOL_PLURAL), (OBJECTIVE_API_VERSION, OBJECTIVE_PLURAL))
    missing = tuple(f"{plural}.{api}" for api, plural in wanted if not kube.has_resource(api, plural))
    record(missing)
    return missing


def support() -> EngineSupport:
    """The verdict for a pool member: SUPPORTED unless discovery found an API absent."""
    with _lock:
        missing = _missing or ()
    if not missing:
        return SUPPORTED
    return EngineSupport(
        False,
        f"spec.gateway.inferencePool is true and {', '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not installed in this cluster; install the "
        f"Gateway API Inference Extension CRDs with: {GIE_INSTALL}",
        reason=POOL_MISSING,
    )
