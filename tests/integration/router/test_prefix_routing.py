"""Three real server replicas behind `llmservice router`: prefix-aware vs round-robin.

8 shared system prompts, each asked several times (bench/router_workload.py). The
servers' own prefix-cache counters give the hit rate; the client measures TTFT. The
single-replica hit rate (every request on one server, where every repeat is a hit)
is the ceiling the router should reach (issue target: >= 85 % of it). A short variant
(~150-token prompts) and the 1000-token one; both e2e-marked until the short one's
duration on the shared machine is measured.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from router_workload import RunResult, chat_bodies, percentile, prefix_counters, run, system_prompts

from tests.support.router_process import start_router
from tests.support.server_process import spawn_server, wait_ready


def measure(servers, url: str, policy: str, bodies: list[dict], concurrency: int) -> RunResult:
    before = prefix_counters([s.metrics() for s in servers])
    ttfts = asyncio.run(run(url, bodies, concurrency))
    after = prefix_counters([s.metrics() for s in servers])
    hits, queries = after[0] - before[0], after[1] - before[1]
    return RunResult(
        policy,
        hits / queries,
        percentile(ttfts, 50) * 1e3,
        percentile(ttfts, 99) * 1e3,
        len(bodies),
    )


def compare(tmp_path: Path, words: int, per_prompt: int, max_model_len: int, kv_gib: float) -> dict:
    args = ["--max-model-len", str(max_model_len), "--kv-cache-memory-gib", str(kv_gib),
            "--served-model-name", "m"]  # fmt: skip
    servers = [spawn_server(args, tmp_path / f"server-{i}.log") for i in range(3)]
    routers = []
    try:
        for s in servers:
            wait_ready(s)
        results = {}
        single = chat_bodies(system_prompts(8, words, seed=1), per_prompt, seed=1)
        results["single-replica"] = measure(servers, servers[0].url, "single-replica", single, 2)
        for seed, policy in ((2, "prefix"), (3, "round-robin")):
            proc, url = start_router(
                [s.url for s in servers], tmp_path / f"router-{policy}.log", ["--policy", policy]
            )
            routers.append(proc)
            bodies = chat_bodies(system_prompts(8, words, seed=seed), per_prompt, seed=seed)
            results[policy] = measure(servers, url, policy, bodies, 2)
        return {k: v.as_dict() for k, v in results.items()}
    finally:
        for proc in routers:
            proc.terminate()
            proc.wait(10)
        for s in servers:
            s.stop()


def check(results: dict) -> None:
    print(json.dumps(results, indent=1))
    single, prefix, rr = results["single-replica"], results["prefix"], results["round-robin"]
    assert prefix["hit_rate"] >= 0.85 * single["hit_rate"], results
    assert prefix["hit_rate"] > rr["hit_rate"] + 0.2, results


@pytest.mark.e2e  # move to the default tier once its duration is measured (< 30 s wanted)
def test_prefix_aware_routing_keeps_the_single_replica_hit_rate(tmp_path):
    # 150 words ~ 170 tokens per system prompt, asked 3 times each
    check(compare(tmp_path, words=150, per_prompt=3, max_model_len=512, kv_gib=0.25))


@pytest.mark.e2e
def test_prefix_aware_routing_with_1000_token_system_prompts(tmp_path):
    results = compare(tmp_path, words=900, per_prompt=4, max_model_len=2048, kv_gib=1.0)
    out = Path(__file__).resolve().parents[3] / "bench" / "results" / "router_real_pods.json"
    if os.environ.get("LLMSERVICE_WRITE_RESULTS"):
        out.write_text(
            json.dumps(
                {"machine": "2 cores, shared with other sessions (noisy)", **results}, indent=1
            )
        )
    check(results)
