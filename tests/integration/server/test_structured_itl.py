"""A grammar that takes long to compile does not stall the other streams (e2e: its own
server, with the test-only hook that makes every compile 2.5 s slower).

The fast variant in the default tier is tests/unit/engine/test_grammar.py::
test_request_whose_grammar_compiles_waits_without_blocking_others (engine level).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import jsonschema
import openai
import pytest
from llmservice.server.engine.grammar import TEST_ONLY_SLOW_COMPILE_ENV

from tests.support.server_process import running_server

pytestmark = pytest.mark.e2e
MODEL = "builtin:smollm2-135m"
SLOW_MS = 2500
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "My favourite food is",
]


def _schema(tag: str) -> dict:
    return {
        "title": tag,  # a new title is a new cache key: a fresh (slow) compile
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
    }


async def _stream_gaps(client, prompt: str, started: asyncio.Event) -> list[float]:
    stamps = []
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=100,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for _ in stream:
        stamps.append(time.perf_counter())
        started.set()
    return [
        b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)
    ]  # gaps after the first token


async def _constrained(client, tag: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A number as JSON"}],
        max_tokens=20,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": tag, "schema": _schema(tag)},
        },
    )
    return time.perf_counter() - t0, r.choices[0].message.content


async def _run(client, tag: str | None) -> tuple[list[float], tuple[float, str] | None]:
    started = asyncio.Event()
    streams = [asyncio.create_task(_stream_gaps(client, p, started)) for p in PROMPTS]
    constrained = None
    if tag is not None:
        await started.wait()
        constrained = asyncio.create_task(_constrained(client, tag))
    gaps = [g for gs in await asyncio.gather(*streams) for g in gs]
    return gaps, (await constrained if constrained else None)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def test_slow_compile_does_not_stall_other_streams(tmp_path):
    args = ["--max-model-len", "512", "--kv-cache-memory-gib", "0.25"]
    with running_server(args, tmp_path, env={TEST_ONLY_SLOW_COMPILE_ENV: str(SLOW_MS)}) as server:
        client = openai.AsyncOpenAI(
            base_url=server.base_url, api_key="unused", max_retries=0, timeout=300
        )

        async def scenario():
            await _constrained(client, "warm-up")  # xgrammar import, vocabulary tables
            base, _ = await _run(client, None)
            slow, constrained = await _run(client, "fresh")
            return base, slow, constrained

        base, slow, (latency, content) = asyncio.run(scenario())
    jsonschema.validate(json.loads(content), _schema("fresh"))
    assert latency >= SLOW_MS / 1000  # it did wait for its compile...
    # ...while the other streams kept their pace
    assert p99(slow) <= 2 * p99(base), (p99(base), p99(slow), max(slow))
