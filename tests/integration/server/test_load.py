"""32 concurrent streaming clients against the main server: every stream complete with
the right token counts, metrics counters equal to the workload, KV usage within [0, 1]
and moving, and /health answering quickly while the engine is saturated."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from llmservice.server.loadgen.client import HealthProbe
from llmservice.server.loadgen.stats import percentile
from openai import AsyncOpenAI

MODEL = "builtin:smollm2-135m"
NUM_CLIENTS = 32
MAX_TOKENS = 8
NUM_PROBES = 200


@dataclass
class LoadResult:
    chunks: list[int] = field(default_factory=list)  # token chunks per client
    usage: list = field(default_factory=list)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    kv_samples: list[float] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    health_failures: int = 0
    expected_prompt_tokens: int = 0


def _probe_health(url: str, start: threading.Event, result: LoadResult) -> None:
    """Probes from their own process (bench serve's probe), once the engine is busy."""
    start.wait(120)
    with HealthProbe(url + "/health", interval_s=0.005, max_probes=NUM_PROBES) as probe:
        probe.wait(120)
    result.health_ms = [v * 1000 for v in probe.latencies]
    result.health_failures = probe.failures


def _sample_kv(server, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        out.append(server.metrics()["vllm:kv_cache_usage_perc"])
        time.sleep(0.1)


async def _client(api: AsyncOpenAI, i: int, first_token: threading.Event, result: LoadResult) -> None:
    stream = await api.completions.create(
        model=MODEL, prompt=f"Request number {i}: write a short story about a cat called {i}.",
        max_tokens=MAX_TOKENS, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    n = 0
    async for chunk in stream:
        if chunk.choices:
            n += 1
            first_token.set()
        if chunk.usage is not None:
            result.usage.append(chunk.usage)
    result.chunks.append(n)


@pytest.fixture(scope="module")
def load(main_server) -> LoadResult:
    result = LoadResult()
    for i in range(NUM_CLIENTS):
        prompt = f"Request number {i}: write a short story about a cat called {i}."
        result.expected_prompt_tokens += httpx.post(main_server.url + "/tokenize", json={"prompt": prompt}).json()["count"]
    result.before = main_server.metrics()
    first_token, stop = threading.Event(), threading.Event()
    threads = [
        threading.Thread(target=_probe_health, args=(main_server.url, first_token, result)),
        threading.Thread(target=_sample_kv, args=(main_server, stop, result.kv_samples)),
    ]
    for t in threads:
        t.start()

    async def run() -> None:
        async with AsyncOpenAI(base_url=main_server.base_url, api_key="unused", max_retries=0, timeout=300) as api:
            await asyncio.gather(*(_client(api, i, first_token, result) for i in range(NUM_CLIENTS)))

    try:
        asyncio.run(run())
    finally:
        first_token.set()
        stop.set()
        for t in threads:
            t.join(120)
    result.after = main_server.metrics()
    return result


def _delta(load: LoadResult, name: str) -> float:
    return load.after.get(name, 0.0) - load.before.get(name, 0.0)


def test_all_streams_complete_with_correct_token_counts(load):
    assert load.chunks == [MAX_TOKENS] * NUM_CLIENTS
    assert [u.completion_tokens for u in load.usage] == [MAX_TOKENS] * NUM_CLIENTS
    assert sum(u.prompt_tokens for u in load.usage) == load.expected_prompt_tokens


def test_counters_equal_the_workload(load):
    assert _delta(load, "vllm:prompt_tokens_total") == load.expected_prompt_tokens
    assert _delta(load, "vllm:generation_tokens_total") == NUM_CLIENTS * MAX_TOKENS
    reason = f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}}'
    assert _delta(load, reason) == NUM_CLIENTS
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "time_per_output_token_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert _delta(load, f"vllm:{hist}_count") == NUM_CLIENTS, hist
    assert _delta(load, "vllm:inter_token_latency_seconds_count") == NUM_CLIENTS * (MAX_TOKENS - 1)
    assert _delta(load, "vllm:request_generation_tokens_sum") == NUM_CLIENTS * MAX_TOKENS
    assert _delta(load, "vllm:prefix_cache_queries_total") >= load.expected_prompt_tokens
    # every token computed in a step is counted by the iteration histogram
    assert _delta(load, "vllm:iteration_tokens_total_sum") >= load.expected_prompt_tokens + NUM_CLIENTS * (MAX_TOKENS - 1)


def test_kv_cache_usage_in_range_and_moves(load):
    assert load.kv_samples, "no /metrics samples taken during the load"
    assert all(0.0 <= v <= 1.0 for v in load.kv_samples)
    assert max(load.kv_samples) > 0.0
    assert load.after["vllm:kv_cache_usage_perc"] == 0.0
    assert load.after["vllm:num_requests_running"] == 0.0
    assert load.after["vllm:num_requests_waiting"] == 0.0


def test_health_stays_fast_while_saturated(load):
    assert len(load.health_ms) == NUM_PROBES and load.health_failures == 0
    p99 = percentile(load.health_ms, 99)
    print(f"/health under load: p50 {percentile(load.health_ms, 50):.2f} ms, p99 {p99:.2f} ms")
    assert p99 <= 50.0
