"""Sleep mode over HTTP on a real server: /sleep, /is_sleeping, /wake_up; a completion that
arrives while asleep is answered 503 with Retry-After; greedy output is the same before
sleep and after wake."""

from __future__ import annotations

import httpx
import openai
import pytest


@pytest.fixture(scope="module")
def sleepy_server(launch_server):
    return launch_server("--max-model-len", "256", "--kv-cache-memory-gib", "0.1", "--enable-sleep-mode")


def greedy(server) -> str:
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    out = client.completions.create(model=client.models.list().data[0].id, prompt="The capital of France is",
                                    max_tokens=12, temperature=0)
    return out.choices[0].text


def test_sleep_then_wake_serves_the_same_greedy_text(sleepy_server):
    url = sleepy_server.url
    before = greedy(sleepy_server)
    assert httpx.get(f"{url}/is_sleeping").json()["is_sleeping"] is False
    slept = httpx.post(f"{url}/sleep", params={"level": 1}, timeout=60)
    assert slept.status_code == 200 and slept.json()["level"] == 1
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True, "level": 1, "seconds": None}
    asleep = httpx.post(f"{sleepy_server.base_url}/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert asleep.status_code == 503 and asleep.headers["retry-after"] == "5"
    assert "wake_up" in asleep.json()["error"]["message"]
    woke = httpx.post(f"{url}/wake_up", timeout=60)
    assert woke.status_code == 200 and woke.json()["is_sleeping"] is False
    assert greedy(sleepy_server) == before


def test_bad_level_is_a_400(sleepy_server):
    r = httpx.post(f"{sleepy_server.url}/sleep", params={"level": 3})
    assert r.status_code == 400 and "level" in r.json()["error"]["message"]
