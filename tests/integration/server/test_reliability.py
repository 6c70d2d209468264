"""Real `llmservice serve` processes under their limits and faults.

`guarded`: an API key, a small body limit, --max-tokens-default and a request timeout;
each engine step takes at least MIN_STEP_MS (a test-only knob), so 240 tokens take at
least 240 x 40 ms = 9.6 s, three times the timeout, however fast the machine.
`fragile`: plain; its engine-core process is killed with SIGKILL during 16 streams, so
it is used by the last test of the module only. Both boot together (10-15 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from llmservice.server.engine.core import TEST_ONLY_MIN_STEP_ENV

from tests.support.server_process import wait_ready

MODEL = "builtin:smollm2-135m"
KEY = "s3cret-key"
COMMON = ("--max-model-len", "256", "--kv-cache-memory-gib", "0.1")
# 3 s: a 5-token answer on a loaded 2-core machine must not hit it (2 s did, once)
TIMEOUT_S = "3"
GUARDED = (*COMMON, "--api-key", KEY, "--max-request-body-bytes", "65536",
           "--max-tokens-default", "5", "--request-timeout-s", TIMEOUT_S)
AUTH = {"Authorization": f"Bearer {KEY}"}
MIN_STEP_MS = 40
SLOW_STEPS = {TEST_ONLY_MIN_STEP_ENV: str(MIN_STEP_MS)}


@pytest.fixture(scope="module")
def _servers(launch_server):
    return {"guarded": launch_server(*GUARDED, wait=False, env=SLOW_STEPS), "fragile": launch_server(*COMMON, wait=False)}


@pytest.fixture(scope="module")
def guarded(_servers):
    return wait_ready(_servers["guarded"])


@pytest.fixture(scope="module")
def fragile(_servers):
    return wait_ready(_servers["fragile"])


def _shaped(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    return err


def test_api_key_required_except_probes(guarded):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    _shaped(httpx.post(guarded.base_url + "/completions", json=body, timeout=30), 401)
    bad = httpx.post(guarded.base_url + "/completions", json=body, headers={"Authorization": "Bearer x"}, timeout=30)
    assert _shaped(bad, 401)["type"] and bad.headers["www-authenticate"] == "Bearer"
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(guarded.url + path, timeout=30).status_code == 200, path
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=guarded.base_url, api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=guarded.base_url, api_key=KEY, max_retries=0, timeout=60)
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=1).usage.completion_tokens == 1


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completions", {"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
        ("/completions", {"prompt": "hi", "stream": 1}, "stream"),
        ("/completions", {"prompt": "hi", "n": 2.5}, "n"),
        ("/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ("/completions", {"prompt": "hi", "logit_bias": {"42": 150}}, "logit_bias"),
        ("/completions", {"prompt": "hi", "logit_bias": {"42": 3}}, "logit_bias"),
        ("/completions", {"prompt": "hi", "n": 4, "max_tokens": 100}, "max_tokens"),
        ("/completions", {"prompt": ["a"] * 2049}, "prompt"),
        ("/chat/completions", {"messages": [{"role": "user"}]}, "messages"),
        ("/chat/completions", {"messages": [{"role": "tool", "content": "1"}]}, "messages"),
        ("/chat/completions", {"messages": [{"role": "assistant", "content": None}]}, "messages"),
        ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "1"}, "temperature"),
    ],
)
def test_openai_rejects_so_do_we(guarded, path, body, param):
    r = httpx.post(guarded.base_url + path, json={"model": MODEL, **body}, headers=AUTH, timeout=30)
    assert _shaped(r, 400)["param"] == param


def test_body_over_the_limit_is_413(guarded):
    body = {"model": MODEL, "prompt": "x" * 70000, "max_tokens": 1}
    err = _shaped(httpx.post(guarded.base_url + "/completions", json=body, headers=AUTH, timeout=30), 413)
    assert "65536" in err["message"]


def test_max_tokens_default_applies_when_left_out(guarded):
    client = openai.OpenAI(base_url=guarded.base_url, api_key=KEY, max_retries=0, timeout=60)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                         extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"
    out = client.completions.create(model=MODEL, prompt="Hi", extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 5


def test_request_timeout_ends_with_length_and_says_why(guarded):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 240, "ignore_eos": True}
    assert 240 * MIN_STEP_MS / 1000 > 3 * float(TIMEOUT_S)  # the clock fires first
    started = time.monotonic()
    r = httpx.post(guarded.base_url + "/completions", json=body, headers=AUTH, timeout=60)
    took = time.monotonic() - started
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] < 240  # stopped by the clock, not by max_tokens
    assert "request-timeout" in r.headers["llmservice-truncated"]
    assert took >= float(TIMEOUT_S)  # it ran until the clock fired
    # a stream announces the limit up front and ends its choice with length
    with httpx.stream("POST", guarded.base_url + "/completions", json={**body, "stream": True},
                      headers=AUTH, timeout=60) as s:
        assert s.headers["llmservice-request-timeout-s"] == TIMEOUT_S
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    reasons = [c["finish_reason"] for e in events[:-1] for c in json.loads(e)["choices"]]
    assert reasons[-1] == "length" and len(reasons) < 241


def _engine_pid(server_pid: int) -> int:
    """The engine core: the server's multiprocessing child (not the resource tracker)."""
    for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmdline:
            return int(child)
    raise AssertionError("no engine-core child process")


def test_engine_core_killed_during_16_streams(fragile):
    """Must stay the last test of this module: the server exits."""
    num = 16
    body = {"model": MODEL, "prompt": "Tell me a long story", "max_tokens": 200, "ignore_eos": True, "stream": True}

    async def stream(http: httpx.AsyncClient, first: asyncio.Event, killed: dict) -> tuple[str, float]:
        outcome = "closed"
        async with http.stream("POST", "/completions", json=body) as r:
            assert r.status_code == 200
            try:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        event = json.loads(line[6:])
                        if "error" in event:
                            outcome = "error event"
                        first.set()
            except httpx.HTTPError:
                outcome = "connection error"
        return outcome, time.monotonic() - killed.get("at", time.monotonic())

    async def run():
        killed: dict[str, float] = {}
        limits = httpx.Limits(max_connections=num + 4)
        async with httpx.AsyncClient(base_url=fragile.base_url, timeout=60, limits=limits) as http:
            firsts = [asyncio.Event() for _ in range(num)]
            tasks = [asyncio.create_task(stream(http, firsts[i], killed)) for i in range(num)]
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 120)
            os.kill(_engine_pid(fragile.proc.pid), signal.SIGKILL)
            killed["at"] = time.monotonic()
            results = await asyncio.gather(*tasks)
            health = None
            try:
                health = (await http.get(fragile.url + "/health", timeout=5)).status_code
            except httpx.HTTPError:
                pass  # already gone: fails as a probe too
            return results, health

    results, health = asyncio.run(run())
    assert len(results) == num
    assert all(after < 5.0 for _, after in results), results  # nobody hangs
    assert all(outcome in ("error event", "connection error", "closed") for outcome, _ in results)
    assert sum(outcome == "error event" for outcome, _ in results) >= 1, results
    assert health in (None, 503)
    assert fragile.proc.wait(30) != 0  # the kubelet restarts the container
    assert "engine core" in fragile.log()
