"""What the router knows about the pods right now: addresses, loads, recent failures.

Load of a pod = max(its own scraped `vllm:num_requests_running` + `num_requests_waiting`,
the requests this router has in flight to it). The scrape sees every router's traffic
(two routers need nothing shared); the local count covers the time between scrapes.
A pod that refused a connection is skipped for `FAILED_FOR_S` or until a scrape of it
succeeds again. `changed` wakes held requests whenever the set of pods changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from llmservice.router.endpoints import Endpoint
from llmservice.router.routing import Choice, Ring, choose, round_robin

FAILED_FOR_S = 5.0


class PodPool:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.endpoints: dict[str, Endpoint] = {}
        self.ring = Ring(())
        self.scraped: dict[str, float] = {}
        self.in_flight: dict[str, int] = {}
        self.failed_until: dict[str, float] = {}
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
        for table in (self.scraped, self.failed_until):
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

    def set_scraped(self, pod: str, load: float) -> None:
        if pod in self.endpoints:
            self.scraped[pod] = load
            self.failed_until.pop(pod, None)

    def failed(self) -> set[str]:
        now = self.clock()
        return {p for p, until in self.failed_until.items() if until > now}

    def loads(self) -> dict[str, float]:
        return {
            p: max(self.scraped.get(p, 0.0), float(self.in_flight.get(p, 0)))
            for p in self.endpoints
        }

    def started(self, pod: str) -> None:
        self.in_flight[pod] = self.in_flight.get(pod, 0) + 1

    def finished(self, pod: str) -> None:
        left = self.in_flight.get(pod, 1) - 1
        if left > 0:
            self.in_flight[pod] = left
        else:
            self.in_flight.pop(pod, None)

    # --- decisions ---------------------------------------------------------------------

    def pick(
        self,
        key: bytes | None,
        policy: str,
        load_factor: float,
        exclude: set[str] | frozenset[str] = frozenset(),
    ) -> Choice | None:
        """A pod for one request; pods that failed lately only when nothing else is left."""
        skip = self.failed() | set(exclude)
        if not set(self.endpoints) - skip:
            skip = set(exclude)  # every pod failed lately: try them anyway
        if policy == "round-robin":
            self._rr += 1
            return round_robin(self.endpoints, self._rr, skip)
        return choose(self.ring, key, self.loads(), load_factor, skip)
