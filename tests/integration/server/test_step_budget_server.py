"""A real server under a mixed workload: no step that carries prefill runs past 1.5x its
step-time target; decode-only steps and forced steps (whose decodes alone, or smallest
chunk, were already predicted over the target: the budget cannot shorten them) are
counted and reported. Read from the server's own metrics
(llmservice:step_time_over_target_ratio{kind}).

The machine is shared and noisy (2 cores, other jobs; at a load of 11 a 6-sequence
decode step of the embedded model at one thread took 150-250 ms, so a 150 ms target
was all forced steps): the default-tier version runs at --max-step-ms 400 and allows a
quarter of the steps with prefill to miss (a step slowed by a neighbour is not the
budget's miss; a budget that does not work misses on nearly every long prompt, whose
whole prefill in one step takes several times the target); the e2e version
(`make e2e`) runs the issue's 150 ms with 64 requests and allows 1 %. Measured at load 9
with 12 requests: 105 mixed steps, 2 prefill, 16 decode, 95 forced, none over 1.5x."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from tests.support.server_process import running_server, wait_for_metric

RATIO = "llmservice:step_time_over_target_ratio"
WORDS = "the quick brown fox jumps over a lazy dog while seven tired cats watch".split()


def step_counts(metrics: dict[str, float], kind: str, bound: str = "1.5") -> tuple[int, int]:
    """(steps of this kind that had a target, of which over `bound` x the target)."""
    total = sum(
        v for k, v in metrics.items() if k.startswith(RATIO + "_count{") and f'kind="{kind}"' in k
    )
    within = sum(
        v for k, v in metrics.items()
        if k.startswith(RATIO + "_bucket{") and f'kind="{kind}"' in k and f'le="{bound}"' in k
    )  # fmt: skip
    return int(total), int(total - within)


async def mixed_load(url: str, n: int, concurrency: int, seed: int = 0) -> None:
    """Long and short prompts at once, so prefill chunks share steps with decodes."""
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        words = rng.choice([8, 20, 60, 250])
        prompt = " ".join(rng.choice(WORDS) for _ in range(words))
        body = {
            "prompt": prompt,
            "max_tokens": rng.randint(8, 24),
            "temperature": 0,
            "ignore_eos": True,
        }
        async with sem:
            r = await client.post(url + "/v1/completions", json=body, timeout=600)
            assert r.status_code == 200, r.text

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(one(client, i) for i in range(n)))


def check(server, n: int, concurrency: int, tolerance: float) -> dict[str, tuple[int, int]]:
    # the budget's cost model starts from the start-up profile, which the engine runs once
    # it is ready and idle (docs/startup.md); its preemption prices come with it
    wait_for_metric(server, "llmservice:preemption_recompute_seconds_per_token", timeout_s=300)
    asyncio.run(mixed_load(server.url, n, concurrency))
    metrics = server.metrics()
    counts = {kind: step_counts(metrics, kind) for kind in ("mixed", "prefill", "decode", "forced")}
    print(f"steps with a target (total, over 1.5x): {counts}")
    with_prefill = counts["mixed"][0] + counts["prefill"][0]
    missed = counts["mixed"][1] + counts["prefill"][1]
    assert counts["mixed"][0] >= 5, counts  # the workload really mixed prefill with decodes
    assert missed <= max(1, tolerance * with_prefill), counts
    return counts


def test_steps_with_prefill_stay_within_the_target(tmp_path):
    args = ["--max-model-len", "512", "--kv-cache-memory-gib", "0.1", "--max-step-ms", "400"]
    with running_server(args, tmp_path) as server:
        # 16 requests, 4 at a time: each of the last 12 starts while 3 others decode, so its
        # prefill shares steps with decodes whatever the speed of the machine
        check(server, n=16, concurrency=4, tolerance=0.25)


@pytest.mark.e2e
def test_steps_with_prefill_stay_within_150ms_under_64_requests(tmp_path):
    args = ["--max-model-len", "1024", "--kv-cache-memory-gib", "0.25", "--max-step-ms", "150"]
    with running_server(args, tmp_path) as server:
        check(server, n=64, concurrency=16, tolerance=0.01)
