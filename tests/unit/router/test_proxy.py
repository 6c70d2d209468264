"""The proxy with fake pods: streams through untouched, retries a refused connection,
holds requests at zero pods (bounded, timed out with 504), and drains."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from llmservice.router.endpoints import Endpoint
from llmservice.router.proxy import Router, RouterConfig

from tests.unit.router.fake_pods import FakePod, free_port

CHAT = {"model": "m", "stream": True, "messages": [{"role": "system", "content": "S" * 400},
                                                   {"role": "user", "content": "hi"}]}  # fmt: skip


async def with_router(
    config: RouterConfig, pods: list[FakePod], body: Callable[[Router, str], Awaitable[Any]]
) -> Any:
    for pod in pods:
        await pod.start()
    router = Router(config)
    router.pool.update({p.name: Endpoint(p.name, p.url) for p in pods})
    runner = web.AppRunner(router.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        return await body(router, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
        for pod in pods:
            await pod.stop()


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_streams_sse_through_untouched_and_sticks_to_a_pod():
    pods = [FakePod("a", chunks=5), FakePod("b", chunks=5), FakePod("c", chunks=5)]

    async def body(router: Router, url: str) -> list[bytes]:
        out = []
        async with aiohttp.ClientSession() as s:
            for _ in range(6):
                async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                    assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
                    out.append(await r.read())
        return out

    bodies = run(with_router(RouterConfig(), pods, body))
    assert len(set(bodies)) == 1  # one pod answered every time (same prefix)
    events = bodies[0].decode().split("\n\n")
    assert [json.loads(e.removeprefix("data: "))["i"] for e in events[:5]] == [0, 1, 2, 3, 4]
    assert events[5] == "data: [DONE]"
    assert sorted(p.requests for p in pods) == [0, 0, 6]


def test_a_refused_connection_is_retried_once_on_another_pod():
    live = FakePod("live")
    dead_port = free_port()  # nothing listens there

    async def body(router: Router, url: str) -> tuple[int, str]:
        router.pool.update({"dead": Endpoint("dead", f"http://127.0.0.1:{dead_port}"),
                            "live": Endpoint("live", live.url)})  # fmt: skip
        statuses = []
        async with aiohttp.ClientSession() as s:
            for i in range(8):
                payload = {"model": "m", "prompt": f"prompt {i} " * 40}
                async with s.post(url + "/v1/completions", json=payload) as r:
                    statuses.append(r.status)
            async with s.get(url + "/metrics") as r:
                metrics = await r.text()
        return statuses, metrics

    statuses, metrics = run(with_router(RouterConfig(), [live], body))
    assert statuses == [200] * 8
    assert 'llmservice_router_routing_decisions_total{reason="retry"} 1.0' in metrics
    assert 'llmservice_router_requests_total{code="200",pod="live"} 8.0' in metrics


def test_held_at_zero_pods_then_answered_when_one_appears():
    pod = FakePod("late")

    async def body(router: Router, url: str) -> tuple[list[int], float]:
        router.pool.update({})
        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> int:
                async with s.post(
                    url + "/v1/completions", json={"model": "m", "prompt": f"p{i}"}
                ) as r:
                    await r.read()
                    return r.status

            tasks = [asyncio.create_task(one(i)) for i in range(20)]
            await asyncio.sleep(0.3)
            held = router.held
            router.pool.update({"late": Endpoint("late", pod.url)})
            return await asyncio.gather(*tasks), held

    statuses, held = run(with_router(RouterConfig(), [pod], body))
    assert held == 20 and statuses == [200] * 20


def test_past_max_held_503_with_retry_after_and_past_timeout_504():
    async def body(router: Router, url: str) -> list[tuple[int, str | None, str]]:
        router.pool.update({})
        async with aiohttp.ClientSession() as s:

            async def one() -> tuple[int, str | None, str]:
                async with s.post(url + "/v1/completions", json={"model": "m", "prompt": "p"}) as r:
                    return (
                        r.status,
                        r.headers.get("Retry-After"),
                        (await r.json())["error"]["message"],
                    )

            return await asyncio.gather(*(one() for _ in range(3)))

    config = RouterConfig(service="smollm2", max_held=2, hold_timeout_s=0.5)
    answers = sorted(run(with_router(config, [], body)))
    assert [a[0] for a in answers] == [503, 504, 504]
    assert answers[0][1] is not None and "maxHeldRequests" in answers[0][2]
    assert "smollm2 is starting" in answers[1][2] and "holdTimeoutSeconds" in answers[1][2]


def test_load_bound_spreads_a_hot_prefix():
    pods = [FakePod(n, chunks=2, delay_s=0.3) for n in "abc"]

    async def body(router: Router, url: str) -> None:
        async with aiohttp.ClientSession() as s:

            async def one() -> None:
                async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                    await r.read()

            await asyncio.gather(*(one() for _ in range(12)))

    run(with_router(RouterConfig(load_factor=1.25), pods, body))
    counts = sorted(p.requests for p in pods)
    assert sum(counts) == 12 and counts[0] > 0, counts  # no pod got all 12 at once
