"""Each pod's load from its own /metrics: running + waiting requests, every half second.

`parse_load` is pure and reads two gauges by line prefix (the whole exposition of a
server is a few hundred lines of histograms; a full parse per pod per tick is waste).
A pod that refuses the scrape is marked failed; a slow answer just keeps the old value.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from llmservice.router.pool import PodPool

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
INTERVAL_S = 0.5


def parse_load(text: str) -> float | None:
    """Sum of the two gauges over all their series; None if the pod reports neither."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line.startswith("vllm:num_requests_"):
            continue
        if line.split("{", 1)[0].split(" ", 1)[0] in GAUGES:
            with contextlib.suppress(ValueError, IndexError):
                total += float(line.rsplit(None, 1)[-1])
                seen = True
    return total if seen else None


async def scrape_once(
    session: aiohttp.ClientSession, pool: PodPool, timeout: float = INTERVAL_S
) -> None:
    async def one(pod: str, url: str) -> None:
        try:
            async with session.get(
                url + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as r:
                load = parse_load(await r.text()) if r.status == 200 else None
        except aiohttp.ClientConnectionError:
            pool.mark_failed(pod)
            return
        except (TimeoutError, aiohttp.ClientError):
            return
        if load is not None:
            pool.set_scraped(pod, load)

    await asyncio.gather(*(one(p, e.url) for p, e in list(pool.endpoints.items())))


async def scrape_forever(
    session: aiohttp.ClientSession, pool: PodPool, interval: float = INTERVAL_S
) -> None:
    while True:
        await scrape_once(session, pool)
        await asyncio.sleep(interval)
