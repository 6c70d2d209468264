"""`llmservice router` (the real process) in front of three fake LoRA pods: requests for
an adapter go to the pod where it is active, requests for an adapter active nowhere go
to the pod with a free slot, and base-model requests are routed as without adapters.

The pods are fake (aiohttp, no model): each serves `/metrics` written by the server's own
`LoRAMetrics` and request gauges through prometheus_client, a `/v1/models` that lists the
base and its adapters as the server does, and answers completions, recording the `model`
of each. The adapters they report as running are fixed by the test (a long request of
each) and every pod reports one running request, so every routing decision is known in
advance.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from llmservice.router.prefix_key import prefix_key
from llmservice.router.routing import Ring, choose
from llmservice.server.lora_metrics import LoRAMetrics
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port

BIN = Path(sys.executable).parent / "llmservice"
BASE, ADAPTERS = "tiny-base", ("sql", "chat", "poem")
NAMES = ["pod-0", "pod-1", "pod-2"]  # the router names --backend pods in order


@dataclass
class LoraPod:
    running: tuple[str, ...]  # adapters of the long requests the pod reports running
    max_loras: int
    requests: int = 1  # running requests it reports (every pod one: a lagging in-flight
    # count of the router's own, max(scraped, in flight), changes no load)
    port: int = field(default_factory=free_port)
    models: list[str] = field(default_factory=list)  # `model` of each completion answered
    models_reads: int = 0
    scrapes_since_models_read: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._list)
        app.router.add_post("/v1/completions", self._complete)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner

    async def _metrics(self, _: web.Request) -> web.Response:
        registry = CollectorRegistry()
        for name, value in (("running", self.requests), ("waiting", 0)):
            Gauge(f"vllm:num_requests_{name}", "requests", ["model_name"], registry=registry)\
                .labels(model_name=BASE).set(value)  # fmt: skip
        LoRAMetrics(registry, self.max_loras).on_adapters(self.running, ())
        self.scrapes_since_models_read += self.models_reads > 0
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def _list(self, _: web.Request) -> web.Response:
        self.models_reads += 1
        self.scrapes_since_models_read = 0
        data = [{"id": BASE, "object": "model", "root": "/m", "parent": None}]
        data += [{"id": a, "object": "model", "root": f"/a/{a}", "parent": BASE} for a in ADAPTERS]
        return web.json_response({"object": "list", "data": data})

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.models.append(body["model"])
        return web.json_response({"choices": [{"text": "ok", "index": 0}]})


def body(model: str, i: int) -> dict:
    return {"model": model, "prompt": f"question number {i}: " + "words " * 40, "max_tokens": 1}


async def wait_until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def scenario(tmp_path: Path) -> tuple[list[LoraPod], dict[str, list[str]], dict[str, float]]:
    pods = [LoraPod(("sql",), 1), LoraPod(("chat",), 1), LoraPod((), 2)]
    runners = [await p.start() for p in pods]
    port = free_port()
    cmd = [str(BIN), "router", "--host", "127.0.0.1", "--port", str(port)]
    for p in pods:
        cmd += ["--backend", p.url]
    log = tmp_path / "router.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        # every pod's adapter list read, and a scrape after it: the router knows it all
        await wait_until(
            lambda: all(p.scrapes_since_models_read >= 1 for p in pods) or proc.poll() is not None,
            "the router never read the pods",
        )
        assert proc.poll() is None, log.read_text()
        sent: dict[str, list[str]] = {}
        async with aiohttp.ClientSession() as s:
            for model, n in (("sql", 10), ("poem", 10), (BASE, 12), ("no-such-model", 4)):
                for i in range(n):
                    before = [len(p.models) for p in pods]
                    async with s.post(url + "/v1/completions", json=body(model, i)) as r:
                        assert r.status == 200, await r.text()
                    got = [NAMES[j] for j, p in enumerate(pods) if len(p.models) > before[j]]
                    sent.setdefault(model, []).extend(got)
            async with s.get(url + "/metrics") as r:
                text = await r.text()
        reasons = {
            sample.labels["reason"]: sample.value
            for fam in text_string_to_metric_families(text)
            if fam.name == "llmservice_router_routing_decisions"
            for sample in fam.samples
            if sample.name.endswith("_total")
        }
        return pods, sent, reasons
    finally:
        proc.terminate()
        proc.wait(10)
        for runner in runners:
            await runner.cleanup()


def test_requests_follow_their_adapter_and_the_base_model_keeps_the_prefix_rule(tmp_path):
    pods, sent, reasons = asyncio.run(scenario(tmp_path))
    ring, scraped = Ring(NAMES), dict.fromkeys(NAMES, 1.0)

    def by_prefix(model: str, n: int) -> list[str]:
        return [choose(ring, prefix_key(body(model, i), 256), scraped, 1.25).pod for i in range(n)]

    # without adapters these prompts would spread over the pods ...
    assert len(set(by_prefix("sql", 10))) > 1 and len(set(by_prefix("poem", 10))) > 1
    # ... with them: all on the pod where sql runs, and on the one pod with a free slot
    assert sent["sql"] == ["pod-0"] * 10
    assert sent["poem"] == ["pod-2"] * 10
    # the base model and an unknown name: the prefix rule, full pods included
    assert sent[BASE] == by_prefix(BASE, 12) and len(set(sent[BASE])) > 1
    assert sent["no-such-model"] == by_prefix("no-such-model", 4)
    assert reasons["lora-affinity"] == 10 and reasons["lora-slot"] == 10
    assert reasons.get("prefix", 0) + reasons.get("least-loaded", 0) == 16
    assert sum(len(p.models) for p in pods) == 36
