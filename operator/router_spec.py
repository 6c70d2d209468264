"""`spec.router` as typed data, with the CRD's defaults and the "on by default" rule. Pure.

The router is on unless `router.enabled` says otherwise when the object can have no
replica (autoscaling with `minReplicas: 0`: something must hold requests) or more than
one (`replicas > 1`, or autoscaling up to `maxReplicas > 1`: prefix affinity pays).
"Can have", not "has now": a Service that switched between the router and the pods at
every autoscaling step would drop every pod's prefix affinity with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RouterSpec:
    enabled: bool = False
    replicas: int = 2
    policy: str = "prefix"
    load_factor: float = 1.25
    prefix_tokens: int = 256
    max_held_requests: int = 100
    hold_timeout_seconds: int = 300
    image: str | None = None
    cpu: str = "250m"
    memory: str = "256Mi"
    scale_from_zero: bool = False  # autoscaling on with minReplicas 0: a held request wakes it

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> RouterSpec:
        data = spec.get("router") or {}
        auto = spec.get("autoscaling") or {}
        d = cls()

        def get(key: str, default: Any) -> Any:
            value = data.get(key)
            return default if value is None else value

        autoscaled = bool(auto.get("enabled", False))
        to_zero = autoscaled and auto.get("minReplicas") == 0
        several = int(spec.get("replicas") or 1) > 1 or (
            autoscaled and int(auto.get("maxReplicas") or 4) > 1
        )
        enabled = data.get("enabled")
        return cls(
            enabled=(to_zero or several) if enabled is None else bool(enabled),
            replicas=int(get("replicas", d.replicas)),
            policy=str(get("policy", d.policy)),
            load_factor=float(get("loadFactor", d.load_factor)),
            prefix_tokens=int(get("prefixTokens", d.prefix_tokens)),
            max_held_requests=int(get("maxHeldRequests", d.max_held_requests)),
            hold_timeout_seconds=int(get("holdTimeoutSeconds", d.hold_timeout_seconds)),
            image=get("image", None) or None,
            cpu=str(get("cpu", d.cpu)),
            memory=str(get("memory", d.memory)),
            scale_from_zero=to_zero,
        )
