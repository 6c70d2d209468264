"""Each pod's load from its own /metrics: running + waiting requests, every half second.

`parse_load` is pure and reads two gauges by line prefix (the whole exposition of a
server is a few hundred lines of histograms; a full parse per pod per tick is waste).
The same text gives the pod's LoRA state (`vllm:lora_requests_info`: active adapters and
slots, router/lora_info.py); a pod that exports it also has its /v1/models read every
`MODELS_EVERY_S`, for the names it serves as adapters. A pod without the gauge holds no
adapter and no slot. A pod that refuses the scrape is marked failed; a slow answer just
keeps the old value.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from llmservice.router.lora_info import adapter_names, parse_lora_info
from llmservice.router.pool import PodPool

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
INTERVAL_S = 0.5
MODELS_EVERY_S = 5.0  # adapters are loaded and unloaded rarely; slots change every step


def parse_requests(text: str) -> tuple[float, float] | None:
    """(running, waiting) over all their series; None if the pod reports neither."""
    sums, seen = [0.0, 0.0], False
    for line in text.splitlines():
        if not line.startswith("vllm:num_requests_"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in GAUGES:
            with contextlib.suppress(ValueError, IndexError):
                sums[GAUGES.index(name)] += float(line.rsplit(None, 1)[-1])
                seen = True
    return (sums[0], sums[1]) if seen else None


def parse_load(text: str) -> float | None:
    """Running + waiting requests; None if the pod reports neither."""
    requests = parse_requests(text)
    return sum(requests) if requests is not None else None


async def scrape_once(
    session: aiohttp.ClientSession, pool: PodPool, timeout: float = INTERVAL_S
) -> None:
    async def one(pod: str, url: str) -> None:
        try:
            async with session.get(
                url + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as r:
                text = await r.text() if r.status == 200 else ""
        except aiohttp.ClientConnectionError:
            pool.mark_failed(pod)
            return
        except (TimeoutError, aiohttp.ClientError):
            return
        requests = parse_requests(text)
        if requests is None:
            return
        lora = parse_lora_info(text)
        pool.set_scraped(pod, sum(requests), lora, waiting=requests[1])
        if lora is not None and pool.models_due(pod, MODELS_EVERY_S):
            await read_adapters(session, pool, pod, url, timeout)

    await asyncio.gather(*(one(p, e.url) for p, e in list(pool.endpoints.items())))


async def read_adapters(
    session: aiohttp.ClientSession, pool: PodPool, pod: str, url: str, timeout: float
) -> None:
    """The adapters the pod serves, from /v1/models (a pod behind `--api-key` answers 401:
    then only the adapters seen active on it are known)."""
    try:
        async with session.get(
            url + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout)
        ) as r:
            if r.status != 200:
                return
            models = await r.json(content_type=None)
    except (TimeoutError, ValueError, aiohttp.ClientError):
        return
    pool.set_served(pod, adapter_names(models))


async def scrape_forever(
    session: aiohttp.ClientSession, pool: PodPool, interval: float = INTERVAL_S
) -> None:
    while True:
        await scrape_once(session, pool)
        await asyncio.sleep(interval)
