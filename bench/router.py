"""The router's cost and its prefix hit rate, against fake pods that do no model work.

1. Added latency: an open-loop client at `--rate` req/s (default 200) sends streamed
   completions straight to a fake pod, and through `llmservice router` in front of
   three fake pods, on uvloop (the router's default when installed) and on plain
   asyncio; every pod answers the same fixed SSE stream (8 events). The three targets
   take turns in `--blocks` blocks of `--seconds / --blocks` each (direct, uvloop,
   asyncio, direct, ...), so a neighbour's burst on this shared machine lands on all
   of them alike instead of on whichever ran at that minute. Added p50/p99 = the
   routed percentile minus the direct one. Target: added p99 <= 2 ms.
   With `--pin` (the default where there are >= 2 CPUs) the routers get the last CPU
   and the client and pods the others, as a router Deployment's CPU request gives it
   a core of its own in a cluster; `--no-pin` measures all of them sharing every CPU.
2. Hit rate: 8 shared system prompts x 25 requests, through the router with
   --policy prefix and --policy round-robin, and all on one pod (the ceiling). A hit
   is a request whose prefix key the pod that served it had seen before (an
   unbounded prefix cache). Target: prefix >= 85 % of the single-pod rate.
The real-server version of (2) (3 replicas of the embedded model, prefix-cache
counters and TTFT) is tests/integration/router/test_prefix_routing.py.

    .venv/bin/python bench/router.py [--rate 200 --seconds 20 --blocks 10] [--no-pin]
    # writes bench/results/router.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "llmservice"
EVENTS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- fake pods (a child process: the client never shares their event loop) -----------


async def serve_fake_pods(ports: list[int]) -> None:
    from llmservice.router.prefix_key import prefix_key

    runners = []
    for port in ports:
        seen: set[bytes] = set()
        stats = {"requests": 0, "hits": 0, "running": 0}

        async def answer(request: web.Request, seen=seen, stats=stats) -> web.StreamResponse:
            body = await request.json()
            key = prefix_key(body, 256)
            stats["requests"] += 1
            stats["hits"] += key in seen
            seen.add(key)
            stats["running"] += 1
            try:
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                for i in range(EVENTS):
                    await response.write(
                        b'data: {"choices":[{"index":0,"delta":{"content":"x%d"}}]}\n\n' % i
                    )
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                return response
            finally:
                stats["running"] -= 1

        async def metrics(_: web.Request, stats=stats) -> web.Response:
            return web.Response(
                text=f"vllm:num_requests_running {stats['running']}\nvllm:num_requests_waiting 0\n"
            )

        async def get_stats(_: web.Request, stats=stats, seen=seen) -> web.Response:
            return web.json_response(stats)

        async def reset(_: web.Request, stats=stats, seen=seen) -> web.Response:
            seen.clear()
            stats.update(requests=0, hits=0)
            return web.json_response(stats)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/stats", get_stats)
        app.router.add_post("/reset", reset)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    await asyncio.Event().wait()


# --- client ----------------------------------------------------------------------------


def body_for(prompt: str, i: int) -> dict:
    return {"model": "m", "stream": True, "max_tokens": 8, "messages": [
        {"role": "system", "content": prompt}, {"role": "user", "content": f"question {i}"}]}  # fmt: skip


async def open_loop(url: str, rate: float, seconds: float, prompts: list[str]) -> list[float]:
    """Latency (start -> last byte) of each request, sent on a fixed schedule."""
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            try:
                async with session.post(
                    url + "/v1/chat/completions", json=body_for(prompts[i % len(prompts)], i)
                ) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        return
            except aiohttp.ClientError:
                errors += 1
                return
            latencies.append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        n = int(rate * seconds)
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    if errors:
        raise RuntimeError(f"{errors} requests failed against {url}")
    return latencies


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


async def wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            try:
                async with s.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} never came up")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(10)


def start_router(pods: list[str], policy: str, event_loop: str = "auto") -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [str(BIN), "router", "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
           "--log-level", "warning", "--event-loop", event_loop] + [a for p in pods for a in ("--backend", p)]  # fmt: skip
    return subprocess.Popen(cmd), f"http://127.0.0.1:{port}"


async def hit_rates(pods: list[str], prompts: list[str], per_prompt: int) -> dict[str, float]:
    order = [(p, j) for p in prompts for j in range(per_prompt)]
    random.Random(0).shuffle(order)
    out = {}
    async with aiohttp.ClientSession() as s:

        async def reset() -> None:
            for pod in pods:
                async with s.post(pod + "/reset"):
                    pass

        async def send(url: str) -> float:
            await reset()
            sem = asyncio.Semaphore(4)

            async def one(prompt: str, j: int) -> None:
                async with sem, s.post(url + "/v1/chat/completions", json=body_for(prompt, j)) as r:
                    await r.read()

            await asyncio.gather(*(one(p, j) for p, j in order))
            stats = []
            for pod in pods:
                async with s.get(pod + "/stats") as r:
                    stats.append(await r.json())
            return sum(x["hits"] for x in stats) / sum(x["requests"] for x in stats)

        out["single-pod"] = await send(pods[0])
        for policy in ("prefix", "round-robin"):
            proc, url = start_router(pods, policy)
            try:
                await wait_up(url + "/healthz")
                out[policy] = await send(url)
            finally:
                stop(proc)
    return out


def cpu_split(pin: bool) -> tuple[set[int], set[int]] | None:
    """(the routers' CPUs, everyone else's), or None to leave the scheduler alone."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None
    return {cpus[-1]}, set(cpus[:-1])


async def main_async(args: argparse.Namespace) -> dict:
    # the router's default loop first (uvloop when installed), then plain asyncio for comparison
    loops = ["uvloop", "asyncio"] if importlib.util.find_spec("uvloop") else ["asyncio"]
    split = cpu_split(args.pin)
    if split is not None:
        os.sched_setaffinity(0, split[1])  # the client, and the pods' process it starts
    ports = [free_port() for _ in range(3)]
    env = dict(os.environ, PYTHONPATH="")
    pods_proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-fake-pods", *map(str, ports)], env=env
    )
    pods = [f"http://127.0.0.1:{p}" for p in ports]
    routers: dict[str, tuple[subprocess.Popen, str]] = {}
    samples: dict[str, list[float]] = {"direct": [], **{loop: [] for loop in loops}}
    try:
        for pod in pods:
            await wait_up(pod + "/stats")
        for event_loop in loops:
            proc, url = start_router(pods, "prefix", event_loop)
            routers[event_loop] = (proc, url)
            if split is not None:
                os.sched_setaffinity(proc.pid, split[0])
        targets = {"direct": pods[0], **{loop: routers[loop][1] for loop in loops}}
        for loop in loops:
            await wait_up(targets[loop] + "/healthz")
        prompts = [f"system prompt {i}: " + "policy text " * 200 for i in range(8)]
        for url in targets.values():
            await open_loop(url, args.rate, 1.0, prompts)  # warm connections and code paths
        block_s = args.seconds / args.blocks
        for _ in range(args.blocks):
            for name, url in targets.items():
                samples[name] += await open_loop(url, args.rate, block_s, prompts)
    finally:
        for proc, _ in routers.values():
            stop(proc)
    try:
        rates = await hit_rates(pods, prompts, 25)
    finally:
        stop(pods_proc)
    direct, routed = samples["direct"], samples[loops[0]]
    ms = 1e3

    def added(v: list[float]) -> dict[str, float]:
        return {"p50": (pct(v, 50) - pct(direct, 50)) * ms, "p99": (pct(v, 99) - pct(direct, 99)) * ms}

    pin_flag = "" if args.pin else " --no-pin"
    result = {
        "machine": f"{os.cpu_count()} CPU cores shared with other sessions' tests and benchmarks (noisy)",
        "command": f".venv/bin/python bench/router.py --rate {args.rate:g} --seconds {args.seconds:g} "
        f"--blocks {args.blocks}{pin_flag}",
        "cpus": None if split is None else {"routers": sorted(split[0]), "client_and_pods": sorted(split[1])},
        "rate_rps": args.rate,
        "requests_per_target": len(direct),
        "direct_ms": {"p50": pct(direct, 50) * ms, "p99": pct(direct, 99) * ms},
        "routed_ms": {"p50": pct(routed, 50) * ms, "p99": pct(routed, 99) * ms},
        "added_ms": added(routed),
        "event_loop": loops[0],
        "added_ms_by_event_loop": {loop: added(samples[loop]) for loop in loops},
        "hit_rate": rates,
        "prefix_vs_single_pod": rates["prefix"] / rates["single-pod"],
        "targets": {"added_p99_ms": 2.0, "prefix_vs_single_pod": 0.85},
    }
    return result


def main() -> int:
    if sys.argv[1:2] == ["--serve-fake-pods"]:
        asyncio.run(serve_fake_pods([int(p) for p in sys.argv[2:]]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0, help="per target, all blocks")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", default=str(ROOT / "bench/results/router.json"))
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
