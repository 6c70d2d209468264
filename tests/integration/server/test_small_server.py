"""A server with a tiny KV pool (8 blocks of 16 tokens), a 64-token context and a queue
bound of 8: preemption under load, 503 + Retry-After past the bound with bounded
memory, and fuzzing from /openapi.json; and SIGTERM draining, on a server of its own whose
engine steps take at least STEP_FLOOR_MS (a test-only knob), so the drain outlasts the
test's checks on a machine of any speed."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from llmservice.server.engine.core import TEST_ONLY_MIN_STEP_ENV
from openai import AsyncOpenAI, OpenAI
from schemathesis import GenerationMode

from tests.integration.server.conftest import SMALL_ARGS
from tests.support.server_process import wait_for_metric

MODEL = "builtin:smollm2-135m"
STEP_FLOOR_MS = 100


def _api(server) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def wait_until_engine_idle(server, timeout_s: float) -> dict[str, float]:
    """Poll /metrics until nothing runs or waits (or the timeout); the last sample."""
    deadline = time.monotonic() + timeout_s
    sample = server.metrics()
    while sample["vllm:num_requests_running"] + sample["vllm:num_requests_waiting"] > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        sample = server.metrics()
    return sample


def test_chat_max_tokens_defaults_to_rest_of_context(small_server):
    messages = [{"role": "user", "content": "Hi"}]
    prompt_len = httpx.post(small_server.url + "/tokenize", json={"messages": messages}).json()["count"]
    client = OpenAI(base_url=small_server.base_url, api_key="unused", max_retries=0, timeout=300)
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 64 - prompt_len


def test_preemptions_rise_with_a_tiny_kv_pool(small_server):
    before = small_server.metrics()["vllm:num_preemptions_total"]

    async def one(api, i):
        out = await api.completions.create(
            model=MODEL, prompt=f"Story {i}: once upon a time in a land far away there",
            max_tokens=24, temperature=0, extra_body={"ignore_eos": True},
        )
        return out.usage.completion_tokens

    async def run():
        async with _api(small_server) as api:
            return await asyncio.gather(*(one(api, i) for i in range(6)))

    # 6 requests x 3 blocks each do not fit 8 blocks: the engine must preempt, and all finish.
    assert asyncio.run(run()) == [24] * 6
    after = small_server.metrics()
    assert after["vllm:num_preemptions_total"] > before
    assert after["vllm:kv_cache_usage_perc"] == 0.0
    # the advisor's price of a preemption: the victims' tokens and the measured recompute
    # cost (no swap space under recompute, so no swap price rather than a 0)
    assert after["llmservice:preempted_tokens_recompute_total"] > 0
    assert after.get("llmservice:preempted_tokens_swap_total") == 0
    # the price is measured after ready, while the engine is idle (server/engine/warm_up.py)
    priced = wait_for_metric(small_server, "llmservice:preemption_recompute_seconds_per_token", timeout_s=120)
    assert 0 < priced["llmservice:preemption_recompute_seconds_per_token"] < 1
    assert "llmservice:preemption_swap_seconds_per_token" not in priced


def test_overload_gets_503_with_retry_after_and_memory_stays_bounded(small_server):
    # Each admitted stream needs 4 of the 8 KV blocks and is held open, so the queue
    # fills: past 8 waiting requests the server must answer 503 at once.
    body = {"model": MODEL, "prompt": "Tell me a story", "max_tokens": 50, "temperature": 0,
            "stream": True, "ignore_eos": True}

    async def flood(n: int) -> list[tuple[int, dict, dict]]:
        limits = httpx.Limits(max_connections=n + 5)
        async with httpx.AsyncClient(base_url=small_server.base_url, timeout=120, limits=limits) as http:
            answered, release = asyncio.Event(), asyncio.Event()
            results: list[tuple[int, dict, dict]] = []

            async def one():
                async with http.stream("POST", "/completions", json=body) as r:
                    payload = json.loads(await r.aread()) if r.status_code != 200 else {}
                    results.append((r.status_code, dict(r.headers), payload))
                    if len(results) == n:
                        answered.set()
                    if r.status_code == 200:
                        await release.wait()  # hold the stream open; closing it aborts the request

            tasks = [asyncio.create_task(one()) for _ in range(n)]
            await asyncio.wait_for(answered.wait(), 120)
            release.set()
            await asyncio.gather(*tasks)
            return results

    asyncio.run(flood(30))  # warm-up: allocator and caches settle
    rss_before = small_server.rss_bytes()
    results = [r for _ in range(3) for r in asyncio.run(flood(60))]
    rss_after = small_server.rss_bytes()
    codes = [code for code, _, _ in results]
    assert set(codes) <= {200, 503}
    assert codes.count(503) >= 3 * 40, codes  # at most 8 waiting + 2 running (+ a few finishing) per wave
    for code, headers, payload in results:
        if code == 503:
            assert int(headers["retry-after"]) >= 1
            assert "overloaded" in payload["error"]["message"]
    assert rss_after - rss_before < 64 * 2**20, (rss_before, rss_after)
    idle = wait_until_engine_idle(small_server, 30)
    assert idle["vllm:kv_cache_usage_perc"] == 0.0  # every held-open stream was aborted on close
    # n beyond the bound can never be admitted: a 400, not a 503
    r = httpx.post(small_server.base_url + "/completions", json={**body, "stream": False, "n": 9, "max_tokens": 5})
    assert r.status_code == 400 and "max-waiting-requests" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def generation_schema(small_server):
    return schemathesis.openapi.from_url(small_server.url + "/openapi.json").include(
        path_regex=r"^/v1/(chat/)?completions$"
    )


@pytest.mark.parametrize("mode", [GenerationMode.NEGATIVE, GenerationMode.POSITIVE])
def test_fuzz_generation_endpoints_never_5xx(generation_schema, small_server, mode):
    seen: list[int] = []

    @given(case=generation_schema.as_strategy(generation_mode=mode))
    @settings(
        max_examples=30 if mode == GenerationMode.NEGATIVE else 12, deadline=None, database=None,
        phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
    )
    def check(case):
        response = case.call(timeout=120)  # a hang fails the test (ReadTimeout)
        seen.append(response.status_code)
        assert response.status_code < 500 or response.status_code == 503, (
            f"{response.status_code} for {case.body!r}: {response.text[:500]}"
        )
        if 400 <= response.status_code < 500:  # every refusal is OpenAI-shaped, `param` included
            err = response.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == response.status_code, err
            assert err["message"] and err["type"], err

    check()
    assert seen and httpx.get(small_server.url + "/health").status_code == 200
    # 503 only means "queue full"; sequential fuzzing never fills the queue
    assert 503 not in seen


@pytest.fixture(scope="module")
def draining_server(launch_server):
    """Stopped by its test. Ten tokens take at least 1 s of this server's steps."""
    return launch_server(*SMALL_ARGS, env={TEST_ONLY_MIN_STEP_ENV: str(STEP_FLOOR_MS)})


async def _until_draining(url: str, timeout_s: float) -> httpx.Response:
    """/ready from the moment the signal lands: 503 once the server drains."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            ready = await http.get(url + "/ready")
            if ready.status_code == 503 or time.monotonic() > deadline:
                return ready
            await asyncio.sleep(0.01)


def test_sigterm_drains_in_flight_streams_then_exits_0(draining_server):
    num = 8
    server = draining_server

    async def stream(api, i, first: asyncio.Event) -> tuple[int, str | None]:
        s = await api.completions.create(
            model=MODEL, prompt=f"Item {i}:", max_tokens=10, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )
        n, reason = 0, None
        async for chunk in s:
            if chunk.choices:
                n += 1
                reason = chunk.choices[0].finish_reason or reason
                first.set()
        return n, reason

    async def run():
        api = _api(server)
        firsts = [asyncio.Event() for _ in range(num)]
        tasks = [asyncio.create_task(stream(api, i, firsts[i])) for i in range(num)]
        await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 420)
        # each stream has 9 tokens to go, 0.9 s or more of steps: the checks fall inside the drain
        server.proc.send_signal(signal.SIGTERM)
        ready = await _until_draining(server.url, 60)
        async with httpx.AsyncClient(timeout=10) as http:
            refused = await http.post(server.base_url + "/completions", json={"model": MODEL, "prompt": "x"})
        results = await asyncio.gather(*tasks)
        await api.close()
        return results, ready, refused

    results, ready, refused = asyncio.run(run())
    assert ready.status_code == 503
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    assert results == [(10, "length")] * num
    deadline = time.monotonic() + 60
    while server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.proc.returncode == 0, server.log()[-3000:]
