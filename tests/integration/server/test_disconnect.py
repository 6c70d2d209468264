"""A client that goes away mid-request aborts its engine request and frees its KV blocks
(read back from /metrics)."""

from __future__ import annotations

import time

import httpx
import pytest

MODEL = "builtin:smollm2-135m"
ABORT = f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}'


def _wait_idle(server, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0:
            return m
        if time.monotonic() > deadline:
            pytest.fail(f"engine still busy after {timeout} s: {m}")
        time.sleep(0.1)


def test_stream_disconnect_aborts_and_frees_kv(main_server):
    before = _wait_idle(main_server)
    body = {"model": MODEL, "prompt": "Count from one to a thousand:", "max_tokens": 400, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", main_server.base_url + "/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
            if got == 3:
                break
        assert main_server.metrics()["vllm:kv_cache_usage_perc"] > 0
    # connection closed here, ~397 tokens before the request would end
    after = _wait_idle(main_server)
    assert after[ABORT] == before[ABORT] + 1
    assert after["vllm:kv_cache_usage_perc"] == 0.0
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 100


def test_non_streaming_disconnect_aborts(main_server):
    before = _wait_idle(main_server)
    body = {"model": MODEL, "prompt": "Count from one to a thousand:", "max_tokens": 400, "temperature": 0,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(main_server.base_url + "/completions", json=body, timeout=httpx.Timeout(60, read=1.5))
    after = _wait_idle(main_server)
    assert after[ABORT] == before[ABORT] + 1
    assert after["vllm:kv_cache_usage_perc"] == 0.0
