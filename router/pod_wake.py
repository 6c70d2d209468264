"""Wake a sleeping pod: the request that finds it asleep waits for its wake-up, then runs.

With `spec.autoscaling.scaleToZero: sleep` the operator puts idle pods to sleep
(`POST /sleep?level=1`) instead of deleting them (docs/cold-start.md). A sleeping server
answers a generation request 503 with the `llmservice-asleep` header; the router then
calls `POST /wake_up` on that pod and sends the request again. However many requests
find the pod asleep at once, the pod gets one wake-up call: they all wait on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import aiohttp

log = logging.getLogger(__name__)

ASLEEP_HEADER = "llmservice-asleep"  # set by the server on its 503 while asleep
WAKE_TIMEOUT_S = 300.0  # a level-2 wake reloads the weights from disk


def is_asleep(status: int, headers: Mapping[str, str]) -> bool:
    """Is this upstream answer a sleeping server's refusal (not an overload 503)?"""
    return status == 503 and ASLEEP_HEADER in headers


class PodWaker:
    """One `POST /wake_up` per pod and sleep, shared by every request that found it asleep.

    A request that saw the pod asleep before the last wake-up of that pod completed is
    covered by it: only a 503 seen after a completed wake-up means the pod slept again.
    """

    def __init__(
        self, on_woken: Callable[[str], None] = lambda pod: None, timeout_s: float = WAKE_TIMEOUT_S
    ) -> None:
        self.on_woken = on_woken
        self.timeout_s = timeout_s
        self._waking: dict[str, asyncio.Task[bool]] = {}
        self._woken_at: dict[str, float] = {}

    async def wake(
        self,
        session: aiohttp.ClientSession,
        pod: str,
        base_url: str,
        headers: Mapping[str, str],
        asleep_seen_at: float,
    ) -> bool:
        """True once the pod is awake; False if the wake-up failed (logged).
        `asleep_seen_at`: when (time.monotonic()) the request got the pod's asleep answer."""
        task = self._waking.get(pod)
        if task is None or task.done():
            if self._woken_at.get(pod, -1.0) >= asleep_seen_at:
                return True
            task = asyncio.ensure_future(self._call(session, pod, base_url, dict(headers)))
            self._waking[pod] = task
        return await asyncio.shield(task)

    async def _call(
        self, session: aiohttp.ClientSession, pod: str, base_url: str, headers: dict[str, str]
    ) -> bool:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with session.post(base_url + "/wake_up", headers=headers, timeout=timeout) as r:
                if r.status == 200:
                    self._woken_at[pod] = time.monotonic()
                    log.info("woke pod %s", pod)
                    self.on_woken(pod)
                    return True
                log.warning("wake-up of pod %s answered %d: %s", pod, r.status, await r.text())
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("wake-up of pod %s failed: %r", pod, exc)
        return False
