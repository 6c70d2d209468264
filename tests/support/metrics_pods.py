"""Fake pods that serve scripted vLLM `/metrics`, for the autoscaler's integration tests.

The fake kubelet (mode "ready") gives every pod an IP 127.x.y.z and marks it Ready; this
serves `GET /metrics` on that IP and the pod's port, with values a test sets per LLMService
or per pod: KV usage, waiting requests, a preemption counter that grows at a scripted rate
per minute (so the operator computes a realistic rate from counter deltas), and failure
modes (`error`: HTTP 500, `hang`: answers after 30 s, `garbage`: not Prometheus text).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from tests.support.kubelet import PODS
from tests.support.store import Store


def unique_ip_prefix() -> str:
    """A 127.a.b. prefix of this process, so concurrent test runs never share pod IPs."""
    pid = os.getpid()
    return f"127.{20 + (pid >> 8) % 200}.{pid % 256}."


@dataclass(frozen=True)
class Script:
    kv_cache_usage: float = 0.1
    waiting: float = 0.0
    preemptions_per_minute: float = 0.0  # growth rate of vllm:num_preemptions_total
    mode: str = "ok"  # ok | error | hang | garbage
    alternate_kv: float | None = None  # if set, every other scrape reports this KV usage
    old_kv_name: bool = False  # only vllm:gpu_cache_usage_perc (vLLM before the rename)
    block_size: int | None = None  # export vllm:cache_config_info with this block size
    answer_tokens: float | None = None  # every scrape, 20 more finished requests of this length


@dataclass
class RateCounter:
    """A counter that grows at the current script's rate; continuous across script changes."""

    value: float = 0.0
    since: float = 0.0
    rate_per_minute: float = 0.0

    def read(self, now: float) -> float:
        return self.value + self.rate_per_minute * (now - self.since) / 60.0

    def retarget(self, rate_per_minute: float, now: float) -> None:
        self.value, self.since, self.rate_per_minute = self.read(now), now, rate_per_minute


def _advisor_text(script: Script, scrape: int) -> str:
    """What the advisor's block-size rule reads: the cache config and the request shapes."""
    text = ""
    if script.block_size is not None:
        text += (
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{script.block_size}",num_gpu_blocks="512"}} 1.0\n'
        )
    if script.answer_tokens is not None:
        n, length = 20 * scrape, script.answer_tokens
        for name, value in (("request_generation_tokens", length), ("request_prompt_tokens", 20.0)):
            text += f"# TYPE vllm:{name} histogram\n"
            for le in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000):
                text += f'vllm:{name}_bucket{{model_name="m",le="{float(le)}"}} {n if value <= le else 0}\n'
            text += f'vllm:{name}_bucket{{model_name="m",le="+Inf"}} {n}\n'
            text += f'vllm:{name}_count{{model_name="m"}} {n}\nvllm:{name}_sum{{model_name="m"}} {n * value}\n'
    return text


def render(script: Script, preemptions: float, kv: float, scrape: int = 0) -> str:
    kv_name = "vllm:gpu_cache_usage_perc" if script.old_kv_name else "vllm:kv_cache_usage_perc"
    return _advisor_text(script, scrape) + (
        f"# TYPE {kv_name} gauge\n"
        f'{kv_name}{{model_name="m"}} {kv}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {script.waiting}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} 1.0\n'
        "# TYPE vllm:num_preemptions_total counter\n"
        f'vllm:num_preemptions_total{{model_name="m"}} {preemptions}\n'
    )


class MetricsPods:
    """Serve scripted /metrics for every pod the fake kubelet runs (start it on the cluster loop)."""

    def __init__(self, store: Store, port: int = 8000) -> None:
        self.store = store
        self.port = port
        self._service_scripts: dict[str, Script] = {}
        self._pod_scripts: dict[str, Script] = {}
        self._counters: dict[str, RateCounter] = {}
        self._sites: dict[str, tuple[web.AppRunner, str]] = {}  # pod name -> (runner, ip)
        self._closing = asyncio.Event()
        self.scrapes: dict[str, int] = {}  # pod -> /metrics requests answered so far
        self.rate_changed_at: dict[str, int] = {}  # pod -> the scrape its current rate began

    # ---------------------------------------------------------------- scripting (any thread)

    def set_service(self, service: str, **changes: Any) -> None:
        """Script every pod of an LLMService (pods without their own script).

        A new preemption rate starts at the pod's next scrape (the worst case for the
        autoscaler: that scrape still sees the old rate, the one after sees the new one).
        """
        self._service_scripts[service] = replace(
            self._service_scripts.get(service, Script()), **changes
        )

    def set_pod(self, pod: str, **changes: Any) -> None:
        self._pod_scripts[pod] = replace(self.script(pod), **changes)

    def script(self, pod: str) -> Script:
        if pod in self._pod_scripts:
            return self._pod_scripts[pod]
        return self._service_scripts.get(self._service_of(pod) or "", Script())

    def _service_of(self, pod: str) -> str | None:
        # Pods are named <service>-<template hash>-<suffix> by the fake deployment controller.
        return next(
            (
                s
                for s in sorted(self._service_scripts, key=len, reverse=True)
                if pod.startswith(f"{s}-")
            ),
            None,
        )

    def _preemptions(self, pod: str, scrape: int) -> float:
        """The counter now; a changed rate takes effect from this scrape on."""
        now = time.monotonic()
        counter = self._counters.setdefault(pod, RateCounter(since=now))
        rate = self.script(pod).preemptions_per_minute
        if rate != counter.rate_per_minute:
            counter.retarget(rate, now)
            self.rate_changed_at[pod] = scrape
        return counter.read(now)

    # ---------------------------------------------------------------- serving (cluster loop)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[MetricsPods]:
        task = asyncio.create_task(self._loop())
        try:
            yield self
        finally:
            self._closing.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for name in list(self._sites):
                await self._close(name)

    async def _loop(self) -> None:
        while True:
            pods = {
                p["metadata"]["name"]: p
                for p in self.store.items(PODS, copied=False)
                if (p.get("status") or {}).get("podIP")
                and not p["metadata"].get("deletionTimestamp")
            }
            for name, pod in pods.items():
                if name not in self._sites:
                    await self._open(name, pod["status"]["podIP"])
            for name in [n for n in self._sites if n not in pods]:
                await self._close(name)
            await asyncio.sleep(0.05)

    async def _open(self, pod: str, ip: str) -> None:
        async def metrics(request: web.Request) -> web.StreamResponse:
            n = self.scrapes.get(pod, 0) + 1
            self.scrapes[pod] = n
            script = self.script(pod)
            if script.mode == "error":
                return web.Response(status=500, text="engine dead")
            if script.mode == "hang":  # until the test ends (bounded, so nothing lingers)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), timeout=30)
            if script.mode == "garbage":
                return web.Response(text="<html>not metrics</html>")
            kv = script.kv_cache_usage
            if script.alternate_kv is not None and n % 2 == 0:
                kv = script.alternate_kv
            value = self._preemptions(pod, n)
            return web.Response(text=render(script, value, kv, n), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, ip, self.port).start()
        self._sites[pod] = (runner, ip)

    async def _close(self, pod: str) -> None:
        runner, _ = self._sites.pop(pod)
        await runner.cleanup()


class ServedMetrics:
    """`with ServedMetrics(cluster) as pods:` runs MetricsPods on the cluster's event loop."""

    def __init__(self, cluster: Any, port: int = 8000) -> None:
        self.cluster = cluster
        self.pods = MetricsPods(cluster.emulator.store, port)
        self._stop: asyncio.Event | None = None
        self._runner: concurrent.futures.Future[None] | None = None

    async def _serve(self, started: concurrent.futures.Future[None]) -> None:
        self._stop = asyncio.Event()
        async with self.pods.running():
            started.set_result(None)
            await self._stop.wait()

    def __enter__(self) -> MetricsPods:
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._runner = asyncio.run_coroutine_threadsafe(self._serve(started), self.cluster.loop)
        started.result(timeout=10)
        return self.pods

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self.cluster.loop.call_soon_threadsafe(self._stop.set)
        if self._runner is not None:
            self._runner.result(timeout=30)
