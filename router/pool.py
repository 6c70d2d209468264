"""What the router knows about the pods right now: addresses, loads, recent failures.

Load of a pod = max(its own scraped `vllm:num_requests_running` + `num_requests_waiting`,
the requests this router has in flight to it). The scrape sees every router's traffic
(two routers need nothing shared); the local count covers the time between scrapes.
A pod that refused a connection is skipped for `FAILED_FOR_S` or until a scrape of it
succeeds again. `changed` wakes held requests whenever the set of pods changes.
LoRA adapters of a pod, likewise: those its scrape reports active, plus those of this
router's own requests in flight to it; the adapters it serves come from its /v1/models
and from every adapter seen active on it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from llmservice.router.endpoints import Endpoint
from llmservice.router.lora_info import LoraInfo
from llmservice.router.pod_load import PodLoad
from llmservice.router.routing import Choice, Ring, round_robin, route

FAILED_FOR_S = 5.0


class PodPool:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.endpoints: dict[str, Endpoint] = {}
        self.ring = Ring(())
        self.scraped: dict[str, float] = {}
        self.in_flight: dict[str, int] = {}
        self.failed_until: dict[str, float] = {}
        self.waiting: dict[str, float] = {}
        self.lora: dict[str, LoraInfo] = {}
        self.served: dict[str, frozenset[str]] = {}
        self.models_read_at: dict[str, float] = {}
        self.adapters_in_flight: dict[str, Counter[str]] = {}
        self._changed = asyncio.Event()
        self._rr = 0

    # --- membership --------------------------------------------------------------------

    def update(self, endpoints: dict[str, Endpoint]) -> None:
        """A new set of routable pods (from the EndpointSlice watch); call in the loop."""
        if endpoints == self.endpoints:
            return
        self.endpoints = dict(endpoints)
        if set(endpoints) != self.ring.pods:
            self.ring = Ring(endpoints)
        for table in (self.scraped, self.waiting, self.failed_until, self.lora, self.served,
                      self.models_read_at):  # fmt: skip
            for gone in [p for p in table if p not in endpoints]:
                del table[gone]
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout: float) -> None:
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass

    # --- health and load ---------------------------------------------------------------

    def mark_failed(self, pod: str) -> None:
        self.failed_until[pod] = self.clock() + FAILED_FOR_S

    def set_scraped(
        self, pod: str, load: float, lora: LoraInfo | None = None, waiting: float = 0.0
    ) -> None:
        if pod in self.endpoints:
            self.scraped[pod] = load
            self.waiting[pod] = waiting
            self.failed_until.pop(pod, None)
            if lora is None:
                self.lora.pop(pod, None)
                return
            info = lora.after(self.lora.get(pod))
            self.lora[pod] = info
            self.served[pod] = self.served.get(pod, frozenset()) | (info.active or frozenset())

    def set_served(self, pod: str, adapters: frozenset[str]) -> None:
        """The adapters the pod lists in /v1/models (with those seen active on it)."""
        if pod in self.endpoints:
            info = self.lora.get(pod)
            self.served[pod] = adapters | (info.active if info and info.active else frozenset())

    def models_due(self, pod: str, every_s: float) -> bool:
        """Whether to read the pod's /v1/models now (at most every `every_s`); marks it read."""
        now = self.clock()
        if now - self.models_read_at.get(pod, -every_s) < every_s:
            return False
        self.models_read_at[pod] = now
        return True

    def failed(self) -> set[str]:
        now = self.clock()
        return {p for p, until in self.failed_until.items() if until > now}

    def loads(self) -> dict[str, float]:
        return {
            p: max(self.scraped.get(p, 0.0), float(self.in_flight.get(p, 0)))
            for p in self.endpoints
        }

    def pod_loads(self) -> dict[str, PodLoad]:
        """Each pod's record for `routing.route`."""
        out = {}
        for pod, load in self.loads().items():
            info = self.lora.get(pod)
            active = (info.active if info and info.active else frozenset()) | frozenset(
                self.adapters_in_flight.get(pod, ())
            )
            out[pod] = PodLoad(
                requests=load,
                waiting=self.waiting.get(pod, 0.0),
                active_adapters=active,
                max_lora=info.max_lora if info else 0,
                served_adapters=self.served.get(pod, frozenset()) | active,
            )
        return out

    def started(self, pod: str, adapter: str | None = None) -> None:
        self.in_flight[pod] = self.in_flight.get(pod, 0) + 1
        if adapter:
            self.adapters_in_flight.setdefault(pod, Counter())[adapter] += 1

    def finished(self, pod: str, adapter: str | None = None) -> None:
        left = self.in_flight.get(pod, 1) - 1
        if left > 0:
            self.in_flight[pod] = left
        else:
            self.in_flight.pop(pod, None)
        adapters = self.adapters_in_flight.get(pod)
        if adapter and adapters is not None:
            adapters[adapter] -= 1
            if adapters[adapter] <= 0:
                del adapters[adapter]
            if not adapters:
                del self.adapters_in_flight[pod]

    # --- decisions ---------------------------------------------------------------------

    def pick(
        self,
        key: bytes | None,
        policy: str,
        load_factor: float,
        exclude: set[str] | frozenset[str] = frozenset(),
        model: str | None = None,
    ) -> Choice | None:
        """A pod for one request (`model`: its `model` field, for LoRA adapter affinity);
        pods that failed lately only when nothing else is left."""
        skip = self.failed() | set(exclude)
        if not set(self.endpoints) - skip:
            skip = set(exclude)  # every pod failed lately: try them anyway
        if policy == "round-robin":
            self._rr += 1
            return round_robin(self.endpoints, self._rr, skip)
        return route(self.ring, self.pod_loads(), model, key, load_factor, skip)
