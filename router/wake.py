"""Scale from zero: a held request sets the LLMService's replicas from 0 to 1.

Through the scale subresource (`llmservices/scale`, get + patch on this one object:
the router's Role names it), so the router can change nothing but the replica count;
the operator then renders the Deployment as for any scale. It only ever writes when it
read 0, so two routers (or a router and the autoscaler) agree: writing 1 twice is the
same as once, and the autoscaler holds at 0 replicas only while nothing is waiting.
At most one attempt per `MIN_INTERVAL_S` while requests are held.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "llmservice.dev", "v1alpha1", "llmservices"
MIN_INTERVAL_S = 1.0


class Waker:
    def __init__(
        self, namespace: str, name: str, on_wake: Callable[[], None] = lambda: None
    ) -> None:
        self.namespace, self.name = namespace, name
        self.on_wake = on_wake
        self._last = -1e9
        self._task: asyncio.Task[None] | None = None
        self._api = None

    def poke(self) -> None:
        """Called while requests are held; starts a check unless one ran within a second."""
        now = time.monotonic()
        if (self._task is not None and not self._task.done()) or now - self._last < MIN_INTERVAL_S:
            return
        self._last = now
        self._task = asyncio.create_task(asyncio.to_thread(self._wake))

    def _wake(self) -> None:
        from kubernetes import client

        if self._api is None:
            self._api = client.CustomObjectsApi()
        try:
            scale = self._api.get_namespaced_custom_object_scale(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
            if int((scale.get("spec") or {}).get("replicas") or 0) != 0:
                return  # a pod is on its way (Pending, pulling, loading): keep waiting
            self._api.patch_namespaced_custom_object_scale(
                GROUP, VERSION, self.namespace, PLURAL, self.name, {"spec": {"replicas": 1}}
            )
            log.info("%s/%s: scaled from zero for a held request", self.namespace, self.name)
            self.on_wake()
        except Exception as exc:  # retried at the next poke
            log.warning("scale from zero of %s/%s failed: %s", self.namespace, self.name, exc)
