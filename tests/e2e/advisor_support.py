"""Helpers for the advisor's end-to-end tests: a real `llmservice serve`, a real
workload over HTTP, and `llmservice advise --json` run as a user would run it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.server_process import BIN, running_server


@contextmanager
def server(args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A ready server's URL (tests/support/server_process.py); stopped on exit."""
    with running_server(args, log_dir, env) as proc:
        yield proc.url


async def _drive(
    url: str, prompts: list[list[int]] | list[str], max_tokens: int, concurrency: int
) -> None:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, trust_env=False) as client:

        async def one(prompt: list[int] | str) -> None:
            async with gate:
                r = await client.post(
                    "/v1/completions",
                    json={
                        "model": "builtin:smollm2-135m",
                        "prompt": prompt,
                        "max_tokens": max_tokens,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                )
                r.raise_for_status()

        await asyncio.gather(*(one(p) for p in prompts))


def advise_during(
    url: str,
    window: float,
    prompts: list[list[int]] | list[str],
    max_tokens: int,
    concurrency: int = 4,
) -> tuple[int, list[dict]]:
    """Start `llmservice advise URL --window W --json`, drive the workload inside the
    window, and return its exit code and findings."""
    proc = subprocess.Popen(
        [str(BIN), "advise", url, "--window", str(window), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # its first scrape is taken before the workload
    started = time.monotonic()
    asyncio.run(_drive(url, prompts, max_tokens, concurrency))
    took = time.monotonic() - started
    out, err = proc.communicate(timeout=window + 60)
    assert took < window - 1, f"the workload took {took:.0f} s, longer than the {window} s window"
    assert proc.returncode in (0, 3), err
    return proc.returncode, json.loads(out)


def advise_while(
    url: str,
    window: float,
    prompts: list[list[int]] | list[str],
    max_tokens: int,
    concurrency: int,
    *,
    warmup: float = 3.0,
) -> tuple[int, list[dict]]:
    """Keep `concurrency` clients sending the prompts (round robin) from `warmup` s before
    `llmservice advise URL --window W --json` until it is done, so both of its scrapes
    see the server under the same load (a standing queue, say); then stop them and
    return the exit code and findings."""
    stop = threading.Event()
    failure: list[BaseException] = []
    sent = [0]

    async def clients() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=300, trust_env=False) as client:

            async def worker(first: int) -> None:
                i = first
                while not stop.is_set():
                    r = await client.post("/v1/completions", json={
                        "model": "builtin:smollm2-135m", "prompt": prompts[i % len(prompts)],
                        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                    })  # fmt: skip
                    r.raise_for_status()
                    sent[0] += 1
                    i += concurrency

            await asyncio.gather(*(worker(k) for k in range(concurrency)))

    def drive() -> None:
        try:
            asyncio.run(clients())
        except BaseException as exc:  # reported in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    time.sleep(warmup)
    try:
        out = subprocess.run(
            [str(BIN), "advise", url, "--window", str(window), "--json"],
            capture_output=True, text=True, timeout=window + 60,
        )  # fmt: skip
    finally:
        stop.set()
        thread.join(300)
    assert not failure and sent[0] > 0, (failure, sent)
    assert out.returncode in (0, 3), out.stderr
    return out.returncode, json.loads(out.stdout)
