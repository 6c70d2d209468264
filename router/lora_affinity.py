"""Which pods to prefer for a request that names a LoRA adapter. Pure.

The Gateway API Inference Extension's "LoRA affinity" filter, made deterministic: prefer
the pods where the adapter is already active (running or waiting: its weights sit in a
slot), else the pods with a free slot (fewer active adapters than `max_lora`), else no
preference. Every other pod would have to evict an adapter to load this one; with a small
`--max-loras` that thrashes. The endpoint picker applies affinity only among pods that are
not queueing; likewise, when every pod holding the adapter has requests waiting (its
scheduler admits no more now) and some pod has a free slot, the free-slot pods are
preferred, so a hot adapter spreads to spare slots instead of queueing on one pod, and
no pod evicts for it while a slot is free. A model no pod knows as an adapter (the base
model, an unknown name) gets no preference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmservice.router.pod_load import PodLoad

IDLE = PodLoad()


@dataclass(frozen=True)
class Preference:
    pods: list[str]  # the pods to choose among, by the usual prefix / least-loaded rule
    active: bool  # the adapter is active on them (else: they have a free slot)


def is_adapter(model: str | None, pods: Sequence[str], loads: Mapping[str, PodLoad]) -> bool:
    """Whether some pod serves `model` as an adapter (lists it, or reports it active)."""
    if not model:
        return False
    return any(
        model in (s := loads.get(p, IDLE)).served_adapters or model in s.active_adapters
        for p in pods
    )


def prefer(
    pods: Sequence[str], loads: Mapping[str, PodLoad], model: str | None
) -> Preference | None:
    """The preferred subset of `pods` for `model`, or None for no preference."""
    if not pods or not is_adapter(model, pods, loads):
        return None
    load = {p: loads.get(p, IDLE) for p in pods}
    active = [p for p in pods if model in load[p].active_adapters]
    free = [p for p in pods if p not in active and load[p].has_free_slot]
    queueing = all(load[p].waiting > 0 for p in active)
    if active and not (free and queueing):
        return Preference(active, active=True)
    if free:
        return Preference(free, active=False)
    return None
