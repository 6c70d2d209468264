"""Put idle pods to sleep (`scaleToZero: sleep`): POST /sleep?level=1 to each, concurrently.

Level 1 frees the KV cache and moves the weights to host memory: the GPU memory goes back
to the node while the pod, its image and its loaded weights stay, so waking is a copy back
instead of a cold start (docs/cold-start.md). The sleep call answers once the pod's running
requests have finished; a request that arrives meanwhile gets 503 + llmservice-asleep and
the router wakes the pod again (router/pod_wake.py).
"""

from __future__ import annotations

import asyncio

import httpx
from llmservice.operator.scrape import PodTarget

SLEEP_LEVEL = 1
SLEEP_TIMEOUT_S = 60.0  # running requests finish first


async def sleep_pod(client: httpx.AsyncClient, target: PodTarget, api_key: str | None) -> str | None:
    """None once the pod sleeps, else what went wrong (for an Event)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"http://{target.ip}:{target.port}/sleep"
    try:
        r = await client.post(url, params={"level": SLEEP_LEVEL}, headers=headers, timeout=SLEEP_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"{target.name}: POST /sleep failed: {type(exc).__name__} {exc}".strip()
    if r.status_code != 200:
        return f"{target.name}: POST /sleep answered {r.status_code}: {r.text[:300]}"
    return None


async def sleep_pods(
    client: httpx.AsyncClient, targets: list[PodTarget], api_key: str | None
) -> list[str]:
    """Every target put to sleep at once; the problems, one line per pod that refused."""
    answers = await asyncio.gather(*(sleep_pod(client, t, api_key) for t in targets))
    return [a for a in answers if a is not None]
