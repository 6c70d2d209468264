"""The real router in front of a real server put to sleep: the requests that find it asleep
wake it with one `POST /wake_up` and are answered, with the greedy text of before.

This is how `spec.autoscaling.scaleToZero: sleep` serves the first request after an idle
window: the operator slept the pod (POST /sleep), the router wakes it (docs/cold-start.md).
"""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.router_process import start_router
from tests.support.server_process import running_server

PROMPT = {"model": "m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def wake_ups(router_url: str) -> float:
    text = httpx.get(router_url + "/metrics").text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "llmservice_router_pod_wake_ups"
        for s in fam.samples
        if s.name.endswith("_total")
    )


async def complete_many(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(*(client.post(url + "/v1/completions", json=PROMPT) for _ in range(n)))


def test_requests_to_a_sleeping_pod_wake_it_once_and_are_served(tmp_path):
    args = ["--max-model-len", "256", "--kv-cache-memory-gib", "0.1", "--enable-sleep-mode",
            "--served-model-name", "m"]  # fmt: skip
    with running_server(args, tmp_path) as server:
        router, url = start_router([server.url], tmp_path / "router.log")
        try:
            awake = httpx.post(url + "/v1/completions", json=PROMPT, timeout=120)
            assert awake.status_code == 200, awake.text
            before = awake.json()["choices"][0]["text"]
            assert wake_ups(url) == 0

            slept = httpx.post(server.url + "/sleep", params={"level": 1}, timeout=120)
            assert slept.status_code == 200 and slept.json()["is_sleeping"] is True
            direct = httpx.post(server.url + "/v1/completions", json=PROMPT, timeout=30)
            assert direct.status_code == 503 and direct.headers["llmservice-asleep"] == "1"

            answers = asyncio.run(complete_many(url, 3))
            assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
            assert {r.json()["choices"][0]["text"] for r in answers} == {before}
            assert httpx.get(server.url + "/is_sleeping").json()["is_sleeping"] is False
            assert wake_ups(url) == 1  # three requests found it asleep; one wake-up call
        finally:
            router.terminate()
            router.wait(timeout=30)

