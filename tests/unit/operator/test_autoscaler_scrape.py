"""Reading pods' metrics (operator/scrape.py): parsing, the rename, counter rates, fetching."""

from __future__ import annotations

import asyncio
import socket

import httpx
import prometheus_client
import pytest
from aiohttp import web
from llmservice.operator.scrape import (
    PodTarget,
    PreemptionRates,
    parse_metrics,
    pod_target,
    scrape_pods,
)
from llmservice.server.metrics import CacheInfo, ServerMetrics

from llmservice.pod_address import address_map

NEW = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.42
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m"} 17.0
"""
# vLLM before the rename: KV usage only as gpu_cache_usage_perc, counter without TYPE line
OLD = """vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:num_requests_waiting{model_name="m"} 1.0
vllm:num_preemptions_total{model_name="m"} 4.0
"""


def test_parses_the_current_names():
    s = parse_metrics(NEW)
    assert (s.kv_cache_usage, s.waiting_requests, s.running_requests) == (0.42, 3.0, 7.0)
    assert s.preemptions_total == 17.0


def test_accepts_the_old_kv_name():
    s = parse_metrics(OLD)
    assert s.kv_cache_usage == 0.9
    assert s.preemptions_total == 4.0 and s.running_requests is None


def test_prefers_the_new_name_when_both_are_there():
    both = NEW + 'vllm:gpu_cache_usage_perc{model_name="m"} 0.99\n'
    assert parse_metrics(both).kv_cache_usage == 0.42


def test_sums_over_label_sets():
    two = (
        'vllm:num_requests_waiting{model_name="a"} 2\n'
        'vllm:num_requests_waiting{model_name="b"} 5\n'
        'vllm:kv_cache_usage_perc{model_name="a"} 0.3\n'
        'vllm:kv_cache_usage_perc{model_name="b"} 0.6\n'
    )
    s = parse_metrics(two)
    assert s.waiting_requests == 7 and s.kv_cache_usage == 0.6


def test_reads_our_own_servers_exposition():
    metrics = ServerMetrics("m", 2048, CacheInfo(16, 64, 0, 0.9))
    metrics.preemptions.inc(5)
    metrics.kv_usage.set(0.25)
    text = prometheus_client.generate_latest(metrics.registry).decode()
    s = parse_metrics(text)
    assert (s.kv_cache_usage, s.preemptions_total, s.waiting_requests) == (0.25, 5.0, 0.0)
    assert s.sleep_level == 0.0  # awake, and says so (scaleToZero sleep reads it)
    metrics.sleep_level.set(1)
    assert parse_metrics(prometheus_client.generate_latest(metrics.registry).decode()).sleep_level == 1.0
    assert parse_metrics("vllm:num_requests_running 0\n").sleep_level is None  # stock vLLM


def test_missing_metrics_are_none_and_garbage_raises():
    assert parse_metrics("").kv_cache_usage is None
    with pytest.raises(ValueError):
        parse_metrics("<html>not metrics</html>")


def test_rate_needs_two_readings_then_is_per_minute():
    rates = PreemptionRates()
    assert rates.update("pod", 10.0, 100.0) is None
    assert rates.update("pod", 13.0, 115.0) == pytest.approx(12.0)  # 3 in 15 s
    assert rates.update("pod", 13.0, 130.0) == 0.0


def test_counter_reset_counts_from_zero():
    """A restarted container starts its counter again: the new value is the increase."""
    rates = PreemptionRates()
    rates.update("pod", 500.0, 0.0)
    assert rates.update("pod", 6.0, 30.0) == pytest.approx(12.0)  # not -988/min


def test_rates_are_per_pod_and_forgotten_when_pods_go():
    rates = PreemptionRates()
    rates.update("a", 0.0, 0.0)
    rates.update("b", 100.0, 0.0)
    assert rates.update("a", 5.0, 60.0) == 5.0
    assert rates.update("b", 100.0, 60.0) == 0.0
    rates.forget_except(["a"])
    assert rates.update("b", 200.0, 120.0) is None  # b is new again


def test_pod_target_reads_ip_port_and_readiness():
    pod = {
        "metadata": {"uid": "u1", "name": "svc-abc-1"},
        "spec": {"containers": [{"ports": [{"name": "grpc", "containerPort": 9000},
                                           {"name": "http", "containerPort": 8123}]}]},
        "status": {"phase": "Running", "podIP": "10.0.0.7",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    t = pod_target(pod)
    assert (t.uid, t.ip, t.port, t.ready, t.starting) == ("u1", "10.0.0.7", 8123, True, False)
    assert t.url == "http://10.0.0.7:8123/metrics"
    pending = pod_target({"metadata": {"uid": "u2", "name": "p"}, "status": {"phase": "Pending"}})
    assert (pending.ip, pending.port, pending.ready, pending.starting) == (None, 8000, False, True)
    gone = pod_target({"metadata": {"uid": "u3", "name": "p", "deletionTimestamp": "x"}})
    assert gone.terminating and not gone.starting
    # a hosts-as-pods test cluster's routable IP, dialled on loopback (llmservice/pod_address.py)
    assert pod_target(pod, address_map("10.=127.")).url == "http://127.0.0.7:8123/metrics"
    v6 = {**pod, "status": {**pod["status"], "podIP": "fd00::7"}}
    assert pod_target(v6).url == "http://[fd00::7]:8123/metrics"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.asyncio
async def test_scrapes_concurrently_and_reports_each_failure():
    """One hanging pod costs the timeout once; the others answer; nothing raises.

    Concurrency is shown by the server, not by the clock: all three scrapes of the hanging
    pod are in flight at once (a sequential scrape would hold at most one)."""
    hanging = {"now": 0, "most": 0}

    async def ok(request):
        return web.Response(text=NEW)

    async def hang(request):
        hanging["now"] += 1
        hanging["most"] = max(hanging["most"], hanging["now"])
        try:
            await asyncio.sleep(10)
        finally:
            hanging["now"] -= 1
        return web.Response(text=NEW)

    async def error(request):
        return web.Response(status=500)

    async def garbage(request):
        return web.Response(text="<html>")

    app = web.Application()
    for path, fn in (("/ok/metrics", ok), ("/hang/metrics", hang), ("/error/metrics", error),
                     ("/garbage/metrics", garbage)):  # fmt: skip
        app.router.add_get(path, fn)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()

    class Target(PodTarget):
        @property
        def url(self) -> str:
            return f"http://127.0.0.1:{self.port}/{self.name}/metrics"

    targets = [
        Target(n, n, "127.0.0.1", port, True, False) for n in ("ok", "hang", "error", "garbage")
    ]
    targets += [PodTarget("refused", "refused", "127.0.0.1", _free_port(), True, False)]
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            results = await scrape_pods(client, targets * 3, timeout=2.0)
    finally:
        await runner.cleanup()
    assert hanging["most"] == 3  # the three scrapes of the hanging pod waited together
    by_name = {r.target.name: r for r in results}
    assert by_name["ok"].sample is not None and by_name["ok"].sample.preemptions_total == 17.0
    assert by_name["hang"].error == "hang: timed out after 2s"
    assert by_name["error"].error == "error: HTTP 500"
    assert "unparseable" in (by_name["garbage"].error or "")
    assert (by_name["refused"].error or "").startswith("refused: ConnectError")
    assert sum(r.sample is not None for r in results) == 3
