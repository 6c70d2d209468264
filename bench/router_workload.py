"""The router's prefix workload: N shared system prompts, short user turns, TTFT and hits.

Shared by bench/router.py and tests/integration/router (they put bench/ on sys.path).
Each request is a streamed chat completion of one token after one of the shared system
prompts, so nearly all prefill work is the system prompt: a replica that already holds
it in its prefix cache answers from cache. The hit rate is the servers' own
vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total over the run (tokens).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx

WORDS = (
    "the model answers each question with care and cites the policy section it relies on "
    "customers may return items within thirty days when the receipt shows the store and date "
    "refunds go to the original card and gift cards are never refunded as cash under any rule"
).split()


def system_prompts(n: int, words: int, seed: int) -> list[str]:
    """n distinct prompts of about `words` tokens (common English words: ~1 token each)."""
    rng = random.Random(seed)
    return [f"[{seed}-{i}] " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def chat_bodies(prompts: list[str], per_prompt: int, seed: int, model: str = "m") -> list[dict]:
    """per_prompt requests for each prompt, shuffled (a fixed order per seed)."""
    bodies = [
        {
            "model": model,
            "stream": True,
            "max_tokens": 1,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": p},
                {"role": "user", "content": f"Question {j}: may I return item {j}?"},
            ],
        }
        for p in prompts
        for j in range(per_prompt)
    ]
    random.Random(seed).shuffle(bodies)
    return bodies


async def ttft_of(client: httpx.AsyncClient, url: str, body: dict) -> float:
    """Seconds to the first SSE data line (the first token), then reads to the end."""
    t0 = time.perf_counter()
    first = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if first is None and line.startswith("data:"):
                first = time.perf_counter() - t0
    assert first is not None
    return first


async def run(url: str, bodies: list[dict], concurrency: int) -> list[float]:
    """Every body through `url` with at most `concurrency` in flight; TTFTs in order."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300, trust_env=False) as client:

        async def one(body: dict) -> float:
            async with sem:
                return await ttft_of(client, url, body)

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def prefix_counters(metrics: list[dict[str, float]]) -> tuple[float, float]:
    """(hits, queries) summed over servers, from ServerProcess.metrics()-style dicts."""
    hits = sum(m.get("vllm:prefix_cache_hits_total", 0.0) for m in metrics)
    queries = sum(m.get("vllm:prefix_cache_queries_total", 0.0) for m in metrics)
    return hits, queries


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


@dataclass(frozen=True)
class RunResult:
    policy: str
    hit_rate: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    requests: int

    def as_dict(self) -> dict:
        return self.__dict__.copy()
