"""What to load and unload in one pod, and what status that adds up to. Pure.

A pod's adapters are what its `GET /v1/models` lists with a non-null `parent` (vLLM's
shape; `root` is the path it was loaded from). The desired ones are spec.adapters, each
with the `lora_path` the operator sends (adapter_spec.served_path). An adapter whose root
differs from the desired path (its source changed) is unloaded and loaded again; one the
spec no longer lists is unloaded. No memory of earlier passes is needed: a pod that
restarted lists nothing and gets everything again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from llmservice.operator.adapter_spec import AdapterSpec

ADAPTERS_READY = "AdaptersReady"
ALL_LOADED = "AllAdaptersLoaded"
LOADING = "AdaptersLoading"
LOAD_FAILED = "AdapterLoadFailed"


def loaded_adapters(models: dict[str, Any]) -> dict[str, str]:
    """{adapter name: root} from a `GET /v1/models` answer (the base models have no parent)."""
    return {
        m["id"]: str(m.get("root") or "")
        for m in models.get("data") or []
        if isinstance(m, dict) and m.get("parent") is not None and "id" in m
    }


@dataclass(frozen=True)
class AdapterPlan:
    unload: tuple[str, ...] = ()
    load: tuple[tuple[str, str], ...] = ()  # (name, lora_path), unloads first

    @property
    def empty(self) -> bool:
        return not self.unload and not self.load


def plan_adapters(desired: dict[str, str], loaded: dict[str, str]) -> AdapterPlan:
    """The calls that make `loaded` equal `desired` (both name -> path)."""
    unload = tuple(sorted(n for n, root in loaded.items() if desired.get(n) != root))
    load = tuple(sorted((n, p) for n, p in desired.items() if loaded.get(n) != p))
    return AdapterPlan(unload, load)


@dataclass(frozen=True)
class PodAdapters:
    """One pod after a sync pass: what it serves now, and why any load was refused."""

    pod: str
    loaded: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # adapter name -> the server's message
    unreachable: str | None = None  # GET /v1/models failed: nothing is known of this pod


def adapters_status(
    adapters: Iterable[AdapterSpec], desired: dict[str, str], pods: list[PodAdapters]
) -> list[dict[str, Any]]:
    """status.adapters: per adapter, the ready pods that serve it from the desired path."""
    out = []
    for a in adapters:
        entry: dict[str, Any] = {
            "name": a.name,
            "source": a.source,
            "loadedReplicas": sum(1 for p in pods if p.loaded.get(a.name) == desired[a.name]),
        }
        errors = [p.errors[a.name] for p in pods if a.name in p.errors]
        if errors:
            entry["error"] = errors[0][:1024]
        out.append(entry)
    return out


def adapters_condition(
    adapters: Iterable[AdapterSpec], desired: dict[str, str], pods: list[PodAdapters]
) -> dict[str, str]:
    """AdaptersReady: True when every ready pod serves every adapter; False naming the
    refused adapters and the server's message, or what is still loading."""
    names = [a.name for a in adapters]
    failed = {}
    for p in pods:
        for name, message in p.errors.items():
            failed.setdefault(name, f"adapter {name} on pod {p.pod}: {message}")
    if failed:
        return _condition("False", LOAD_FAILED, "; ".join(failed[n] for n in names if n in failed))
    missing = [n for n in names if any(p.loaded.get(n) != desired[n] for p in pods)]
    unreachable = [f"{p.pod}: {p.unreachable}" for p in pods if p.unreachable]
    if unreachable:
        return _condition("False", LOADING, "cannot list the adapters of " + "; ".join(unreachable))
    if missing or not pods:
        where = f"on {len(pods)} ready pods" if pods else "(no pod is ready yet)"
        return _condition("False", LOADING, f"not yet loaded {where}: {', '.join(missing or names)}")
    return _condition("True", ALL_LOADED, f"{len(names)} adapters loaded on {len(pods)} ready pods: {', '.join(names)}")


def _condition(status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": ADAPTERS_READY, "status": status, "reason": reason, "message": message[:1024]}
