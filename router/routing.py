"""Which pod serves a request: consistent hashing with bounded load (CHWBL). Pure.

Each pod owns `VNODES` points on a hash ring; a request's prefix key hashes to a point
and the first pod clockwise owns it, so every request that starts with the same system
prompt lands on the pod that already holds that prefix in its KV cache, and a pod that
comes or goes moves only its own share of keys (KubeAI's CHWBL, Mirrokni et al. 2016).
The load bound keeps a hot prefix from piling onto one pod: when the owner's load + 1
is above ceil(`load_factor` x the mean load) (this request counted), the request goes to the
least-loaded pod instead, ties broken in ring order from the key so a spilled prefix
keeps going to the same second pod. Two routers that see the same pods and loads make
the same choice: there is no state to share.

`route` is the whole decision for one request: a request that names a LoRA adapter is
first narrowed to the pods that hold it or have a free slot (router/lora_affinity.py),
then the ring and the bound choose among those.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from llmservice.router.lora_affinity import is_adapter, prefer
from llmservice.router.pod_load import PodLoad

VNODES = 64  # points per pod: keys spread within a few % of even with 3+ pods

# Routing decision reasons (the llmservice_router_routing_decisions_total label)
PREFIX = "prefix"  # the key's owner on the ring, under the load bound
SPILL = "least-loaded"  # the owner was above the bound
NO_KEY = "no-prefix"  # nothing to hash (no prompt): least-loaded
ROUND_ROBIN = "round-robin"  # --policy round-robin (the baseline)
RETRY = "retry"  # a connection error before the first byte: another pod
LORA_AFFINITY = "lora-affinity"  # the request's adapter is active on the chosen pod
LORA_SLOT = "lora-slot"  # the chosen pod has a free adapter slot (the adapter is not active)


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Choice:
    pod: str
    reason: str
    adapter: str | None = None  # the request's LoRA adapter, when its model is one


class Ring:
    """The hash ring of a set of pod names (rebuilt when the set changes)."""

    def __init__(self, pods: Iterable[str], vnodes: int = VNODES) -> None:
        self.pods = frozenset(pods)
        points = sorted(
            (hash64(f"{pod}#{i}".encode()), pod) for pod in self.pods for i in range(vnodes)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [p for _, p in points]

    def walk(self, key_hash: int) -> Iterator[str]:
        """Every pod once, clockwise from `key_hash`."""
        if not self._owners:
            return
        start = bisect.bisect_left(self._hashes, key_hash)
        seen: set[str] = set()
        n = len(self._owners)
        for i in range(n):
            pod = self._owners[(start + i) % n]
            if pod not in seen:
                seen.add(pod)
                yield pod
                if len(seen) == len(self.pods):
                    return


def choose(
    ring: Ring,
    key: bytes | None,
    loads: Mapping[str, float],
    load_factor: float,
    exclude: Iterable[str] = (),
) -> Choice | None:
    """The pod for one request, or None when no pod of the ring is left after `exclude`.

    `loads` holds each pod's requests in flight (running + waiting); a pod missing from
    it counts as idle. `exclude`: pods that failed (a connection error, a failed scrape).
    """
    skip = set(exclude)
    order = [p for p in ring.walk(hash64(key or b"")) if p not in skip]
    if not order:
        return None
    load = {p: max(0.0, float(loads.get(p, 0.0))) for p in order}
    if key is None:
        return Choice(_least_loaded(order, load), NO_KEY)
    # KubeAI's bound: ceil(c x mean), the mean counting this request (an idle set fits 1).
    bound = math.ceil(load_factor * (sum(load.values()) + 1) / len(order) - 1e-9)
    owner = order[0]
    if load[owner] + 1 <= bound:
        return Choice(owner, PREFIX)
    return Choice(_least_loaded(order, load), SPILL)


def route(
    pods: Ring | Iterable[str],
    loads: Mapping[str, PodLoad],
    model: str | None,
    key: bytes | None,
    load_factor: float,
    exclude: Iterable[str] = (),
) -> Choice | None:
    """The pod for one request: LoRA adapter affinity first, then `choose` within it.

    `model`: the request's `model` field; `key`: its prefix key. A pod missing from
    `loads` counts as idle with no adapters. The base model and names no pod serves as an
    adapter are routed by `choose` alone.
    """
    ring = pods if isinstance(pods, Ring) else Ring(pods)
    skip = set(exclude)
    live = sorted(p for p in ring.pods if p not in skip)
    requests = {p: s.requests for p, s in loads.items()}
    adapter = model if is_adapter(model, live, loads) else None
    preferred = prefer(live, loads, adapter)
    if preferred is None:
        choice = choose(ring, key, requests, load_factor, skip)
        return Choice(choice.pod, choice.reason, adapter) if choice is not None else None
    outside = set(live) - set(preferred.pods)
    choice = choose(ring, key, requests, load_factor, skip | outside)
    assert choice is not None  # `preferred.pods` is a non-empty subset of `live`
    return Choice(choice.pod, LORA_AFFINITY if preferred.active else LORA_SLOT, adapter)


def _least_loaded(order: list[str], load: Mapping[str, float]) -> str:
    """Lowest load; ties in ring order (`min` keeps the first of equal keys)."""
    return min(order, key=lambda p: load[p])


def round_robin(pods: Iterable[str], counter: int, exclude: Iterable[str] = ()) -> Choice | None:
    """The baseline a plain Service gives: the next pod in name order."""
    skip = set(exclude)
    order = sorted(p for p in pods if p not in skip)
    if not order:
        return None
    return Choice(order[counter % len(order)], ROUND_ROBIN)
