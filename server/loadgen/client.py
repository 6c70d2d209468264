"""Async HTTP load generator: streams each request over SSE and times every chunk.

The client runs in its own event loop; `/health` probes (optional) run in a separate
process with their own connection so the load's parsing work does not delay them.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from collections.abc import Callable

import httpx
from llmservice.server.loadgen.arrivals import arrival_offsets
from llmservice.server.loadgen.datasets import BenchPrompt
from llmservice.server.loadgen.stats import RequestResult


def build_payload(endpoint: str, model: str, p: BenchPrompt, temperature: float, extra: dict) -> dict:
    body: dict = {"model": model, "max_tokens": p.output_len, "temperature": temperature, "stream": True,
                  "stream_options": {"include_usage": True}}
    if endpoint.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": p.prompt}]
    else:
        body["prompt"] = p.prompt
    body.update(extra)
    return body


async def send_request(http: httpx.AsyncClient, url: str, body: dict, approx_prompt_len: int, t0: float) -> RequestResult:
    result = RequestResult(success=False, prompt_len=approx_prompt_len)
    start = time.perf_counter()
    result.start = start - t0
    last = None
    chunks = 0
    try:
        async with http.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if "error" in msg:
                    result.error = str(msg["error"])[:300]
                    return result
                now = time.perf_counter()
                if msg.get("choices"):
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    chunks += 1
                usage = msg.get("usage")
                if usage:
                    result.prompt_len = usage.get("prompt_tokens", result.prompt_len)
                    result.output_len = usage.get("completion_tokens", chunks)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.output_len = result.output_len or chunks
    result.success = chunks > 0
    if not result.success:
        result.error = "no tokens received"
    return result


async def run_load(
    base_url: str,
    endpoint: str,
    payloads: list[tuple[dict, int]],
    request_rate: float,
    burstiness: float,
    max_concurrency: int | None,
    seed: int,
    on_done: Callable[[RequestResult], None] | None = None,
    timeout_s: float = 3600.0,
) -> tuple[list[RequestResult], float]:
    """Send every payload on the gamma schedule; returns results (input order) and the duration."""
    offsets = arrival_offsets(len(payloads), request_rate, burstiness, seed)
    limit = max_concurrency or len(payloads)
    sem = asyncio.Semaphore(limit)
    limits = httpx.Limits(max_connections=limit + 4, max_keepalive_connections=limit + 4)
    url = base_url.rstrip("/") + endpoint
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as http:
        t0 = time.perf_counter()

        async def one(i: int) -> RequestResult:
            delay = offsets[i] - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                body, approx = payloads[i]
                r = await send_request(http, url, body, approx, t0)
            if on_done:
                on_done(r)
            return r

        results = await asyncio.gather(*(one(i) for i in range(len(payloads))))
        duration = time.perf_counter() - t0
    return list(results), duration


def _probe_main(url: str, interval_s: float, max_probes: int | None, stop, conn) -> None:
    latencies: list[float] = []
    failures = 0
    with httpx.Client(timeout=10) as http:
        while not stop.is_set() and (max_probes is None or len(latencies) < max_probes):
            t = time.perf_counter()
            try:
                ok = http.get(url).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t)
            else:
                failures += 1
            stop.wait(interval_s)
    conn.send((latencies, failures))
    conn.close()


class HealthProbe:
    """GET /health every interval from a separate process (so the load generator's own
    GIL and event loop do not inflate the figure); latencies in seconds."""

    def __init__(self, url: str, interval_s: float = 0.05, max_probes: int | None = None):
        ctx = multiprocessing.get_context("spawn")
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_probe_main, args=(url, interval_s, max_probes, self._stop, send), name="health-probe", daemon=True
        )

    def __enter__(self) -> HealthProbe:
        self._proc.start()
        return self

    def wait(self, timeout_s: float) -> None:
        """Block until the probe process has made max_probes probes (or the timeout)."""
        self._proc.join(timeout_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._recv.poll(30):
            self.latencies, self.failures = self._recv.recv()
        self._proc.join(15)
